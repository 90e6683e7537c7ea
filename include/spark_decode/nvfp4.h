// spark_decode/nvfp4.h: NVFP4 (block 16, E4M3 block scales, E2M1 codes) as
// vLLM's scaled_fp4_quant computes it, with its linear or its swizzled
// (is_sf_swizzled_layout=True) scale layout. docs/design.md, "Exact
// semantics".
//
// Per block of 16 consecutive BF16 values y of a row, with the FP32 global
// scale gs:
//   vmax      = max |y_i|
//   sf        = e4m3_rn_satfinite(gs * (vmax * rcp(6)))
//   out_scale = sf == 0 ? 0 : rcp(float(sf) * rcp(gs))
//   code_i    = e2m1_rn_satfinite(y_i * out_scale)
//   a[row, 8 blk + j] = code(16 blk + 2j) | code(16 blk + 2j + 1) << 4
//   a_sf[row, blk]    = sf
// On the GPU rcp is rcp.approx.ftz.f32 (about 1 ulp, subnormals flushed);
// the CPU reference below uses exact (correctly rounded) division 1.0f / x
// in its place, and does not flush subnormals. The two can therefore differ
// where y_i * out_scale lies within a few ulps of an E2M1 rounding boundary
// (tests/gpu/test_pooler_kernels.cu, PoolerNvfp4.*, counts and bounds those
// cases), and for
// subnormal gs (which no model uses).
//
// Three parts:
//   1. CPU conversions (host, any machine): checked exhaustively against
//      CUDA's host conversions (cuda_fp8.h, cuda_fp4.h) in tests/cpu.
//   2. The CPU reference quantizer (host memory).
//   3. nvfp4_quantize: the stock standalone quantize kernel (the oracle the
//      Pooler's fused consumer is checked against, and the stock path of the
//      benchmark).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "spark_decode/types.h"

namespace spark_decode {

inline constexpr int kNvfp4Block = 16;

// Where the block scales a_sf go (src/kernels/nvfp4/scale_layout.h):
//   linear    [rows][cols / 16], row-major;
//   swizzled  vLLM's 128x4 layout: [round_up(rows, 128)][round_up(cols / 16,
//             4)] bytes, tiles of 128 rows x 4 scale columns (512 bytes),
//             row r, scale column c at byte ((r / 128) * (scale columns / 4)
//             + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
//             the padding rows and columns hold zero.
enum class ScaleLayout { linear, swizzled };
const char* scale_layout_name(ScaleLayout layout);
// Rows and columns of a_sf for y [rows, cols] (cols % 16 == 0).
int nvfp4_scale_rows(int rows, ScaleLayout layout);
int nvfp4_scale_cols(int cols, ScaleLayout layout);
// The byte of a_sf holding the scale of block `blk` of row `row`.
int64_t nvfp4_scale_offset(int row, int blk, int cols, ScaleLayout layout);

// ---- 1. CPU conversions ------------------------------------------------------

// Float to an E2M1 code (bits 0..3: sign in bit 3), round to nearest even,
// saturating to +-6 (Inf too); NaN becomes +6 (code 0x7), as CUDA's host
// conversion does. The sign of zero and of values that round to zero is
// kept (-0.1 -> 0x8).
uint8_t e2m1_rn_satfinite(float x);
// An E2M1 code (bits 0..3) to float.
float e2m1_to_float(uint8_t code);
// Float to E4M3 (fn: no Inf, 0x7f/0xff NaN), round to nearest even,
// saturating to +-448 (Inf too); NaN becomes 0x7f. Sign of zero kept.
uint8_t e4m3_rn_satfinite(float x);
// An E4M3 byte to float (0x7f and 0xff are NaN).
float e4m3_to_float(uint8_t e4m3);

namespace reference {

// One block: 16 values (BF16 values widened to float) -> 8 code bytes and
// the returned E4M3 scale byte; exact division for the GPU's rcp (see the
// file comment).
uint8_t nvfp4_quantize_block(const float* y16, float global_scale, uint8_t* packed8);

// y BF16 bits [rows, cols] (cols % 16 == 0) -> a [rows, cols / 2] and a_sf
// (nvfp4_scale_rows x nvfp4_scale_cols bytes in `layout`, its padding
// zeroed), host memory.
void nvfp4_quantize(const uint16_t* y, int rows, int cols, float global_scale, uint8_t* a, uint8_t* a_sf,
                    ScaleLayout layout = ScaleLayout::linear);

// Where the GPU may differ from this reference (its rcp.approx against exact
// division moves a value across a rounding boundary): the distance of |p| to
// the nearest E2M1 rounding threshold, and of |v| to the nearest E4M3
// rounding midpoint, each relative to it.
double e2m1_threshold_distance(float p);
double e4m3_midpoint_distance(float v);

}  // namespace reference

// ---- 3. the stock quantize kernel ------------------------------------------------

// a[rows, cols/2] u8 and a_sf (E4M3 bytes, nvfp4_scale_rows x
// nvfp4_scale_cols in `layout`, the swizzled layout's padding written zero)
// from y[rows, cols] BF16, with the global scale read from global_scale
// (device, FP32 [1]).
// Requirements (InvalidArgument, nothing launched): cols > 0, cols % 16 == 0,
// 1 <= rows <= 65535 (the grid's y); y, a 16-byte aligned, a_sf and
// global_scale 4-byte aligned, all non-null device pointers of the current
// device, of compute capability 9.0+ (RuntimeError below); the outputs may
// overlap neither y nor each other. One thread per block of 16, grid (ceil(cols/16 / 128), rows).
// May not allocate or synchronise; capturable. With enable_pdl the kernel
// waits (griddepcontrol.wait) before reading y and global_scale.
void nvfp4_quantize(const void* y, const float* global_scale, void* a, void* a_sf, int rows,
                    int cols, cudaStream_t stream, bool enable_pdl = true,
                    ScaleLayout layout = ScaleLayout::linear);
// The same on views: y BF16 [rows, cols], global_scale F32 [1], a U8
// [rows, cols / 2], a_sf U8 or E4M3 [nvfp4_scale_rows, nvfp4_scale_cols],
// contiguous, one device.
void nvfp4_quantize(const TensorRef& y, const TensorRef& global_scale, const TensorRef& a,
                    const TensorRef& a_sf, cudaStream_t stream, bool enable_pdl = true,
                    ScaleLayout layout = ScaleLayout::linear);

}  // namespace spark_decode
