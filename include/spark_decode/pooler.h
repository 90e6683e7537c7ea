// spark_decode/pooler.h: the pooler of the Muse Spark MoE layers: the
// boundary before the routed experts (docs/design.md, "The Pooler").
//
// Per MoE layer and TP rank r of tp:
//   project  shard[b, P/tp] = x[b, H] @ W[r P/tp : (r+1) P/tp, :]^T  (pooler GEMM)
//   publish  rows [0, b) of shard into slot r of every rank's Lamport mailbox
//   gather   every rank reads the tp blocks of the full rows [b, P] and makes,
//            in one kernel, the layer's output format (OutputFormat):
//            bf16            normed BF16 [b, P] = pre_expert_norm(rows): the
//                            stock gather + ExpertNorm bit for bit except the
//                            sign of zero (publishers store BF16 -0.0 as +0.0,
//                            the mailbox's sentinel being -0.0);
//            nvfp4           a uint8 [b, P/2] (two E2M1 codes a byte, the even
//                            column in the low nibble) and a_sf E4M3 [b, P/16]
//                            (block scales, linear layout) =
//                            nvfp4(pre_expert_norm(rows), global_scale), bit
//                            for bit what the stock all-gather + ExpertNorm +
//                            nvfp4_quantize give;
//            nvfp4_swizzled  the same codes, a_sf in vLLM's swizzled 128x4
//                            layout ([round_up(b, 128), P/16], padding zero;
//                            spark_decode/nvfp4.h), as the stock quantizer
//                            with ScaleLayout::swizzled gives.
//   run = project + publish + gather, as the plan table's row of (tp, b)
//           says (spark_decode/plan.h): the publish done by the GEMM's own
//           epilogue (the same mailbox bytes and stage word as publish(),
//           one kernel fewer) or by the publish kernel: two kernels per
//           call on the epilogue route, three otherwise. With programmatic
//           dependent launch the consumer lets the next kernel launch at
//           its start or once its data has arrived (the row's consumer
//           launch point; Options::consumer_launches_early forces either).
//           The plan of every b is chosen at construction; run() looks it
//           up once and validates once.
// One mailbox serves every layer; every rank runs its calls in the same
// order with the same b (see mailbox.h). Outputs go into the caller's
// tensors (the forms taking a PoolerOutput), or into the Pooler's scratch,
// whose views the other forms return and the next call overwrites.
//
// The workspace first, the layers later: Pooler(group, config) builds the
// mailbox and the scratch (collective); attach(layer, ...) then adds one
// layer's weights on this rank alone (validated, its GEMM prepared; not
// collective), e.g. once a model's weights are loaded and processed. The
// constructor that takes every layer does both.
//
// Requirements (checked; InvalidArgument, nothing launched):
//   tp in {1, 2, 4, 8} == group.size(), rank == group.rank();
//   1 <= every batch <= min(capacity, 16); P % 512 == 0, P <= 16384
//   (ExpertNorm), P/tp % 16 == 0 (an NVFP4 block never straddles two ranks'
//   blocks);
//   every layer: weight BF16 [P/tp, H] contiguous 16-byte aligned on
//   `device`; norm_weight BF16 [P] contiguous 16-byte aligned on `device`;
//   global_scale FP32 [1] on `device`, 4-byte aligned, for the NVFP4 formats
//   (ignored by bf16); eps >= 0. H itself: the GEMM engine the table picks
//   for each b must take [P/tp, H] (pooler_gemm.h: the skinny shape needs H
//   % 8192 == 0, the split-K engine launch_unsupported's conditions on K =
//   H, the ring engine P/tp % 32 == 0 and H % 1024 == 0 and 225 KiB of
//   shared memory per block, the on-chip engine onchip_unsupported's).
//   Per call: the layer attached; x BF16 [b, H] contiguous 16-byte aligned on
//   `device`, b one of `batches`; the device current on the calling thread;
//   caller outputs of the layer's format and b (pooler_output_spec), on
//   `device`, overlapping neither each other, x, the layer's tensors nor the
//   mailbox.
// Weights, norm weights and global scales are views (not copied) that must
// outlive the Pooler (or the next attach of their layer). Weights and norm
// weights are read before griddepcontrol.wait, so no grid still running when
// a call is enqueued may write them; the global scale is read after it (as
// the stock quantizer reads it), so a preceding grid may.
//
// What project/publish/gather/run may not do: allocate, synchronise or
// prepare a kernel. They are CUDA-graph capturable. Construction (collective
// over `group`; when any rank fails, every rank throws, the failing one its
// own reason), attach (this rank) and warm_up (collective) are not.
// Destruction is not collective: call barrier() on every rank first.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "spark_decode/group.h"
#include "spark_decode/mailbox.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/nvfp4.h"
#include "spark_decode/pooler_gemm.h"
#include "spark_decode/types.h"

