// Compile-time facts of the streamed MMA pooler GEMM (stream_gemm.cuh) that
// host validation also needs. Plain C++: the checks run without a GPU.
#pragma once

#if defined(__CUDACC__)
#define SPARK_STREAM_HD __host__ __device__
#else
#define SPARK_STREAM_HD
#endif

namespace spark_decode::kernels {

// The copy engine fills each stage with boxes of [rows][64] BF16: 128-byte
// rows, the widest the 128-byte swizzle takes (it spreads a box's rows over
// the shared-memory banks, so the MMA operand reads are conflict-free).
inline constexpr int kStreamBoxK = 64;
// 32 KiB per stage: the copy size the bare streaming read measured fastest
// (16-32 KiB per request, bench/NOTES.md).
inline constexpr int kStreamStageBytes = 32768;
inline constexpr int kStreamMaxStages = 8;
inline constexpr int kStreamMinStages = 2;
// Header: full[kStreamMaxStages], empty[kStreamMaxStages], the x barrier and
// the reduction barrier (8 bytes each), padded.
inline constexpr int kStreamHeaderBytes = 256;
// The ring's stages start 1024-byte aligned (the 128-byte swizzle's period);
// the dynamic shared memory base is only 16-byte aligned, so we reserve the
// slack and align at run time.
inline constexpr int kStreamAlignSlack = 1024;

// K columns per stage for `rows` weight rows per CTA.
SPARK_STREAM_HD constexpr int stream_stage_k(int rows) { return kStreamStageBytes / (rows * 2); }
// Threads per CTA: one consumer warp per 16-row MMA tile, one producer warp.
SPARK_STREAM_HD constexpr int stream_threads(int rows) { return (rows / 16 + 1) * 32; }
// The most 16-row tiles one cluster rank reduces (tile i goes to rank i % splits).
SPARK_STREAM_HD constexpr int stream_owned_max(int rows, int splits) {
  return (rows / 16 + splits - 1) / splits;
}
// Shared memory layout: header | y [tile][owned_max * 16] BF16 | partials
// [splits][owned_max][tile / 8][32 lanes][4] FP32 | x [tile][k / splits + 8]
// BF16 (rows padded by 16 bytes: conflict-free reads) | slack | ring.
SPARK_STREAM_HD constexpr int stream_x_stride_bytes(int k, int splits) { return (k / splits) * 2 + 16; }
SPARK_STREAM_HD constexpr int stream_y_offset() { return kStreamHeaderBytes; }
SPARK_STREAM_HD constexpr int stream_partials_offset(int rows, int splits, int tile) {
  return stream_y_offset() + tile * stream_owned_max(rows, splits) * 16 * 2;
}
SPARK_STREAM_HD constexpr int stream_x_offset(int rows, int splits, int tile) {
  return stream_partials_offset(rows, splits, tile) + splits * stream_owned_max(rows, splits) * (tile / 8) * 512;
}
SPARK_STREAM_HD constexpr int stream_ring_offset(int rows, int splits, int tile, int k) {
  return stream_x_offset(rows, splits, tile) + tile * stream_x_stride_bytes(k, splits) + kStreamAlignSlack;
}
SPARK_STREAM_HD constexpr int stream_smem_bytes(int rows, int splits, int tile, int k, int stages) {
  return stream_ring_offset(rows, splits, tile, k) + stages * kStreamStageBytes;
}
// The deepest ring that fits `smem_limit` (may be below kStreamMinStages:
// then the shape cannot run).
SPARK_STREAM_HD constexpr int stream_stages(int rows, int splits, int tile, int k, int smem_limit) {
  const int left = smem_limit - stream_ring_offset(rows, splits, tile, k);
  const int stages = left < 0 ? 0 : left / kStreamStageBytes;
  return stages > kStreamMaxStages ? kStreamMaxStages : stages;
}

}  // namespace spark_decode::kernels
