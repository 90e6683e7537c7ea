// spark_decode/unpooler.h: the decode-time unpooler GEMM of one TP rank.
//
//   out[m, N] = x[m, K] @ W[N, K]^T      BF16 in and out, FP32 accumulation
//
// W is this rank's [N, K] shard of the replicated [H, K] unpooler weight
// (N = H / tp, K = P); 1 <= m <= 16 decode tokens.
//
// Requirements (checked; a violation throws InvalidArgument and launches
// nothing):
//   W    BF16, 2-D, contiguous, 16-byte aligned, N % 16 == 0, on a device of
//        compute capability 9.0 or newer (RuntimeError below that);
//   x    BF16 [m, K] contiguous, 16-byte aligned, same device;
//   out  BF16 [m, N] contiguous, 16-byte aligned, same device; may not
//        overlap x (both overloads of run check it);
//   W's device current on the calling thread at run().
//   The tactic: K = S * warps * kw with S in {1, 2, 4, 8}, kw one of the
//   compiled widths (multiples of 32), 1 <= warps <= 32 and at most what
//   kw's register budget allows per CTA (16 at kw = 256:
//   splitk_max_warps), accs in {1, 2, 4}, every warp partial within
//   the shared memory of a block; for a batch served with R = 2 row tiles
//   per CTA also N % 32 == 0, accs <= 2, at most 16 warps per CTA.
//   launch_unsupported() names the failing rule. Construction also throws
//   RuntimeError when the device cannot run the tactic (its shared memory
//   opt-in below the tactic's, or no cluster of S CTAs fits).
//
// Semantics: out = bf16_rne(sum_k x * w) with FP32 accumulation in an order
// fixed by (N, K, S, kw, accs) alone (not by the token tile or row tiles),
// so results are bitwise reproducible and batch invariant (a row's result
// does not depend on the other rows of the batch, nor on m).
//
// The engine: the plan table's for the model's shapes (N = H / tp, K = P),
// the split-K MMA engine elsewhere (spark_decode/plan.h), at its tactic;
// Options::engine forces the split-K or the on-chip engine (onchip_mma,
// whose checks are onchip_unsupported's, and which also throws
// RuntimeError where the device's shared memory or clusters cannot take its
// tactic). At the same kw and accs both give the same bits.
//
// Zero-copy publish (Options::mailbox; docs/design.md, "Zero-copy publish
// and the ticket stage"): the epilogue also writes
// y into this rank's slot of every rank's copy of the next boundary's
// LamportMailbox (width == N), -0.0 stored as +0.0, at the stage its NEXT
// word names, and sets its ACTIVE word: the same bytes and stage word the
// mailbox's own publish() would write, so the boundary needs no publish
// kernel; its consumer (gather, ...) follows as usual. With a ticket (int32
// [1] device memory on the mailbox's device, stage in its upper 16 bits) the
// slot's stage is the ticket's and no stage word is written: the consuming
// boundary advances the stage itself. max_m = min(16, capacity).
//
// What run() may not do: allocate, synchronise, or prepare a kernel under
// CUDA graph capture. It is capturable; it reads W before waiting on the
// previous grid (programmatic dependent launch) and x only after.
#pragma once

#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "spark_decode/plan.h"
#include "spark_decode/types.h"

namespace spark_decode {

class LamportMailbox;
namespace engines {
class SplitKMma;
class OnchipMma;
}

// The plan table's split-K tactic for an [n, k] unpooler weight (see
// splitk_tactic); valid defaults for other shapes.
SplitKTactic unpooler_tactic(int n, int k);
// The engine that serves m rows of an [n, k] unpooler weight by default: the
// plan table's where [n, k] is a model shape, else splitk_mma. A shape may
// take the split-K engine at some m and the on-chip one at others (the same
// bits: spark_decode/plan.h).
GemmEngine unpooler_engine(int n, int k, int m);

class Unpooler {
 public:
  struct Options {
    bool enable_pdl = true;
    // The engine of every m: splitk_mma or onchip_mma (default: per m,
    // unpooler_engine(N, K, m)).
    std::optional<GemmEngine> engine;
    std::optional<SplitKTactic> tactic;  // the split-K engine's; default: unpooler_tactic(N, K)
    // The on-chip engine's, at every m; default: per m,
    // onchip_tactic(PlanOp::unpooler, N, K, m).
    std::optional<OnchipTactic> onchip;
    // Row counts whose token tiles are prepared at construction (nullopt,
    // the default: all of 1..max_m; empty: none, as the Python binding's rows=()).
    // run() with another m prepares its tile then, which it refuses under
    // CUDA graph capture.
    std::optional<std::vector<int>> rows;
    // Zero-copy publish into this mailbox (not owned; it must outlive the
    // Unpooler), and optionally the ticket that gives its stage: INT32 [1],
    // non-null, 4-byte aligned, on the mailbox's device, a view that must
    // outlive the Unpooler. Its stage (upper 16 bits) must be 0, 1 or 2
    // when a run reads it: any other value traps the kernel with a printed
    // reason (which poisons the CUDA context).
    LamportMailbox* mailbox = nullptr;
    std::optional<TensorRef> ticket;
  };

