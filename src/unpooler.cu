// The Unpooler: validation, kernel selection and launch.
#include <algorithm>

#include "cuda_utils.h"
#include "kernels/common/launch.cuh"
#include "kernels/unpooler/unpooler_kernel.cuh"
#include "publish_target.cuh"
#include "spark_decode/error.h"
#include "spark_decode/mailbox.h"
#include "spark_decode/unpooler.h"

namespace spark_decode {
namespace {

using KernelFn = void (*)(kernels::UnpoolerArgs);

// The compiled variants: kUnpoolerKws x tile {8, 16} x (accs, row tiles)
// with accs * row tiles <= 4, row-swizzled; and kw = 256, accs = 1 with the
// fragment-order loads (launch_unsupported refuses the rest).
static_assert(kUnpoolerRowTiles.size() == 2 && kUnpoolerRowTiles[1] == 2,
              "keep the dispatch in step with kUnpoolerRowTiles");
template <int KW, int ACCS, int R, bool SWIZZLE = true>
KernelFn pick_tile(int tile) {
  return tile == 8 ? kernels::unpooler_kernel<KW, ACCS, 8, R, SWIZZLE>
                   : kernels::unpooler_kernel<KW, ACCS, 16, R, SWIZZLE>;
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

KernelFn unpooler_kernel_for(const UnpoolerTactic& t, int tile, int row_tiles) {
  static_assert(kUnpoolerKws[0] == 64 && kUnpoolerKws[1] == 128 && kUnpoolerKws[2] == 256,
                "keep the dispatch in step with kUnpoolerKws");
  static_assert(kUnpoolerUnswizzledKw == 256 && kUnpoolerUnswizzledAccs == 1,
                "keep the dispatch in step with the unswizzled variant");
  if (!t.row_swizzle)
    return row_tiles == 2 ? pick_tile<256, 1, 2, false>(tile) : pick_tile<256, 1, 1, false>(tile);
  switch (t.kw) {
    case 64: return pick_accs<64>(t.accs, tile, row_tiles);
    case 128: return pick_accs<128>(t.accs, tile, row_tiles);
    default: return pick_accs<256>(t.accs, tile, row_tiles);
  }
}

int variant_index(int tile, int row_tiles) { return (tile == 8 ? 0 : 2) + row_tiles - 1; }

kernels::LaunchShape launch_shape(int n, int k, const UnpoolerTactic& t, int tile, int row_tiles, bool pdl) {
  kernels::LaunchShape shape;
  shape.grid = dim3(n / (kUnpoolerTileN * row_tiles), t.splits);
  shape.block = dim3(32 * t.warps(k));
  shape.smem_bytes = kernels::unpooler_smem_bytes(k, t.kw, tile, row_tiles);
  shape.cluster_y = t.splits;
  shape.cluster_balance = t.cluster_balance;
  shape.enable_pdl = pdl;
  return shape;
}

}  // namespace

std::optional<std::string> Unpooler::unsupported(const TensorRef& weight,
                                                 const UnpoolerTactic& tactic) {
  if (weight.ndim != 2) return detail::concat("unpooler shard must be 2-D, got ", weight.describe());
  const int64_t n = weight.shape[0], k = weight.shape[1];
  if (weight.dtype != DType::bf16 || !weight.is_contiguous() || !weight.is_aligned(16) ||
      n % kUnpoolerTileN || weight.data == nullptr)
    return detail::concat("unpooler shard ", weight.describe(),
                          ": needs a contiguous, 16-byte aligned BF16 [N, K] with N % ",
                          kUnpoolerTileN, " == 0");
  if (weight.device < 0) return detail::concat("unpooler shard ", weight.describe(), ": needs device memory");
  if (n > (1 << 30) || k > (1 << 30)) return detail::concat("unpooler shard ", weight.describe(), " too large");
  return launch_unsupported(static_cast<int>(n), static_cast<int>(k), tactic);
}

std::optional<std::string> Unpooler::unsupported(const TensorRef& weight) {
  if (weight.ndim != 2) return unsupported(weight, UnpoolerTactic{});
  return unsupported(weight, unpooler_tactic(static_cast<int>(weight.shape[0]),
                                              static_cast<int>(weight.shape[1])));
}

Unpooler::Unpooler(const TensorRef& weight, Options options)
    : weight_(weight.data), n_(0), k_(0), device_(weight.device), enable_pdl_(options.enable_pdl) {
  if (weight.ndim == 2) {
    n_ = static_cast<int>(weight.shape[0]);
    k_ = static_cast<int>(weight.shape[1]);
  }
  tactic_ = options.tactic ? *options.tactic : unpooler_tactic(n_, k_);
  if (auto reason = unsupported(weight, tactic_)) throw InvalidArgument(*reason);
  mailbox_ = options.mailbox;
  if (mailbox_) {
    SPARK_CHECK(mailbox_->width() == n_, "mailbox width ", mailbox_->width(), " != unpooler N ", n_);
    SPARK_CHECK(mailbox_->device() == device_, "the mailbox is on cuda:", mailbox_->device(),
                ", the unpooler weight on cuda:", device_);
    max_m_ = std::min(kUnpoolerMaxM, mailbox_->capacity());
    if (options.ticket) {
      const TensorRef& t = *options.ticket;
      SPARK_CHECK(t.dtype == DType::i32 && t.ndim == 1 && t.shape[0] == 1 && t.device == mailbox_->device() &&
                      t.data != nullptr && t.is_aligned(4),
                  "the ticket must be int32 [1] on the mailbox");
      ticket_ = static_cast<int32_t*>(t.data);
    }
  } else {
    SPARK_CHECK(!options.ticket, "a ticket stage needs a mailbox");
  }
  std::vector<int> rows;
  if (options.rows)
    rows = *options.rows;
  else
    for (int m = 1; m <= max_m_; ++m) rows.push_back(m);
  for (int m : rows) SPARK_CHECK(m >= 1 && m <= max_m_, "rows: ", m, " outside 1..", max_m_);
  detail::require_sm90(device_, "the unpooler GEMM");
  detail::DeviceGuard guard(device_);
  for (int m : rows) prepare(tactic_.token_tile[m - 1], tactic_.row_tiles[m - 1]);
}

Unpooler Unpooler::from_moe(const TensorRef& full_weight, int tp, int rank, Options options) {
  SPARK_CHECK(full_weight.ndim == 2, "unpooler weight must be 2-D, got ", full_weight.describe());
  SPARK_CHECK(tp >= 1 && full_weight.shape[0] % tp == 0, "unpooler weight ",
              full_weight.describe(), " does not split into tp=", tp, " row blocks");
  SPARK_CHECK(rank >= 0 && rank < tp, "rank ", rank, " outside [0, ", tp, ")");
  const int64_t n = full_weight.shape[0] / tp;
  return Unpooler(full_weight.narrow_rows(rank * n, n), std::move(options));
}

bool Unpooler::prepared(int tile, int row_tiles) const {
  SPARK_CHECK((tile == 8 || tile == 16) &&
                  std::find(kUnpoolerRowTiles.begin(), kUnpoolerRowTiles.end(), row_tiles) != kUnpoolerRowTiles.end(),
              "no unpooler kernel for token tile ", tile, " and ", row_tiles, " row tiles (tiles 8, 16; row tiles 1, 2)");
  return prepared_[variant_index(tile, row_tiles)];
}

void Unpooler::prepare(int tile, int row_tiles) {
  if (prepared(tile, row_tiles)) return;
  const KernelFn fn = unpooler_kernel_for(tactic_, tile, row_tiles);
  const auto shape = launch_shape(n_, k_, tactic_, tile, row_tiles, enable_pdl_);
  // The cap is per kernel and per device, shared by every Unpooler (and the
  // Pooler's MMA engine) using this kernel: set it to the most any of them may
  // need, never to this one's size, which could lower it under another's
  // feet. Launches still reserve only what they ask for.
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
  SPARK_CHECK_RUNTIME(shape.smem_bytes <= optin, "unpooler tactic ", tactic_.to_string(), " needs ",
                      shape.smem_bytes, " bytes of shared memory per block; cuda:", device_, " allows ", optin);
  CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  if (tactic_.splits > 1) {
    // can_implement: the cluster must fit an SM group at all.
    SPARK_CHECK_RUNTIME(kernels::max_active_clusters(fn, shape) > 0, "unpooler tactic ",
                        tactic_.to_string(), " with token tile ", tile, " and ", row_tiles,
                        " row tiles: no cluster of this shape fits the device");
  }
  prepared_[variant_index(tile, row_tiles)] = true;
}

void Unpooler::run(const void* x, void* out, int m, cudaStream_t stream) {
  SPARK_CHECK(m >= 1 && m <= max_m_, "x [", m, ", ", k_, "]: needs [1..", max_m_, ", ", k_, "]");
  SPARK_CHECK(x != nullptr && out != nullptr && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                  reinterpret_cast<uintptr_t>(out) % 16 == 0,
              "x and out must be non-null 16-byte aligned BF16");
  const auto* xb = static_cast<const char*>(x);
  const auto* ob = static_cast<const char*>(out);
  SPARK_CHECK(ob + size_t(m) * n_ * 2 <= xb || xb + size_t(m) * k_ * 2 <= ob, "out may not overlap x");
  const int tile = tactic_.token_tile[m - 1], row_tiles = tactic_.row_tiles[m - 1];
  if (!prepared(tile, row_tiles)) {
    SPARK_CHECK(!detail::is_capturing(stream), "the kernel for m=", m, " (token tile ", tile, ", ", row_tiles,
                " row tiles) was not prepared at construction (rows), and cannot be under CUDA graph capture");
    detail::DeviceGuard guard(device_);
    prepare(tile, row_tiles);
  }
  detail::require_current_device(device_, "the unpooler");
  kernels::UnpoolerArgs args{static_cast<const __nv_bfloat16*>(weight_),
                             static_cast<const __nv_bfloat16*>(x),
                             static_cast<__nv_bfloat16*>(out), n_, k_, m, {}};
  if (mailbox_) args.publish = publish_target(*mailbox_, ticket_);
  kernels::launch(unpooler_kernel_for(tactic_, tile, row_tiles),
                  launch_shape(n_, k_, tactic_, tile, row_tiles, enable_pdl_), stream, args);
}

void Unpooler::run(const TensorRef& x, const TensorRef& out, cudaStream_t stream) {
  const int m = x.ndim == 2 ? static_cast<int>(x.shape[0]) : 0;
  SPARK_CHECK(x.ndim == 2 && m >= 1 && m <= max_m_ && x.shape[1] == k_, "x ", x.describe(),
              ": needs [1..", max_m_, ", ", k_, "]");
  SPARK_CHECK(out.ndim == 2 && out.shape[0] == m && out.shape[1] == n_, "out ", out.describe(),
              " != [", m, ", ", n_, "]");
  for (const TensorRef* t : {&x, &out})
    SPARK_CHECK(t->dtype == DType::bf16 && t->is_contiguous() && t->is_aligned(16),
                "x and out must be contiguous 16-byte aligned BF16, got ", t->describe());
  SPARK_CHECK(x.device == device_ && out.device == device_, "x and out must be on cuda:", device_,
              ", got ", x.describe(), " and ", out.describe());
  run(x.data, out.data, m, stream);
}

}  // namespace spark_decode
