// Payloads for checking the mailbox (the tests, `spark-decode verify`): BF16 bit patterns that a float path would
// mangle (-0.0, NaNs with payloads, infinities, subnormals of both signs)
// mixed with random bits. A pure function of (seed, call, source, row, col),
// so every rank of a test computes what every other rank publishes without
// asking the code under test.
#pragma once

#include <cstdint>

namespace spark_decode::reference {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint16_t payload_bits(uint64_t seed, int64_t call, int source, int row, int col) {
  uint64_t h = splitmix64(seed ^ splitmix64(uint64_t(call) * 0x100000001b3ull +
                                            uint64_t(source) * 0x1000193ull));
  h = splitmix64(h ^ (uint64_t(row) << 32) ^ uint64_t(col));
  const uint16_t sign = (h >> 8) & 1 ? 0x8000 : 0;
  const uint16_t mant = uint16_t(1 + (h >> 9) % 127);  // 1..127: never zero
  switch (h % 16) {
    case 0:
    case 1: return 0x8000;               // -0.0: must arrive as +0.0
    case 2: return 0x0000;               // +0.0
    case 3: return sign | 0x7f80 | mant;  // NaN, quiet or signalling, any payload
    case 4: return sign | 0x7f80;         // +-Inf
    case 5:
    case 6: return 0x8000 | mant;         // negative subnormal (FTZ would make it -0.0)
    case 7: return mant;                  // positive subnormal
    default: return uint16_t(h >> 16);    // anything, the sentinel included
  }
}

// What a consumer must read for a published value (docs/design.md, "The Lamport mailbox protocol").
inline uint16_t arrived_bits(uint16_t bits) { return bits == 0x8000 ? 0 : bits; }

}  // namespace spark_decode::reference
