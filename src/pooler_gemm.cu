// The pooler GEMM: kernel selection, validation and launch of the skinny
// GEMM and the ring engine, and the engine choice per batch (skinny, the
// Unpooler's MMA engine, or ring).
#include <algorithm>

#include "cuda_utils.h"
#include "kernels/common/launch.cuh"
#include "kernels/pooler/ring_gemm.cuh"
#include "kernels/pooler/skinny_gemm.cuh"
#include "publish_target.cuh"
#include "spark_decode/error.h"
#include "spark_decode/mailbox.h"
#include "spark_decode/pooler_gemm.h"
#include "spark_decode/unpooler.h"

namespace spark_decode {
namespace {

using SkinnyFn = void (*)(kernels::PoolerGemmArgs);

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

// The compiled shapes: keep in step with pooler_gemm_shapes().
SkinnyFn skinny_kernel(const PoolerGemmShape& s, int m) {
  const int tile = row_tile(m);
  if (s == PoolerGemmShape{256, 2, 4}) return pick_tile<256, 2, 4>(tile);
  if (s == PoolerGemmShape{256, 4, 4}) return pick_tile<256, 4, 4>(tile);
  if (s == PoolerGemmShape{512, 2, 2}) return pick_tile<512, 2, 2>(tile);
  if (s == PoolerGemmShape{512, 4, 2}) return pick_tile<512, 4, 2>(tile);
  return nullptr;
}

bool aligned16(const void* p) { return p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void launch_skinny(const PoolerGemmShape& s, const void* w, const void* x, void* out, int n, int k, int m,
                   cudaStream_t stream, bool enable_pdl, const LamportMailbox* publish_into = nullptr) {
  kernels::PoolerGemmArgs args{static_cast<const __nv_bfloat16*>(w), static_cast<const __nv_bfloat16*>(x),
                               static_cast<__nv_bfloat16*>(out), n, k, m, {}};
  if (publish_into) args.publish = publish_target(*publish_into);
  kernels::LaunchShape shape;
  shape.grid = dim3(n / s.outputs_per_block);
  shape.block = dim3(s.block_size);
  shape.enable_pdl = enable_pdl;
  kernels::launch(skinny_kernel(s, m), shape, stream, args);
}

static_assert(kernels::ring::rows(2) == pooler_ring_rows(1) && kernels::ring::rows(4) == pooler_ring_rows(2) &&
                  kernels::ring::k_multiple(2, 1) == pooler_ring_k_multiple(1) &&
                  kernels::ring::k_multiple(4, 2) == pooler_ring_k_multiple(2),
              "keep the ring engine's public constants in step with its kernel");

// Every compiled ring shape fits the 227 KiB of shared memory an sm_90 CTA
// may opt into (checked again at construction against the device's limit).
static_assert(kernels::ring::smem_bytes(8, 2, 1) <= 227 * 1024 && kernels::ring::smem_bytes(16, 2, 1) <= 227 * 1024 &&
                  kernels::ring::smem_bytes(8, 4, 2) <= 227 * 1024 && kernels::ring::smem_bytes(16, 4, 2) <= 227 * 1024,
              "a ring shape needs more shared memory than an H100/H200 CTA can have");

// The compiled ring kernels: (token tile, split); split 1 is 32-row tiles
// (RT = 2), split 2 64-row tiles (RT = 4) over a cluster of two CTAs.
using RingFn = void (*)(kernels::PoolerGemmArgs);
int ring_tile(int m) { return m <= 8 ? 8 : 16; }
int ring_rt(int split) { return pooler_ring_rows(split) / 16; }  // 16-row MMA tiles per ring tile
RingFn ring_kernel(int m, int split) {
  const bool t8 = ring_tile(m) == 8;
  if (split == 1) return t8 ? kernels::ring_gemm_kernel<8, 2, 1> : kernels::ring_gemm_kernel<16, 2, 1>;
  return t8 ? kernels::ring_gemm_kernel<8, 4, 2> : kernels::ring_gemm_kernel<16, 4, 2>;
}

kernels::LaunchShape ring_shape(int m, int split, int grid, bool enable_pdl) {
  kernels::LaunchShape shape;
  shape.grid = dim3(grid, split);
  shape.block = dim3(32 * kernels::ring::kWarps);
  shape.smem_bytes = kernels::ring::smem_bytes(ring_tile(m), ring_rt(split), split);
  shape.cluster_y = split;
  shape.enable_pdl = enable_pdl;
  return shape;
}

// grid: tiles in flight (CTAs at split 1, clusters of `split` CTAs above).
void launch_ring(const void* w, const void* x, void* out, int n, int k, int m, int split, int grid,
                 cudaStream_t stream, bool enable_pdl, const LamportMailbox* publish_into) {
  kernels::PoolerGemmArgs args{static_cast<const __nv_bfloat16*>(w), static_cast<const __nv_bfloat16*>(x),
                               static_cast<__nv_bfloat16*>(out), n, k, m, {}};
  if (publish_into) args.publish = publish_target(*publish_into);
  kernels::launch(ring_kernel(m, split), ring_shape(m, split, grid, enable_pdl), stream, args);
}

void check_operands(const void* w, const void* x, void* out, int n, int k, int m) {
  SPARK_CHECK(aligned16(w) && aligned16(x) && aligned16(out),
              "pooler GEMM: W, x and out must be non-null 16-byte aligned device pointers");
  const char* xb = static_cast<const char*>(x);
  const char* ob = static_cast<const char*>(out);
  SPARK_CHECK(ob + size_t(m) * n * 2 <= xb || xb + size_t(m) * k * 2 <= ob, "pooler GEMM: out may not overlap x");
}

}  // namespace

void skinny_gemm(const PoolerGemmShape& shape, const void* w, const void* x, void* out, int n, int k, int m,
                 cudaStream_t stream, bool enable_pdl) {
  if (auto reason = pooler_gemm_unsupported(n, k, m, shape)) throw InvalidArgument(*reason);
  check_operands(w, x, out, n, k, m);
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  detail::require_sm90(device, "the pooler GEMM");
  launch_skinny(shape, w, x, out, n, k, m, stream, enable_pdl);
}

PoolerGemm::PoolerGemm(const TensorRef& weight, int tp, Options options)
    : weight_(weight.data), device_(weight.device), enable_pdl_(options.enable_pdl), mailbox_(options.mailbox) {
  SPARK_CHECK(weight.ndim == 2 && weight.dtype == DType::bf16 && weight.is_contiguous() &&
                  weight.is_aligned(16) && weight.data != nullptr,
              "pooler GEMM weight ", weight.describe(), ": needs a contiguous 16-byte aligned BF16 [N, K]");
  SPARK_CHECK(weight.device >= 0, "pooler GEMM weight ", weight.describe(), ": needs device memory");
  SPARK_CHECK(weight.shape[0] <= (1 << 30) && weight.shape[1] <= (1 << 30), "pooler GEMM weight ",
              weight.describe(), " too large");
  n_ = static_cast<int>(weight.shape[0]);
  k_ = static_cast<int>(weight.shape[1]);
  std::vector<int> batches = options.batches;
  if (batches.empty())
    for (int b = 1; b <= kPoolerMaxBatch; ++b) batches.push_back(b);
  choice_.assign(kPoolerMaxBatch, std::nullopt);
  std::vector<int> mma_rows;
  for (int b : batches) {
    SPARK_CHECK(b >= 1 && b <= kPoolerMaxBatch, "pooler GEMM: batch ", b, " outside [1, ", kPoolerMaxBatch, "]");
    const PoolerGemmChoice c = options.force ? *options.force : pooler_gemm_choice(n_, k_, tp, b);
    if (auto reason = pooler_choice_unsupported(n_, k_, b, c)) throw InvalidArgument(*reason);
    if (c.engine == PoolerGemmEngine::mma) mma_rows.push_back(b);
    choice_[b - 1] = c;
  }
  if (mailbox_) {
    SPARK_CHECK(mailbox_->width() == n_ && mailbox_->device() == device_, "pooler GEMM: the mailbox (width ",
                mailbox_->width(), ", cuda:", mailbox_->device(), ") must have width N = ", n_, " and live on cuda:",
                device_);
    const int most = *std::max_element(batches.begin(), batches.end());
    SPARK_CHECK(most <= mailbox_->capacity(), "pooler GEMM: batch ", most, " exceeds the mailbox capacity ",
                mailbox_->capacity());
  }
  detail::require_sm90(device_, "the pooler GEMM");
  detail::DeviceGuard guard(device_);
  if (!mma_rows.empty()) {
    Unpooler::Options uo;
    uo.enable_pdl = enable_pdl_;
    uo.rows = mma_rows;
    if (auto reason = Unpooler::unsupported(weight)) throw InvalidArgument("pooler GEMM on the MMA engine: " + *reason);
    mma_ = std::make_unique<Unpooler>(weight, uo);
    if (mailbox_) {
      uo.mailbox = mailbox_;  // the zero-copy epilogue: same bytes as publish()
      mma_publish_ = std::make_unique<Unpooler>(weight, uo);
    }
  }
  // Load the skinny kernels now: never lazily under capture.
  for (int b : batches)
    if (choice_[b - 1]->engine == PoolerGemmEngine::skinny) {
      cudaFuncAttributes attrs;
      CUDA_CHECK(cudaFuncGetAttributes(&attrs, skinny_kernel(choice_[b - 1]->shape, b)));
    }
  // The ring engine: its shared memory (the same for every caller of a
  // kernel, so setting it cannot lower another's), one CTA per SM; with a
  // split, as many clusters as fit at once.
  ring_grid_.assign(kPoolerMaxBatch, 0);
  int optin = 0, sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_));
  for (int b : batches)
    if (choice_[b - 1]->engine == PoolerGemmEngine::ring) {
      const int split = choice_[b - 1]->ring_split;
      const int smem = kernels::ring::smem_bytes(ring_tile(b), ring_rt(split), split);
      SPARK_CHECK_RUNTIME(smem <= optin, "pooler GEMM ring engine: needs ", smem,
                          " bytes of shared memory per block; cuda:", device_, " allows ", optin);
      CUDA_CHECK(cudaFuncSetAttribute(ring_kernel(b, split), cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      const int tiles = n_ / pooler_ring_rows(split);
      int fit = sms;
      if (split > 1) {
        fit = kernels::max_active_clusters(ring_kernel(b, split), ring_shape(b, split, tiles, false));
        SPARK_CHECK_RUNTIME(fit >= 1, "pooler GEMM ring engine: cuda:", device_, " cannot run a cluster of ", split,
                            " CTAs with ", smem, " bytes of shared memory each");
      }
      ring_grid_[b - 1] = std::min(tiles, fit);
    }
}

PoolerGemm::~PoolerGemm() = default;
PoolerGemm::PoolerGemm(PoolerGemm&&) noexcept = default;
PoolerGemm& PoolerGemm::operator=(PoolerGemm&&) noexcept = default;

PoolerGemmChoice PoolerGemm::choice(int m) const {
  SPARK_CHECK(m >= 1 && m <= static_cast<int>(choice_.size()) && choice_[m - 1], "pooler GEMM: batch ", m,
              " was not prepared at construction (Options::batches)");
  return *choice_[m - 1];
}

void PoolerGemm::launch(const void* x, void* out, int m, cudaStream_t stream, bool publish) const {
  const PoolerGemmChoice c = choice(m);
  check_operands(weight_, x, out, n_, k_, m);
  detail::require_current_device(device_, "the pooler GEMM");
  if (c.engine == PoolerGemmEngine::mma)
    (publish ? mma_publish_ : mma_)->run(x, out, m, stream);
  else if (c.engine == PoolerGemmEngine::ring)
    launch_ring(weight_, x, out, n_, k_, m, c.ring_split, ring_grid_[m - 1], stream, enable_pdl_,
                publish ? mailbox_ : nullptr);
  else
    launch_skinny(c.shape, weight_, x, out, n_, k_, m, stream, enable_pdl_, publish ? mailbox_ : nullptr);
}

void PoolerGemm::run(const void* x, void* out, int m, cudaStream_t stream) const {
  launch(x, out, m, stream, /*publish=*/false);
}

void PoolerGemm::run_publish(const void* x, void* out, int m, cudaStream_t stream) const {
  SPARK_CHECK(mailbox_ != nullptr, "pooler GEMM: run_publish needs Options::mailbox");
  launch(x, out, m, stream, /*publish=*/true);
}

void PoolerGemm::run(const TensorRef& x, const TensorRef& out, cudaStream_t stream) const {
  const int m = x.ndim == 2 ? static_cast<int>(x.shape[0]) : 0;
  SPARK_CHECK(x.ndim == 2 && x.shape[1] == k_ && x.dtype == DType::bf16 && x.is_contiguous() && x.is_aligned(16) &&
                  x.device == device_,
              "pooler GEMM: x ", x.describe(), " must be contiguous 16-byte aligned BF16 [m, ", k_, "] on cuda:",
              device_);
  SPARK_CHECK(out.ndim == 2 && out.shape[0] == m && out.shape[1] == n_ && out.dtype == DType::bf16 &&
                  out.is_contiguous() && out.is_aligned(16) && out.device == device_,
              "pooler GEMM: out ", out.describe(), " must be contiguous 16-byte aligned BF16 [", m, ", ", n_,
              "] on cuda:", device_);
  run(x.data, out.data, m, stream);
}

}  // namespace spark_decode
