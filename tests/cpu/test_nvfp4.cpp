// NVFP4 on the CPU: the E2M1 and E4M3 conversions against CUDA's own host
// conversion functions (cuda_fp4.h, cuda_fp8.h) over every float32 bit
// pattern, and the reference quantizer on blocks whose bytes were worked
// out by hand (the expected bytes below come from the docs/design.md, "Exact semantics" formula
// evaluated on paper, not from the code).
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "spark_decode/bf16.h"
#include "kernels/nvfp4/scale_layout.h"
#include "spark_decode/nvfp4.h"

namespace sd = spark_decode;

namespace {

uint8_t cuda_e4m3(float f) { return __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3); }
uint8_t cuda_e2m1(float f) { return __nv_cvt_float_to_fp4(f, __NV_E2M1, cudaRoundNearest); }

float half_raw_to_float(__half_raw h) { return __half2float(__half(h)); }

// Runs check(bits) for every uint32 over the machine's threads (at least 2);
// returns the mismatch count and the first mismatching input.
struct Sweep {
  uint64_t mismatches = 0;
  uint32_t first = 0;
};
Sweep every_float(const std::function<bool(uint32_t)>& same) {
  const unsigned threads = std::max(2u, std::thread::hardware_concurrency());
  std::atomic<uint64_t> bad_total{0};
  std::atomic<uint32_t> first{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      const uint64_t begin = (uint64_t{1} << 32) * t / threads;
      const uint64_t end = (uint64_t{1} << 32) * (t + 1) / threads;
      uint64_t bad = 0;
      for (uint64_t i = begin; i < end; ++i)
        if (!same(static_cast<uint32_t>(i)) && bad++ == 0) first = static_cast<uint32_t>(i);
      bad_total += bad;
    });
  for (auto& th : pool) th.join();
  return {bad_total.load(), first.load()};
}

}  // namespace

TEST(Nvfp4Cpu, E4m3MatchesCudaForEveryFloat) {
  const Sweep s = every_float([](uint32_t bits) {
    const float f = sd::bits_to_float(bits);
    return sd::e4m3_rn_satfinite(f) == cuda_e4m3(f);
  });
  EXPECT_EQ(s.mismatches, 0u) << "first mismatch at float bits 0x" << std::hex << s.first << ": ours 0x"
                              << int(sd::e4m3_rn_satfinite(sd::bits_to_float(s.first))) << " cuda 0x"
                              << int(cuda_e4m3(sd::bits_to_float(s.first)));
}

TEST(Nvfp4Cpu, E2m1MatchesCudaForEveryFloat) {
  const Sweep s = every_float([](uint32_t bits) {
    const float f = sd::bits_to_float(bits);
    return sd::e2m1_rn_satfinite(f) == cuda_e2m1(f);
  });
  EXPECT_EQ(s.mismatches, 0u) << "first mismatch at float bits 0x" << std::hex << s.first << ": ours 0x"
                              << int(sd::e2m1_rn_satfinite(sd::bits_to_float(s.first))) << " cuda 0x"
                              << int(cuda_e2m1(sd::bits_to_float(s.first)));
}

TEST(Nvfp4Cpu, DecodesMatchCudaForEveryCode) {
  for (int v = 0; v < 256; ++v) {
    const float want = half_raw_to_float(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3));
    const float got = sd::e4m3_to_float(static_cast<uint8_t>(v));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "e4m3 0x" << std::hex << v;
    } else {
      EXPECT_EQ(sd::float_to_bits(got), sd::float_to_bits(want)) << "e4m3 0x" << std::hex << v;
    }
  }
  for (int c = 0; c < 16; ++c) {
    const float want = half_raw_to_float(__nv_cvt_fp4_to_halfraw(static_cast<__nv_fp4_storage_t>(c), __NV_E2M1));
    EXPECT_EQ(sd::float_to_bits(sd::e2m1_to_float(static_cast<uint8_t>(c))), sd::float_to_bits(want))
        << "e2m1 code " << c;
  }
}

