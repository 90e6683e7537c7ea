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
//   unpooler_max_threads), accs in {1, 2, 4}, every warp partial within
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
// Zero-copy publish (Options::mailbox, SPEC §2.5): the epilogue also writes
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

#include <array>
#include <optional>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "spark_decode/types.h"

namespace spark_decode {

class LamportMailbox;

// Rows of W per CTA (the MMA's M) and K per 16-byte load step of a lane quad.
inline constexpr int kUnpoolerTileN = 16;
inline constexpr int kUnpoolerBlockK = 32;
inline constexpr int kUnpoolerMaxM = 16;
// The K-per-warp widths with a compiled kernel, and the most warps each can
// run per CTA: a warp holds its whole weight slice in registers (kw / 4 of
// them per thread), so wider slices leave room for fewer threads.
inline constexpr std::array<int, 3> kUnpoolerKws = {64, 128, 256};
// The one (kw, accs) compiled with fragment-order weight loads
// (UnpoolerTactic::row_swizzle = false).
inline constexpr int kUnpoolerUnswizzledKw = 256;
inline constexpr int kUnpoolerUnswizzledAccs = 1;
// The row tiles per CTA with a compiled kernel (UnpoolerTactic::row_tiles).
// 4 was measured too and lost at every shape (bench/NOTES.md).
inline constexpr std::array<int, 2> kUnpoolerRowTiles = {1, 2};
int unpooler_max_warps(int kw, int row_tiles = 1);

// Launch shape of the unpooler GEMM.
struct UnpoolerTactic {
  int splits = 1;  // S: CTAs of one cluster splitting K
  int kw = 256;    // consecutive K per warp
  int accs = 2;    // independent accumulator sets per warp
  // token_tile[m - 1]: the token tile (8 or 16) that serves a batch of m.
  std::array<int, kUnpoolerMaxM> token_tile = {8, 8, 8, 8, 8, 8, 8, 8,
                                               16, 16, 16, 16, 16, 16, 16, 16};
  // row_tiles[m - 1]: 16-row MMA tiles per CTA (R, one of
  // kUnpoolerRowTiles) for a batch of m. 1 is SPEC §2.1's shape (a CTA owns
  // 16 features); R = 2 lets a CTA own 32 and reuse each activation
  // fragment for both, halving the activation reads that bound large
  // batches, in half the CTAs. Every R gives the same bits.
  std::array<int, kUnpoolerMaxM> row_tiles = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  // Clusters (S > 1) launched with the load-balancing scheduling policy
  // instead of the default (spread). Scheduling only: the same bits. It
  // places the next wave's clusters sooner where a grid runs in two or more
  // waves (measured: tp 1, bench/NOTES.md); ignored at S = 1.
  bool cluster_balance = false;
  // Weight loads row-swizzled: each load instruction reads 4 rows x 128
  // contiguous bytes, and lanes exchange halves by shuffle before the MMA,
  // instead of 8 rows x 64 bytes in the MMA fragment's order. Loads only:
  // the same bits. Faster wherever the grid streams at bandwidth (tp 1-4);
  // the fragment order (false) is compiled for kw = 256, accs = 1 only.
  bool row_swizzle = true;

  int warps(int k) const { return k / (splits * kw); }
  std::string to_string() const;
  // Written out (not defaulted) so that the public headers stay C++17 for
  // C++17 consumers such as vLLM's extension; a new field joins it (the
  // static_assert below counts the bytes).
  bool operator==(const UnpoolerTactic& o) const {
    return splits == o.splits && kw == o.kw && accs == o.accs && token_tile == o.token_tile &&
           row_tiles == o.row_tiles && cluster_balance == o.cluster_balance && row_swizzle == o.row_swizzle;
  }
  bool operator!=(const UnpoolerTactic& o) const { return !(*this == o); }
};
static_assert(sizeof(UnpoolerTactic) == 3 * sizeof(int) + 2 * kUnpoolerMaxM * sizeof(int) + sizeof(int),  // + 2 bools, padded
              "a field was added to UnpoolerTactic: add it to operator== too");

// One row of the tactic table: the launch shape measured fastest for [n, k].
struct UnpoolerTacticEntry {
  int n, k;
  UnpoolerTactic tactic;
  const char* measured;  // where and how the choice was measured
};

// The tactic table for the model's shapes.
const std::vector<UnpoolerTacticEntry>& unpooler_tactic_table();
// The table's tactic for [n, k], or a valid default for other shapes (a
// shape no tactic can run gets one whose launch_unsupported() says why).
UnpoolerTactic unpooler_tactic(int n, int k);
// The table as text, one shape per line, for logs.
std::string format_unpooler_tactic_table();

// Why no kernel launches for an [n, k] weight with K split over `splits`
// CTAs, `kw` K per warp and `accs` accumulators, or nullopt.
std::optional<std::string> launch_unsupported(int n, int k, int splits, int kw, int accs);
// The same, plus the token tiles (each 8 or 16, covering its m) and the row
// tiles (1; or 2 where N % 32 == 0, accs <= 2 and the partials fit).
std::optional<std::string> launch_unsupported(int n, int k, const UnpoolerTactic& tactic);

class Unpooler {
 public:
  struct Options {
    bool enable_pdl = true;
    std::optional<UnpoolerTactic> tactic;  // default: unpooler_tactic(N, K)
    // Row counts whose token tiles are prepared at construction (nullopt,
    // the default: all of 1..max_m; empty: none, as the seed's rows=()).
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

  // Rows [rank N, (rank + 1) N) of a replicated [H, K] weight, N = H / tp
  // (tp >= 1, H % tp == 0, 0 <= rank < tp: InvalidArgument otherwise), then
  // the constructor's own checks on that view.
  static Unpooler from_moe(const TensorRef& full_weight, int tp, int rank, Options options);
  static Unpooler from_moe(const TensorRef& full_weight, int tp, int rank) {
    return from_moe(full_weight, tp, rank, Options{});
  }

  // Why the GEMM cannot take `weight` at `tactic`, or nullopt: the
  // constructor's checks, which it raises as InvalidArgument.
  static std::optional<std::string> unsupported(const TensorRef& weight,
                                                const UnpoolerTactic& tactic);
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
  const UnpoolerTactic& tactic() const { return tactic_; }
  // Whether the kernel for token tile `tile` (8 or 16) with `row_tiles`
  // (1 or 2) is prepared; other values throw InvalidArgument.
  bool prepared(int tile, int row_tiles = 1) const;

 private:
  void prepare(int tile, int row_tiles);

  const void* weight_;
  int n_, k_, device_;
  int max_m_ = kUnpoolerMaxM;
  LamportMailbox* mailbox_ = nullptr;
  int32_t* ticket_ = nullptr;
  bool enable_pdl_;
  UnpoolerTactic tactic_;
  std::array<bool, 4> prepared_{};  // [tile 8, 16] x [row tiles 1, 2]
};

}  // namespace spark_decode
