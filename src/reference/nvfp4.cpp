// The CPU side of NVFP4: conversions and the reference quantizer.
//
// Plain FP32 arithmetic in the order the GPU runs it; this file must not be
// compiled with floating-point contraction (-ffp-contract=fast) or x87
// excess precision: C++20 on x86-64 with GCC/Clang (ISO mode, SSE) has
// neither by default.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/nvfp4/e2m1.h"
#include "spark_decode/bf16.h"
#include "spark_decode/error.h"
#include "spark_decode/nvfp4.h"
#include "kernels/nvfp4/scale_layout.h"

namespace spark_decode {

// The very function the sm_90a kernels run (kernels/nvfp4/e2m1.h).
uint8_t e2m1_rn_satfinite(float x) { return static_cast<uint8_t>(nvfp4_common::e2m1_code(x)); }

float e2m1_to_float(uint8_t code) {
  static const float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMagnitude[code & 7];
  return (code & 8) ? -m : m;
}

uint8_t e4m3_rn_satfinite(float x) {
  const uint32_t bits = float_to_bits(x);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7f;  // NaN (CUDA canonicalises: positive)
  const uint8_t sign = static_cast<uint8_t>((bits >> 31) << 7);
  const float a = bits_to_float(abs);
  uint8_t res;
  if (a <= 0x1p-10f) {
    res = 0;  // at most half the smallest subnormal 2^-9: ties to even (0)
  } else if (a > 464.0f) {
    res = 0x7e;  // past 448 + half an ulp (16): saturate; Inf too
  } else if (a >= 0x1p-6f) {
    // Normal: exponent field e + 7, three mantissa bits rounded to nearest
    // even from float's 23 (a carry rolls into the exponent, as it must;
    // 464 itself rounds to even, down to 448).
    const uint32_t e = (abs >> 23) - 127 + 7;
    const uint32_t m = (abs >> 20) & 7u;
    const uint32_t rest = abs & 0xfffffu;
    uint32_t r = (e << 3) | m;
    if (rest > 0x80000u || (rest == 0x80000u && (m & 1u))) ++r;
    res = static_cast<uint8_t>(r);
  } else {
    // Subnormal: multiples of 2^-9; a * 512 is exact and nearbyint rounds
    // to nearest even in the default rounding mode. 8 is the smallest
    // normal, whose encoding 0x08 the same integer gives.
    res = static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  return static_cast<uint8_t>(res | sign);
}

float e4m3_to_float(uint8_t v) {
  const int e = (v >> 3) & 0xf, m = v & 7;
  float mag;
  if (e == 0xf && m == 7) return std::nanf("");
  if (e == 0)
    mag = std::ldexp(static_cast<float>(m), -9);
  else
    mag = std::ldexp(1.0f + m / 8.0f, e - 7);
  return (v & 0x80) ? -mag : mag;
}

const char* scale_layout_name(ScaleLayout layout) { return layout == ScaleLayout::linear ? "linear" : "swizzled"; }

int nvfp4_scale_rows(int rows, ScaleLayout layout) {
  return layout == ScaleLayout::linear ? rows : nvfp4_layout::swizzled_rows(rows);
}

int nvfp4_scale_cols(int cols, ScaleLayout layout) {
  return layout == ScaleLayout::linear ? cols / kNvfp4Block : nvfp4_layout::swizzled_cols(cols / kNvfp4Block);
}

int64_t nvfp4_scale_offset(int row, int blk, int cols, ScaleLayout layout) {
  const int scale_cols = cols / kNvfp4Block;
  return layout == ScaleLayout::linear ? int64_t(row) * scale_cols + blk
                                       : nvfp4_layout::swizzled_offset(row, blk, scale_cols);
}

namespace reference {

uint8_t nvfp4_quantize_block(const float* y, float global_scale, uint8_t* packed) {
  float vmax = 0.0f;
  for (int i = 0; i < kNvfp4Block; ++i) vmax = std::fmax(vmax, std::fabs(y[i]));
  // GPU: vmax * rcp_approx_ftz(6), then * gs; here the exact reciprocal.
  const float sf_value = global_scale * (vmax * (1.0f / 6.0f));
  const uint8_t sf = e4m3_rn_satfinite(sf_value);
  const float sf_float = e4m3_to_float(sf);
  const float out_scale = sf_float == 0.0f ? 0.0f : 1.0f / (sf_float * (1.0f / global_scale));
  for (int j = 0; j < kNvfp4Block / 2; ++j) {
    const uint8_t lo = e2m1_rn_satfinite(y[2 * j] * out_scale);
    const uint8_t hi = e2m1_rn_satfinite(y[2 * j + 1] * out_scale);
    packed[j] = static_cast<uint8_t>(lo | hi << 4);
  }
  return sf;
}

void nvfp4_quantize(const uint16_t* y, int rows, int cols, float global_scale, uint8_t* a, uint8_t* a_sf,
                    ScaleLayout layout) {
  SPARK_CHECK(rows >= 0 && cols > 0 && cols % kNvfp4Block == 0, "nvfp4 reference: [", rows, ", ",
              cols, "] needs cols % ", kNvfp4Block, " == 0");
  std::fill(a_sf, a_sf + size_t(nvfp4_scale_rows(rows, layout)) * nvfp4_scale_cols(cols, layout), uint8_t(0));
  float block[kNvfp4Block];
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < cols / kNvfp4Block; ++b) {
      for (int i = 0; i < kNvfp4Block; ++i)
        block[i] = bf16_to_float(y[size_t(r) * cols + b * kNvfp4Block + i]);
      a_sf[nvfp4_scale_offset(r, b, cols, layout)] =
          nvfp4_quantize_block(block, global_scale, a + size_t(r) * (cols / 2) + b * 8);
    }
}

double e2m1_threshold_distance(float p) {
  const double a = std::fabs(static_cast<double>(p));
  double best = 1e300;
  for (double t : {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0}) best = std::min(best, std::fabs(a - t) / t);
  return best;
}

double e4m3_midpoint_distance(float v) {
  const double a = std::fabs(static_cast<double>(v));
  double best = 1e300;
  for (int c = 0; c < 0x7e; ++c) {
    const double mid = (e4m3_to_float(uint8_t(c)) + e4m3_to_float(uint8_t(c + 1))) / 2;
    best = std::min(best, std::fabs(a - mid) / mid);
  }
  return best;
}

}  // namespace reference
}  // namespace spark_decode
