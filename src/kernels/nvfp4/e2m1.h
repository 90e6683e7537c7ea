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
// 4, 6 are codes 0..7, so the code is the number of rounding thresholds
// (midpoints of neighbours, exact in float) that |x| passes; a value on a
// threshold goes to the even code: ">" where the lower neighbour is the
// even one (0.25, 1.25, 2.5, 5), ">=" where the upper one is (0.75, 1.75,
// 3.5). Inf saturates to 7; NaN gives +6 (code 0x7), as CUDA's conversion
// does; the sign is kept for values that round to zero.
SPARK_NVFP4_HD uint32_t e2m1_code(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7u;
  float a;
  std::memcpy(&a, &abs, 4);
  const uint32_t code = uint32_t(a > 0.25f) + uint32_t(a >= 0.75f) + uint32_t(a > 1.25f) +
                        uint32_t(a >= 1.75f) + uint32_t(a > 2.5f) + uint32_t(a >= 3.5f) +
                        uint32_t(a > 5.0f);
  return code | ((bits >> 28) & 0x8u);
}

}  // namespace spark_decode::nvfp4_common
