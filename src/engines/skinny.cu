// The skinny GEMM engine: kernel selection and launch.
#include "engines/skinny.h"

#include "cuda_utils.h"
#include "kernels/common/launch.cuh"
#include "kernels/gemm/skinny.cuh"
#include "spark_decode/error.h"

namespace spark_decode::engines {
namespace {

using SkinnyFn = void (*)(kernels::GemmArgs);

int row_tile(int m) { return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : m <= 8 ? 8 : 16; }

template <int B, int O, int U>
SkinnyFn pick_tile(int tile) {
  switch (tile) {
    case 1: return kernels::skinny_gemm_kernel<B, O, U, 1>;
    case 2: return kernels::skinny_gemm_kernel<B, O, U, 2>;
    case 4: return kernels::skinny_gemm_kernel<B, O, U, 4>;
    case 8: return kernels::skinny_gemm_kernel<B, O, U, 8>;
    default: return kernels::skinny_gemm_kernel<B, O, U, 16>;
  }
}

// The compiled shape: keep in step with pooler_gemm_shapes().
SkinnyFn skinny_kernel(const PoolerGemmShape& s, int m) {
  if (s == PoolerGemmShape{512, 4, 2}) return pick_tile<512, 4, 2>(row_tile(m));
  return nullptr;
}

}  // namespace

void prepare_skinny(const PoolerGemmShape& shape, int m) {
  cudaFuncAttributes attrs;
  CUDA_CHECK(cudaFuncGetAttributes(&attrs, skinny_kernel(shape, m)));
}

void launch_skinny(const PoolerGemmShape& s, const void* w, const void* x, void* out, int n, int k, int m,
                   bool enable_pdl, const MailboxView* publish, cudaStream_t stream) {
  kernels::GemmArgs args{static_cast<const __nv_bfloat16*>(w), static_cast<const __nv_bfloat16*>(x),
                         static_cast<__nv_bfloat16*>(out), n, k, m,
                         publish ? kernels::mailbox_dev::Publish::into(*publish, nullptr, m) : kernels::mailbox_dev::Publish::none()};
  kernels::LaunchShape shape;
  shape.grid = dim3(n / s.outputs_per_block);
  shape.block = dim3(s.block_size);
  shape.enable_pdl = enable_pdl;
  kernels::launch(skinny_kernel(s, m), shape, stream, args);
}

}  // namespace spark_decode::engines