TEST(Nvfp4Cpu, ConversionLandmarks) {
  // Hand-picked values, so that a shared misunderstanding of ours and the
  // host library's would still be caught on the values that matter.
  EXPECT_EQ(sd::e4m3_rn_satfinite(448.0f), 0x7e);
  EXPECT_EQ(sd::e4m3_rn_satfinite(464.0f), 0x7e);        // tie -> even (448)
  EXPECT_EQ(sd::e4m3_rn_satfinite(1e9f), 0x7e);          // saturate
  EXPECT_EQ(sd::e4m3_rn_satfinite(-INFINITY), 0xfe);
  EXPECT_EQ(sd::e4m3_rn_satfinite(1.0f), 0x38);
  EXPECT_EQ(sd::e4m3_rn_satfinite(0x1p-9f), 0x01);       // smallest subnormal
  EXPECT_EQ(sd::e4m3_rn_satfinite(0x1p-10f), 0x00);      // tie -> 0
  EXPECT_EQ(sd::e4m3_rn_satfinite(-0.0f), 0x80);
  EXPECT_EQ(sd::e4m3_rn_satfinite(1.0f / 6.0f), 0x23);   // 0.1666 -> 1.375 * 2^-3
  EXPECT_EQ(sd::e2m1_rn_satfinite(0.25f), 0x0);
  EXPECT_EQ(sd::e2m1_rn_satfinite(0.75f), 0x2);
  EXPECT_EQ(sd::e2m1_rn_satfinite(5.0f), 0x6);
  EXPECT_EQ(sd::e2m1_rn_satfinite(5.0001f), 0x7);
  EXPECT_EQ(sd::e2m1_rn_satfinite(-0.1f), 0x8);
  EXPECT_EQ(sd::e2m1_rn_satfinite(INFINITY), 0x7);
  EXPECT_EQ(sd::e2m1_rn_satfinite(NAN), 0x7);
}

namespace {

struct Block {
  float y[16];
  uint8_t packed[8];
  uint8_t sf;
};

Block quantize(std::initializer_list<float> values, float gs) {
  Block b{};
  int i = 0;
  for (float v : values) b.y[i++] = v;
  EXPECT_EQ(i, 16);
  // Every input must be a BF16 value (the quantizer's inputs are).
  for (float v : b.y) EXPECT_EQ(sd::bf16_to_float(sd::float_to_bf16_rne(v)), v) << v;
  b.sf = sd::reference::nvfp4_quantize_block(b.y, gs, b.packed);
  return b;
}

void expect_bytes(const Block& b, uint8_t sf, std::initializer_list<uint8_t> packed) {
  EXPECT_EQ(b.sf, sf);
  int j = 0;
  for (uint8_t p : packed) {
    EXPECT_EQ(b.packed[j], p) << "byte " << j;
    ++j;
  }
}

}  // namespace

