// Compile-time facts of the split-K MMA kernel that host validation also
// needs. Plain C++ (no CUDA headers): the tactic checks run on machines
// without a GPU.
#pragma once

#include "kernels/common/limits.h"
#include "spark_decode/plan.h"

// The sizes below are used in device code as well (compile-time constants).
#if defined(__CUDACC__)
#define SPARK_SPLITK_HD __host__ __device__
#else
#define SPARK_SPLITK_HD
#endif

namespace spark_decode::kernels {

// Threads per CTA the kernel is compiled for, by KW and row tiles R: it
// bounds registers per thread to 65536 / threads. A lane holds KW / 4
// registers of weights at R = 1; at R > 1 up to 64 (the kernel loads them in
// chunks) plus R times the accumulators.
SPARK_SPLITK_HD constexpr int splitk_max_threads(int kw, int row_tiles = 1) {
  return row_tiles > 1 || kw >= 256 ? 512 : 1024;
}

// Shared memory of cluster rank 0: a header (an mbarrier, then the CTA's
// [16 tokens][16 R] BF16 output tile), then one FP32 [R][TILE x 16] partial
// per warp of the cluster (every CTA reserves it; only rank 0's is used).
inline constexpr int kSplitKSmemBarrier = 16;
SPARK_SPLITK_HD constexpr int splitk_smem_header(int row_tiles) {
  return kSplitKSmemBarrier + kMaxBatch * kSplitKTileN * row_tiles * 2;
}
SPARK_SPLITK_HD constexpr int splitk_smem_bytes(int k, int kw, int tile, int row_tiles = 1) {
  return splitk_smem_header(row_tiles) + (k / kw) * row_tiles * tile * kSplitKTileN * static_cast<int>(sizeof(float));
}

}  // namespace spark_decode::kernels
