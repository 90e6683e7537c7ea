// The on-chip MMA engine: kernel selection, preparation and launch.
#include "engines/onchip_mma.h"

#include "cuda_utils.h"
#include "kernels/common/launch.cuh"
#include "kernels/gemm/onchip_mma.cuh"
#include "spark_decode/error.h"

namespace spark_decode::engines {
namespace {

using KernelFn = void (*)(kernels::GemmArgs, int);

// The compiled variants: kOnchipKws x accs 1..kOnchipMaxAccs x (token tile,
// row tiles) in {(8, 1), (16, 1), (16, 2)} (onchip_unsupported refuses the
// rest).
static_assert(kOnchipKws[0] == 128 && kOnchipKws[1] == 256 && kOnchipMaxAccs == 2 && kOnchipMaxRowTiles == 2,
              "keep the dispatch in step with the compiled on-chip kernels");
template <int KW, int ACCS>
KernelFn pick_tile(int tile, int rows) {
  if (tile == 8) return kernels::onchip_mma_kernel<KW, ACCS, 8, 1>;
  return rows == 1 ? kernels::onchip_mma_kernel<KW, ACCS, 16, 1> : kernels::onchip_mma_kernel<KW, ACCS, 16, 2>;
}
template <int KW>
KernelFn pick_accs(int accs, int tile, int rows) {
  return accs == 1 ? pick_tile<KW, 1>(tile, rows) : pick_tile<KW, 2>(tile, rows);
}
KernelFn kernel_for(const OnchipTactic& t, int tile, int rows) {
  return t.kw == 128 ? pick_accs<128>(t.accs, tile, rows) : pick_accs<256>(t.accs, tile, rows);
}

kernels::LaunchShape launch_shape(int n, int k, const OnchipTactic& t, int tile, int rows, bool pdl) {
  kernels::LaunchShape shape;
  shape.grid = dim3(n / (rows * kSplitKTileN), t.splits);
  shape.block = dim3(32 * t.warps(k));
  shape.smem_bytes = kernels::onchip::smem_bytes(k, t.splits, t.kw, tile, rows);
  shape.cluster_y = t.splits;
  shape.cluster_balance = t.cluster_balance;
  shape.enable_pdl = pdl;
  return shape;
}

}  // namespace

OnchipMma::OnchipMma(const void* weight, int n, int k, int device, const OnchipTactic& tactic, bool enable_pdl,
                     const std::vector<int>& rows)
    : weight_(weight), n_(n), k_(k), device_(device), tactic_(tactic), stage_shift_(0), enable_pdl_(enable_pdl) {
  while ((2 << stage_shift_) <= tactic_.stage_warps_for(k_)) ++stage_shift_;  // a power of two (checked)
  for (int m : rows) prepare(tactic_.token_tile[m - 1], tactic_.row_tiles[m - 1]);
}

void OnchipMma::prepare(int tile, int rows) {
  const int v = variant(tile, rows);
  SPARK_CHECK(v >= 0, "no on-chip MMA kernel for token tile ", tile, " and ", rows,
              " row tiles ((8, 1), (16, 1), (16, 2))");
  if (prepared_[v]) return;
  const KernelFn fn = kernel_for(tactic_, tile, rows);
  const auto shape = launch_shape(n_, k_, tactic_, tile, rows, enable_pdl_);
  // The cap is per kernel and per device, shared by every user of this
  // kernel: set it to the most any of them may need (the device's opt-in),
  // never to this one's size, which could lower it under another's feet.
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
  SPARK_CHECK_RUNTIME(shape.smem_bytes <= optin, "on-chip MMA tactic ", tactic_.to_string(), " at K=", k_, " needs ",
                      shape.smem_bytes, " bytes of shared memory per block; cuda:", device_, " allows ", optin);
  CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  int resident = 0;
  if (tactic_.splits > 1) {
    // can_implement: a cluster of S such CTAs must fit an SM group at all.
    resident = kernels::max_active_clusters(fn, shape) * tactic_.splits;
    SPARK_CHECK_RUNTIME(resident > 0, "on-chip MMA tactic ", tactic_.to_string(), " with token tile ", tile,
                        " and ", rows, " row tiles: no cluster of this shape fits the device");
  } else {
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_));
    resident = kernels::max_active_blocks_per_sm(fn, shape) * sms;
    SPARK_CHECK_RUNTIME(resident > 0, "on-chip MMA tactic ", tactic_.to_string(), " with token tile ", tile,
                        " and ", rows, " row tiles: no CTA of this shape fits an SM");
  }
  resident_[v] = resident;
  prepared_[v] = true;
}

void OnchipMma::launch(const void* x, void* out, int m, const MailboxView* publish, int32_t* ticket,
                       cudaStream_t stream) const {
  const int tile = tactic_.token_tile[m - 1], rows = tactic_.row_tiles[m - 1];
  kernels::GemmArgs args{static_cast<const __nv_bfloat16*>(weight_), static_cast<const __nv_bfloat16*>(x),
                         static_cast<__nv_bfloat16*>(out), n_, k_, m,
                         publish ? kernels::mailbox_dev::Publish::into(*publish, ticket, m)
                                 : kernels::mailbox_dev::Publish::none()};
  kernels::launch(kernel_for(tactic_, tile, rows), launch_shape(n_, k_, tactic_, tile, rows, enable_pdl_), stream,
                  args, stage_shift_);
}

}  // namespace spark_decode::engines