TEST(Nvfp4Reference, AllZeroBlock) {
  // vmax 0 -> sf 0 -> out_scale 0 -> every code 0 (+0.0 * 0 = +0).
  const Block b = quantize({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 1.0f);
  expect_bytes(b, 0x00, {0, 0, 0, 0, 0, 0, 0, 0});
  // -0.0 * 0 = -0.0, whose E2M1 code keeps the sign: 0x8.
  const Block n = quantize({-0.0f, 0, -0.0f, -0.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -0.0f}, 1.0f);
  expect_bytes(n, 0x00, {0x08, 0x88, 0, 0, 0, 0, 0, 0x80});
}

TEST(Nvfp4Reference, AllEqualBlock) {
  // vmax = 1: sf_value = 1 * (1 * 1/6) = 0.16667 -> E4M3 1.375 * 2^-3 =
  // 0.171875 (0x23); out_scale = 1 / 0.171875 = 5.818; 1 * 5.818 -> 6
  // (code 7).
  const Block b = quantize({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 1.0f);
  expect_bytes(b, 0x23, {0x77, 0x77, 0x77, 0x77, 0x77, 0x77, 0x77, 0x77});
  // All -2: vmax 2, sf_value 0.3333 = 1.333 * 2^-2 -> 1.375 * 2^-2 (0x2b),
  // out_scale 2.909; -2 * 2.909 = -5.82 -> -6 (code 0xf).
  const Block m = quantize({-2, -2, -2, -2, -2, -2, -2, -2, -2, -2, -2, -2, -2, -2, -2, -2}, 1.0f);
  expect_bytes(m, 0x2b, {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff});
}

TEST(Nvfp4Reference, OneOutlier) {
  // vmax 100: sf_value 16.67 -> E4M3 16 (0x58); out_scale 1/16: 100/16 =
  // 6.25 -> 6 (code 7), 1/16 = 0.0625 -> 0.
  const Block b = quantize({100, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 1.0f);
  expect_bytes(b, 0x58, {0x07, 0, 0, 0, 0, 0, 0, 0});
  // The outlier last and negative: -100 -> code 0xf in the high nibble of byte 7.
  const Block c = quantize({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -100}, 1.0f);
  expect_bytes(c, 0x58, {0, 0, 0, 0, 0, 0, 0, 0xf0});
}

TEST(Nvfp4Reference, E2m1RoundingTies) {
  // vmax 6 and gs 1: sf_value = 6 * fl(1/6) = fl(1.0000000298) = 1 (0x38),
  // out_scale = 1 / (1 * 1) = 1, so codes are e2m1(y) directly. Every
  // midpoint goes to the even code: 0.25 -> 0, 0.75 -> 1.0 (2), 1.25 -> 1.0
  // (2), 1.75 -> 2.0 (4), 2.5 -> 2.0 (4), 3.5 -> 4.0 (6), 5 -> 4.0 (6);
  // byte j = code(2j) | code(2j + 1) << 4, negatives with bit 3 set.
  const Block b = quantize({6, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -0.25f, -0.75f, -1.25f, -1.75f,
                            -2.5f, -3.5f, -5, 0.5f},
                           1.0f);
  expect_bytes(b, 0x38, {0x07, 0x22, 0x44, 0x66, 0xa8, 0xca, 0xec, 0x1e});
}

TEST(Nvfp4Reference, Saturation) {
  // gs 2^20 with vmax 6: sf_value 2^20 saturates to 448 (0x7e); out_scale =
  // 1 / (448 * 2^-20) = 2340.6: every nonzero code saturates at 6 (7), and
  // 2^-12 * 2340.6 = 0.571 -> 0.5 (1).
  const Block b = quantize({6, 1, -1, 0x1p-12f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -6}, 0x1p20f);
  expect_bytes(b, 0x7e, {0x77, 0x1f, 0, 0, 0, 0, 0, 0xf0});
}

TEST(Nvfp4Reference, TinyAndHugeGlobalScales) {
  // gs 2^10, values 2^-10 * {6, ties}: sf_value = 2^10 * (6 2^-10 * fl(1/6))
  // = 1 exactly (powers of two scale exactly) -> 0x38, out_scale =
  // 1 / (1 * 2^-10) = 2^10: the codes of the tie test.
  const float s = 0x1p-10f;
  const Block h = quantize({6 * s, 0.25f * s, 0.75f * s, 1.25f * s, 1.75f * s, 2.5f * s, 3.5f * s, 5 * s,
                            -0.25f * s, -0.75f * s, -1.25f * s, -1.75f * s, -2.5f * s, -3.5f * s, -5 * s,
                            0.5f * s},
                           0x1p10f);
  expect_bytes(h, 0x38, {0x07, 0x22, 0x44, 0x66, 0xa8, 0xca, 0xec, 0x1e});
  // gs 2^-10, values 2^10 * {...}: the same by symmetry.
  const float t = 0x1p10f;
  const Block l = quantize({6 * t, 0.25f * t, 0.75f * t, 1.25f * t, 1.75f * t, 2.5f * t, 3.5f * t, 5 * t,
                            -0.25f * t, -0.75f * t, -1.25f * t, -1.75f * t, -2.5f * t, -3.5f * t, -5 * t,
                            0.5f * t},
                           0x1p-10f);
  expect_bytes(l, 0x38, {0x07, 0x22, 0x44, 0x66, 0xa8, 0xca, 0xec, 0x1e});
  // gs 2^-30 with vmax 6: sf_value 2^-30 is below half the smallest E4M3
  // subnormal (2^-10): sf 0, out_scale 0, every code a signed zero.
  const Block z = quantize({6, 1, -1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -6}, 0x1p-30f);
  expect_bytes(z, 0x00, {0x00, 0x08, 0, 0, 0, 0, 0, 0x80});
}

TEST(Nvfp4Reference, RowsUseLinearLayout) {
  // Two rows of two blocks each; block (r, b) is all equal to a value whose
  // expected sf and code are known from the tests above.
  const float vals[2][2] = {{1.0f, -2.0f}, {0.0f, 1.0f}};
  std::vector<uint16_t> y(2 * 32);
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 32; ++c) y[r * 32 + c] = sd::float_to_bf16_rne(vals[r][c / 16]);
  std::vector<uint8_t> a(2 * 16, 0xcc), sf(2 * 2, 0xcc);
  sd::reference::nvfp4_quantize(y.data(), 2, 32, 1.0f, a.data(), sf.data());
  const uint8_t want_sf[4] = {0x23, 0x2b, 0x00, 0x23};
  const uint8_t want_code[4] = {0x77, 0xff, 0x00, 0x77};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(sf[i], want_sf[i]) << i;
  for (int i = 0; i < 32; ++i) EXPECT_EQ(a[i], want_code[i / 8]) << i;
}

// The swizzled 128x4 scale layout (spark_decode/nvfp4.h): hand-worked
// offsets, then every (row, column) of a few shapes mapped to a distinct
// byte inside the padded buffer (a brute-force inverse), padding zeroed by
// the reference quantizer.
TEST(Nvfp4ScaleLayout, SwizzledOffsetsByHand) {
  using sd::ScaleLayout;
  const int cols = 4096;  // 256 scale columns: 64 tiles of 4 per 128-row band
  EXPECT_EQ(sd::nvfp4_scale_rows(1, ScaleLayout::swizzled), 128);
  EXPECT_EQ(sd::nvfp4_scale_rows(129, ScaleLayout::swizzled), 256);
  EXPECT_EQ(sd::nvfp4_scale_cols(cols, ScaleLayout::swizzled), 256);
  EXPECT_EQ(sd::nvfp4_scale_cols(16 * 5, ScaleLayout::swizzled), 8);  // 5 scale columns pad to 8
  EXPECT_EQ(sd::nvfp4_scale_rows(7, ScaleLayout::linear), 7);
  EXPECT_EQ(sd::nvfp4_scale_cols(cols, ScaleLayout::linear), 256);
  // Row 0: columns 0..3 are the tile's first 4 bytes, column 4 the next tile.
  EXPECT_EQ(sd::nvfp4_scale_offset(0, 0, cols, ScaleLayout::swizzled), 0);
  EXPECT_EQ(sd::nvfp4_scale_offset(0, 3, cols, ScaleLayout::swizzled), 3);
  EXPECT_EQ(sd::nvfp4_scale_offset(0, 4, cols, ScaleLayout::swizzled), 512);
  // Rows 0..31 are 16 bytes apart; row 32 starts the second group of 4
  // bytes in the same 16; row 127 the last group of row 31's 16.
  EXPECT_EQ(sd::nvfp4_scale_offset(1, 0, cols, ScaleLayout::swizzled), 16);
  EXPECT_EQ(sd::nvfp4_scale_offset(31, 0, cols, ScaleLayout::swizzled), 496);
  EXPECT_EQ(sd::nvfp4_scale_offset(32, 0, cols, ScaleLayout::swizzled), 4);
  EXPECT_EQ(sd::nvfp4_scale_offset(127, 3, cols, ScaleLayout::swizzled), 31 * 16 + 3 * 4 + 3);
  // Row 128: the next band, after 64 tiles of 512 bytes.
  EXPECT_EQ(sd::nvfp4_scale_offset(128, 0, cols, ScaleLayout::swizzled), 64 * 512);
  EXPECT_EQ(sd::nvfp4_scale_offset(130, 9, cols, ScaleLayout::swizzled), 64 * 512 + 2 * 512 + 2 * 16 + 1);
  EXPECT_EQ(sd::nvfp4_scale_offset(5, 7, cols, ScaleLayout::linear), 5 * 256 + 7);
}

TEST(Nvfp4ScaleLayout, SwizzledIsABijectionOntoThePaddedBuffer) {
  using sd::ScaleLayout;
  for (auto [rows, cols] : {std::pair{1, 512}, {16, 4096}, {129, 16 * 5}, {300, 16 * 12}}) {
    const int pr = sd::nvfp4_scale_rows(rows, ScaleLayout::swizzled), pc = sd::nvfp4_scale_cols(cols, ScaleLayout::swizzled);
    std::vector<int> owner(size_t(pr) * pc, -1);
    // Every padded (row, column), including the padding, lands on its own byte.
    for (int r = 0; r < pr; ++r)
      for (int c = 0; c < pc; ++c) {
        const int64_t o = sd::nvfp4_layout::swizzled_offset(r, c, cols / 16);
        ASSERT_GE(o, 0);
        ASSERT_LT(o, int64_t(owner.size())) << rows << "x" << cols << " r " << r << " c " << c;
        ASSERT_EQ(owner[o], -1) << rows << "x" << cols << " r " << r << " c " << c << " collides";
        owner[o] = r * pc + c;
      }
    for (int v : owner) ASSERT_NE(v, -1);
  }
}

TEST(Nvfp4ScaleLayout, ReferenceQuantizerWritesEachLayoutAndZeroPadding) {
  const int rows = 3, cols = 16 * 5;
  std::vector<uint16_t> y(size_t(rows) * cols);
  for (size_t i = 0; i < y.size(); ++i) y[i] = sd::float_to_bf16_rne(0.25f * float(int(i % 23) - 11));
  std::vector<uint8_t> a1(rows * cols / 2), s1(rows * cols / 16), a2(a1.size());
  std::vector<uint8_t> s2(size_t(sd::nvfp4_scale_rows(rows, sd::ScaleLayout::swizzled)) *
                              sd::nvfp4_scale_cols(cols, sd::ScaleLayout::swizzled),
                          0xcd);
  sd::reference::nvfp4_quantize(y.data(), rows, cols, 4.0f, a1.data(), s1.data());
  sd::reference::nvfp4_quantize(y.data(), rows, cols, 4.0f, a2.data(), s2.data(), sd::ScaleLayout::swizzled);
  EXPECT_EQ(a1, a2);  // the codes do not depend on the scale layout
  int nonzero = 0;
  for (int r = 0; r < sd::nvfp4_scale_rows(rows, sd::ScaleLayout::swizzled); ++r)
    for (int c = 0; c < sd::nvfp4_scale_cols(cols, sd::ScaleLayout::swizzled); ++c) {
      const uint8_t got = s2[sd::nvfp4_layout::swizzled_offset(r, c, cols / 16)];
      if (r < rows && c < cols / 16) {
        EXPECT_EQ(got, s1[r * (cols / 16) + c]) << r << " " << c;
        nonzero += got != 0;
      } else {
        EXPECT_EQ(got, 0) << "padding " << r << " " << c;
      }
    }
  EXPECT_GT(nonzero, 0);
}