namespace spark_decode {

// The expert input a layer's consumer makes (see the file comment): the
// normed BF16 rows (what Hopper's weight-only NVFP4 MoE kernels and the BF16
// edge layers take), or NVFP4 with linear or swizzled block scales (what
// Blackwell's NVFP4 MoE kernels take).
enum class OutputFormat { bf16, nvfp4, nvfp4_swizzled };
const char* format_name(OutputFormat format);

// What the pooler reads from one MoE layer (views, no copies).
struct PoolerLayer {
  TensorRef weight;       // [P / tp, H] BF16: this rank's rows of pooler.weight
  TensorRef norm_weight;  // [P] BF16 pre_expert_norm weight
  float eps = 1e-5f;
  float gain_center = 1.0f;
  // [1] FP32 NVFP4 input global scale of the experts; nullopt for a BF16
  // edge layer.
  std::optional<TensorRef> global_scale;
  // Default: nvfp4 with a global scale, bf16 without.
  std::optional<OutputFormat> format;
};

// The format a layer's consumer makes (its own, or the default above).
inline OutputFormat format_of(const PoolerLayer& layer) {
  return layer.format ? *layer.format : layer.global_scale ? OutputFormat::nvfp4 : OutputFormat::bf16;
}

// A consumer's outputs: normed for bf16; a and a_sf for the NVFP4 formats.
// Views of the Pooler's scratch (the scratch forms) or the caller's tensors.
struct PoolerOutput {
  OutputFormat format = OutputFormat::nvfp4;
  TensorRef a;       // NVFP4: U8 [b, P/2]
  TensorRef a_sf;    // NVFP4: E4M3 [b, P/16] (linear) or [round_up(b, 128), P/16] (swizzled)
  TensorRef normed;  // bf16: BF16 [b, P]
};

// The shapes and dtypes of a consumer's outputs at (format, b, P): the
// tensors a caller allocates (unused ones have ndim 0).
struct PoolerOutputSpec {
  TensorRef a, a_sf, normed;  // data null; dtype, shape filled
};
PoolerOutputSpec pooler_output_spec(OutputFormat format, int b, int pooled);
// The outputs of pooler_output_spec(format, b, pooled) over caller memory on
// `device`: `normed` for bf16, `a` and `a_sf` for the NVFP4 formats (the
// others unused, may be null).
PoolerOutput pooler_output_in(OutputFormat format, int b, int pooled, void* normed, void* a, void* a_sf, int device);

// The parts of one stock MuseSpark MoE layer pooler_layer() reads (the C++
// stand-in of the model module's attributes).
struct StockMoeLayer {
  TensorRef pooler_weight;  // pooler.weight, [P, H]
  struct Norm {
    bool present = true;                          // pre_expert_norm is not None
    bool has_weight = true;
    std::optional<int> variance_size_override;    // must be unset
    bool applies_weight_before_norm = false;      // must be false
    TensorRef weight;                             // [P] BF16
    float variance_epsilon = 1e-5f;
    float fused_gain_center = 1.0f;
  } pre_expert_norm;
  std::optional<TensorRef> nvfp4_input_global_scale;  // experts.nvfp4_input_global_scale
};

// The pooler of one stock MoE layer, checked against what the fused path
// assumes (the stock path's own conditions for its fused gather); throws
// InvalidArgument with these reasons:
//   "pooler weight must be [P, H] BF16" (with the numbers),
//   "pre_expert_norm must apply a [P] BF16 weight after the norm",
//   "the NVFP4 input global scale must be one FP32 value".
// The weight view is rows [rank P/tp, (rank + 1) P/tp) of pooler_weight.
PoolerLayer pooler_layer(const StockMoeLayer& moe, int tp, int rank, const ModelShape& shape = kMuseSpark);

// The fused gather + pre_expert_norm (+ NVFP4) consumer on its own (what
// Pooler::gather runs), over a mailbox of width P / tp, into `out`'s device
// pointers (out.format says which: normed for bf16, a and a_sf for the
// NVFP4 formats; their shapes pooler_output_spec's) from the published
// blocks of the current call. norm_weight BF16 [P] 16-byte aligned,
// global_scale FP32 [1] 4-byte aligned (NVFP4 formats), normed and a
// 16-byte and a_sf 4-byte aligned device pointers of the mailbox's device,
// 1 <= b <= capacity; the mailbox's width a multiple of 16 and P = tp width
// a multiple of 512, at most 16384; eps >= 0; the outputs may not overlap
// the mailbox (all checked, InvalidArgument). The norm weight is read
// before griddepcontrol.wait, the mailbox and the global scale after. One
// kernel, grid (b), P/16 threads; capturable, allocates nothing.
// `launch_next_early`: the next kernel (with programmatic dependent launch)
// may launch at this one's start, else once its data has arrived (the plan
// table's consumer launch point; the bytes are the same).
void gather_norm(LamportMailbox& mailbox, const void* norm_weight, const float* global_scale, float eps,
                 float gain_center, const PoolerOutput& out, int b, cudaStream_t stream, bool enable_pdl = true,
                 bool launch_next_early = true);

struct PoolerOptions {
  double spin_timeout_s = 5.0;      // the mailbox's
  LamportMailbox::OnFailure on_failure = LamportMailbox::OnFailure::poison;  // the mailbox's
  size_t mailbox_guard_bytes = 0;   // the mailbox's (tests)
  // Every layer's GEMM on this engine instead of the table's (tune, tests).
  std::optional<PoolerGemmChoice> gemm;
  // Where the fused consumer lets the next kernel launch, instead of the
  // plan table's (bench, tests).
  std::optional<bool> consumer_launches_early;
};

// What Pooler::run does at one b: the plan table's row of (tp, b) (defaults
// for shapes outside the table: the epilogue publish, the early launch
// point), with Options' overrides applied.
struct PoolerStep {
  PoolerGemmChoice gemm;
  PublishRoute publish = PublishRoute::epilogue;
  ConsumerLaunch consumer = ConsumerLaunch::early;
};

// The workspace of a Pooler: everything but the layers.
struct PoolerConfig {
  int tp = 1, rank = 0, device = 0;
  int hidden = kMuseSpark.hidden;  // H, the GEMM's K
  int pooled = kMuseSpark.pooled;  // P
  std::vector<int> batches = {8};  // the b a call may take (their kernels are prepared)
  int capacity = kMaxBatch;        // the mailbox's
  bool enable_pdl = true;
  PoolerOptions options;
};

class Pooler {
 public:
  using Options = PoolerOptions;

