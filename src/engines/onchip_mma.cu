// The on-chip MMA engine: kernel selection, preparation and launch.
#include "engines/onchip_mma.h"

#include <algorithm>

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

OnchipMma::OnchipMma(const void* weight, int n, int k, int device,
                     const std::array<OnchipTactic, kMaxBatch>& tactic_of, bool enable_pdl,
                     const std::vector<int>& rows)
    : weight_(weight), n_(n), k_(k), device_(device), enable_pdl_(enable_pdl) {
  for (int m = 1; m <= kMaxBatch; ++m) {
    const OnchipTactic& t = tactic_of[m - 1];
    auto same = std::find_if(launches_.begin(), launches_.end(), [&](const Launch& l) { return l.tactic == t; });
    if (same == launches_.end()) {
      Launch l{t, 0};
      while ((2 << l.stage_shift) <= t.stage_warps_for(k_)) ++l.stage_shift;  // a power of two (checked)
      same = launches_.insert(launches_.end(), l);
    }
    of_[m - 1] = static_cast<int>(same - launches_.begin());
  }
  for (int m : rows) prepare(m);
}

bool OnchipMma::prepared(int m) const {
  const int v = variant_of(m);
  return v >= 0 && launches_[of_[m - 1]].prepared[v];
}

bool OnchipMma::prepared(int tile, int rows) const {
  const int v = variant(tile, rows);
  return v >= 0 && std::any_of(launches_.begin(), launches_.end(), [&](const Launch& l) { return l.prepared[v]; });
}

void OnchipMma::prepare(int m) {
  Launch& l = launches_[of_[m - 1]];
  const OnchipTactic& t = l.tactic;
  const int tile = t.token_tile[m - 1], rows = t.row_tiles[m - 1];
  const int v = variant(tile, rows);
  SPARK_CHECK(v >= 0, "no on-chip MMA kernel for token tile ", tile, " and ", rows,
              " row tiles ((8, 1), (16, 1), (16, 2))");
  if (l.prepared[v]) return;
  const KernelFn fn = kernel_for(t, tile, rows);
  const auto shape = launch_shape(n_, k_, t, tile, rows, enable_pdl_);
  // The cap is per kernel and per device, shared by every user of this
  // kernel: set it to the most any of them may need (the device's opt-in),
  // never to this one's size, which could lower it under another's feet.
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
  SPARK_CHECK_RUNTIME(shape.smem_bytes <= optin, "on-chip MMA tactic ", t.to_string(), " at K=", k_, " needs ",
                      shape.smem_bytes, " bytes of shared memory per block; cuda:", device_, " allows ", optin);
  CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  // can_implement: a cluster of S such CTAs must fit an SM group at all, or
  // one CTA an SM. (Fewer resident than the grid is valid: the grid then runs
  // in waves, and the later CTAs stream nothing before the wait.)
  if (t.splits > 1) {
    SPARK_CHECK_RUNTIME(kernels::max_active_clusters(fn, shape) > 0, "on-chip MMA tactic ", t.to_string(),
                        " with token tile ", tile, " and ", rows,
                        " row tiles: no cluster of this shape fits the device");
  } else {
    SPARK_CHECK_RUNTIME(kernels::max_active_blocks_per_sm(fn, shape) > 0, "on-chip MMA tactic ", t.to_string(),
                        " with token tile ", tile, " and ", rows, " row tiles: no CTA of this shape fits an SM");
  }
  l.prepared[v] = true;
}

void OnchipMma::launch(const void* x, void* out, int m, const MailboxView* publish, int32_t* ticket,
                       cudaStream_t stream) const {
  const Launch& l = launches_[of_[m - 1]];
  const int tile = l.tactic.token_tile[m - 1], rows = l.tactic.row_tiles[m - 1];
  kernels::GemmArgs args{static_cast<const __nv_bfloat16*>(weight_), static_cast<const __nv_bfloat16*>(x),
                         static_cast<__nv_bfloat16*>(out), n_, k_, m,
                         publish ? kernels::mailbox_dev::Publish::into(*publish, ticket, m)
                                 : kernels::mailbox_dev::Publish::none()};
  kernels::launch(kernel_for(l.tactic, tile, rows), launch_shape(n_, k_, l.tactic, tile, rows, enable_pdl_), stream,
                  args, l.stage_shift);
}

}  // namespace spark_decode::engines
