// spark_decode/pooler_gemm.h: the pooler GEMM of one TP rank,
//
//   out[m, N] = x[m, K] @ W[N, K]^T      BF16 in and out, FP32 accumulation
//
// W this rank's [P / tp, H] rows of the pooler weight (N = P / tp, K = H),
// 1 <= m <= 16. Served by one of the GEMM engines (spark_decode/plan.h:
// splitk_mma, ring_mma, skinny, onchip_mma), the plan table's for the model's shapes: one
// engine for every b of a shape, so that each is bitwise reproducible and
// batch invariant (docs/design.md, "Exact semantics"). The engines sum in
// different orders, so a forced engine (Options::force) gives other last
// bits than the table's.
//
// Requirements (checked; InvalidArgument, nothing launched):
//   W    BF16 [N, K] contiguous, 16-byte aligned, device memory of compute
//        capability 9.0+ (RuntimeError below); the engine's own conditions:
//        split-K launch_unsupported(N, K, tactic); ring N % kRingRows == 0,
//        K % kRingKMultiple == 0 and 225 KiB of shared memory per CTA
//        (RuntimeError where the device has less); skinny
//        pooler_gemm_unsupported; on-chip onchip_unsupported(N, K,
//        onchip_tactic(PlanOp::pooler, N, K)) (RuntimeError where the
//        device's shared memory or clusters cannot take it);
//   x    BF16 [m, K] contiguous 16-byte aligned on W's device;
//   out  BF16 [m, N] contiguous 16-byte aligned on W's device, not
//        overlapping x; m one of the batches prepared at construction;
//   W's device current on the calling thread at run(). The raw-pointer
//   run() can check only non-null, alignment, overlap, m and the current
//   device: the operands' dtype, extent and device are the caller's word.
// W is read before griddepcontrol.wait (programmatic dependent launch), x
// after. run() may not allocate, synchronise or prepare a kernel; it is
// CUDA-graph capturable (one kernel).
//
// Fused publish (Options::mailbox; what Pooler::run uses where its plan says
// so): run_publish() also writes out into this rank's slot of every rank's
// copy of the mailbox at its next stage, and sets the stage word: the same
// bytes and stage word as run() followed by the mailbox's own publish(out,
// m), in one kernel instead of two. The mailbox must have width N, capacity
// >= every prepared batch, and live on W's device; it must outlive the
// PoolerGemm.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "spark_decode/plan.h"
#include "spark_decode/types.h"

namespace spark_decode {

class LamportMailbox;
class Pooler;

// One engine of the pooler GEMM: the split-K MMA engine (at the plan table's
// split-K tactic for the shape), the ring engine, the on-chip engine (at
// onchip_tactic for the shape), or the skinny GEMM at a compiled launch
// shape.
struct PoolerGemmChoice {
  GemmEngine engine = GemmEngine::skinny;
  PoolerGemmShape shape;  // for skinny (ignored by the others)
  std::string to_string() const;
};

// Every engine at every shape it offers (for tests, benchmarks and tuning:
// what `Options::force` can name).
std::vector<PoolerGemmChoice> pooler_gemm_candidates();
// Why `choice` cannot serve [n, k] at m rows, or nullopt (split-K: nullopt;
// its conditions are checked at construction; ring: its shape rules, the
// device's shared memory at construction; on-chip: onchip_unsupported at its
// tactic).
std::optional<std::string> pooler_choice_unsupported(int n, int k, int m, const PoolerGemmChoice& choice);
// The engine that serves (tp, b): the plan table's for the model's shapes
// (N = P / tp, K = H); for other shapes the compiled skinny shape where it
// fits, else the split-K engine (one engine for every b either way).
PoolerGemmChoice pooler_gemm_choice(int n, int k, int tp, int b);

class PoolerGemm {
 public:
  struct Options {
    bool enable_pdl = true;
    // The batch sizes run() accepts (default 1..16); their kernels are
    // prepared at construction.
    std::vector<int> batches;
    // Every batch on this engine/shape instead of the table's choice.
    std::optional<PoolerGemmChoice> force;
    // The mailbox run_publish() publishes into (not owned), or none.
    LamportMailbox* mailbox = nullptr;
  };

  // weight: a view that must outlive the PoolerGemm; tp only keys the table.
  PoolerGemm(const TensorRef& weight, int tp, Options options);
  PoolerGemm(const TensorRef& weight, int tp) : PoolerGemm(weight, tp, Options{}) {}
  ~PoolerGemm();
  PoolerGemm(PoolerGemm&&) noexcept;
  PoolerGemm& operator=(PoolerGemm&&) noexcept;

  void run(const void* x, void* out, int m, cudaStream_t stream) const;
  void run(const TensorRef& x, const TensorRef& out, cudaStream_t stream) const;
  // run(), publishing out into Options::mailbox in the same kernel (see above).
  void run_publish(const void* x, void* out, int m, cudaStream_t stream) const;

  // The engine that serves batch m (m must be prepared).
  PoolerGemmChoice choice(int m) const;
  int n() const { return n_; }
  int k() const { return k_; }
  int device() const { return device_; }

 private:
  friend class Pooler;  // validates a call once, then launches
  struct Engines;

  // One kernel: the engine of batch m, publishing into mailbox_ or not
  // (claiming `tag`: the Pooler's layer; MailboxView::tag). No checks: m is
  // prepared, the pointers are valid, the device is current.
  void launch(const void* x, void* out, int m, bool publish, cudaStream_t stream, uint32_t tag = 0) const;
  void check_operands(const void* x, void* out, int m) const;  // alignment, overlap
  void check_run(const void* x, void* out, int m) const;       // + m prepared, the current device

  const void* weight_;
  int n_ = 0, k_ = 0, device_ = -1;
  bool enable_pdl_ = true;
  std::vector<std::optional<PoolerGemmChoice>> choice_;  // by m - 1
  LamportMailbox* mailbox_ = nullptr;
  std::unique_ptr<Engines> engines_;
};

// One launch of the skinny GEMM at `shape` on the current device (for
// benchmarks and tests that pick the engine themselves): the shape, m,
// alignment and overlap are checked (InvalidArgument), compute capability
// 9.0+ (RuntimeError); W, x and out must be memory of the current device
// (not checked). It loads its kernel lazily on first use, so its first call
// for a (shape, row tile) may not be under CUDA graph capture; PoolerGemm
// prepares its kernels at construction.
void skinny_gemm(const PoolerGemmShape& shape, const void* w, const void* x, void* out, int n, int k,
                 int m, cudaStream_t stream, bool enable_pdl = true);

}  // namespace spark_decode