  // weight: this rank's [N, K] shard (a view; it must outlive the Unpooler).
  explicit Unpooler(const TensorRef& weight, Options options);
  explicit Unpooler(const TensorRef& weight) : Unpooler(weight, Options{}) {}
  ~Unpooler();
  Unpooler(Unpooler&&) noexcept;
  Unpooler& operator=(Unpooler&&) noexcept;

  // Rows [rank N, (rank + 1) N) of a replicated [H, K] weight, N = H / tp
  // (tp >= 1, H % tp == 0, 0 <= rank < tp: InvalidArgument otherwise), then
  // the constructor's own checks on that view.
  static Unpooler from_moe(const TensorRef& full_weight, int tp, int rank, Options options);
  static Unpooler from_moe(const TensorRef& full_weight, int tp, int rank) {
    return from_moe(full_weight, tp, rank, Options{});
  }

  // Why the GEMM cannot take `weight` at `tactic`, or nullopt: the
  // constructor's checks, which it raises as InvalidArgument.
  static std::optional<std::string> unsupported(const TensorRef& weight, const SplitKTactic& tactic);
  static std::optional<std::string> unsupported(const TensorRef& weight, const OnchipTactic& tactic);
  static std::optional<std::string> unsupported(const TensorRef& weight);

  // out[m, N] = x[m, K] @ W^T on `stream`. x and out are device pointers to
  // contiguous BF16 rows. Enqueues one kernel; see the file comment.
  void run(const void* x, void* out, int m, cudaStream_t stream);
  void run(const TensorRef& x, const TensorRef& out, cudaStream_t stream);

  int n() const { return n_; }
  int k() const { return k_; }
  int max_m() const { return max_m_; }
  LamportMailbox* mailbox() const { return mailbox_; }
  int device() const { return device_; }
  bool enable_pdl() const { return enable_pdl_; }
  // The engine that runs m rows (1..kMaxBatch).
  GemmEngine engine(int m = 1) const { return engine_of_[std::clamp(m, 1, kMaxBatch) - 1]; }
  // The split-K tactic (what the m with engine(m) == splitk_mma run).
  const SplitKTactic& tactic() const { return tactic_; }
  // The on-chip tactic of m rows (what they run where engine(m) ==
  // onchip_mma).
  const OnchipTactic& onchip_tactic(int m = 1) const { return onchip_[std::clamp(m, 1, kMaxBatch) - 1]; }
  // The engines and their tactics (with the m each serves where there are
  // two), for logs and benchmark records.
  std::string describe() const;
  // Whether a kernel for token tile `tile` (8 or 16) with `row_tiles` (1 or
  // 2) is prepared, on either engine; other values throw InvalidArgument.
  // The on-chip engine has two row tiles at token tile 16 only.
  bool prepared(int tile, int row_tiles = 1) const;

 private:
  const void* weight_;
  int n_, k_, device_;
  int max_m_ = kMaxBatch;
  LamportMailbox* mailbox_ = nullptr;
  int32_t* ticket_ = nullptr;
  bool enable_pdl_;
  std::array<GemmEngine, kMaxBatch> engine_of_{};  // the engine of m rows, [m - 1]
  SplitKTactic tactic_;
  std::array<OnchipTactic, kMaxBatch> onchip_;  // m's, [m - 1]
  std::unique_ptr<engines::SplitKMma> engine_;
  std::unique_ptr<engines::OnchipMma> onchip_engine_;
};

}  // namespace spark_decode
