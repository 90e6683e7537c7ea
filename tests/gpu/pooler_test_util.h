// Helpers of the Pooler's GPU tests: rows of several distributions, the
// FP64 GEMM reference with its error bound, the norm's CPU model, device
// vectors.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_util.h"
#include "spark_decode/bf16.h"
#include "spark_decode/error.h"
#include "spark_decode/mailbox.h"
#include "spark_decode/pooler_gemm.h"
#include "spark_decode/reference.h"

namespace spark_decode::testing::pooler_tests {

#define POOLER_REQUIRE(cond, ...)                                                                  \
  do {                                                                                             \
    if (!(cond)) throw std::runtime_error(::spark_decode::detail::concat(__VA_ARGS__));            \
  } while (0)

// The row distributions of the bit-exactness tests (issue 4).
enum class RowDist { normal, heavy_tailed, zero_blocks, negative_zeros, subnormals, huge, tiny, kCount };
inline const char* row_dist_name(RowDist d) {
  static const char* names[] = {"normal", "heavy_tailed", "zero_blocks", "negative_zeros", "subnormals", "huge", "tiny"};
  return names[static_cast<int>(d)];
}

// One row of `cols` BF16 values from distribution d.
inline void random_row(uint16_t* out, int cols, RowDist d, std::mt19937_64& g) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(1, 127);
  const float row_scale = std::ldexp(1.0f, std::uniform_int_distribution<int>(-8, 8)(g));
  for (int c = 0; c < cols; ++c) {
    float f = normal(g) * row_scale;
    switch (d) {
      case RowDist::normal: break;
      case RowDist::heavy_tailed: f = normal(g) / std::max(unit(g), 1e-6f); break;  // Cauchy-like tails
      case RowDist::zero_blocks: break;  // zeroed below, per block
      case RowDist::negative_zeros:
        if (unit(g) < 0.3f) f = unit(g) < 0.5f ? -0.0f : 0.0f;
        break;
      case RowDist::subnormals:
        if (unit(g) < 0.5f) {
          out[c] = static_cast<uint16_t>(small(g) | (unit(g) < 0.5f ? 0x8000 : 0));
          continue;
        }
        f *= 0x1p-120f;
        break;
      case RowDist::huge: f *= 0x1p100f; break;   // x^2 overflows FP32: mean = Inf
      case RowDist::tiny: f *= 0x1p-60f; break;   // mean(x^2) far below eps
      default: break;
    }
    out[c] = float_to_bf16_rne(f);
  }
  if (d == RowDist::zero_blocks) {
    const bool all = unit(g) < 0.05f;
    for (int b = 0; b < cols / 16; ++b)
      if (all || unit(g) < 0.4f)
        for (int i = 0; i < 16; ++i) out[b * 16 + i] = unit(g) < 0.5f ? 0x8000 : 0x0000;
  }
}

// The data generators below split their work into kDataChunks chunks, each
// with its own generator seeded from (seed, chunk), spread over the host's
// threads: the values depend on the seed alone, not on the thread count, so
// a seed replays on any machine.
inline constexpr int kDataChunks = 64;
template <typename Chunk>
void for_each_chunk(Chunk chunk) {
  const int threads = std::max(1, std::min<int>(kDataChunks, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int c = t; c < kDataChunks; c += threads) chunk(c);
    });
  for (auto& th : pool) th.join();
}

// rows x cols values, each row from a random distribution.
inline std::vector<uint16_t> random_rows(int rows, int cols, uint64_t seed) {
  std::vector<uint16_t> out(size_t(rows) * cols);
  for_each_chunk([&](int c) {
    std::mt19937_64 g(seed * 7919 + c);
    for (int r = c; r < rows; r += kDataChunks)
      random_row(out.data() + size_t(r) * cols, cols,
                 static_cast<RowDist>(g() % static_cast<uint64_t>(RowDist::kCount)), g);
  });
  return out;
}

// Plain normal BF16 values (GEMM operands), fast.
inline std::vector<uint16_t> normal_bf16(size_t count, uint64_t seed, float scale = 1.0f) {
  std::vector<uint16_t> out(count);
  for_each_chunk([&](int c) {
    std::mt19937_64 g(seed * 104729 + c);
    std::normal_distribution<float> normal(0.0f, scale);
    const size_t b = count * c / kDataChunks, e = count * (c + 1) / kDataChunks;
    for (size_t i = b; i < e; ++i) out[i] = float_to_bf16_rne(normal(g));
  });
  return out;
}

