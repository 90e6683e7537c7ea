// Compile-time facts of the on-chip MMA kernel (onchip_mma.cuh) that host
// validation also needs. Plain C++ (no CUDA headers): the launch-shape checks
// run on machines without a GPU.
#pragma once

#include "kernels/common/limits.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/plan.h"

#if defined(__CUDACC__)
#define SPARK_ONCHIP_HD __host__ __device__
#else
#define SPARK_ONCHIP_HD
#endif

namespace spark_decode::kernels::onchip {

// Threads per CTA the kernel is compiled for: kOnchipMaxWarps warps, so up
// to 128 registers per thread (65536 / 512). A lane holds the x fragments of
// its whole K range (kw / 32 vectors per n8 tile) and one A fragment; the
// weights themselves stay in shared memory. With two row tiles
// (kOnchipRowTiles2Warps warps at most) a lane holds twice the accumulators
// and A fragments beside the same x fragments: up to 255 registers.
inline constexpr int kMaxThreads = 32 * kOnchipMaxWarps;
SPARK_ONCHIP_HD constexpr int max_threads(int row_tiles) {
  return row_tiles == 1 ? kMaxThreads : 32 * kOnchipRowTiles2Warps;
}

// A copy stage: `width` consecutive K (G warps' kw) of the CTA's 16 rows, one
// bulk copy per row. Rows are stored in two halves by parity, the odd half
// starting 64 bytes past a multiple of 128: a quarter warp's 16-byte fragment
// reads (rows g and g + 1, 64 bytes each at the same K) then fall on the two
// halves of the 32 banks, so each phase of a ld.shared.v4 is conflict-free
// without padding every row (the copies write whole rows, so no XOR swizzle
// is possible).
//
// With R row tiles per CTA (16 R rows), a stage is R such 16-row blocks, one
// after the other: block rt holds rows [16 rt, 16 rt + 16) of the CTA.
SPARK_ONCHIP_HD constexpr int row_bytes(int width) { return 2 * width; }
inline constexpr int kParitySkew = 64;
SPARK_ONCHIP_HD constexpr int block_bytes(int width) { return 16 * row_bytes(width) + kParitySkew; }
SPARK_ONCHIP_HD constexpr int stage_bytes(int width, int row_tiles = 1) { return row_tiles * block_bytes(width); }
// Byte offset of row r (0..15) in its block: even rows packed from 0, odd
// rows packed from half the block plus the skew.
SPARK_ONCHIP_HD constexpr int row_offset(int width, int r) {
  return (r & 1) * (8 * row_bytes(width) + kParitySkew) + (r >> 1) * row_bytes(width);
}
static_assert(row_offset(128, 1) % 128 == 64 && row_offset(1024, 1) % 128 == 64 && row_offset(128, 2) % 128 == 0 &&
                  row_offset(128, 9) - row_offset(128, 1) == 4 * row_bytes(128),
              "rows g and g + 1 start on opposite halves of the banks; rows g and g + 8 in one half");

// Shared memory, in order: the mbarriers (one per stage, then the one the
// remote partials complete on), the CTA's output tile [16 tokens][16 R rows]
// BF16, one FP32 [R x TILE x 16] partial per warp of the cluster (every CTA
// reserves them; only rank 0's are written), then the stages.
inline constexpr int kHeaderBytes = 256;
static_assert(8 * (kOnchipMaxWarps + 1) <= kHeaderBytes);
inline constexpr int kPartialBar = 8 * kOnchipMaxWarps;  // byte offset of the partials' mbarrier
inline constexpr int kYTileBytes = kMaxBatch * 16 * kOnchipMaxRowTiles * 2;
inline constexpr int kPartialsOffset = kHeaderBytes + kYTileBytes;
SPARK_ONCHIP_HD constexpr int partial_floats(int tile, int row_tiles = 1) { return row_tiles * tile * 16; }
SPARK_ONCHIP_HD constexpr int stages_offset(int k, int kw, int tile, int row_tiles = 1) {
  return kPartialsOffset + (k / kw) * partial_floats(tile, row_tiles) * 4;
}
SPARK_ONCHIP_HD constexpr int smem_bytes(int k, int splits, int kw, int tile, int row_tiles = 1) {
  // (k / (splits kw)) warps' K = k / splits per row, in stages of any G:
  // the stages' padding is one skew per block of a stage, at most R per warp.
  return stages_offset(k, kw, tile, row_tiles) + 16 * row_tiles * row_bytes(k / splits) +
         row_tiles * (k / (splits * kw)) * kParitySkew;
}

}  // namespace spark_decode::kernels::onchip
