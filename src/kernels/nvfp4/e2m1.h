// Float to E2M1 (round to nearest even, saturating to +-6), written once for
// the host (the CPU reference, src/reference/nvfp4.cpp) and for GPUs without
// the cvt.rn.satfinite.e2m1x2.f32 instruction (sm_90a). Its result is
// CUDA's own: tests/cpu/test_nvfp4.cpp compares it with cuda_fp4.h's host
// conversion (NVIDIA's emulation of the instruction) for every float32 bit
// pattern, so the code the Hopper kernels run is checked exhaustively.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SPARK_NVFP4_HD __host__ __device__ __forceinline__
#else
#define SPARK_NVFP4_HD inline
#endif

namespace spark_decode::nvfp4_common {

// The E2M1 code (sign in bit 3) of x. The magnitudes 0, 0.5, 1, 1.5, 2, 3,
// 4, 6 are codes 0..7: a grid of step 0.5 on [0, 2), 1 on [2, 4) and 2 on
// [4, 6]. Scaled by 2, 1 or 1/2, |x| (saturated to 6) is on a grid of step
// one, and adding 1.5 * 2^23 plus the first code of its range rounds it to
// the nearest integer, ties to even (floats in [2^23, 2^24) are the
// integers; the product is exact, so one rounding, fused or not): the code
// is then the sum's low bits. The ties land where CUDA's conversion puts
// them (0.25, 1.25, 2.5 and 5 down, 0.75, 1.75 and 3.5 up: the even code).
// Inf saturates to 7; NaN gives +6 (code 0x7), as CUDA's conversion does;
// the sign is kept for values that round to zero.
//
// NOTES: no branch and no chain between the 16 values of a block. The
// first form counted the thresholds |x| passes, with an early return for
// NaN; on sm_90a that compiled to a branch region per value and a chain of
// dependent selects, about 30 instructions per value one after the other,
// which was most of the fused consumer's quantizer (docs/perf/consumer.md).
SPARK_NVFP4_HD uint32_t e2m1_code(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint32_t abs = bits & 0x7fffffffu;
  float a;
  std::memcpy(&a, &abs, 4);
  a = a < 6.0f ? a : 6.0f;  // NaN too: replaced below
  const bool low = a < 2.0f, mid = a < 4.0f;
  const float scale = low ? 2.0f : mid ? 1.0f : 0.5f;
  const float first = low ? 12582912.0f : mid ? 12582914.0f : 12582916.0f;  // 1.5 * 2^23 + 0, 2, 4
  const float sum = a * scale + first;
  uint32_t sum_bits;
  std::memcpy(&sum_bits, &sum, 4);
  const uint32_t code = (sum_bits - 0x4B400000u) | ((bits >> 28) & 0x8u);  // 0x4B400000: 1.5 * 2^23
  return abs > 0x7f800000u ? 0x7u : code;
}

}  // namespace spark_decode::nvfp4_common
