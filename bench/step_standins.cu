// The step's stand-in kernels (bench/step_standins.h says what they compute
// and cost).
#include "step_standins.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/common/launch.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/nvfp4/scale_layout.h"
#include "spark_decode/error.h"

namespace spark_decode::bench::standins {
namespace {

constexpr int kFormatBf16 = 0, kFormatNvfp4 = 1, kFormatNvfp4Swizzled = 2;

__device__ __forceinline__ float e2m1_value(uint32_t code) {
  const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = magnitude[code & 7];
  return (code & 8) ? -m : m;
}

// An E4M3 byte as float, exactly (the scales are never NaN: the quantizer
// saturates).
__device__ __forceinline__ float e4m3_value(uint32_t v) {
  const uint32_t e = (v >> 3) & 0xf, m = v & 7;
  const float mag = e == 0 ? float(m) * 0x1p-9f : __uint_as_float(((e + 120) << 23) | (m << 20));
  return (v & 0x80) ? -mag : mag;
}

// +0.0f added with its own rounding (never contracted or dropped): -0.0
// becomes +0.0, everything else is unchanged.
__device__ __forceinline__ float drop_zero_sign(float x) { return __fadd_rn(x, 0.0f); }

// Grid (b), P / 16 threads: thread t owns columns [16t, 16t + 16) of row
// blockIdx.x, one NVFP4 block.
template <int FORMAT>
__global__ void experts_kernel(const void* normed, const uint8_t* a, const uint8_t* a_sf, const float* global_scale,
                               __nv_bfloat16* m, int pooled, bool launch_next_early) {
  if (launch_next_early) ptx::griddep_launch_dependents();
  ptx::griddep_wait();
  const int row = blockIdx.x, blk = threadIdx.x;
  float v[16];
  if constexpr (FORMAT == kFormatBf16) {
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(normed) +
                                                      size_t(row) * pooled + 16 * blk);
    for (int h = 0; h < 2; ++h) {
      const uint4 q = src[h];
      const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&q);
      for (int i = 0; i < 8; ++i) v[8 * h + i] = __bfloat162float(e[i]);
    }
  } else {
    const int scale_cols = pooled / 16;
    const int64_t sf_at = FORMAT == kFormatNvfp4 ? int64_t(row) * scale_cols + blk
                                                 : nvfp4_layout::swizzled_offset(row, blk, scale_cols);
    // Dequantization as the experts' GEMM sees it: code value x (block scale
    // / global scale), each step rounded on its own.
    const float scale = __fdiv_rn(e4m3_value(a_sf[sf_at]), *global_scale);
    const uint2 codes = *reinterpret_cast<const uint2*>(a + size_t(row) * (pooled / 2) + 8 * blk);
    for (int i = 0; i < 16; ++i) {
      const uint32_t word = i < 8 ? codes.x : codes.y;
      v[i] = __fmul_rn(e2m1_value((word >> (4 * (i % 8))) & 0xf), scale);
    }
  }
  __align__(16) __nv_bfloat16 out[16];
  for (int i = 0; i < 16; ++i) out[i] = __float2bfloat16_rn(drop_zero_sign(v[i]));
  uint4* dst = reinterpret_cast<uint4*>(m + size_t(row) * pooled + 16 * blk);
  dst[0] = reinterpret_cast<const uint4*>(out)[0];
  dst[1] = reinterpret_cast<const uint4*>(out)[1];
}

// Grid (b, ceil(H / 8 / 256)), 256 threads, 8 columns each.
__global__ void residual_kernel(const __nv_bfloat16* h, const __nv_bfloat16* update, __nv_bfloat16* out, int hidden,
                                bool launch_next_early) {
  if (launch_next_early) ptx::griddep_launch_dependents();
  ptx::griddep_wait();
  const int col = 8 * (blockIdx.y * blockDim.x + threadIdx.x);
  if (col >= hidden) return;
  const size_t at = size_t(blockIdx.x) * hidden + col;
  const uint4 hq = *reinterpret_cast<const uint4*>(h + at), uq = *reinterpret_cast<const uint4*>(update + at);
  const __nv_bfloat16* he = reinterpret_cast<const __nv_bfloat16*>(&hq);
  const __nv_bfloat16* ue = reinterpret_cast<const __nv_bfloat16*>(&uq);
  __align__(16) __nv_bfloat16 o[8];
  for (int i = 0; i < 8; ++i)
    o[i] = __float2bfloat16_rn(drop_zero_sign(__fadd_rn(__bfloat162float(he[i]), __bfloat162float(ue[i]))));
  *reinterpret_cast<uint4*>(out + at) = *reinterpret_cast<const uint4*>(o);
}

