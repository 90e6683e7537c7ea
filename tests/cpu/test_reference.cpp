// The CPU reference GEMM on cases computed by hand.
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
