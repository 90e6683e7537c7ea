// Compile-time facts of the streamed MMA pooler GEMM (stream_gemm.cuh) that
// host validation also needs. Plain C++: the checks run without a GPU.
#pragma once

#if defined(__CUDACC__)
#define SPARK_STREAM_HD __host__ __device__
#else
#define SPARK_STREAM_HD
#endif

namespace spark_decode::kernels {

// A stage is 8 weight rows (one n8 MMA tile) x 2048 columns: 32 KiB, one
// contiguous 4 KiB bulk copy per row. A CTA's K slice (k / splits columns)
// is k / splits / 2048 consecutive stages of the same rows.
inline constexpr int kStreamRows = 8;
inline constexpr int kStreamStageK = 2048;
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
SPARK_STREAM_HD constexpr int stream_row_bytes(int cols) { return cols * 2 + 16; }
inline constexpr int kStreamStageBytes = kStreamRows * (kStreamStageK * 2 + 16);
// Row groups a cluster owns at most: the partial buffer below has a fixed
// size, so that whether a batch fits never depends on the GPU's SM count
// (more groups than clusters x kStreamMaxPer: a second wave, slower, right).
inline constexpr int kStreamMaxPer = 8;
// Shared memory layout: header | y [16 tokens][kStreamMaxPer 8] BF16 |
// partials [splits][kStreamWarps][owned_max][32 lanes][4] FP32 (owned_max =
// ceil(per / splits) <= kStreamMaxPer / splits) | x [m][k_slice + 8] BF16 |
// ring.
SPARK_STREAM_HD constexpr int stream_y_offset() { return kStreamHeaderBytes; }
SPARK_STREAM_HD constexpr int stream_partials_offset() { return stream_y_offset() + 16 * kStreamMaxPer * kStreamRows * 2; }
SPARK_STREAM_HD constexpr int stream_x_offset() { return stream_partials_offset() + kStreamWarps * kStreamMaxPer * 512; }
SPARK_STREAM_HD constexpr int stream_ring_offset(int k_slice, int m) { return stream_x_offset() + m * stream_row_bytes(k_slice); }
SPARK_STREAM_HD constexpr int stream_smem_bytes(int k_slice, int m, int stages) {
  return stream_ring_offset(k_slice, m) + stages * kStreamStageBytes;
}
// The deepest ring that fits `smem_limit` (may be below kStreamMinStages:
// then the shape cannot run).
SPARK_STREAM_HD constexpr int stream_stages(int k_slice, int m, int smem_limit) {
  const int left = smem_limit - stream_ring_offset(k_slice, m);
  const int stages = left < 0 ? 0 : left / kStreamStageBytes;
  return stages > kStreamMaxStages ? kStreamMaxStages : stages;
}

}  // namespace spark_decode::kernels
