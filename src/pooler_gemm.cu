// The pooler GEMM: validation, the engine of each batch, and its launch.
#include <algorithm>

#include "cuda_utils.h"
#include "engines/onchip_mma.h"
#include "engines/ring_mma.h"
#include "engines/skinny.h"
#include "engines/splitk_mma.h"
#include "spark_decode/error.h"
#include "spark_decode/mailbox.h"
#include "spark_decode/pooler_gemm.h"
#include "validate.h"

namespace spark_decode {
namespace {

void check_gemm_operands(const void* w, const void* x, void* out, int n, int k, int m) {
  SPARK_CHECK(detail::aligned(w, 16) && detail::aligned(x, 16) && detail::aligned(out, 16),
              "pooler GEMM: W, x and out must be non-null 16-byte aligned device pointers");
  detail::require_disjoint(out, size_t(m) * n * 2, x, size_t(m) * k * 2, "pooler GEMM: out may not overlap x");
}

}  // namespace

// The engines some batch of this GEMM runs on.
struct PoolerGemm::Engines {
  std::optional<engines::SplitKMma> splitk;
  std::optional<engines::RingMma> ring;
  std::optional<engines::OnchipMma> onchip;
};

void skinny_gemm(const PoolerGemmShape& shape, const void* w, const void* x, void* out, int n, int k, int m,
                 cudaStream_t stream, bool enable_pdl) {
  if (auto reason = pooler_gemm_unsupported(n, k, m, shape)) throw InvalidArgument(*reason);
  check_gemm_operands(w, x, out, n, k, m);
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  detail::require_sm90(device, "the pooler GEMM");
  engines::launch_skinny(shape, w, x, out, n, k, m, enable_pdl, nullptr, stream);
}

PoolerGemm::PoolerGemm(const TensorRef& weight, int tp, Options options)
    : weight_(weight.data), device_(weight.device), enable_pdl_(options.enable_pdl), mailbox_(options.mailbox),
      engines_(std::make_unique<Engines>()) {
  SPARK_CHECK(weight.ndim == 2 && weight.dtype == DType::bf16 && weight.is_contiguous() && weight.is_aligned(16) &&
                  weight.data != nullptr,
              "pooler GEMM weight ", weight.describe(), ": needs a contiguous 16-byte aligned BF16 [N, K]");
  SPARK_CHECK(weight.device >= 0, "pooler GEMM weight ", weight.describe(), ": needs device memory");
  SPARK_CHECK(weight.shape[0] <= (1 << 30) && weight.shape[1] <= (1 << 30), "pooler GEMM weight ",
              weight.describe(), " too large");
  n_ = static_cast<int>(weight.shape[0]);
  k_ = static_cast<int>(weight.shape[1]);
  std::vector<int> batches = options.batches;
  if (batches.empty())
    for (int b = 1; b <= kMaxBatch; ++b) batches.push_back(b);
  choice_.assign(kMaxBatch, std::nullopt);
  std::vector<int> splitk_rows, onchip_rows;
  bool ring = false;
  for (int b : batches) {
    SPARK_CHECK(b >= 1 && b <= kMaxBatch, "pooler GEMM: batch ", b, " outside [1, ", kMaxBatch, "]");
    const PoolerGemmChoice c = options.force ? *options.force : pooler_gemm_choice(n_, k_, tp, b);
    if (auto reason = pooler_choice_unsupported(n_, k_, b, c)) throw InvalidArgument(*reason);
    if (c.engine == GemmEngine::splitk_mma) splitk_rows.push_back(b);
    if (c.engine == GemmEngine::onchip_mma) onchip_rows.push_back(b);
    ring |= c.engine == GemmEngine::ring_mma;
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
  const SplitKTactic tactic = splitk_tactic(PlanOp::pooler, n_, k_);
  if (!splitk_rows.empty())
    if (auto reason = launch_unsupported(n_, k_, tactic))
      throw InvalidArgument("pooler GEMM on the MMA engine: " + *reason);
  detail::require_sm90(device_, "the pooler GEMM");
  detail::DeviceGuard guard(device_);
  if (!splitk_rows.empty()) engines_->splitk.emplace(weight_, n_, k_, device_, tactic, enable_pdl_, splitk_rows);
  if (ring) engines_->ring.emplace(weight_, n_, k_, device_, enable_pdl_);
  // (pooler_choice_unsupported checked the on-chip tactic above.)
  if (!onchip_rows.empty()) {
    std::array<OnchipTactic, kMaxBatch> tactic_of;
    for (int b = 1; b <= kMaxBatch; ++b) tactic_of[b - 1] = onchip_tactic(PlanOp::pooler, n_, k_, b);
    engines_->onchip.emplace(weight_, n_, k_, device_, tactic_of, enable_pdl_, onchip_rows);
  }
  // Load the skinny kernels now: never lazily under capture.
  for (int b : batches)
    if (choice_[b - 1]->engine == GemmEngine::skinny) engines::prepare_skinny(choice_[b - 1]->shape, b);
}

PoolerGemm::~PoolerGemm() = default;
PoolerGemm::PoolerGemm(PoolerGemm&&) noexcept = default;
PoolerGemm& PoolerGemm::operator=(PoolerGemm&&) noexcept = default;

PoolerGemmChoice PoolerGemm::choice(int m) const {
  SPARK_CHECK(m >= 1 && m <= static_cast<int>(choice_.size()) && choice_[m - 1], "pooler GEMM: batch ", m,
              " was not prepared at construction (Options::batches)");
  return *choice_[m - 1];
}

void PoolerGemm::launch(const void* x, void* out, int m, bool publish, cudaStream_t stream, uint32_t tag) const {
  const PoolerGemmChoice& c = *choice_[m - 1];
  MailboxView tagged;
  if (publish) {
    tagged = mailbox_->view();
    tagged.tag = tag;
  }
  const MailboxView* into = publish ? &tagged : nullptr;
  switch (c.engine) {
    case GemmEngine::splitk_mma: engines_->splitk->launch(x, out, m, into, nullptr, stream); break;
    case GemmEngine::ring_mma: engines_->ring->launch(x, out, m, into, stream); break;
    case GemmEngine::onchip_mma: engines_->onchip->launch(x, out, m, into, nullptr, stream); break;
    case GemmEngine::skinny:
      engines::launch_skinny(c.shape, weight_, x, out, n_, k_, m, enable_pdl_, into, stream);
      break;
  }
  if (publish) mailbox_->publish_enqueued();
}

void PoolerGemm::check_operands(const void* x, void* out, int m) const {
  check_gemm_operands(weight_, x, out, n_, k_, m);
  const size_t out_bytes = size_t(m) * n_ * 2;
  detail::require_disjoint(out, out_bytes, weight_, size_t(n_) * k_ * 2, "pooler GEMM: out may not overlap W");
  if (mailbox_) {
    const void* mb = mailbox_->memory().local();
    const size_t mb_bytes = mailbox_->memory().bytes();
    detail::require_disjoint(out, out_bytes, mb, mb_bytes, "pooler GEMM: out may not overlap the mailbox");
    detail::require_disjoint(x, size_t(m) * k_ * 2, mb, mb_bytes, "pooler GEMM: x may not overlap the mailbox");
  }
}

void PoolerGemm::check_run(const void* x, void* out, int m) const {
  choice(m);  // prepared
  check_operands(x, out, m);
  detail::require_current_device(device_, "the pooler GEMM");
}

void PoolerGemm::run(const void* x, void* out, int m, cudaStream_t stream) const {
  check_run(x, out, m);
  launch(x, out, m, /*publish=*/false, stream);
}

void PoolerGemm::run_publish(const void* x, void* out, int m, cudaStream_t stream) const {
  SPARK_CHECK(mailbox_ != nullptr, "pooler GEMM: run_publish needs Options::mailbox");
  mailbox_->check();
  check_run(x, out, m);
  launch(x, out, m, /*publish=*/true, stream);
}

void PoolerGemm::run(const TensorRef& x, const TensorRef& out, cudaStream_t stream) const {
  const int m = x.ndim == 2 ? static_cast<int>(x.shape[0]) : 0;
  detail::require_matrix(x, DType::bf16, -1, k_, device_, "pooler GEMM: x ", x.describe(),
                         " must be contiguous 16-byte aligned BF16 [m, ", k_, "] on cuda:", device_);
  detail::require_matrix(out, DType::bf16, m, n_, device_, "pooler GEMM: out ", out.describe(),
                         " must be contiguous 16-byte aligned BF16 [", m, ", ", n_, "] on cuda:", device_);
  run(x.data, out.data, m, stream);
}

}  // namespace spark_decode