  // The workspace (collective): the mailbox and scratch, no layer yet.
  Pooler(Group& group, const PoolerConfig& config);
  // The workspace from layers[0]'s H and P, then every layer attached, their
  // validation agreed on by every rank.
  Pooler(Group& group, int tp, int rank, int device, std::vector<PoolerLayer> layers,
         std::vector<int> batches = {8}, int capacity = kMaxBatch, bool enable_pdl = true,
         Options options = Options{});
  ~Pooler();
  Pooler(const Pooler&) = delete;
  Pooler& operator=(const Pooler&) = delete;

  // Attaches (or replaces) layer `index` (>= 0) on this rank: validates it,
  // prepares its GEMM's kernels for every batch; not collective, not under
  // capture. Every rank must attach the same layers before their calls.
  void attach(int index, const PoolerLayer& layer);
  bool attached(int index) const;

  // The pooler GEMM: this rank's [b, P/tp] columns into scratch (returned).
  TensorRef project(int layer, const void* x, int b, cudaStream_t stream);
  TensorRef project(int layer, const TensorRef& x, cudaStream_t stream);
  // Publish the first b rows of the projected block.
  void publish(int b, cudaStream_t stream);
  // Consume the published blocks into the layer's format: into scratch
  // (returned), or into the caller's `out` (its format must be the layer's,
  // its tensors pooler_output_spec's at b).
  PoolerOutput gather(int layer, int b, cudaStream_t stream);
  void gather(int layer, int b, const PoolerOutput& out, cudaStream_t stream);
  // x BF16 [b, H] (the pre_ffn_norm output) -> the expert input, into scratch
  // (returned) or the caller's `out`.
  PoolerOutput run(int layer, const void* x, int b, cudaStream_t stream);
  PoolerOutput run(int layer, const TensorRef& x, cudaStream_t stream);
  void run(int layer, const TensorRef& x, const PoolerOutput& out, cudaStream_t stream);
  // One call of each form per batch on an all-zero input, before capture;
  // every rank alike (collective; allocates and frees that input;
  // synchronises).
  void warm_up(cudaStream_t stream);
  // Collective: this device synchronised, then the group.
  void barrier() { mailbox_->barrier(); }

