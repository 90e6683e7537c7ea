// The Pooler: the workspace (collective), the layers (attached per rank), the
// plan of every batch, and project / publish / gather / run / warm_up.
#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <tuple>

#include "cuda_utils.h"
#include "kernels/mailbox/protocol.h"
#include "launchers.h"
#include "spark_decode/error.h"
#include "spark_decode/expert_norm.h"
#include "spark_decode/pooler.h"
#include "validate.h"

namespace spark_decode {
namespace {

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// The rows b of an activation x: contiguous 16-byte aligned BF16 [b, hidden]
// on the Pooler's device (checked; b itself is checked against the batches
// by the call).
int checked_rows(const TensorRef& x, int hidden, int device) {
  detail::require_matrix(x, DType::bf16, -1, hidden, device, "pooler: x ", x.describe(),
                         " must be contiguous 16-byte aligned BF16 [b, ", hidden, "] on cuda:", device);
  return static_cast<int>(x.shape[0]);
}

// The byte range a view covers (contiguous views only).
std::pair<const void*, size_t> range_of(const TensorRef& t) {
  return {t.data, size_t(t.numel()) * dtype_size(t.dtype)};
}

}  // namespace

const char* format_name(OutputFormat format) {
  switch (format) {
    case OutputFormat::bf16: return "bf16";
    case OutputFormat::nvfp4: return "nvfp4";
    case OutputFormat::nvfp4_swizzled: return "nvfp4_swizzled";
  }
  return "?";
}

PoolerOutputSpec pooler_output_spec(OutputFormat format, int b, int pooled) {
  PoolerOutputSpec s;
  if (format == OutputFormat::bf16) {
    s.normed = TensorRef::contiguous(nullptr, DType::bf16, {b, pooled}, -1);
    return s;
  }
  const ScaleLayout layout = format == OutputFormat::nvfp4 ? ScaleLayout::linear : ScaleLayout::swizzled;
  s.a = TensorRef::contiguous(nullptr, DType::u8, {b, pooled / 2}, -1);
  s.a_sf = TensorRef::contiguous(nullptr, DType::e4m3,
                                 {nvfp4_scale_rows(b, layout), nvfp4_scale_cols(pooled, layout)}, -1);
  return s;
}

PoolerOutput pooler_output_in(OutputFormat format, int b, int pooled, void* normed, void* a, void* a_sf,
                              int device) {
  const PoolerOutputSpec spec = pooler_output_spec(format, b, pooled);
  auto over = [device](TensorRef t, void* data) {
    t.data = data;
    t.device = device;
    return t;
  };
  PoolerOutput o;
  o.format = format;
  if (format == OutputFormat::bf16) {
    o.normed = over(spec.normed, normed);
  } else {
    o.a = over(spec.a, a);
    o.a_sf = over(spec.a_sf, a_sf);
  }
  return o;
}

void gather_norm(LamportMailbox& mb, const void* norm_weight, const float* global_scale, float eps,
                 float gain_center, const PoolerOutput& out, int b, cudaStream_t stream, bool enable_pdl,
                 bool launch_next_early) {
  mb.check();
  const int cols = mb.tp() * mb.width();
  SPARK_CHECK(b >= 1 && b <= mb.capacity(), "gather_norm: b = ", b, " outside [1, ", mb.capacity(),
              "] (the mailbox capacity)");
  SPARK_CHECK(mb.width() % kNvfp4Block == 0, "gather_norm: mailbox width ", mb.width(), " must be a multiple of ",
              kNvfp4Block, " (an NVFP4 block may not straddle two ranks)");
  if (auto reason = ExpertNorm::cols_unsupported(cols)) throw InvalidArgument("gather_norm: " + *reason);
  SPARK_CHECK(detail::aligned(norm_weight, 16), "gather_norm: norm_weight must be a 16-byte aligned device pointer");
  SPARK_CHECK(eps >= 0.0f, "gather_norm: eps ", eps, " must be >= 0");
  SPARK_CHECK(out.format != OutputFormat::nvfp4_swizzled || b <= 32, "gather_norm: b = ", b,
              " above 32 with swizzled scales (its rows would share 16-byte pieces of the 128x4 tiles)");
  const PoolerOutputSpec spec = pooler_output_spec(out.format, b, cols);
  std::vector<std::pair<const void*, size_t>> outputs;
  if (out.format == OutputFormat::bf16) {
    SPARK_CHECK(detail::aligned(out.normed.data, 16), "gather_norm: normed must be a 16-byte aligned device pointer");
    outputs.push_back({out.normed.data, size_t(b) * cols * 2});
  } else {
    const int sf_align = out.format == OutputFormat::nvfp4_swizzled ? 16 : 4;
    SPARK_CHECK(detail::aligned(global_scale, 4) && detail::aligned(out.a.data, 16) &&
                    detail::aligned(out.a_sf.data, sf_align),
                "gather_norm: a must be 16-byte aligned, global_scale 4-byte aligned and a_sf ", sf_align,
                "-byte aligned, all non-null device pointers");
    outputs.push_back({out.a.data, size_t(b) * cols / 2});
    outputs.push_back({out.a_sf.data, size_t(spec.a_sf.numel())});
  }
  for (const auto& [p, bytes] : outputs) {
    detail::require_disjoint(p, bytes, mb.memory().local(), mb.memory().bytes(),
                             "gather_norm: outputs may not overlap the mailbox");
    detail::require_disjoint(p, bytes, norm_weight, size_t(cols) * 2,
                             "gather_norm: outputs may not overlap the norm weight");
    if (out.format != OutputFormat::bf16)
      detail::require_disjoint(p, bytes, global_scale, 4, "gather_norm: outputs may not overlap the global scale");
  }
  if (outputs.size() == 2)
    detail::require_disjoint(outputs[0].first, outputs[0].second, outputs[1].first, outputs[1].second,
                             "gather_norm: a and a_sf may not overlap");
  detail::require_current_device(mb.device(), "gather_norm");
  mb.before_consume(stream);
  detail::launch_gather_norm(mb.view(), out.format, norm_weight, global_scale, eps, gain_center, out.normed.data,
                             out.a.data, out.a_sf.data, b, enable_pdl && !mb.shares_device(),
                             launch_next_early && !mb.shares_device(), /*pad_before_wait=*/false, stream);
}

// One attached layer: its views and its GEMM (prepared for every batch).
struct Pooler::Layer {
  PoolerLayer spec;
  OutputFormat format;
  PoolerGemm gemm;
};

void Pooler::build(Group& group, const PoolerConfig& c) {
  // This rank's arguments, agreed on before the mailbox's collective
  // construction: a rank that refuses alone must not leave its peers there.
  collective_step(group, "pooler: construction", [&] {
    SPARK_CHECK(!c.batches.empty(), "batches must lie in [1, ", c.capacity, "]");
    const auto [lo, hi] = std::minmax_element(c.batches.begin(), c.batches.end());
    SPARK_CHECK(1 <= *lo && *hi <= c.capacity && *hi <= kMaxBatch, "batches must lie in [1, ",
                std::min(c.capacity, kMaxBatch), "]");
    SPARK_CHECK(std::find(std::begin(kTensorParallelSizes), std::end(kTensorParallelSizes), c.tp) !=
                    std::end(kTensorParallelSizes),
                "no pooler GEMM shape for TP", c.tp);
    SPARK_CHECK(c.pooled > 0 && c.pooled % c.tp == 0 && (c.pooled / c.tp) % kNvfp4Block == 0, "pooler: P = ",
                c.pooled, " (the norm weight's length) must split into tp = ", c.tp, " blocks of a multiple of ",
                kNvfp4Block, " columns");
    if (auto reason = ExpertNorm::cols_unsupported(c.pooled)) throw InvalidArgument("pooler: " + *reason);
    SPARK_CHECK(c.hidden > 0, "pooler: H = ", c.hidden, " must be positive");
    std::set<int> unique(c.batches.begin(), c.batches.end());
    batches_.assign(unique.begin(), unique.end());
    detail::require_sm90(c.device, "the pooler");
  });
  detail::DeviceGuard guard(device_);
  const int shard = pooled_ / tp_;
  LamportMailbox::Options mo;
  mo.spin_timeout_s = options_.spin_timeout_s;
  mo.on_failure = options_.on_failure;
  mo.guard_bytes = options_.mailbox_guard_bytes;
  // Collective: returns once every rank's copy is initialised.
  mailbox_ = std::make_unique<LamportMailbox>(group, tp_, rank_, capacity_, shard, device_, mo);
  enable_pdl_ = enable_pdl_ && !mailbox_->shares_device();  // see LamportMailbox::shares_device

  // The rest is per rank (kernels, scratch) and may fail on one rank alone
  // (out of memory): agreed on too, so that no peer waits in warm_up.
  auto prepare = [&] {
    detail::load_norm_kernels();  // now, not under capture
    // The plan of every batch: the table's row where the shape is the
    // model's, Options' overrides on top.
    const bool model = model_tp(PlanOp::pooler, shard, hidden_) == tp_;
    steps_.assign(kMaxBatch, std::nullopt);
    for (int b : batches_) {
      PoolerStep st;
      st.gemm = options_.gemm ? *options_.gemm : pooler_gemm_choice(shard, hidden_, tp_, b);
      if (const PlanRow* row = model ? plan_row(PlanOp::pooler, tp_, b) : nullptr) {
        st.publish = row->publish;
        st.consumer = row->consumer;
      }
      if (options_.consumer_launches_early)
        st.consumer = *options_.consumer_launches_early ? ConsumerLaunch::early : ConsumerLaunch::late;
      steps_[b - 1] = st;
    }
    // Scratch, 256-byte aligned pieces of one allocation; the scales sized
    // for the swizzled layout (128 padded rows).
    const PoolerOutputSpec most = pooler_output_spec(OutputFormat::nvfp4_swizzled, capacity_, pooled_);
    const size_t shard_bytes = round_up(size_t(capacity_) * shard * 2, 256);
    const size_t packed_bytes = round_up(size_t(capacity_) * pooled_ / 2, 256);
    const size_t scales_bytes = round_up(size_t(most.a_sf.numel()), 256);
    const size_t normed_bytes = round_up(size_t(capacity_) * pooled_ * 2, 256);
    CUDA_CHECK(cudaMalloc(&scratch_, shard_bytes + packed_bytes + scales_bytes + normed_bytes));
    char* p = static_cast<char*>(scratch_);
    shard_ = p;
    packed_ = p + shard_bytes;
    scales_ = p + shard_bytes + packed_bytes;
    normed_ = p + shard_bytes + packed_bytes + scales_bytes;
    CUDA_CHECK(cudaMemset(scratch_, 0, shard_bytes + packed_bytes + scales_bytes + normed_bytes));
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

Pooler::Pooler(Group& group, const PoolerConfig& config)
    : group_(&group), tp_(config.tp), rank_(config.rank), device_(config.device), capacity_(config.capacity),
      hidden_(config.hidden), pooled_(config.pooled), enable_pdl_(config.enable_pdl), options_(config.options) {
  build(group, config);
}

Pooler::Pooler(Group& group, int tp, int rank, int device, std::vector<PoolerLayer> layers, std::vector<int> batches,
               int capacity, bool enable_pdl, Options options)
    : group_(&group), tp_(tp), rank_(rank), device_(device), capacity_(capacity), enable_pdl_(enable_pdl),
      options_(options) {
  PoolerConfig config;
  config.tp = tp;
  config.rank = rank;
  config.device = device;
  config.batches = std::move(batches);
  config.capacity = capacity;
  config.enable_pdl = enable_pdl;
  config.options = options;
  // H and P from the first layer, agreed on with the layers' own checks.
  collective_step(group, "pooler: layers", [&] {
    SPARK_CHECK(!layers.empty(), "the pooler needs at least one layer");
    hidden_ = config.hidden = layers[0].weight.ndim == 2 ? static_cast<int>(layers[0].weight.shape[1]) : 0;
    pooled_ = config.pooled = layers[0].norm_weight.ndim == 1 ? static_cast<int>(layers[0].norm_weight.shape[0]) : 0;
  });
  build(group, config);
  try {
    collective_step(group, "pooler: attaching the layers", [&] {
      for (int i = 0; i < static_cast<int>(layers.size()); ++i) attach(i, layers[i]);
    });
  } catch (...) {
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

void Pooler::attach(int index, const PoolerLayer& layer) {
  SPARK_CHECK(index >= 0 && index < (1 << 20), "pooler attach: layer index ", index, " out of range");
  const int shard = pooled_ / tp_;
  const TensorRef& w = layer.weight;
  SPARK_CHECK(detail::is_matrix(w, DType::bf16, shard, hidden_, device_) && w.data != nullptr,
              "layer weights must be contiguous [", shard, ", ", hidden_, "] (BF16, 16-byte aligned, on cuda:", device_,
              "; got ", w.describe(), ")");
  const TensorRef& nw = layer.norm_weight;
  SPARK_CHECK(nw.ndim == 1 && nw.shape[0] == pooled_ && nw.dtype == DType::bf16 && nw.is_contiguous() &&
                  nw.is_aligned(16) && nw.data != nullptr && nw.device == device_,
              "pre_expert_norm must apply a [P] BF16 weight after the norm (need contiguous 16-byte aligned [", pooled_,
              "] BF16 on cuda:", device_, ", got ", nw.describe(), ")");
  SPARK_CHECK(layer.eps >= 0.0f, "pre_expert_norm eps ", layer.eps, " must be >= 0");
  const OutputFormat format = format_of(layer);
  if (format != OutputFormat::bf16)
    SPARK_CHECK(layer.global_scale.has_value(), "pooler attach: layer ", index, " has format ", format_name(format),
                ", which needs the NVFP4 input global scale (none given)");
  if (layer.global_scale) {
    const TensorRef& gs = *layer.global_scale;
    SPARK_CHECK(gs.numel() == 1 && gs.dtype == DType::f32 && gs.is_aligned(4) && gs.data != nullptr &&
                    gs.device == device_,
                "the NVFP4 input global scale must be one FP32 value (4-byte aligned, on cuda:", device_, "; got ",
                gs.describe(), ")");
  }
  detail::DeviceGuard guard(device_);
  PoolerGemm::Options go;
  go.enable_pdl = enable_pdl_;
  go.batches = batches_;
  go.force = options_.gemm;
  go.mailbox = mailbox_.get();  // run() publishes from the GEMM's epilogue
  auto attached = std::make_unique<Layer>(Layer{layer, format, PoolerGemm(w, tp_, go)});
  if (index >= static_cast<int>(layers_.size())) layers_.resize(index + 1);
  layers_[index] = std::move(attached);
}

bool Pooler::attached(int index) const {
  return index >= 0 && index < static_cast<int>(layers_.size()) && layers_[index] != nullptr;
}

OutputFormat Pooler::format(int layer) const {
  SPARK_CHECK(attached(layer), "pooler: layer ", layer, " is not attached");
  return layers_[layer]->format;
}

PoolerGemmChoice Pooler::gemm_choice(int layer, int b) const {
  SPARK_CHECK(attached(layer), "pooler: layer ", layer, " is not attached");
  return layers_[layer]->gemm.choice(b);
}

const PoolerStep& Pooler::step(int b) const {
  SPARK_CHECK(b >= 1 && b <= kMaxBatch && steps_[b - 1], "pooler: b = ", b,
              " is not one of the batches given at construction");
  return *steps_[b - 1];
}

const PoolerStep& Pooler::check_call(int layer, int b, const char* what) const {
  SPARK_CHECK(layer >= 0 && layer < static_cast<int>(layers_.size()), "pooler ", what, ": layer ", layer,
              " outside [0, ", layers_.size(), ")");
  SPARK_CHECK(layers_[layer] != nullptr, "pooler ", what, ": layer ", layer, " is not attached");
  SPARK_CHECK(b >= 1 && b <= kMaxBatch && steps_[b - 1], "pooler ", what, ": b = ", b,
              " is not one of the batches given at construction");
  detail::require_current_device(device_, "the pooler");
  mailbox_->check();
  return *steps_[b - 1];
}

// A caller's outputs: the layer's format, pooler_output_spec's shapes, on
// the device, overlapping neither each other nor x, the layer's tensors or
// the mailbox.
void Pooler::check_outputs(int layer, int b, const PoolerOutput& out, const void* x) const {
  const Layer& l = *layers_[layer];
  SPARK_CHECK(out.format == l.format, "pooler: outputs of format ", format_name(out.format), " for layer ", layer,
              ", whose format is ", format_name(l.format));
  const PoolerOutputSpec spec = pooler_output_spec(l.format, b, pooled_);
  std::vector<std::pair<const char*, const TensorRef*>> outs;
  if (l.format == OutputFormat::bf16)
    outs = {{"normed", &out.normed}};
  else
    outs = {{"a", &out.a}, {"a_sf", &out.a_sf}};
  for (const auto& [name, t] : outs) {
    const TensorRef& want = std::string(name) == "normed" ? spec.normed : std::string(name) == "a" ? spec.a : spec.a_sf;
    const bool dtype_ok = t->dtype == want.dtype || (want.dtype == DType::e4m3 && t->dtype == DType::u8);
    SPARK_CHECK(t->ndim == 2 && t->shape[0] == want.shape[0] && t->shape[1] == want.shape[1] && dtype_ok &&
                    t->is_contiguous() && t->data != nullptr &&
                    t->is_aligned(want.dtype == DType::e4m3 && l.format == OutputFormat::nvfp4 ? 4 : 16) &&
                    t->device == device_,
                "pooler: output ", name, " ", t->describe(), " must be contiguous aligned ", dtype_name(want.dtype), " [",
                want.shape[0], ", ", want.shape[1], "] on cuda:", device_, " (layer ", layer, ", format ",
                format_name(l.format), ", b = ", b, ")");
  }
  std::vector<std::pair<std::string, std::pair<const void*, size_t>>> inputs = {
      {"x", {x, size_t(b) * hidden_ * 2}},
      {"the layer's weight", range_of(l.spec.weight)},
      {"the layer's norm weight", range_of(l.spec.norm_weight)},
      {"the mailbox", {mailbox_->memory().local(), mailbox_->memory().bytes()}},
      {"the Pooler's scratch", {shard_, size_t(capacity_) * (pooled_ / tp_) * 2}}};
  if (l.spec.global_scale) inputs.push_back({"the layer's global scale", range_of(*l.spec.global_scale)});
  for (size_t i = 0; i < outs.size(); ++i) {
    const auto [p, bytes] = range_of(*outs[i].second);
    for (const auto& [what, r] : inputs)
      detail::require_disjoint(p, bytes, r.first, r.second, "pooler: output ", outs[i].first, " overlaps ", what);
    for (size_t j = 0; j < i; ++j) {
      const auto [q, qbytes] = range_of(*outs[j].second);
      detail::require_disjoint(p, bytes, q, qbytes, "pooler: outputs ", outs[j].first, " and ", outs[i].first,
                               " overlap");
    }
  }
}

TensorRef Pooler::project(int layer, const void* x, int b, cudaStream_t stream) {
  check_call(layer, b, "project");
  layers_[layer]->gemm.check_operands(x, shard_, b);
  layers_[layer]->gemm.launch(x, shard_, b, /*publish=*/false, stream);
  projected_layer_ = layer;
  return TensorRef::contiguous(shard_, DType::bf16, {b, shard_width()}, device_);
}

TensorRef Pooler::project(int layer, const TensorRef& x, cudaStream_t stream) {
  return project(layer, x.data, checked_rows(x, hidden_, device_), stream);
}

// The layer as the mailbox's call tag (MailboxView::tag): every publish and
// consume of a call carries it, so ranks calling different layers fail
// instead of norming each other's projections.
uint32_t Pooler::layer_tag(int layer) { return static_cast<uint32_t>(layer) & mailbox::kMaxTag; }

MailboxView Pooler::tagged_view(int layer) const {
  MailboxView v = mailbox_->view();
  v.tag = layer_tag(layer);
  return v;
}

void Pooler::publish(int b, cudaStream_t stream) {
  mailbox_->check();
  SPARK_CHECK(b >= 1 && b <= kMaxBatch && steps_[b - 1], "pooler publish: b = ", b,
              " is not one of the batches given at construction");
  detail::require_current_device(device_, "the pooler");
  detail::launch_mailbox_publish(tagged_view(projected_layer_), shard_, b, LamportMailbox::PublishOptions{}.threads,
                                 enable_pdl_, stream);
  mailbox_->publish_enqueued();
}

// The consumer of (layer, b) into `out`, in the layer's format. after_own:
// the grid before it is this Pooler's GEMM or publish (run), which lets it
// store the swizzled scales' padding before its wait (gather_norm.cuh,
// pad_before_wait); after a caller's kernels (gather) it may not.
void Pooler::consume(int layer, int b, const PoolerStep& st, const PoolerOutput& out, bool after_own,
                     cudaStream_t stream) {
  const PoolerLayer& spec = layers_[layer]->spec;
  mailbox_->before_consume(stream);
  detail::launch_gather_norm(tagged_view(layer), out.format, spec.norm_weight.data,
                             spec.global_scale ? static_cast<const float*>(spec.global_scale->data) : nullptr,
                             spec.eps, spec.gain_center, out.normed.data, out.a.data, out.a_sf.data, b, enable_pdl_,
                             st.consumer == ConsumerLaunch::early && !mailbox_->shares_device(), after_own, stream);
}

PoolerOutput Pooler::scratch_outputs(int layer, int b) const {
  const OutputFormat format = layers_[layer]->format;
  const PoolerOutputSpec spec = pooler_output_spec(format, b, pooled_);
  PoolerOutput out;
  out.format = format;
  if (format == OutputFormat::bf16) {
    out.normed = TensorRef::contiguous(normed_, DType::bf16, {b, pooled_}, device_);
  } else {
    out.a = TensorRef::contiguous(packed_, DType::u8, {b, pooled_ / 2}, device_);
    out.a_sf = TensorRef::contiguous(scales_, DType::e4m3, {spec.a_sf.shape[0], spec.a_sf.shape[1]}, device_);
  }
  return out;
}

PoolerOutput Pooler::gather(int layer, int b, cudaStream_t stream) {
  const PoolerStep& st = check_call(layer, b, "gather");
  const PoolerOutput out = scratch_outputs(layer, b);
  consume(layer, b, st, out, /*after_own=*/false, stream);
  return out;
}

void Pooler::gather(int layer, int b, const PoolerOutput& out, cudaStream_t stream) {
  const PoolerStep& st = check_call(layer, b, "gather");
  check_outputs(layer, b, out, shard_);
  consume(layer, b, st, out, /*after_own=*/false, stream);
}

// project + publish + gather: one lookup of b's plan and one validation,
// then two or three kernels (the publish from the GEMM's epilogue or by the
// publish kernel, as the plan says).
PoolerOutput Pooler::run(int layer, const void* x, int b, cudaStream_t stream) {
  const PoolerStep& st = check_call(layer, b, "run");
  const PoolerGemm& gemm = layers_[layer]->gemm;
  gemm.check_operands(x, shard_, b);
  const PoolerOutput out = scratch_outputs(layer, b);
  const bool epilogue = st.publish == PublishRoute::epilogue;
  gemm.launch(x, shard_, b, /*publish=*/epilogue, stream, layer_tag(layer));
  if (!epilogue) {
    detail::launch_mailbox_publish(tagged_view(layer), shard_, b, LamportMailbox::PublishOptions{}.threads, enable_pdl_,
                                   stream);
    mailbox_->publish_enqueued();
  }
  consume(layer, b, st, out, /*after_own=*/true, stream);
  return out;
}

PoolerOutput Pooler::run(int layer, const TensorRef& x, cudaStream_t stream) {
  return run(layer, x.data, checked_rows(x, hidden_, device_), stream);
}

void Pooler::run(int layer, const TensorRef& x, const PoolerOutput& out, cudaStream_t stream) {
  const int b = checked_rows(x, hidden_, device_);
  const PoolerStep& st = check_call(layer, b, "run");
  const PoolerGemm& gemm = layers_[layer]->gemm;
  gemm.check_operands(x.data, shard_, b);
  check_outputs(layer, b, out, x.data);
  const bool epilogue = st.publish == PublishRoute::epilogue;
  gemm.launch(x.data, shard_, b, /*publish=*/epilogue, stream, layer_tag(layer));
  if (!epilogue) {
    detail::launch_mailbox_publish(tagged_view(layer), shard_, b, LamportMailbox::PublishOptions{}.threads, enable_pdl_,
                                   stream);
    mailbox_->publish_enqueued();
  }
  consume(layer, b, st, out, /*after_own=*/true, stream);
}

void Pooler::warm_up(cudaStream_t stream) {
  SPARK_CHECK(!detail::is_capturing(stream), "pooler warm_up cannot run under CUDA graph capture");
  detail::DeviceGuard guard(device_);
  // Every rank must have attached the same layers: warm_up runs one layer of
  // each form, and a rank missing it would leave its peers spinning.
  std::vector<int> mine;
  for (int i = 0; i < layers(); ++i) mine.push_back(attached(i) ? int(format(i)) : -1);
  const int count = static_cast<int>(mine.size());
  const std::vector<uint8_t> counts = group_->all_gather(&count, sizeof count);
  for (int q = 0; q < tp_; ++q) {
    int theirs;
    std::memcpy(&theirs, counts.data() + q * sizeof theirs, sizeof theirs);
    SPARK_CHECK(theirs == count, "pooler warm_up: rank ", q, " has ", theirs, " layer slots where rank ", rank_,
                " has ", count, "; every rank must attach the same layers");
  }
  const std::vector<uint8_t> all = group_->all_gather(mine.data(), mine.size() * sizeof(int));
  for (int q = 0; q < tp_; ++q)
    SPARK_CHECK(std::memcmp(all.data() + q * mine.size() * sizeof(int), mine.data(), mine.size() * sizeof(int)) == 0,
                "pooler warm_up: rank ", q, " attached other layers or formats than rank ", rank_,
                "; every rank must attach the same layers");
  // No rank publishes before every rank has prepared its kernels: the
  // gather's poll gives up after the spin timeout, which a peer's setup
  // could exceed.
  group_->barrier();
  // One layer per form: each output format per (eps, gain_center).
  std::map<std::tuple<int, float, float>, int> forms;
  for (int i = 0; i < layers(); ++i)
    if (attached(i)) forms.emplace(std::make_tuple(int(layers_[i]->format), layers_[i]->spec.eps,
                                                   layers_[i]->spec.gain_center),
                                   i);
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
