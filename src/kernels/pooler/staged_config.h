// Compile-time facts of the staged skinny GEMM (skinny_staged.cuh) that host
// validation also needs. Plain C++: the checks run on machines without a GPU.
#pragma once

#if defined(__CUDACC__)
#define SPARK_STAGED_HD __host__ __device__
#else
#define SPARK_STAGED_HD
#endif

namespace spark_decode::kernels {

// Compute threads per CTA: the skinny GEMM's block_size 256, whose sum order
// the staged kernel reproduces bit for bit; plus one producer warp.
inline constexpr int kStagedBlock = 256;
inline constexpr int kStagedThreads = kStagedBlock + 32;
// x lives in shared memory for the whole call: row tiles 1, 2 and 4.
inline constexpr int kStagedMaxRows = 4;
// Ring depth: as many stages as the shared memory left after x holds, at
// most kStagedMaxStages (their mbarriers sit in a fixed header), at least 2.
inline constexpr int kStagedMaxStages = 16;
inline constexpr int kStagedMinStages = 2;
// Header: full and empty mbarriers per stage, then the two tiles' warp
// partials [2][8 warps][kValues <= 16] FP32 and published y [2][16] BF16.
inline constexpr int kStagedBarrierBytes = 2 * kStagedMaxStages * 8;
inline constexpr int kStagedHeaderBytes = kStagedBarrierBytes + 2 * (kStagedBlock / 32) * 16 * 4 + 2 * 16 * 2;

// Weight columns per stage and bytes per stage: kOpb rows of
// 8 * kStagedBlock * k_unroll columns.
SPARK_STAGED_HD constexpr int staged_stage_cols(int k_unroll) { return 8 * kStagedBlock * k_unroll; }
SPARK_STAGED_HD constexpr int staged_stage_bytes(int opb, int k_unroll) {
  return opb * staged_stage_cols(k_unroll) * 2;
}
// Offset of x (16-byte aligned rows [rows][K] BF16) and of the ring.
SPARK_STAGED_HD constexpr int staged_x_offset() { return (kStagedHeaderBytes + 127) / 128 * 128; }
SPARK_STAGED_HD constexpr int staged_ring_offset(int rows, int k) {
  return (staged_x_offset() + rows * k * 2 + 127) / 128 * 128;
}
// The deepest ring that fits `smem_limit` bytes of dynamic shared memory
// (may be below kStagedMinStages: then the shape cannot run).
SPARK_STAGED_HD constexpr int staged_stages(int opb, int k_unroll, int rows, int k, int smem_limit) {
  const int left = smem_limit - staged_ring_offset(rows, k);
  const int stages = left < 0 ? 0 : left / staged_stage_bytes(opb, k_unroll);
  return stages > kStagedMaxStages ? kStagedMaxStages : stages;
}
SPARK_STAGED_HD constexpr int staged_smem_bytes(int opb, int k_unroll, int rows, int k, int stages) {
  return staged_ring_offset(rows, k) + stages * staged_stage_bytes(opb, k_unroll);
}

}  // namespace spark_decode::kernels