  int tp() const { return tp_; }
  int rank() const { return rank_; }
  int hidden() const { return hidden_; }
  int pooled() const { return pooled_; }
  int shard_width() const { return pooled_ / tp_; }
  int capacity() const { return capacity_; }
  int device() const { return device_; }
  // One more than the highest attached layer index.
  int layers() const { return static_cast<int>(layers_.size()); }
  const std::vector<int>& batches() const { return batches_; }
  OutputFormat format(int layer) const;
  bool is_nvfp4(int layer) const { return format(layer) != OutputFormat::bf16; }
  PoolerGemmChoice gemm_choice(int layer, int b) const;
  // The plan of batch b (one of batches()).
  const PoolerStep& step(int b) const;
  LamportMailbox& mailbox() { return *mailbox_; }

 private:
  struct Layer;
  void build(Group& group, const PoolerConfig& config);
  // The one validation of a call: layer attached, b (its plan), the device.
  const PoolerStep& check_call(int layer, int b, const char* what) const;
  void check_outputs(int layer, int b, const PoolerOutput& out, const void* x) const;
  void consume(int layer, int b, const PoolerStep& step, const PoolerOutput& out, bool after_own, cudaStream_t stream);
  PoolerOutput scratch_outputs(int layer, int b) const;

  Group* group_;
  int tp_, rank_, device_, capacity_, hidden_ = 0, pooled_ = 0;
  bool enable_pdl_;
  PoolerOptions options_;
  std::vector<std::unique_ptr<Layer>> layers_;  // by index; null: not attached
  // The layer of the last project: the tag publish(b) claims.
  int projected_layer_ = 0;
  static uint32_t layer_tag(int layer);
  MailboxView tagged_view(int layer) const;
  std::vector<std::optional<PoolerStep>> steps_;  // by b - 1
  std::vector<int> batches_;
  std::unique_ptr<LamportMailbox> mailbox_;
  void* scratch_ = nullptr;
  void *shard_ = nullptr, *packed_ = nullptr, *scales_ = nullptr, *normed_ = nullptr;
};

}  // namespace spark_decode
