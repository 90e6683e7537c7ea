// spark_decode/bf16.h: host-side BF16 conversions (the CPU reference's).
//
// Round to nearest even, as the GPU's cvt.rn.bf16.f32; every NaN becomes the
// canonical 0x7fff, as CUDA's own host conversion does. Checked exhaustively
// against cuda_bf16.h in tests/cpu.
#pragma once

#include <cstdint>
#include <cstring>

namespace spark_decode {

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline uint16_t float_to_bf16_rne(float f) {
  const uint32_t x = float_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  // Adding 0x7fff plus the kept LSB rounds ties to even; it cannot overflow
  // past 0xffffffff because NaNs were handled above.
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// BF16 -0.0: the Lamport mailbox's "not yet written" sentinel.
inline constexpr uint16_t kBf16NegativeZero = 0x8000;

}  // namespace spark_decode
