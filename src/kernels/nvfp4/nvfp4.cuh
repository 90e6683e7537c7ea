// NVFP4 (vLLM scaled_fp4_quant, block 16) on the device: its conversion
// helpers with vLLM's PTX semantics, and the one block quantizer that the stock
// quantize kernel and the Pooler's fused consumer both call, so that their
// bytes agree by construction (the GPU tests check it anyway).
//
// Per block of 16 BF16 values y (docs/design.md, "Exact semantics"):
//   vmax      = max |y_i|                                    (exact)
//   sf        = e4m3_rn_satfinite(gs * (vmax * rcp_approx_ftz(6)))
//   out_scale = sf == 0 ? 0 : rcp_approx_ftz(float(sf) * rcp_approx_ftz(gs))
//   code_i    = e2m1_rn_satfinite(y_i * out_scale)
//   byte j    = code(2j) | code(2j + 1) << 4
// Every multiply is a separately rounded mul.rn.f32 (__fmul_rn): nothing may
// be contracted or reassociated, or the bytes would differ from vLLM's.
#pragma once

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/nvfp4/e2m1.h"

namespace spark_decode::kernels::nvfp4 {

inline constexpr int kBlock = 16;

__device__ __forceinline__ float rcp_approx_ftz(float a) { return ptx::rcp_approx_ftz_f32(a); }
__device__ __forceinline__ float fabs_f32(float a) { return ptx::abs_f32(a); }
__device__ __forceinline__ float fmax_f32(float a, float b) { return ptx::max_f32(a, b); }

// Eight floats to eight E2M1 codes packed into a uint32: v0 in bits 0..3,
// v1 in 4..7, ..., v7 in 28..31 (cvt.rn.satfinite.e2m1x2.f32 per pair, the
// odd value in the high nibble).
// On sm_90a, which lacks the instruction, e2m1.h computes the same codes
// (checked against CUDA's own conversion for every float).
__device__ __forceinline__ uint32_t cvt_e2m1x2_f32(float hi, float lo) {
#if SPARK_PTX_HAS_CVT_E2M1
  return ptx::cvt_rn_satfinite_e2m1x2_f32(hi, lo);
#else
  return nvfp4_common::e2m1_code(lo) | nvfp4_common::e2m1_code(hi) << 4;
#endif
}
__device__ __forceinline__ uint32_t cvt_e2m1x8_f32(float v0, float v1, float v2, float v3, float v4,
                                                   float v5, float v6, float v7) {
  return cvt_e2m1x2_f32(v1, v0) | cvt_e2m1x2_f32(v3, v2) << 8 | cvt_e2m1x2_f32(v5, v4) << 16 |
         cvt_e2m1x2_f32(v7, v6) << 24;
}

// Float to E4M3 (cvt.rn.satfinite.e4m3x2.f32 with a zero partner): the byte
// in bits 0..7, bits 8..31 zero.
__device__ __forceinline__ uint32_t cvt_f32_to_e4m3(float a) {
  return ptx::cvt_rn_satfinite_e4m3x2_f32(0.0f, a);
}

// rcp(float(sf) * rcp(global_scale)), 0 when the E4M3 scale is zero; the
// E4M3 byte (bits 0..7 of fp8_val) widened exactly through the hardware
// f16x2 path, as vLLM's quantizer does.
__device__ __forceinline__ float nvfp4_compute_output_scale(uint32_t fp8_val, float global_scale) {
  const float scale = ptx::cvt_f32_f16_lo(ptx::cvt_rn_f16x2_e4m3x2(fp8_val & 0xffffu));
  const float result = rcp_approx_ftz(__fmul_rn(scale, rcp_approx_ftz(global_scale)));
  return scale == 0.0f ? 0.0f : result;
}

// One block: y[16] (BF16 values widened to float) -> packed[2] (16 codes,
// byte j of the block in byte j % 4 of packed[j / 4]) and the E4M3 scale
// byte (returned).
__device__ __forceinline__ uint32_t quantize_block(const float (&y)[kBlock], float global_scale,
                                                   uint32_t (&packed)[2]) {
  // max.f32 returns the other operand of a NaN and is exact, so any order
  // gives the same vmax (the largest non-NaN |y_i|, or 0): a tree, four
  // dependent steps instead of sixteen. Written out level by level: a loop
  // over the levels kept m in local memory.
  static_assert(kBlock == 16, "the max tree has four levels");
  float m[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) m[i] = fmax_f32(fabs_f32(y[i]), fabs_f32(y[i + 8]));
#pragma unroll
  for (int i = 0; i < 4; ++i) m[i] = fmax_f32(m[i], m[i + 4]);
  m[0] = fmax_f32(fmax_f32(m[0], m[2]), fmax_f32(m[1], m[3]));
  const float vmax = fmax_f32(0.0f, m[0]);
  const float sf_value = __fmul_rn(global_scale, __fmul_rn(vmax, rcp_approx_ftz(6.0f)));
  const uint32_t sf = cvt_f32_to_e4m3(sf_value);
  const float out_scale = nvfp4_compute_output_scale(sf, global_scale);
  float s[kBlock];
#pragma unroll
  for (int i = 0; i < kBlock; ++i) s[i] = __fmul_rn(y[i], out_scale);
  packed[0] = cvt_e2m1x8_f32(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]);
  packed[1] = cvt_e2m1x8_f32(s[8], s[9], s[10], s[11], s[12], s[13], s[14], s[15]);
  return sf;
}

// Eight BF16 values (a 16-byte vector) widened to float, in order.
__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float* out) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

}  // namespace spark_decode::kernels::nvfp4
