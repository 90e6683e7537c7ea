#include "peer_latency.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "kernels/common/ptx.cuh"
#include "spark_decode/error.h"

namespace spark_decode::bench {
namespace {

// One thread on each GPU. The pinger stores i into the ponger's flag and
// waits for i to come back in its own flag; the ponger echoes. Relaxed
// system-scope stores publish; acquire system-scope loads observe without
// being served from L1.
__global__ void ping(uint32_t* peer_flag, const uint32_t* my_flag, int rounds, uint64_t* elapsed_ns) {
  const uint64_t t0 = ptx::globaltimer_ns();
  for (uint32_t i = 1; i <= static_cast<uint32_t>(rounds); ++i) {
    ptx::st_relaxed_sys_u32(peer_flag, i);
    while (ptx::ld_acquire_sys_u32(my_flag) != i) {
    }
  }
  *elapsed_ns = ptx::globaltimer_ns() - t0;
}

__global__ void pong(uint32_t* peer_flag, const uint32_t* my_flag, int rounds) {
  for (uint32_t i = 1; i <= static_cast<uint32_t>(rounds); ++i) {
    while (ptx::ld_acquire_sys_u32(my_flag) != i) {
    }
    ptx::st_relaxed_sys_u32(peer_flag, i);
  }
}

void enable_peer(int from, int to) {
  CUDA_CHECK(cudaSetDevice(from));
  const cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return;
  }
  CUDA_CHECK(err);
}

}  // namespace

double peer_store_latency_us(int a, int b, int round_trips, int trials) {
  int can = 0;
  CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
  SPARK_CHECK_RUNTIME(can, "GPUs ", a, " and ", b, " cannot access each other peer to peer");
  int previous = 0;
  CUDA_CHECK(cudaGetDevice(&previous));
  enable_peer(a, b);
  enable_peer(b, a);
  uint32_t *flag_a, *flag_b;
  uint64_t* elapsed;
  CUDA_CHECK(cudaSetDevice(a));
  CUDA_CHECK(cudaMalloc(&flag_a, 4));
  CUDA_CHECK(cudaMalloc(&elapsed, 8));
  CUDA_CHECK(cudaSetDevice(b));
  CUDA_CHECK(cudaMalloc(&flag_b, 4));
  std::vector<double> us;
  cudaStream_t sa, sb;
  CUDA_CHECK(cudaSetDevice(a));
  CUDA_CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
  CUDA_CHECK(cudaSetDevice(b));
  CUDA_CHECK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
  for (int t = 0; t < trials + 1; ++t) {
    CUDA_CHECK(cudaSetDevice(a));
    CUDA_CHECK(cudaMemset(flag_a, 0, 4));
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaSetDevice(b));
    CUDA_CHECK(cudaMemset(flag_b, 0, 4));
    CUDA_CHECK(cudaDeviceSynchronize());
    // Both kernels must be resident together: the ponger first, on its own
    // device, then the pinger.
    pong<<<1, 1, 0, sb>>>(flag_a, flag_b, round_trips);
    SPARK_CHECK_LAUNCH();
    CUDA_CHECK(cudaSetDevice(a));
    ping<<<1, 1, 0, sa>>>(flag_b, flag_a, round_trips, elapsed);
    SPARK_CHECK_LAUNCH();
    CUDA_CHECK(cudaStreamSynchronize(sa));
    CUDA_CHECK(cudaSetDevice(b));
    CUDA_CHECK(cudaStreamSynchronize(sb));
    uint64_t ns = 0;
    CUDA_CHECK(cudaSetDevice(a));
    CUDA_CHECK(cudaMemcpy(&ns, elapsed, 8, cudaMemcpyDeviceToHost));
    if (t > 0) us.push_back(ns / 1e3 / (2.0 * round_trips));
  }
  CUDA_CHECK(cudaSetDevice(a));
  cudaFree(flag_a);
  cudaFree(elapsed);
  cudaStreamDestroy(sa);
  CUDA_CHECK(cudaSetDevice(b));
  cudaFree(flag_b);
  cudaStreamDestroy(sb);
  CUDA_CHECK(cudaSetDevice(previous));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace spark_decode::bench
