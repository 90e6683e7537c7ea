#include "info.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "spark_decode/bf16.h"
#include "spark_decode/error.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/reference.h"
#include "spark_decode/unpooler.h"

namespace spark_decode::tool {

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

void print_info() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    std::printf("GPUs: none visible (%s)\n", err == cudaSuccess ? "0 devices" : cudaGetErrorString(err));
    return;
  }
  int driver = 0, runtime = 0;
  CUDA_CHECK(cudaDriverGetVersion(&driver));
  CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  std::printf("GPUs: %d (driver API %d, runtime %d)\n", n, driver, runtime);
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, d));
    int cluster = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&cluster, cudaDevAttrClusterLaunch, d));
    std::printf("  cuda:%d %s  cc %d.%d  %d SMs  L2 %.0f MB  %.1f GB  smem/block opt-in %zu KB  clusters %s%s\n", d,
                p.name, p.major, p.minor, p.multiProcessorCount, p.l2CacheSize / 1e6, p.totalGlobalMem / 1e9,
                p.sharedMemPerBlockOptin / 1024, cluster ? "yes" : "no",
                p.major >= 9 ? "" : "  (below 9.0: spark-decode's kernels do not run here)");
  }
  if (n > 1) {
    std::printf("peer access (row can access column):\n      ");
    for (int j = 0; j < n; ++j) std::printf(" %5d", j);
    std::printf("\n");
    for (int i = 0; i < n; ++i) {
      std::printf("  %3d ", i);
      for (int j = 0; j < n; ++j) {
        int can = 0;
        if (i != j) CUDA_CHECK(cudaDeviceCanAccessPeer(&can, i, j));
        std::printf(" %5s", i == j ? "-" : can ? "yes" : "no");
      }
      std::printf("\n");
    }
  }
}

namespace {

std::vector<uint16_t> random_bf16(size_t count, std::mt19937_64& g) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> v(count);
  for (auto& x : v) x = float_to_bf16_rne(normal(g));
  return v;
}

// The GPU result's worst |err| / bound over its out.size() elements (the
// first rows of `exact` and `mag`, which may hold more), where the bound is
// the one the GPU tests use (2^-8 |exact| + K 2^-23 sum|x w| + 2^-126).
double worst_ratio(const std::vector<uint16_t>& out, const std::vector<double>& exact,
                   const std::vector<double>& mag, int k) {
  double worst = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double got = bf16_to_float(out[i]);
    const double bound = std::ldexp(std::fabs(exact[i]), -8) + k * std::ldexp(mag[i], -23) + std::ldexp(1.0, -126);
    const double r = std::fabs(got - exact[i]) / bound;
    worst = std::max(worst, std::isfinite(r) ? r : 1e30);
  }
  return worst;
}

}  // namespace

bool verify_unpooler_gpu() {
  std::mt19937_64 g(std::random_device{}());
  bool ok = true;
  std::printf("unpooler against the FP64 CPU reference (pass: worst |err|/bound <= 1):\n");
  struct S {
    int n, k;
  };
  std::vector<S> shapes = {{48, 256}};
  for (int tp : kTensorParallelSizes) shapes.push_back({kMuseSpark.hidden / tp, kMuseSpark.pooled});
  for (S s : shapes) {
    const int m = kMaxBatch;
    const auto hw = random_bf16(static_cast<size_t>(s.n) * s.k, g), hx = random_bf16(static_cast<size_t>(m) * s.k, g);
    void *w, *x, *out;
    CUDA_CHECK(cudaMalloc(&w, hw.size() * 2));
    CUDA_CHECK(cudaMalloc(&x, hx.size() * 2));
    CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(m) * s.n * 2));
    CUDA_CHECK(cudaMemcpy(w, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    std::vector<uint16_t> ref(static_cast<size_t>(m) * s.n);
    std::vector<double> exact, mag;
    reference::gemm_bf16(hx.data(), hw.data(), ref.data(), m, s.n, s.k, &exact, &mag);
    Unpooler u(TensorRef::contiguous(w, DType::bf16, {s.n, s.k}, 0));
    for (int mm : {1, 8, 16}) {
      CUDA_CHECK(cudaMemset(out, 0xff, static_cast<size_t>(m) * s.n * 2));
      u.run(x, out, mm, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<uint16_t> got(static_cast<size_t>(mm) * s.n);
      CUDA_CHECK(cudaMemcpy(got.data(), out, got.size() * 2, cudaMemcpyDeviceToHost));
      // The first mm rows of the m = 16 reference (a row does not depend on
      // the others).
      const double r = worst_ratio(got, exact, mag, s.k);
      std::printf("  N=%5d K=%d m=%2d  tactic %-36s worst |err|/bound %.3f  %s\n", s.n, s.k, mm,
                  u.tactic().to_string().c_str(), r, r <= 1 ? "ok" : "FAIL");
      ok = ok && r <= 1;
    }
    cudaFree(w);
    cudaFree(x);
    cudaFree(out);
  }
  return ok;
}

void run_cpu_reference_demo() {
  const int m = 4, n = 48, k = 256;
  std::mt19937_64 g(std::random_device{}());
  const auto x = random_bf16(static_cast<size_t>(m) * k, g), w = random_bf16(static_cast<size_t>(n) * k, g);
  std::vector<uint16_t> out(static_cast<size_t>(m) * n);
  reference::gemm_bf16(x.data(), w.data(), out.data(), m, n, k);
  std::printf("CPU reference unpooler GEMM, random N(0,1) inputs, m=%d N=%d K=%d (FP64 sums, BF16 out).\n", m, n, k);
  std::printf("out[0, 0..7]:");
  for (int j = 0; j < 8; ++j) std::printf(" %.4f", bf16_to_float(out[j]));
  std::printf("\nNo GPU figure was measured.\n");
}

}  // namespace spark_decode::tool