__global__ void count_kernel(const uint16_t* a, const uint16_t* b, int64_t n, unsigned long long* counter) {
  unsigned long long differ = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    differ += a[i] != b[i];
  if (differ) atomicAdd(counter, differ);
}

template <int FORMAT>
void launch_experts(const ExpertInput& in, void* m, int b, int pooled, bool enable_pdl, bool early,
                    cudaStream_t stream) {
  kernels::LaunchShape shape;
  shape.grid = dim3(b);
  shape.block = dim3(pooled / 16);
  shape.enable_pdl = enable_pdl;
  kernels::launch(experts_kernel<FORMAT>, shape, stream, in.normed, static_cast<const uint8_t*>(in.a),
                  static_cast<const uint8_t*>(in.a_sf), in.global_scale, static_cast<__nv_bfloat16*>(m), pooled,
                  early);
}

bool aligned16(const void* p) { return p && reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void experts(const ExpertInput& in, void* m, int b, int pooled, bool enable_pdl, bool launch_next_early,
             cudaStream_t stream) {
  SPARK_CHECK(b >= 1 && pooled % 512 == 0 && pooled <= 16384 && aligned16(m), "experts stand-in: b = ", b, ", P = ",
              pooled, " (P % 512 == 0, at most 16384; m 16-byte aligned)");
  switch (in.format) {
    case OutputFormat::bf16:
      SPARK_CHECK(aligned16(in.normed), "experts stand-in: normed must be 16-byte aligned");
      return launch_experts<kFormatBf16>(in, m, b, pooled, enable_pdl, launch_next_early, stream);
    case OutputFormat::nvfp4:
    case OutputFormat::nvfp4_swizzled:
      SPARK_CHECK(aligned16(in.a) && in.a_sf && in.global_scale, "experts stand-in: a (16-byte aligned), a_sf and the "
                  "global scale are needed for ", format_name(in.format));
      if (in.format == OutputFormat::nvfp4)
        return launch_experts<kFormatNvfp4>(in, m, b, pooled, enable_pdl, launch_next_early, stream);
      return launch_experts<kFormatNvfp4Swizzled>(in, m, b, pooled, enable_pdl, launch_next_early, stream);
  }
}

void residual(const void* h, const void* update, void* out, int b, int hidden, bool enable_pdl,
              bool launch_next_early, cudaStream_t stream) {
  SPARK_CHECK(b >= 1 && b <= 65535 && hidden % 8 == 0 && aligned16(h) && aligned16(update) && aligned16(out),
              "residual stand-in: b = ", b, ", H = ", hidden, " (H % 8 == 0, 16-byte aligned pointers)");
  kernels::LaunchShape shape;
  shape.block = dim3(256);
  shape.grid = dim3(b, (hidden / 8 + 255) / 256);
  shape.enable_pdl = enable_pdl;
  kernels::launch(residual_kernel, shape, stream, static_cast<const __nv_bfloat16*>(h),
                  static_cast<const __nv_bfloat16*>(update), static_cast<__nv_bfloat16*>(out), hidden,
                  launch_next_early);
}

void count_mismatches(const void* a, const void* b, int64_t n, unsigned long long* counter, cudaStream_t stream) {
  count_kernel<<<128, 256, 0, stream>>>(static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), n, counter);
  SPARK_CHECK_LAUNCH();
}

void load() {
  cudaFuncAttributes attrs;
  CUDA_CHECK(cudaFuncGetAttributes(&attrs, experts_kernel<kFormatBf16>));
  CUDA_CHECK(cudaFuncGetAttributes(&attrs, experts_kernel<kFormatNvfp4>));
  CUDA_CHECK(cudaFuncGetAttributes(&attrs, experts_kernel<kFormatNvfp4Swizzled>));
  CUDA_CHECK(cudaFuncGetAttributes(&attrs, residual_kernel));
  CUDA_CHECK(cudaFuncGetAttributes(&attrs, count_kernel));
}

}  // namespace spark_decode::bench::standins
