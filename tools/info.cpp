#include "info.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "spark_decode/error.h"

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

std::string info_json() {
  nlohmann::ordered_json j;
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) n = 0;
  j["gpus"] = nlohmann::json::array();
  for (int d = 0; d < n; ++d) {
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, d));
    int cluster = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&cluster, cudaDevAttrClusterLaunch, d));
    std::vector<int> peers;
    for (int e = 0; e < n; ++e) {
      int can = 0;
      if (e != d) CUDA_CHECK(cudaDeviceCanAccessPeer(&can, d, e));
      if (can) peers.push_back(e);
    }
    j["gpus"].push_back({{"index", d},
                         {"name", p.name},
                         {"compute_capability", std::to_string(p.major) + "." + std::to_string(p.minor)},
                         {"sms", p.multiProcessorCount},
                         {"l2_bytes", p.l2CacheSize},
                         {"memory_bytes", p.totalGlobalMem},
                         {"smem_per_block_optin_bytes", p.sharedMemPerBlockOptin},
                         {"clusters", cluster != 0},
                         {"supported", p.major >= 9},
                         {"peer_access", peers}});
  }
  if (err != cudaSuccess && err != cudaErrorNoDevice) j["error"] = cudaGetErrorString(err);
  return j.dump(1);
}

}  // namespace spark_decode::tool
