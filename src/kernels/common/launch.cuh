// One launch path for every kernel: clusters and programmatic dependent
// launch are launch attributes, set here and nowhere else.
#pragma once

#include <cuda_runtime.h>

#include "spark_decode/error.h"

namespace spark_decode::kernels {

struct LaunchShape {
  dim3 grid;
  dim3 block;
  int smem_bytes = 0;
  int cluster_y = 1;         // cluster (1, cluster_y, 1) when > 1
  bool cluster_balance = false;  // clusters: load-balancing scheduling policy
  bool enable_pdl = false;   // may start before the previous kernel ends
};

inline cudaLaunchConfig_t make_config(const LaunchShape& shape, cudaStream_t stream,
                                      cudaLaunchAttribute (&attrs)[3]) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = shape.grid;
  cfg.blockDim = shape.block;
  cfg.dynamicSmemBytes = static_cast<size_t>(shape.smem_bytes);
  cfg.stream = stream;
  unsigned n = 0;
  if (shape.cluster_y > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = 1;
    attrs[n].val.clusterDim.y = static_cast<unsigned>(shape.cluster_y);
    attrs[n].val.clusterDim.z = 1;
    ++n;
    if (shape.cluster_balance) {
      attrs[n].id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
      attrs[n].val.clusterSchedulingPolicyPreference = cudaClusterSchedulingPolicyLoadBalancing;
      ++n;
    }
  }
  if (shape.enable_pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  return cfg;
}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), const LaunchShape& shape, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchAttribute attrs[3];
  const cudaLaunchConfig_t cfg = make_config(shape, stream, attrs);
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
  SPARK_CHECK_LAUNCH();
}

// How many clusters of this shape fit the device at once (0: it cannot run).
template <typename... Params>
int max_active_clusters(void (*kernel)(Params...), const LaunchShape& shape) {
  cudaLaunchAttribute attrs[3];
  LaunchShape one = shape;
  one.enable_pdl = false;
  const cudaLaunchConfig_t cfg = make_config(one, nullptr, attrs);
  int clusters = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, reinterpret_cast<const void*>(kernel), &cfg));
  return clusters;
}

// How many CTAs of this shape fit one SM at once (0: it cannot run).
template <typename... Params>
int max_active_blocks_per_sm(void (*kernel)(Params...), const LaunchShape& shape) {
  int blocks = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, reinterpret_cast<const void*>(kernel),
                                                           static_cast<int>(shape.block.x * shape.block.y *
                                                                            shape.block.z),
                                                           static_cast<size_t>(shape.smem_bytes)));
  return blocks;
}

}  // namespace spark_decode::kernels
