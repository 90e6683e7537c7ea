// The ring MMA engine: preparation and launch.
#include "engines/ring_mma.h"

#include <algorithm>

#include "cuda_utils.h"
#include "kernels/common/launch.cuh"
#include "kernels/gemm/ring_mma.cuh"
#include "spark_decode/error.h"
#include "spark_decode/plan.h"

namespace spark_decode::engines {
namespace {

static_assert(kernels::ring::kRows == kRingRows && kernels::ring::kKMultiple == kRingKMultiple,
              "keep the ring engine's public constants in step with its kernel");

using RingFn = void (*)(kernels::GemmArgs);
int ring_tile(int m) { return m <= 8 ? 8 : 16; }
RingFn ring_kernel(int tile) { return tile == 8 ? kernels::ring_mma_kernel<8> : kernels::ring_mma_kernel<16>; }

}  // namespace

RingMma::RingMma(const void* weight, int n, int k, int device, bool enable_pdl)
    : weight_(weight), n_(n), k_(k), enable_pdl_(enable_pdl) {
  // Its shared memory (the same for every caller of a kernel, so setting it
  // cannot lower another's), one CTA per SM.
  int optin = 0, sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  for (int tile : {8, 16}) {
    const int smem = kernels::ring::smem_bytes(tile);
    SPARK_CHECK_RUNTIME(smem <= optin, "pooler GEMM ring engine: needs ", smem,
                        " bytes of shared memory per block; cuda:", device, " allows ", optin);
    CUDA_CHECK(cudaFuncSetAttribute(ring_kernel(tile), cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  }
  grid_ = std::min(n_ / kRingRows, sms);
}

void RingMma::launch(const void* x, void* out, int m, const MailboxView* publish, cudaStream_t stream) const {
  kernels::GemmArgs args{static_cast<const __nv_bfloat16*>(weight_), static_cast<const __nv_bfloat16*>(x),
                         static_cast<__nv_bfloat16*>(out), n_, k_, m,
                         publish ? kernels::mailbox_dev::Publish::into(*publish, nullptr, m) : kernels::mailbox_dev::Publish::none()};
  const int tile = ring_tile(m);
  kernels::LaunchShape shape;
  shape.grid = dim3(grid_);
  shape.block = dim3(32 * kernels::ring::kWarps);
  shape.smem_bytes = kernels::ring::smem_bytes(tile);
  shape.enable_pdl = enable_pdl_;
  kernels::launch(ring_kernel(tile), shape, stream, args);
}

}  // namespace spark_decode::engines
