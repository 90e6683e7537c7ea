// Compile-time facts of the streamed MMA pooler GEMM (stream_gemm.cuh) that
// host validation also needs. Plain C++: the checks run without a GPU.
#pragma once

#if defined(__CUDACC__)
#define SPARK_STREAM_HD __host__ __device__
#else
#define SPARK_STREAM_HD
#endif

namespace spark_decode::kernels {

// A stage holds G weight rows of one CTA's K slice (K / splits columns):
// 32 KiB, G = 8 at a 2048-column slice, G = 16 at 1024. Each row piece is
// one contiguous bulk copy of 2-4 KiB: the copy size matters (the streaming
// read is slower with short pieces; 2-D boxes of 128-512 bytes per row
// measured far slower still, bench/NOTES.md).
inline constexpr int kStreamStageElems = 16384;  // G * K slice
SPARK_STREAM_HD constexpr int stream_group_rows(int k_slice) { return kStreamStageElems / k_slice; }
inline constexpr int kStreamMaxStages = 8;
// Compute warps per CTA: each takes a quarter of every stage's columns into
// registers (64 per lane) and releases the slot before its MMAs.
inline constexpr int kStreamWarps = 4;
inline constexpr int kStreamThreads = (kStreamWarps + 1) * 32;
inline constexpr int kStreamMinStages = 2;
// Header: full[kStreamMaxStages], empty[kStreamMaxStages], the x barrier and
// the reduction barrier (8 bytes each), padded.
inline constexpr int kStreamHeaderBytes = 256;

// Rows of x and of a stage are padded by 16 bytes, so that the eight rows a
// quarter-warp reads sit in different banks.
SPARK_STREAM_HD constexpr int stream_row_bytes(int k_slice) { return k_slice * 2 + 16; }
SPARK_STREAM_HD constexpr int stream_stage_bytes(int k_slice) {
  return stream_group_rows(k_slice) * stream_row_bytes(k_slice);
}
// Shared memory layout: header | y [16 tokens][owned_max G] BF16 | partials
// [splits][kStreamWarps][owned_max][G / 8][32 lanes][4] FP32 | x [m][row] |
// ring.
SPARK_STREAM_HD constexpr int stream_y_offset() { return kStreamHeaderBytes; }
SPARK_STREAM_HD constexpr int stream_partials_offset(int k_slice, int owned_max) {
  return stream_y_offset() + 16 * owned_max * stream_group_rows(k_slice) * 2;
}
SPARK_STREAM_HD constexpr int stream_x_offset(int k_slice, int splits, int owned_max) {
  return stream_partials_offset(k_slice, owned_max) +
         splits * kStreamWarps * owned_max * (stream_group_rows(k_slice) / 8) * 512;
}
SPARK_STREAM_HD constexpr int stream_ring_offset(int k_slice, int splits, int owned_max, int m) {
  return stream_x_offset(k_slice, splits, owned_max) + m * stream_row_bytes(k_slice);
}
SPARK_STREAM_HD constexpr int stream_smem_bytes(int k_slice, int splits, int owned_max, int m, int stages) {
  return stream_ring_offset(k_slice, splits, owned_max, m) + stages * stream_stage_bytes(k_slice);
}
// The deepest ring that fits `smem_limit` (may be below kStreamMinStages:
// then the shape cannot run).
SPARK_STREAM_HD constexpr int stream_stages(int k_slice, int splits, int owned_max, int m, int smem_limit) {
  const int left = smem_limit - stream_ring_offset(k_slice, splits, owned_max, m);
  const int stages = left < 0 ? 0 : left / stream_stage_bytes(k_slice);
  return stages > kStreamMaxStages ? kStreamMaxStages : stages;
}

}  // namespace spark_decode::kernels
