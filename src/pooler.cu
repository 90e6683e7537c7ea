// The Pooler: construction (collective), the plan of every batch, and
// project / publish / gather / run / warm_up.
#include <algorithm>
#include <map>
#include <set>

#include "cuda_utils.h"
#include "launchers.h"
#include "spark_decode/error.h"
#include "spark_decode/pooler.h"
#include "validate.h"

namespace spark_decode {
namespace {

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// The rows b of an activation x: contiguous 16-byte aligned BF16 [b, hidden]
// on the Pooler's device (checked; b itself is checked against the batches
// by the call).
int checked_rows(const TensorRef& x, int hidden, int device) {
  SPARK_CHECK(x.ndim == 2 && x.shape[1] == hidden && x.dtype == DType::bf16 && x.is_contiguous() &&
                  x.is_aligned(16) && x.device == device,
              "pooler: x ", x.describe(), " must be contiguous 16-byte aligned BF16 [b, ", hidden, "] on cuda:",
              device);
  return static_cast<int>(x.shape[0]);
}

}  // namespace

Pooler::Pooler(Group& group, int tp, int rank, int device, std::vector<PoolerLayer> layers,
               std::vector<int> batches, int capacity, bool enable_pdl, Options options)
    : group_(&group), tp_(tp), rank_(rank), device_(device), capacity_(capacity), enable_pdl_(enable_pdl),
      layers_(std::move(layers)) {
  // This rank's arguments, agreed on before the mailbox's collective
  // construction: a rank that refuses alone must not leave its peers there.
  collective_step(group, "pooler: construction", [&] {
    SPARK_CHECK(!batches.empty(), "batches must lie in [1, ", capacity, "]");
    const auto [lo, hi] = std::minmax_element(batches.begin(), batches.end());
    SPARK_CHECK(1 <= *lo && *hi <= capacity && *hi <= kMaxBatch, "batches must lie in [1, ",
                std::min(capacity, kMaxBatch), "]");
    SPARK_CHECK(std::find(std::begin(kTensorParallelSizes), std::end(kTensorParallelSizes), tp) !=
                    std::end(kTensorParallelSizes),
                "no pooler GEMM shape for TP", tp);
    SPARK_CHECK(!layers_.empty(), "the pooler needs at least one layer");
    hidden_ = layers_[0].weight.ndim == 2 ? static_cast<int>(layers_[0].weight.shape[1]) : 0;
    pooled_ = layers_[0].norm_weight.ndim == 1 ? static_cast<int>(layers_[0].norm_weight.shape[0]) : 0;
    SPARK_CHECK(pooled_ > 0 && pooled_ % tp == 0 && (pooled_ / tp) % kNvfp4Block == 0, "pooler: P = ", pooled_,
                " (the norm weight's length) must split into tp = ", tp, " blocks of a multiple of ", kNvfp4Block,
                " columns");
    if (auto reason = ExpertNorm::cols_unsupported(pooled_)) throw InvalidArgument("pooler: " + *reason);
    const int shard = pooled_ / tp;
    for (const auto& layer : layers_) {
      const TensorRef& w = layer.weight;
      SPARK_CHECK(w.ndim == 2 && w.shape[0] == shard && w.shape[1] == hidden_ && w.dtype == DType::bf16 &&
                      w.is_contiguous() && w.is_aligned(16) && w.device == device,
                  "layer weights must be contiguous [", shard, ", ", hidden_, "] (BF16, 16-byte aligned, on cuda:",
                  device, "; got ", w.describe(), ")");
      const TensorRef& nw = layer.norm_weight;
      SPARK_CHECK(nw.ndim == 1 && nw.shape[0] == pooled_ && nw.dtype == DType::bf16 && nw.is_contiguous() &&
                      nw.is_aligned(16) && nw.device == device,
                  "pre_expert_norm must apply a [P] BF16 weight after the norm (need contiguous 16-byte aligned [",
                  pooled_, "] BF16 on cuda:", device, ", got ", nw.describe(), ")");
      SPARK_CHECK(layer.eps >= 0.0f, "pre_expert_norm eps ", layer.eps, " must be >= 0");
      if (layer.global_scale) {
        const TensorRef& gs = *layer.global_scale;
        SPARK_CHECK(gs.numel() == 1 && gs.dtype == DType::f32 && gs.is_aligned(4) && gs.device == device,
                    "the NVFP4 input global scale must be one FP32 value (4-byte aligned, on cuda:", device,
                    "; got ", gs.describe(), ")");
      }
    }
    std::set<int> unique(batches.begin(), batches.end());
    batches_.assign(unique.begin(), unique.end());
    detail::require_sm90(device, "the pooler");
  });
  detail::DeviceGuard guard(device);
  const int shard = pooled_ / tp;

  LamportMailbox::Options mo;
  mo.spin_timeout_s = options.spin_timeout_s;
  mo.guard_bytes = options.mailbox_guard_bytes;
  // Collective: returns once every rank's copy is initialised.
  mailbox_ = std::make_unique<LamportMailbox>(group, tp, rank, capacity, shard, device, mo);

  // The rest is per rank (kernels, scratch) and may fail on one rank alone
  // (out of memory): agreed on too, so that no peer waits in warm_up.
  auto prepare = [&] {
    PoolerGemm::Options go;
    go.enable_pdl = enable_pdl;
    go.batches = batches_;
    go.force = options.gemm;
    go.mailbox = mailbox_.get();  // run() publishes from the GEMM's epilogue
    gemms_.reserve(layers_.size());
    for (const auto& layer : layers_) gemms_.emplace_back(layer.weight, tp, go);
    detail::load_norm_kernels();  // now, not under capture
    // The plan of every batch: the table's row where the shape is the
    // model's, Options' overrides on top.
    const bool model = model_tp(PlanOp::pooler, shard, hidden_) == tp;
    steps_.assign(kMaxBatch, std::nullopt);
    for (int b : batches_) {
      PoolerStep st;
      st.gemm = gemms_[0].choice(b);
      if (const PlanRow* row = model ? plan_row(PlanOp::pooler, tp, b) : nullptr) {
        st.publish = row->publish;
        st.consumer = row->consumer;
      }
      if (options.consumer_launches_early)
        st.consumer = *options.consumer_launches_early ? ConsumerLaunch::early : ConsumerLaunch::late;
      steps_[b - 1] = st;
    }

    // Scratch, 256-byte aligned pieces of one allocation.
    const size_t shard_bytes = round_up(size_t(capacity) * shard * 2, 256);
    const size_t packed_bytes = round_up(size_t(capacity) * pooled_ / 2, 256);
    const size_t scales_bytes = round_up(size_t(capacity) * pooled_ / kNvfp4Block, 256);
    const size_t rows_bytes = round_up(size_t(capacity) * pooled_ * 2, 256);
    const size_t scratch_bytes = shard_bytes + packed_bytes + scales_bytes + 2 * rows_bytes;
    CUDA_CHECK(cudaMalloc(&scratch_, scratch_bytes));
    char* p = static_cast<char*>(scratch_);
    shard_ = p;
    packed_ = p + shard_bytes;
    scales_ = p + shard_bytes + packed_bytes;
    rows_ = p + shard_bytes + packed_bytes + scales_bytes;
    normed_ = p + shard_bytes + packed_bytes + scales_bytes + rows_bytes;
    CUDA_CHECK(cudaMemset(scratch_, 0, scratch_bytes));
    CUDA_CHECK(cudaDeviceSynchronize());
  };
  try {
    collective_step(group, "pooler: preparation", prepare);
  } catch (...) {
    // A constructor that throws runs no destructor: free the scratch here.
    if (scratch_) cudaFree(scratch_);
    scratch_ = nullptr;
    throw;
  }
}

Pooler::~Pooler() {
  if (scratch_) {
    detail::QuietDeviceScope scope(device_);
    cudaFree(scratch_);
  }
}

const PoolerStep& Pooler::step(int b) const {
  SPARK_CHECK(b >= 1 && b <= kMaxBatch && steps_[b - 1], "pooler: b = ", b,
              " is not one of the batches given at construction");
  return *steps_[b - 1];
}

const PoolerStep& Pooler::check_call(int layer, int b, const char* what) const {
  SPARK_CHECK(layer >= 0 && layer < static_cast<int>(layers_.size()), "pooler ", what, ": layer ", layer,
              " outside [0, ", layers_.size(), ")");
  SPARK_CHECK(b >= 1 && b <= kMaxBatch && steps_[b - 1], "pooler ", what, ": b = ", b,
              " is not one of the batches given at construction");
  detail::require_current_device(device_, "the pooler");
  return *steps_[b - 1];
}

TensorRef Pooler::project(int layer, const void* x, int b, cudaStream_t stream) {
  check_call(layer, b, "project");
  gemms_[layer].check_operands(x, shard_, b);
  gemms_[layer].launch(x, shard_, b, /*publish=*/false, stream);
  return TensorRef::contiguous(shard_, DType::bf16, {b, shard_width()}, device_);
}

TensorRef Pooler::project(int layer, const TensorRef& x, cudaStream_t stream) {
  return project(layer, x.data, checked_rows(x, hidden_, device_), stream);
}

void Pooler::publish(int b, cudaStream_t stream) {
  SPARK_CHECK(b >= 1 && b <= kMaxBatch && steps_[b - 1], "pooler publish: b = ", b,
              " is not one of the batches given at construction");
  detail::require_current_device(device_, "the pooler");
  detail::launch_mailbox_publish(mailbox_->view(), shard_, b, LamportMailbox::PublishOptions{}.threads, enable_pdl_,
                                 stream);
}

// The consumer of (layer, b): the fused gather + norm + NVFP4 for an NVFP4
// layer, the plain gather then pre_expert_norm for an edge layer.
void Pooler::consume(int layer, int b, const PoolerStep& st, cudaStream_t stream) {
  const PoolerLayer& spec = layers_[layer];
  const MailboxView& mb = mailbox_->view();
  if (spec.global_scale) {
    detail::launch_gather_norm_nvfp4(mb, spec.norm_weight.data, static_cast<const float*>(spec.global_scale->data),
                                     spec.eps, spec.gain_center, packed_, scales_, b, enable_pdl_,
                                     st.consumer == ConsumerLaunch::early, stream);
    return;
  }
  detail::launch_mailbox_gather(mb, rows_, b, LamportMailbox::GatherOptions{}.threads, enable_pdl_, stream);
  detail::launch_expert_norm(rows_, spec.norm_weight.data, normed_, b, pooled_, spec.eps, spec.gain_center,
                             enable_pdl_, stream);
}

PoolerOutput Pooler::outputs(int layer, int b) const {
  PoolerOutput out;
  if (layers_[layer].global_scale) {
    out.nvfp4 = true;
    out.a = TensorRef::contiguous(packed_, DType::u8, {b, pooled_ / 2}, device_);
    out.a_sf = TensorRef::contiguous(scales_, DType::e4m3, {b, pooled_ / kNvfp4Block}, device_);
  } else {
    out.normed = TensorRef::contiguous(normed_, DType::bf16, {b, pooled_}, device_);
  }
  return out;
}

PoolerOutput Pooler::gather(int layer, int b, cudaStream_t stream) {
  consume(layer, b, check_call(layer, b, "gather"), stream);
  return outputs(layer, b);
}

// project + publish + gather: one lookup of b's plan and one validation,
// then two or three kernels (the publish from the GEMM's epilogue or by the
// publish kernel, as the plan says).
PoolerOutput Pooler::run(int layer, const void* x, int b, cudaStream_t stream) {
  const PoolerStep& st = check_call(layer, b, "run");
  const PoolerGemm& gemm = gemms_[layer];
  gemm.check_operands(x, shard_, b);
  const bool epilogue = st.publish == PublishRoute::epilogue;
  gemm.launch(x, shard_, b, /*publish=*/epilogue, stream);
  if (!epilogue)
    detail::launch_mailbox_publish(mailbox_->view(), shard_, b, LamportMailbox::PublishOptions{}.threads,
                                   enable_pdl_, stream);
  consume(layer, b, st, stream);
  return outputs(layer, b);
}

PoolerOutput Pooler::run(int layer, const TensorRef& x, cudaStream_t stream) {
  return run(layer, x.data, checked_rows(x, hidden_, device_), stream);
}

void Pooler::warm_up(cudaStream_t stream) {
  SPARK_CHECK(!detail::is_capturing(stream), "pooler warm_up cannot run under CUDA graph capture");
  detail::DeviceGuard guard(device_);
  // No rank publishes before every rank has prepared its kernels: the
  // gather's poll traps after the spin timeout, which a peer's setup could
  // exceed.
  group_->barrier();
  // One layer per form: BF16 edge layers, and NVFP4 layers per (eps,
  // gain_center) as the consumers are specialised.
  std::map<std::pair<int, std::pair<float, float>>, int> forms;
  for (int i = 0; i < static_cast<int>(layers_.size()); ++i) {
    const auto& l = layers_[i];
    const std::pair<int, std::pair<float, float>> key =
        l.global_scale ? std::make_pair(1, std::make_pair(l.eps, l.gain_center))
                       : std::make_pair(0, std::make_pair(0.0f, 0.0f));
    forms.emplace(key, i);
  }
  void* x = nullptr;
  CUDA_CHECK(cudaMalloc(&x, size_t(capacity_) * hidden_ * 2));
  try {
    CUDA_CHECK(cudaMemsetAsync(x, 0, size_t(capacity_) * hidden_ * 2, stream));
    for (int b : batches_)
      for (const auto& [key, index] : forms) run(index, x, b, stream);
    mailbox_->synchronize(stream);
  } catch (...) {
    cudaFree(x);
    throw;
  }
  CUDA_CHECK(cudaFree(x));
}

}  // namespace spark_decode
