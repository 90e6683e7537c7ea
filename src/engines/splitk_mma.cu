// The split-K MMA engine: kernel selection, preparation and launch.
#include "engines/splitk_mma.h"

#include "cuda_utils.h"
#include "kernels/common/launch.cuh"
#include "kernels/gemm/splitk_mma.cuh"
#include "spark_decode/error.h"

namespace spark_decode::engines {
namespace {

using KernelFn = void (*)(kernels::GemmArgs);

// The compiled variants: kSplitKKws x tile {8, 16} x (accs, row tiles) with
// accs * row tiles <= 4, row-swizzled; and kw = 256, accs = 1 with the
// fragment-order loads (launch_unsupported refuses the rest).
static_assert(kSplitKRowTiles.size() == 2 && kSplitKRowTiles[1] == 2, "keep the dispatch in step with kSplitKRowTiles");
template <int KW, int ACCS, int R, bool SWIZZLE = true>
KernelFn pick_tile(int tile) {
  return tile == 8 ? kernels::splitk_mma_kernel<KW, ACCS, 8, R, SWIZZLE>
                   : kernels::splitk_mma_kernel<KW, ACCS, 16, R, SWIZZLE>;
}

template <int KW>
KernelFn pick_accs(int accs, int tile, int row_tiles) {
  if (row_tiles == 2) return accs == 1 ? pick_tile<KW, 1, 2>(tile) : pick_tile<KW, 2, 2>(tile);
  switch (accs) {
    case 1: return pick_tile<KW, 1, 1>(tile);
    case 2: return pick_tile<KW, 2, 1>(tile);
    default: return pick_tile<KW, 4, 1>(tile);
  }
}

KernelFn kernel_for(const SplitKTactic& t, int tile, int row_tiles) {
  static_assert(kSplitKKws[0] == 64 && kSplitKKws[1] == 128 && kSplitKKws[2] == 256,
                "keep the dispatch in step with kSplitKKws");
  static_assert(kSplitKUnswizzledKw == 256 && kSplitKUnswizzledAccs == 1,
                "keep the dispatch in step with the unswizzled variant");
  if (!t.row_swizzle) return row_tiles == 2 ? pick_tile<256, 1, 2, false>(tile) : pick_tile<256, 1, 1, false>(tile);
  switch (t.kw) {
    case 64: return pick_accs<64>(t.accs, tile, row_tiles);
    case 128: return pick_accs<128>(t.accs, tile, row_tiles);
    default: return pick_accs<256>(t.accs, tile, row_tiles);
  }
}

kernels::LaunchShape launch_shape(int n, int k, const SplitKTactic& t, int tile, int row_tiles, bool pdl) {
  kernels::LaunchShape shape;
  shape.grid = dim3(n / (kSplitKTileN * row_tiles), t.splits);
  shape.block = dim3(32 * t.warps(k));
  shape.smem_bytes = kernels::splitk_smem_bytes(k, t.kw, tile, row_tiles);
  shape.cluster_y = t.splits;
  shape.cluster_balance = t.cluster_balance;
  shape.enable_pdl = pdl;
  return shape;
}

}  // namespace

SplitKMma::SplitKMma(const void* weight, int n, int k, int device, const SplitKTactic& tactic, bool enable_pdl,
                     const std::vector<int>& rows)
    : weight_(weight), n_(n), k_(k), device_(device), tactic_(tactic), enable_pdl_(enable_pdl) {
  for (int m : rows) prepare(tactic_.token_tile[m - 1], tactic_.row_tiles[m - 1]);
}

void SplitKMma::prepare(int tile, int row_tiles) {
  if (prepared(tile, row_tiles)) return;
  const KernelFn fn = kernel_for(tactic_, tile, row_tiles);
  const auto shape = launch_shape(n_, k_, tactic_, tile, row_tiles, enable_pdl_);
  // The cap is per kernel and per device, shared by every user of this
  // kernel (Unpoolers, pooler GEMMs): set it to the most any of them may
  // need, never to this one's size, which could lower it under another's
  // feet. Launches still reserve only what they ask for.
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
  SPARK_CHECK_RUNTIME(shape.smem_bytes <= optin, "unpooler tactic ", tactic_.to_string(), " needs ",
                      shape.smem_bytes, " bytes of shared memory per block; cuda:", device_, " allows ", optin);
  CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  if (tactic_.splits > 1) {
    // can_implement: the cluster must fit an SM group at all.
    SPARK_CHECK_RUNTIME(kernels::max_active_clusters(fn, shape) > 0, "unpooler tactic ", tactic_.to_string(),
                        " with token tile ", tile, " and ", row_tiles,
                        " row tiles: no cluster of this shape fits the device");
  }
  prepared_[variant(tile, row_tiles)] = true;
}

void SplitKMma::launch(const void* x, void* out, int m, const MailboxView* publish, int32_t* ticket,
                       cudaStream_t stream) const {
  const int tile = tactic_.token_tile[m - 1], row_tiles = tactic_.row_tiles[m - 1];
  kernels::GemmArgs args{static_cast<const __nv_bfloat16*>(weight_), static_cast<const __nv_bfloat16*>(x),
                         static_cast<__nv_bfloat16*>(out), n_, k_, m,
                         publish ? kernels::mailbox_dev::Publish::into(*publish, ticket, m)
                                 : kernels::mailbox_dev::Publish::none()};
  kernels::launch(kernel_for(tactic_, tile, row_tiles), launch_shape(n_, k_, tactic_, tile, row_tiles, enable_pdl_),
                  stream, args);
}

}  // namespace spark_decode::engines
