// The CPU reference's BF16 conversions against CUDA's own host conversion
// functions (cuda_bf16.h), over every input.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "spark_decode/bf16.h"

namespace sd = spark_decode;

namespace {

uint16_t cuda_float_to_bf16(float f) {
  const __nv_bfloat16 h = __float2bfloat16_rn(f);
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof bits);
  return bits;
}

}  // namespace

TEST(Bf16, FloatToBf16MatchesCudaForEveryFloat) {
  // 2^32 inputs, split over the machine's cores.
  const unsigned threads = std::max(2u, std::thread::hardware_concurrency());
  std::atomic<uint64_t> mismatches{0};
  std::atomic<uint32_t> first_bad{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const uint64_t begin = (uint64_t{1} << 32) * t / threads;
      const uint64_t end = (uint64_t{1} << 32) * (t + 1) / threads;
      uint64_t bad = 0;
      for (uint64_t i = begin; i < end; ++i) {
        const float f = sd::bits_to_float(static_cast<uint32_t>(i));
        if (sd::float_to_bf16_rne(f) != cuda_float_to_bf16(f)) {
          if (bad++ == 0) first_bad = static_cast<uint32_t>(i);
        }
      }
      mismatches += bad;
    });
  }
  for (auto& th : pool) th.join();
  EXPECT_EQ(mismatches.load(), 0u) << "first mismatch at float bits 0x" << std::hex
                                   << first_bad.load();
}

TEST(Bf16, Bf16ToFloatMatchesCudaForEveryBf16) {
  for (uint32_t i = 0; i < 65536; ++i) {
    __nv_bfloat16_raw raw;
    raw.x = static_cast<unsigned short>(i);
    const float want = __bfloat162float(__nv_bfloat16(raw));
    const float got = sd::bf16_to_float(static_cast<uint16_t>(i));
    ASSERT_EQ(sd::float_to_bits(got), sd::float_to_bits(want)) << "bf16 bits " << i;
  }
}

TEST(Bf16, HandPickedRoundings) {
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even mantissa wins (1.0).
  EXPECT_EQ(sd::float_to_bf16_rne(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3 * 2^-8 is a tie between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up.
  EXPECT_EQ(sd::float_to_bf16_rne(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_EQ(sd::float_to_bf16_rne(-0.0f), sd::kBf16NegativeZero);
  EXPECT_EQ(sd::float_to_bf16_rne(3.4e38f), 0x7f80);  // rounds past the largest BF16
}