// GEMM operands of one distribution: w [n, k] and x [m, k] BF16 bits.
// normal: small weights as in the model; the others from random_bf16
// (outliers, -0.0 / subnormal mixes; scaled: x large and w small, so that
// neither products nor sums leave FP32's normal range).
struct GemmOperands {
  std::vector<uint16_t> w, x;
};
inline GemmOperands gemm_operands(int n, int k, int m, Dist dist, uint64_t seed) {
  if (dist == Dist::normal) return {normal_bf16(size_t(n) * k, seed, 0.05f), normal_bf16(size_t(m) * k, seed + 1)};
  std::mt19937_64 g(seed);
  GemmOperands o;
  o.w = random_bf16(size_t(n) * k, dist, dist == Dist::scaled ? -30 : 0, g);
  o.x = random_bf16(size_t(m) * k, dist, dist == Dist::scaled ? 20 : 0, g);
  return o;
}

// out[m, n] (BF16 bits) against the FP64 reference of x[m, k] @ w[n, k]^T:
//   |out - exact| <= 2^-8 |exact| + K 2^-23 sum|x w| + 2^-126
// (the final BF16 rounding; twice FP32's worst-case summation error; the
// smallest normal). Returns "" or the first failure.
inline std::string check_gemm(const std::vector<uint16_t>& out, const uint16_t* x, const uint16_t* w, int m,
                              int n, int k) {
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::string> errors(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      const int n0 = int(int64_t(n) * t / threads), n1 = int(int64_t(n) * (t + 1) / threads);
      if (n1 == n0) return;
      std::vector<uint16_t> ref(size_t(m) * (n1 - n0));
      std::vector<double> exact, mag;
      reference::gemm_bf16(x, w + size_t(n0) * k, ref.data(), m, n1 - n0, k, &exact, &mag);
      for (int i = 0; i < m && errors[t].empty(); ++i)
        for (int j = n0; j < n1; ++j) {
          const size_t o = size_t(i) * (n1 - n0) + (j - n0);
          const double got = bf16_to_float(out[size_t(i) * n + j]);
          const double bound = std::ldexp(std::fabs(exact[o]), -8) + k * std::ldexp(mag[o], -23) + 0x1p-126;
          if (!(std::fabs(got - exact[o]) <= bound)) {
            errors[t] = detail::concat("row ", i, " col ", j, ": got ", got, " exact ", exact[o], " bound ", bound);
            break;
          }
        }
    });
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (!e.empty()) return e;
  return "";
}

template <typename T>
std::vector<T> download(const void* p, size_t count) {
  std::vector<T> v(count);
  CUDA_CHECK(cudaMemcpy(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) { CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(bytes, 16))); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }
  // Synchronous: a pageable copy may return before its DMA lands, and the
  // tests' non-blocking streams do not order against it.
  void upload(const void* h, size_t bytes) {
    CUDA_CHECK(cudaMemcpy(p_, h, bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_;
};

class TestStream {
 public:
  TestStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~TestStream() { cudaStreamDestroy(s_); }
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_;
};

// Every byte of the mailbox's allocation outside its data and state words
// still holds the guard filler (Options::guard_bytes > 0).
inline void check_mailbox_guards(const LamportMailbox& mb) {
  const size_t bytes = mb.memory().bytes();
  const auto raw = download<uint8_t>(mb.memory().local(), bytes);
  const auto [data_begin, data_end, state_begin, state_end] = regions_of(mb);
  for (size_t i = 0; i < bytes; ++i) {
    if ((i >= data_begin && i < data_end) || (i >= state_begin && i < state_end)) continue;
    POOLER_REQUIRE(raw[i] == kMailboxGuardByte, "mailbox allocation byte ", i, " outside data and state changed");
  }
}

// The batches of `candidates` that `engine` (nullopt: the table) can serve
// at [n, k].
inline std::vector<int> servable(const std::optional<PoolerGemmChoice>& engine, int n, int k,
                                 const std::vector<int>& candidates) {
  std::vector<int> out;
  for (int b : candidates)
    if (!engine || !pooler_choice_unsupported(n, k, b, *engine)) out.push_back(b);
  return out;
}

// The table, then every engine and shape (what PoolerGemm::Options::force takes).
inline std::vector<std::optional<PoolerGemmChoice>> table_and_candidates() {
  std::vector<std::optional<PoolerGemmChoice>> out = {std::nullopt};
  for (const auto& c : pooler_gemm_candidates()) out.push_back(c);
  return out;
}

}  // namespace spark_decode::testing::pooler_tests
