// Where an NVFP4 block scale goes, for each scale layout: plain C++ compiled
// for the kernels (the stock quantizer, the fused consumer) and for the CPU
// reference, so that both place every byte by the same arithmetic.
//
// linear:          a_sf [rows][cols / 16], row-major.
// swizzled_128x4:  the layout of vLLM's scaled_fp4_quant(...,
//   is_sf_swizzled_layout=True), which CUTLASS's and FlashInfer's block-scaled
//   MoE GEMMs read: a_sf [round_up(rows, 128)][round_up(cols / 16, 4)] bytes in
//   tiles of 128 rows x 4 scale columns (512 bytes), the tiles of a row band
//   consecutive; inside a tile, row r and column c at
//   (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4 (32 x 4 rows "column-major"
//   by 4-row group, so that a GEMM's 128-row M tile reads its scales as one
//   contiguous 512-byte piece per 4 scale columns). Padding rows and columns
//   hold zero.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPARK_SCALE_HD __host__ __device__ __forceinline__
#else
#define SPARK_SCALE_HD inline
#endif

namespace spark_decode::nvfp4_layout {

SPARK_SCALE_HD int round_up(int x, int to) { return (x + to - 1) / to * to; }

// Rows and columns of a_sf for `rows` x `scale_cols` block scales.
SPARK_SCALE_HD int swizzled_rows(int rows) { return round_up(rows, 128); }
SPARK_SCALE_HD int swizzled_cols(int scale_cols) { return round_up(scale_cols, 4); }

// Byte offset of the scale of (row, scale column c) in the swizzled layout.
SPARK_SCALE_HD int64_t swizzled_offset(int row, int c, int scale_cols) {
  const int64_t tiles_per_band = swizzled_cols(scale_cols) / 4;
  return ((int64_t(row) / 128) * tiles_per_band + c / 4) * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4 + c % 4;
}

}  // namespace spark_decode::nvfp4_layout
