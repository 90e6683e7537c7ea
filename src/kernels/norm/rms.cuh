// pre_expert_norm on the device: the one definition of the mean(x^2)
// reduction order and of the normalised value, called by the standalone
// norm kernel (ExpertNorm) and the Pooler's fused gather + norm + NVFP4
// consumer. Both therefore compute bit-identical BF16 rows (docs/design.md, "Exact semantics"); no
// other code may compute this norm.
//
//   y = bf16_rn(x * rsqrt(mean(x^2) + eps) * (w + gain_center))
//
// Thread layout (both kernels must launch so): one CTA per row of `cols`
// values, blockDim.x = cols / 16 threads (a multiple of 32, at most 1024),
// thread t owning the 16 consecutive columns [16t, 16t + 16), which are also
// exactly one NVFP4 block.
//
// The reduction order: each thread sums its 16 squares left to right with
// fused multiply-adds; each warp combines its lanes by an XOR butterfly
// (masks 16, 8, 4, 2, 1); the warp sums are added in warp order 0, 1, ...
// by every thread. The order depends on `cols` alone.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace spark_decode::kernels::norm {

inline constexpr int kColsPerThread = 16;
inline constexpr int kMaxWarps = 32;

// Threads of the CTA that normalises a row of `cols` values (0: no launch
// shape; see norm_cols_unsupported on the host).
constexpr int threads_for(int cols) { return cols / kColsPerThread; }

// rsqrt(mean(x^2) + eps) of the CTA's row, x being this thread's 16 values.
// Every thread of the CTA must call it (it synchronises the CTA), once per
// kernel (`warp_sums` is reused without a second barrier).
__device__ __forceinline__ float inv_rms(const float (&x)[kColsPerThread], int cols, float eps,
                                         float (&warp_sums)[kMaxWarps]) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kColsPerThread; ++i) s = __fmaf_rn(x[i], x[i], s);
#pragma unroll
  for (int mask = 16; mask >= 1; mask >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, mask));
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if ((threadIdx.x & 31) == 0) warp_sums[warp] = s;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total = __fadd_rn(total, warp_sums[w]);
  const float mean = __fdiv_rn(total, static_cast<float>(cols));
  return rsqrtf(__fadd_rn(mean, eps));
}

// The normalised values of this thread's 16 columns, rounded to BF16:
// bf16_rn((x * inv) * (w + gain_center)), each operation rounded on its own.
// `y` gets the BF16 values widened back to float (what NVFP4 quantizes),
// `out` the BF16 bits (two 16-byte vectors, column order).
__device__ __forceinline__ void normalize(const float (&x)[kColsPerThread],
                                          const float (&w)[kColsPerThread], float inv,
                                          float gain_center, float (&y)[kColsPerThread],
                                          uint4 (&out)[2]) {
  uint32_t words[8];
#pragma unroll
  for (int i = 0; i < kColsPerThread; i += 2) {
    const float lo = __fmul_rn(__fmul_rn(x[i], inv), __fadd_rn(w[i], gain_center));
    const float hi = __fmul_rn(__fmul_rn(x[i + 1], inv), __fadd_rn(w[i + 1], gain_center));
    const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    uint32_t bits;
    __builtin_memcpy(&bits, &pair, 4);
    words[i / 2] = bits;
    y[i] = __uint_as_float(bits << 16);
    y[i + 1] = __uint_as_float(bits & 0xffff0000u);
  }
  out[0] = make_uint4(words[0], words[1], words[2], words[3]);
  out[1] = make_uint4(words[4], words[5], words[6], words[7]);
}

}  // namespace spark_decode::kernels::norm
