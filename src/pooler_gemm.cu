// The pooler GEMM: kernel selection, validation and launch of the skinny
// GEMM and of the stream engine, and the engine choice per batch (skinny,
// the Unpooler's MMA engine, or stream).
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstring>

#include "cuda_utils.h"
#include "kernels/common/launch.cuh"
#include "kernels/pooler/skinny_gemm.cuh"
#include "kernels/pooler/stream_gemm.cuh"
#include "kernels/unpooler/unpooler_config.h"
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

// ---- the stream engine ----------------------------------------------------

using StreamFn = void (*)(kernels::StreamGemmArgs);

int stream_tile(int m) { return m <= 8 ? 8 : 16; }

StreamFn stream_kernel(int rows, int m) {
  const bool wide = stream_tile(m) == 16;
  if (rows == 64) return wide ? kernels::stream_gemm_kernel<64, 16> : kernels::stream_gemm_kernel<64, 8>;
  return wide ? kernels::stream_gemm_kernel<128, 16> : kernels::stream_gemm_kernel<128, 8>;
}

// W [n, k] as a 2-D tensor map of [rows][64] BF16 boxes, 128-byte swizzle
// (what the kernel's operand reads assume). The driver's encoder through the
// runtime's entry point: the library links the CUDA runtime only.
static_assert(sizeof(CUtensorMap) == 128, "PoolerGemm::TensorMapBlob holds a CUtensorMap");
void encode_weight_map(void* map, const void* w, int n, int k, int rows) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    SPARK_CHECK_RUNTIME(found == cudaDriverEntryPointSuccess && fn != nullptr,
                        "pooler GEMM: the driver has no cuTensorMapEncodeTiled (the stream engine needs CUDA 12+)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(n)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(k) * 2};
  const cuuint32_t box[2] = {kernels::kStreamBoxK, static_cast<cuuint32_t>(rows)};
  const cuuint32_t steps[2] = {1, 1};
  const CUresult r = encode(static_cast<CUtensorMap*>(map), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(w),
                            dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  SPARK_CHECK_RUNTIME(r == CUDA_SUCCESS, "pooler GEMM: cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(r),
                      ") for W [", n, ", ", k, "] boxes of [", rows, "][", kernels::kStreamBoxK, "]");
}

kernels::LaunchShape stream_launch_shape(const PoolerStreamShape& s, int n, int k, int m, int stages, bool pdl) {
  kernels::LaunchShape shape;
  shape.grid = dim3(n / s.rows_per_cta, s.splits);
  shape.block = dim3(kernels::stream_threads(s.rows_per_cta));
  shape.smem_bytes = kernels::stream_smem_bytes(s.rows_per_cta, s.splits, stream_tile(m), k, stages);
  shape.cluster_y = s.splits;
  shape.enable_pdl = pdl;
  return shape;
}

// can_implement for one batch: the deepest ring this device's shared memory
// takes, the kernel's attribute set, and at least one cluster resident.
int prepare_stream(const PoolerStreamShape& s, int n, int k, int m, int device) {
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int stages =
      kernels::stream_stages(s.rows_per_cta, s.splits, stream_tile(m), k, std::min(optin, kernels::kMaxSmemPerBlock));
  SPARK_CHECK_RUNTIME(stages >= kernels::kStreamMinStages, "pooler GEMM: ", s.to_string(), " at m = ", m, " fits ",
                      stages, " weight stages in cuda:", device, "'s shared memory");
  const StreamFn fn = stream_kernel(s.rows_per_cta, m);
  CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  std::min(optin, kernels::kMaxSmemPerBlock)));
  SPARK_CHECK_RUNTIME(kernels::max_active_clusters(fn, stream_launch_shape(s, n, k, m, stages, false)) > 0,
                      "pooler GEMM: ", s.to_string(), " at m = ", m, ": no cluster of ", s.splits,
                      " CTAs fits on cuda:", device);
  return stages;
}

void launch_stream(const PoolerStreamShape& s, const void* map, int stages, const void* x, void* out, int n, int k,
                   int m, cudaStream_t stream, bool enable_pdl, const LamportMailbox* publish_into) {
  kernels::StreamGemmArgs args{};
  std::memcpy(&args.w_map, map, sizeof(args.w_map));
  args.x = static_cast<const __nv_bfloat16*>(x);
  args.out = static_cast<__nv_bfloat16*>(out);
  args.n = n;
  args.k = k;
  args.m = m;
  args.stages = stages;
  if (publish_into) args.publish = publish_target(*publish_into);
  kernels::launch(stream_kernel(s.rows_per_cta, m), stream_launch_shape(s, n, k, m, stages, enable_pdl), stream,
                  args);
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
  // Load the skinny kernels now: never lazily under capture. The stream
  // engine: its kernels' attributes, ring depths and W's tensor maps.
  stream_stages_.assign(kPoolerMaxBatch, 0);
  bool mapped[2] = {false, false};
  for (int b : batches) {
    const PoolerGemmChoice& c = *choice_[b - 1];
    if (c.engine == PoolerGemmEngine::skinny) {
      cudaFuncAttributes attrs;
      CUDA_CHECK(cudaFuncGetAttributes(&attrs, skinny_kernel(c.shape, b)));
    } else if (c.engine == PoolerGemmEngine::stream) {
      stream_stages_[b - 1] = prepare_stream(c.stream_shape, n_, k_, b, device_);
      const int which = c.stream_shape.rows_per_cta == 128;
      if (!mapped[which]) encode_weight_map(stream_maps_[which].bytes, weight_, n_, k_, c.stream_shape.rows_per_cta);
      mapped[which] = true;
    }
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
  else if (c.engine == PoolerGemmEngine::stream)
    launch_stream(c.stream_shape, stream_maps_[c.stream_shape.rows_per_cta == 128].bytes, stream_stages_[m - 1], x, out,
                  n_, k_, m, stream, enable_pdl_, publish ? mailbox_ : nullptr);
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
