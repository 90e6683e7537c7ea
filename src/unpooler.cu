// The Unpooler: validation, then the split-K or the on-chip MMA engine.
#include <algorithm>

#include "cuda_utils.h"
#include "engines/onchip_mma.h"
#include "engines/splitk_mma.h"
#include "spark_decode/error.h"
#include "spark_decode/mailbox.h"
#include "spark_decode/unpooler.h"
#include "validate.h"

namespace spark_decode {

SplitKTactic unpooler_tactic(int n, int k) { return splitk_tactic(PlanOp::unpooler, n, k); }

GemmEngine unpooler_engine(int n, int k, int m) {
  if (const int tp = model_tp(PlanOp::unpooler, n, k))
    if (const PlanRow* row = plan_row(PlanOp::unpooler, tp, m)) return row->engine;
  return GemmEngine::splitk_mma;
}

namespace {

// The weight's own conditions, whatever the engine.
std::optional<std::string> shard_unsupported(const TensorRef& weight) {
  if (weight.ndim != 2) return detail::concat("unpooler shard must be 2-D, got ", weight.describe());
  const int64_t n = weight.shape[0], k = weight.shape[1];
  if (weight.dtype != DType::bf16 || !weight.is_contiguous() || !weight.is_aligned(16) || n % kSplitKTileN ||
      weight.data == nullptr)
    return detail::concat("unpooler shard ", weight.describe(),
                          ": needs a contiguous, 16-byte aligned BF16 [N, K] with N % ", kSplitKTileN, " == 0");
  if (weight.device < 0) return detail::concat("unpooler shard ", weight.describe(), ": needs device memory");
  if (n > (1 << 30) || k > (1 << 30)) return detail::concat("unpooler shard ", weight.describe(), " too large");
  return std::nullopt;
}

}  // namespace

std::optional<std::string> Unpooler::unsupported(const TensorRef& weight, const SplitKTactic& tactic) {
  if (auto why = shard_unsupported(weight)) return why;
  return launch_unsupported(static_cast<int>(weight.shape[0]), static_cast<int>(weight.shape[1]), tactic);
}

std::optional<std::string> Unpooler::unsupported(const TensorRef& weight, const OnchipTactic& tactic) {
  if (auto why = shard_unsupported(weight)) return why;
  return onchip_unsupported(static_cast<int>(weight.shape[0]), static_cast<int>(weight.shape[1]), tactic);
}

std::optional<std::string> Unpooler::unsupported(const TensorRef& weight) {
  if (weight.ndim != 2) return unsupported(weight, SplitKTactic{});
  const int n = static_cast<int>(weight.shape[0]), k = static_cast<int>(weight.shape[1]);
  bool splitk = false;
  for (int m = 1; m <= kMaxBatch; ++m) {
    if (unpooler_engine(n, k, m) != GemmEngine::onchip_mma) {
      splitk = true;
    } else if (auto why = unsupported(weight, spark_decode::onchip_tactic(PlanOp::unpooler, n, k, m))) {
      return why;
    }
  }
  if (splitk) return unsupported(weight, unpooler_tactic(n, k));
  return std::nullopt;
}

Unpooler::Unpooler(const TensorRef& weight, Options options)
    : weight_(weight.data), n_(0), k_(0), device_(weight.device), enable_pdl_(options.enable_pdl) {
  if (weight.ndim == 2) {
    n_ = static_cast<int>(weight.shape[0]);
    k_ = static_cast<int>(weight.shape[1]);
  }
  if (options.engine)
    SPARK_CHECK(*options.engine == GemmEngine::splitk_mma || *options.engine == GemmEngine::onchip_mma,
                "the unpooler runs splitk_mma or onchip_mma, not ", engine_name(*options.engine));
  bool splitk = false, onchip = false;
  for (int m = 1; m <= kMaxBatch; ++m) {
    engine_of_[m - 1] = options.engine ? *options.engine : unpooler_engine(n_, k_, m);
    (engine_of_[m - 1] == GemmEngine::onchip_mma ? onchip : splitk) = true;
  }
  tactic_ = options.tactic ? *options.tactic : unpooler_tactic(n_, k_);
  for (int m = 1; m <= kMaxBatch; ++m) {
    onchip_[m - 1] = options.onchip ? *options.onchip : spark_decode::onchip_tactic(PlanOp::unpooler, n_, k_, m);
    if (engine_of_[m - 1] == GemmEngine::onchip_mma)
      if (auto reason = unsupported(weight, onchip_[m - 1])) throw InvalidArgument(*reason);
  }
  if (splitk)
    if (auto reason = unsupported(weight, tactic_)) throw InvalidArgument(*reason);
  mailbox_ = options.mailbox;
  if (mailbox_) {
    SPARK_CHECK(mailbox_->width() == n_, "mailbox width ", mailbox_->width(), " != unpooler N ", n_);
    SPARK_CHECK(mailbox_->device() == device_, "the mailbox is on cuda:", mailbox_->device(),
                ", the unpooler weight on cuda:", device_);
    max_m_ = std::min(kMaxBatch, mailbox_->capacity());
    enable_pdl_ = enable_pdl_ && !mailbox_->shares_device();  // see LamportMailbox::shares_device
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
  // Each engine prepares the kernels of the rows it serves.
  std::vector<int> splitk_rows, onchip_rows;
  for (int m : rows) (engine(m) == GemmEngine::onchip_mma ? onchip_rows : splitk_rows).push_back(m);
  if (onchip)
    onchip_engine_ = std::make_unique<engines::OnchipMma>(weight_, n_, k_, device_, onchip_, enable_pdl_, onchip_rows);
  if (splitk)
    engine_ = std::make_unique<engines::SplitKMma>(weight_, n_, k_, device_, tactic_, enable_pdl_, splitk_rows);
}

std::string Unpooler::describe() const {
  // "engine tactic", and " at m a..b" per engine and tactic where there are
  // two.
  std::string text;
  const auto same = [&](int a, int b) {  // m = a and m = b run alike
    return engine_of_[a - 1] == engine_of_[b - 1] &&
           (engine_of_[a - 1] != GemmEngine::onchip_mma || onchip_[a - 1] == onchip_[b - 1]);
  };
  for (int m = 1; m <= kMaxBatch;) {
    int last = m;
    while (last < kMaxBatch && same(last + 1, m)) ++last;
    const bool onchip = engine_of_[m - 1] == GemmEngine::onchip_mma;
    if (!text.empty()) text += "; ";
    text += std::string(engine_name(engine_of_[m - 1])) + " " +
            (onchip ? onchip_[m - 1].to_string() : tactic_.to_string());
    if (m > 1 || last < kMaxBatch) text += " at m " + std::to_string(m) + ".." + std::to_string(last);
    m = last + 1;
  }
  return text;
}

Unpooler::~Unpooler() = default;
Unpooler::Unpooler(Unpooler&&) noexcept = default;
Unpooler& Unpooler::operator=(Unpooler&&) noexcept = default;

Unpooler Unpooler::from_moe(const TensorRef& full_weight, int tp, int rank, Options options) {
  SPARK_CHECK(full_weight.ndim == 2, "unpooler weight must be 2-D, got ", full_weight.describe());
  SPARK_CHECK(tp >= 1 && full_weight.shape[0] % tp == 0, "unpooler weight ", full_weight.describe(),
              " does not split into tp=", tp, " row blocks");
  SPARK_CHECK(rank >= 0 && rank < tp, "rank ", rank, " outside [0, ", tp, ")");
  const int64_t n = full_weight.shape[0] / tp;
  return Unpooler(full_weight.narrow_rows(rank * n, n), std::move(options));
}

bool Unpooler::prepared(int tile, int row_tiles) const {
  SPARK_CHECK((tile == 8 || tile == 16) &&
                  std::find(kSplitKRowTiles.begin(), kSplitKRowTiles.end(), row_tiles) != kSplitKRowTiles.end(),
              "no unpooler kernel for token tile ", tile, " and ", row_tiles, " row tiles (tiles 8, 16; row tiles 1, 2)");
  return (onchip_engine_ && onchip_engine_->prepared(tile, row_tiles)) ||
         (engine_ && engine_->prepared(tile, row_tiles));
}

void Unpooler::run(const void* x, void* out, int m, cudaStream_t stream) {
  SPARK_CHECK(m >= 1 && m <= max_m_, "x [", m, ", ", k_, "]: needs [1..", max_m_, ", ", k_, "]");
  SPARK_CHECK(detail::aligned(x, 16) && detail::aligned(out, 16), "x and out must be non-null 16-byte aligned BF16");
  const size_t out_bytes = size_t(m) * n_ * 2, x_bytes = size_t(m) * k_ * 2;
  detail::require_disjoint(out, out_bytes, x, x_bytes, "out may not overlap x");
  detail::require_disjoint(out, out_bytes, weight_, size_t(n_) * k_ * 2, "out may not overlap the weight");
  if (mailbox_) {
    const void* mb = mailbox_->memory().local();
    const size_t mb_bytes = mailbox_->memory().bytes();
    detail::require_disjoint(out, out_bytes, mb, mb_bytes, "out may not overlap the mailbox");
    detail::require_disjoint(x, x_bytes, mb, mb_bytes, "x may not overlap the mailbox");
  }
  if (ticket_) detail::require_disjoint(out, out_bytes, ticket_, sizeof(int32_t), "out may not overlap the ticket");
  const bool onchip = engine(m) == GemmEngine::onchip_mma;
  const int tile = onchip ? onchip_[m - 1].token_tile[m - 1] : tactic_.token_tile[m - 1];
  const int row_tiles = onchip ? onchip_[m - 1].row_tiles[m - 1] : tactic_.row_tiles[m - 1];
  if (onchip ? !onchip_engine_->prepared(m) : !engine_->prepared(tile, row_tiles)) {
    SPARK_CHECK(!detail::is_capturing(stream), "the kernel for m=", m, " (token tile ", tile, ", ", row_tiles,
                " row tiles) was not prepared at construction (rows), and cannot be under CUDA graph capture");
    detail::DeviceGuard guard(device_);
    if (onchip)
      onchip_engine_->prepare(m);
    else
      engine_->prepare(tile, row_tiles);
  }
  detail::require_current_device(device_, "the unpooler");
  if (mailbox_) mailbox_->check();
  const MailboxView* into = mailbox_ ? &mailbox_->view() : nullptr;
  if (onchip)
    onchip_engine_->launch(x, out, m, into, ticket_, stream);
  else
    engine_->launch(x, out, m, into, ticket_, stream);
  if (mailbox_) mailbox_->publish_enqueued();
}

void Unpooler::run(const TensorRef& x, const TensorRef& out, cudaStream_t stream) {
  const int m = x.ndim == 2 ? static_cast<int>(x.shape[0]) : 0;
  SPARK_CHECK(x.ndim == 2 && m >= 1 && m <= max_m_ && x.shape[1] == k_, "x ", x.describe(), ": needs [1..", max_m_,
              ", ", k_, "]");
  SPARK_CHECK(out.ndim == 2 && out.shape[0] == m && out.shape[1] == n_, "out ", out.describe(), " != [", m, ", ", n_,
              "]");
  for (const TensorRef* t : {&x, &out})
    SPARK_CHECK(t->dtype == DType::bf16 && t->is_contiguous() && t->is_aligned(16),
                "x and out must be contiguous 16-byte aligned BF16, got ", t->describe());
  SPARK_CHECK(x.device == device_ && out.device == device_, "x and out must be on cuda:", device_, ", got ",
              x.describe(), " and ", out.describe());
  run(x.data, out.data, m, stream);
}

}  // namespace spark_decode
