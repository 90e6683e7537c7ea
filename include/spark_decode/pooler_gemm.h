// spark_decode/pooler_gemm.h: the pooler GEMM of one TP rank,
//
//   out[m, N] = x[m, K] @ W[N, K]^T      BF16 in and out, FP32 accumulation
//
// W this rank's [P / tp, H] rows of the pooler weight (N = P / tp, K = H),
// 1 <= m <= 16. Three engines, chosen per (tp, b) by a tactic table:
//   skinny  our skinny GEMM (src/kernels/pooler/skinny_gemm.cuh) at a launch
//           shape (block_size, outputs_per_block, k_unroll) (the seed's);
//   mma     the Unpooler's split-K tensor-core engine (spark_decode::Unpooler
//           used as a GEMM over this weight);
//   ring    a streaming tensor-core GEMM whose weights reach the MMA through
//           per-warp rings of shared-memory stages filled by cp.async, one
//           CTA per SM (src/kernels/pooler/ring_gemm.cuh); at split 1 over
//           32-row tiles, one CTA each; at split 2 over 64-row tiles whose K
//           is split between the two CTAs of a thread-block cluster (half
//           the activation reads per weight byte).
// Each is bitwise reproducible and batch invariant for a fixed engine and
// shape (SPEC §5); the engines sum in different orders, so their results
// differ in the last bits, and a row's result depends on which engine the
// table picks for the batch size it runs at. The Pooler uses one engine per
// b (see Pooler). The model's table takes one engine for every b at tp 1
// (the ring, split 1), so there a row's result does not depend on b; at tp
// 2..8 b = 1 (skinny) and b >= 2 (mma) differ in the last bits.
//
// Requirements (checked; InvalidArgument, nothing launched):
//   W    BF16 [N, K] contiguous, 16-byte aligned, device memory of compute
//        capability 9.0+ (RuntimeError below); N % outputs_per_block == 0
//        and K % (8 block_size k_unroll) == 0 for a skinny shape; the
//        Unpooler's own conditions for mma (Unpooler::unsupported); for
//        ring N % pooler_ring_rows(split) == 0 and K %
//        pooler_ring_k_multiple(split) == 0, and the device must allow its
//        up to 225 KiB of shared memory per CTA (and, at split 2, run a
//        cluster of two such CTAs) (RuntimeError otherwise);
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
// Fused publish (Options::mailbox; what Pooler::run uses): run_publish()
// also writes out into this rank's slot of every rank's copy of the mailbox
// at its next stage, and sets the stage word: the same bytes and stage word
// as run() followed by the mailbox's own publish(out, m), in one kernel
// instead of two. The mailbox must have width N, capacity >= every prepared
// batch, and live on W's device; it must outlive the PoolerGemm.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "spark_decode/types.h"

namespace spark_decode {

class LamportMailbox;
class Unpooler;

inline constexpr int kPoolerMaxBatch = 16;
// The ring engine's granularity at a split (1 or 2; see above): rows per
// tile, and the K that every warp's 8 KiB stages divide (8 warps x split
// CTAs x 128 K at 32 rows, 64 K at 64 rows).
constexpr int pooler_ring_rows(int split) { return split == 1 ? 32 : 64; }
constexpr int pooler_ring_k_multiple(int split) { return 8 * split * (split == 1 ? 128 : 64); }

// Launch shape of the skinny GEMM: block_size threads per CTA over K,
// outputs_per_block columns per CTA, k_unroll 16-byte weight vectors per
// thread and output loaded together (one chunk).
struct PoolerGemmShape {
  int block_size = 256;
  int outputs_per_block = 4;
  int k_unroll = 4;
  std::string to_string() const;
  // Written out for C++17 consumers (see UnpoolerTactic).
  bool operator==(const PoolerGemmShape& o) const {
    return block_size == o.block_size && outputs_per_block == o.outputs_per_block && k_unroll == o.k_unroll;
  }
  bool operator!=(const PoolerGemmShape& o) const { return !(*this == o); }
};
static_assert(sizeof(PoolerGemmShape) == 3 * sizeof(int), "a field was added to PoolerGemmShape: add it to operator== too");

enum class PoolerGemmEngine { skinny, mma, ring };
const char* engine_name(PoolerGemmEngine engine);

struct PoolerGemmChoice {
  PoolerGemmEngine engine = PoolerGemmEngine::skinny;
  PoolerGemmShape shape;  // for skinny (ignored by the others)
  int ring_split = 1;     // for ring: 1 or 2 CTAs per tile (ignored by the others)
  std::string to_string() const;
};

// The skinny shapes with compiled kernels (each for row tiles 1, 2, 4, 8, 16).
const std::vector<PoolerGemmShape>& pooler_gemm_shapes();
// Why the skinny GEMM cannot run [n, k] at `shape` for m rows, or nullopt.
std::optional<std::string> pooler_gemm_unsupported(int n, int k, int m, const PoolerGemmShape& shape);
// Every engine at every shape it offers, mma and ring first (for tests,
// benchmarks and tuning: what `Options::force` can name).
std::vector<PoolerGemmChoice> pooler_gemm_candidates();
// Why `choice` cannot serve [n, k] at m rows, or nullopt (mma: nullopt; the
// Unpooler checks its own conditions at construction; ring: its shape rules,
// the device's shared memory at construction).
std::optional<std::string> pooler_choice_unsupported(int n, int k, int m, const PoolerGemmChoice& choice);

// The tactic table: for the model's shapes (N = P / tp, K = H) the entry of
// (tp, b); for other shapes the first compiled skinny shape that supports
// them, else mma.
PoolerGemmChoice pooler_gemm_choice(int n, int k, int tp, int b);
// How Pooler::run publishes at (tp, b): from the GEMM's epilogue
// (PoolerGemm::run_publish, one kernel fewer) or with the mailbox's publish
// kernel after a plain GEMM. Either writes the same bytes and stage word;
// the table holds the one measured faster.
bool pooler_fused_publish(int tp, int b);
// Where Pooler's fused gather + norm + NVFP4 consumer lets the next kernel
// (the next layer's GEMM, with programmatic dependent launch) launch at
// (tp, b): at its start (true), so that GEMM's weights stream under it, or
// once its data has arrived (false). The same bytes either way; the table
// holds the one measured faster.
bool pooler_consumer_launches_early(int tp, int b);
std::string format_pooler_gemm_table();

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
  const void* weight_;
  int n_ = 0, k_ = 0, device_ = -1;
  bool enable_pdl_ = true;
  std::vector<std::optional<PoolerGemmChoice>> choice_;  // by m - 1
  std::unique_ptr<Unpooler> mma_;
  LamportMailbox* mailbox_ = nullptr;
  std::unique_ptr<Unpooler> mma_publish_;  // the MMA engine publishing into mailbox_
  std::vector<int> ring_grid_;             // by m - 1: the ring engine's tiles in flight (CTAs or clusters)

  void launch(const void* x, void* out, int m, cudaStream_t stream, bool publish) const;
};

// One launch of the skinny GEMM at `shape` on the current device (for
// benchmarks and tests that pick the shape themselves): the shape, m,
// alignment and overlap are checked (InvalidArgument), compute capability
// 9.0+ (RuntimeError); W, x and out must be memory of the current device
// (not checked). It loads its kernel lazily on first use, so its first call
// for a (shape, row tile) may not be under CUDA graph capture; PoolerGemm
// prepares its kernels at construction.
void skinny_gemm(const PoolerGemmShape& shape, const void* w, const void* x, void* out, int n, int k,
                 int m, cudaStream_t stream, bool enable_pdl = true);

}  // namespace spark_decode
