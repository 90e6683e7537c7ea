// The stock path's standalone kernels: pre_expert_norm (ExpertNorm) and the
// NVFP4 quantize kernel (vLLM scaled_fp4_quant semantics, linear or swizzled
// scales).
// Both use the shared device steps (norm/rms.cuh, nvfp4/nvfp4.cuh), which
// the Pooler's fused consumer uses too.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/norm/rms.cuh"
#include "kernels/nvfp4/nvfp4.cuh"
#include "kernels/nvfp4/scale_layout.h"

namespace spark_decode::kernels {

struct ExpertNormArgs {
  const __nv_bfloat16* x;       // [rows, cols]
  const __nv_bfloat16* weight;  // [cols]
  __nv_bfloat16* y;             // [rows, cols]
  int cols;
  float eps, gain_center;
};

// Grid (rows), block cols / 16: thread t normalises columns [16t, 16t + 16)
// of row blockIdx.x.
__global__ void expert_norm_kernel(const ExpertNormArgs a) {
  const int t = threadIdx.x, row = blockIdx.x;
  __shared__ float warp_sums[norm::kMaxWarps];
  // The norm weight is a model parameter no grid writes: read before the wait.
  float w[16], x[16], y[16];
  nvfp4::bf16x8_to_float(ptx::ld_v4(a.weight + 16 * t), w);
  nvfp4::bf16x8_to_float(ptx::ld_v4(a.weight + 16 * t + 8), w + 8);
  // A small kernel between two GEMMs (the Pooler's edge layers): let the next
  // grid launch now and stream its weights while this one waits; it reads
  // nothing of ours before its own griddepcontrol.wait, which returns after
  // this grid completes.
  ptx::griddep_launch_dependents();
  ptx::griddep_wait();
  const __nv_bfloat16* xr = a.x + int64_t(row) * a.cols + 16 * t;
  nvfp4::bf16x8_to_float(ptx::ld_v4(xr), x);
  nvfp4::bf16x8_to_float(ptx::ld_v4(xr + 8), x + 8);
  const float inv = norm::inv_rms(x, a.cols, a.eps, warp_sums);
  uint4 out[2];
  norm::normalize(x, w, inv, a.gain_center, y, out);
  __nv_bfloat16* yr = a.y + int64_t(row) * a.cols + 16 * t;
  ptx::st_v4(yr, out[0]);
  ptx::st_v4(yr + 8, out[1]);
}

struct Nvfp4QuantizeArgs {
  const __nv_bfloat16* y;     // [rows, cols]
  const float* global_scale;  // [1]
  uint8_t* a;                 // [rows, cols / 2]
  uint8_t* a_sf;              // linear [rows, cols / 16]; swizzled [round_up(rows, 128), round_up(cols / 16, 4)]
  int rows, cols;
  int swizzled;               // the scale layout (kernels/nvfp4/scale_layout.h)
};

// Grid (ceil(cols / 16 / blockDim.x), rows; swizzled: round_up(rows, 128)):
// one thread per block of 16; with the swizzled layout the rows past `rows`
// write their scales' zero padding.
__global__ void nvfp4_quantize_kernel(const Nvfp4QuantizeArgs a) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int blocks = a.cols / nvfp4::kBlock;
  const int blk = blockIdx.x * blockDim.x + threadIdx.x, row = blockIdx.y;
  if (a.swizzled) {
    const int scale_cols = nvfp4_layout::swizzled_cols(blocks);
    if (blk >= scale_cols) return;
    if (row >= a.rows || blk >= blocks) {
      a.a_sf[nvfp4_layout::swizzled_offset(row, blk, blocks)] = 0;
      return;
    }
  }
  if (blk >= blocks) return;
  float y[16];
  const __nv_bfloat16* yr = a.y + int64_t(row) * a.cols + 16 * blk;
  nvfp4::bf16x8_to_float(ptx::ld_v4(yr), y);
  nvfp4::bf16x8_to_float(ptx::ld_v4(yr + 8), y + 8);
  uint32_t packed[2];
  const uint32_t sf = nvfp4::quantize_block(y, *a.global_scale, packed);
  *reinterpret_cast<uint2*>(a.a + int64_t(row) * (a.cols / 2) + 8 * blk) = make_uint2(packed[0], packed[1]);
  a.a_sf[a.swizzled ? nvfp4_layout::swizzled_offset(row, blk, blocks) : int64_t(row) * blocks + blk] =
      static_cast<uint8_t>(sf);
}

}  // namespace spark_decode::kernels
