// Compile-time facts of the unpooler kernel that host validation also needs.
// Plain C++ (no CUDA headers): the tactic checks run on machines without a GPU.
#pragma once

#include "spark_decode/unpooler.h"

namespace spark_decode::kernels {

// Threads per CTA the kernel is compiled for, by KW: it bounds registers per
// thread to 65536 / threads, and a lane holds KW / 4 registers of weights.
constexpr int unpooler_max_threads(int kw) { return kw >= 256 ? 512 : 1024; }

// Shared memory of cluster rank 0: a header (an mbarrier, then the CTA's
// [16 tokens][16] BF16 output tile), then one FP32 [TILE x 16] partial per
// warp of the cluster (every CTA reserves it; only rank 0's is used).
inline constexpr int kUnpoolerSmemBarrier = 16;
inline constexpr int kUnpoolerSmemHeader = kUnpoolerSmemBarrier + kUnpoolerMaxM * kUnpoolerTileN * 2;
constexpr int unpooler_smem_bytes(int k, int kw, int tile) {
  return kUnpoolerSmemHeader + (k / kw) * tile * kUnpoolerTileN * static_cast<int>(sizeof(float));
}

// The opt-in shared memory per block of sm_90 and sm_100 (227 KiB).
constexpr int kMaxSmemPerBlock = 232448;

}  // namespace spark_decode::kernels
