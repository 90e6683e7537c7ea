// `spark-decode step`: the MoE boundaries of one whole decode step, as a
// server runs them, ours against the stock path, timed and checked.
//
// Per layer l of 62 and rank r (b decode tokens, H = 8192, P = 4096):
//   pooler    x_l [b, H] -> the experts' input: BF16 normed rows in the edge
//             layers 0 and 61, NVFP4 in 1..60 (--format);
//   experts   a stand-in (bench/step_standins.h): their [b, P] output from
//             their input, its cost stated there;
//   unpooler  [b, P] -> this rank's [b, H / tp];
//   gather    the full hidden rows [b, H];
//   residual  a stand-in for the rest of the layer: x_{l+1} = x_l + rows.
// Three ways through it, on every rank, the same weights and input:
//   fast       Pooler.run into caller-owned outputs; the Unpooler publishing
//              from its epilogue straight into the hidden rows' mailbox, the
//              mailbox's gather (at tp 1 the unpooler's rows are the hidden
//              rows: no mailbox, as the stock path has no all-gather there);
//              PDL on (off where ranks share a GPU, mailbox.h). One CUDA
//              graph of the whole step, replayed.
//   reference  the stock structure on our GEMM engines: Pooler.project (the
//              same GEMM, no mailbox), the stock exchange (an all-gather on
//              the host), ExpertNorm, nvfp4_quantize, the plain Unpooler (no
//              mailbox), the stock exchange, the same stand-ins; eager. Only
//              the publish route, the mailbox and the fused consumer differ
//              from the fast path, and the semantics make those exact
//              (docs/design.md, "Exact semantics") but for the sign of zero,
//              which the stand-ins drop: the fast path's final hidden rows
//              must equal these bit for bit, on the first replay and on
//              every checked replay after it.
//   stock      what a server runs today: cuBLAS (the fastest cuBLASLt
//              candidate for each shape), ncclAllGather (none at tp 1),
//              ExpertNorm, nvfp4_quantize, the same stand-ins; PDL off; one
//              CUDA graph, replayed. Its GEMMs sum in cuBLAS's order, so its
//              bits differ; its final rows are checked within
//              kStockUpdateBound (see there).
// Timing (CUDA events over graph replays, median; cold weights: 62 distinct
// layers): the step, and the stand-ins alone in a graph of the same launches;
// the boundary per layer is (step - stand-ins) / 62. Where ranks share GPUs
// nothing is timed (correctness only): they split one GPU's bandwidth and
// SMs, and NCCL cannot run two ranks on one GPU, so the stock path then runs
// eagerly with the host exchange.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "spark_decode/model_shape.h"
#include "spark_decode/pooler.h"

namespace spark_decode::bench {

// The stock path's final rows against the fast path's: per row, the L2 norm
// of their difference over the L2 norm of the rows' total update over the
// step (x_62 - x_0, the fast path's) at most this. Why not tighter: NVFP4
// quantization is a step function, so a last-bit GEMM difference moves a
// value across a code's rounding threshold now and then, and each such flip
// feeds every later layer; over 60 NVFP4 layers the two paths' updates drift
// apart by far more than a GEMM's rounding. A wrong, missing or reordered
// operation in every layer moves the update by about its own size (ratio
// about 1 or more), well above the bound. The rounding-level agreement of
// each operation is `spark-decode verify`'s job.
inline constexpr double kStockUpdateBound = 0.25;

struct StepOptions {
  int tp = 1;
  int gpus = 0;                     // GPUs the ranks are spread over (0: tp, one each)
  std::vector<int> bs{1, 4, 8, 16};
  int layers = kMuseSpark.layers;
  // The output format of layers 1..60 (0 and 61 are BF16).
  OutputFormat format = OutputFormat::nvfp4;
  int repeats = 20;                 // timed replays of each graph (median)
  int checked_replays = 20;         // fast-path replays compared with the first, bit for bit
  bool standins_launch_early = false;  // stand-ins let the next kernel launch at their start
  uint64_t seed = 1;
  // Progress lines (long work), on the caller's stream of choice.
  std::function<void(const std::string&)> progress;
};

struct StepBatch {
  int b = 0;
  // Microseconds per step (the whole graph) and for the stand-ins alone;
  // 0 where not timed.
  double fast_us = 0, stock_us = 0, fast_standins_us = 0, stock_standins_us = 0;
  // fast vs reference: elements compared, differing (bit for bit).
  int64_t elements = 0, reference_mismatches = 0;
  // Checked replays after the first, and elements that differed from it.
  int replays = 0;
  int64_t replay_mismatches = 0;
  // stock vs fast: the worst row's ratio (kStockUpdateBound), and how many
  // elements are bit-equal.
  double stock_update_ratio = 0;
  int64_t stock_equal_elements = 0;
  bool stock_checked = false;

  bool bit_exact() const { return reference_mismatches == 0 && replay_mismatches == 0 && elements > 0; }
  bool stock_ok() const { return stock_checked && stock_update_ratio <= kStockUpdateBound; }
  bool ok() const { return bit_exact() && stock_ok(); }
};

struct StepResult {
  std::string gpu, date, commit;
  int tp = 1, gpus = 1, layers = 0;
  bool ranks_share_gpus = false, timed = false;
  OutputFormat format = OutputFormat::nvfp4;
  bool standins_launch_early = false;
  std::string stock_exchange;       // what the stock path exchanged with
  std::string cublas_pooler, cublas_unpooler;  // the cuBLASLt candidates picked (b of the last record)
  uint64_t seed = 0;
  std::vector<StepBatch> batches;
  std::vector<std::string> notes;
  bool ok() const;
};

// Runs the step at every b of the options (tp ranks as threads of this
// process); throws RuntimeError where the GPUs cannot (too few, no peer
// access).
StepResult run_step(const StepOptions& options);

// The record as JSON text (what --json prints and the file holds).
std::string step_json(const StepResult& result);
// The human-readable summary: per b, the step and boundary times, the
// speed-up and saving, the checks.
std::string step_summary(const StepResult& result);
// Writes <dir>/step_tp<tp>.json and .md; returns the JSON path.
std::string write_step(const StepResult& result, const std::string& dir);

}  // namespace spark_decode::bench
