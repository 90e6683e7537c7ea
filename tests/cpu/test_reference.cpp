// The CPU references of the GEMM and of pre_expert_norm on cases computed by hand.
#include <gtest/gtest.h>

#include <vector>

#include "spark_decode/bf16.h"
#include "spark_decode/reference.h"

namespace sd = spark_decode;

namespace {
std::vector<uint16_t> bf16(std::initializer_list<float> values) {
  std::vector<uint16_t> out;
  for (float v : values) out.push_back(sd::float_to_bf16_rne(v));
  return out;
}
}  // namespace

TEST(ReferenceGemm, SmallHandComputed) {
  // x [2, 3], w [2, 3]: out = x @ w^T.
  const auto x = bf16({1, 2, 3, -1, 0.5f, 4});
  const auto w = bf16({1, 0, -1, 2, 2, 2});
  std::vector<uint16_t> out(4);
  sd::reference::gemm_bf16(x.data(), w.data(), out.data(), 2, 2, 3);
  EXPECT_EQ(sd::bf16_to_float(out[0]), -2.0f);  // 1 - 3
  EXPECT_EQ(sd::bf16_to_float(out[1]), 12.0f);  // 2 + 4 + 6
  EXPECT_EQ(sd::bf16_to_float(out[2]), -5.0f);  // -1 - 4
  EXPECT_EQ(sd::bf16_to_float(out[3]), 7.0f);   // -2 + 1 + 8
}

TEST(ReferenceGemm, RoundsOnceAtTheEnd) {
  // 256 + 1 + 1 = 258 is exact in FP64 and representable in BF16 (8 bits of
  // mantissa hold 258 = 0b100000010). Summing in BF16 would give 256.
  const auto x = bf16({256, 1, 1});
  const auto w = bf16({1, 1, 1});
  std::vector<uint16_t> out(1);
  std::vector<double> exact, magnitude;
  sd::reference::gemm_bf16(x.data(), w.data(), out.data(), 1, 1, 3, &exact, &magnitude);
  EXPECT_EQ(sd::bf16_to_float(out[0]), 258.0f);
  EXPECT_EQ(exact[0], 258.0);
  EXPECT_EQ(magnitude[0], 258.0);
  // 256 + 1 = 257 is a tie between 256 and 258 in BF16: even (256) wins.
  const auto x2 = bf16({256, 1});
  sd::reference::gemm_bf16(x2.data(), w.data(), out.data(), 1, 1, 2);
  EXPECT_EQ(sd::bf16_to_float(out[0]), 256.0f);
}

TEST(ReferenceGemm, MagnitudeSumsAbsoluteProducts) {
  const auto x = bf16({3, -3});
  const auto w = bf16({1, 1});
  std::vector<uint16_t> out(1);
  std::vector<double> exact, magnitude;
  sd::reference::gemm_bf16(x.data(), w.data(), out.data(), 1, 1, 2, &exact, &magnitude);
  EXPECT_EQ(exact[0], 0.0);
  EXPECT_EQ(magnitude[0], 6.0);
  EXPECT_EQ(out[0], 0x0000);
}

TEST(ReferenceNorm, HandComputedRows) {
  // Row 0: mean(x^2) = 1, eps 0: y = x (w + 1) exactly.
  // Row 1: x = (3, 4, 0, 0): mean(x^2) = 6.25, rsqrt = 0.4: y = (1.2, 1.6, 0, 0) (w + 1) with
  // w + 1 = (1, 1.5, 0, 3): (1.2, 2.4, 0, 0) -> BF16 1.203125 (0x3f9a) and 2.40625 (0x401a),
  // both rounded up (1.2 = 1.0011001 1001..., 2.4 = 10.011001 1001... in binary).
  const auto x = bf16({1, -1, 1, -1, 3, 4, 0, 0});
  const auto w = bf16({0, 0.5f, -1, 2});
  std::vector<uint16_t> y(8);
  std::vector<double> exact;
  sd::reference::expert_norm(x.data(), w.data(), y.data(), 2, 4, 0.0f, 1.0f, &exact);
  EXPECT_EQ(sd::bf16_to_float(y[0]), 1.0f);
  EXPECT_EQ(sd::bf16_to_float(y[1]), -1.5f);
  EXPECT_EQ(y[2], 0x0000);  // 1 * 0: +0
  EXPECT_EQ(sd::bf16_to_float(y[3]), -3.0f);
  EXPECT_EQ(y[4], 0x3f9a);
  EXPECT_EQ(y[5], 0x401a);
  EXPECT_EQ(y[6], 0x0000);
  EXPECT_EQ(y[7], 0x0000);
  EXPECT_NEAR(exact[4], 1.2, 1e-15);
  EXPECT_NEAR(exact[5], 2.4, 1e-15);
}

TEST(ReferenceNorm, EpsAndGainCenter) {
  // x = 0 everywhere: y = 0 whatever eps (> 0); x = (2, 2): mean 4, eps 12:
  // rsqrt(16) = 0.25, y = 0.5 (w + gc) with gc = 0.5: w = (0.5, 1.5) -> (0.5, 1).
  const auto zeros = bf16({0, 0});
  const auto x = bf16({2, 2});
  const auto w = bf16({0.5f, 1.5f});
  std::vector<uint16_t> y(2);
  sd::reference::expert_norm(zeros.data(), w.data(), y.data(), 1, 2, 1e-5f, 1.0f);
  EXPECT_EQ(y[0], 0x0000);
  EXPECT_EQ(y[1], 0x0000);
  sd::reference::expert_norm(x.data(), w.data(), y.data(), 1, 2, 12.0f, 0.5f);
  EXPECT_EQ(sd::bf16_to_float(y[0]), 0.5f);
  EXPECT_EQ(sd::bf16_to_float(y[1]), 1.0f);
}
