// spark_decode/plan.h: the GEMM engines' parameters and the plan table that
// picks them (docs/design.md, "The plan table" and "Engines").
//
// Every call of a boundary op is served by one plan row, chosen when the
// object is constructed: for an (op, tp, b) of the model's shapes the row of
// the table measured on this machine kind (src/tuning/h200.inc); for other
// shapes a default that is valid or says why not. A row names the GEMM
// engine and its parameters and, for the pooler, how Pooler::run publishes
// and where its fused consumer lets the next kernel launch.
//
// Invariant of every table (checked by plan_table_unsupported, a CPU test):
// within one (op, tp) every row has the same reduction order, so a row of
// output has the same bits whatever batch it came in (batch invariance):
// one engine, except that the split-K and the on-chip engines, which sum in
// the same order at the same kw and accs, may share a shape (one kw and accs
// for both; one split-K tactic; the on-chip rows' S, copy stages and cluster
// policy may differ by row, as row tiles may).
//
// Plain C++ (no CUDA headers): the tables are checked without a GPU.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "spark_decode/model_shape.h"

namespace spark_decode {

// ---- the engines ------------------------------------------------------------

// The GEMM engines, by algorithm (src/kernels/gemm/):
//   splitk_mma  K split over the S CTAs of a cluster, weights from global
//               memory straight into mma.sync registers, warp partials summed
//               at cluster rank 0 (the unpooler's engine, and the pooler's at
//               tp >= 2);
//   ring_mma    weights through per-warp rings of shared-memory stages filled
//               by cp.async, one CTA per SM walking 32-row tiles;
//   skinny      a CUDA-core skinny GEMM with the launch shape (block_size,
//               outputs_per_block, k_unroll);
//   onchip_mma  the split-K engine's decomposition and sum, with every weight
//               byte of a CTA copied into its shared memory by bulk copies
//               before griddepcontrol.wait (small shards: tp 4, tp 8).
enum class GemmEngine { splitk_mma, ring_mma, skinny, onchip_mma };
const char* engine_name(GemmEngine engine);

// Rows of W per split-K CTA row tile (the MMA's M) and K per 16-byte load
// step of a lane quad.
inline constexpr int kSplitKTileN = 16;
inline constexpr int kSplitKBlockK = 32;
// The K-per-warp widths with a compiled split-K kernel: a warp holds its
// whole weight slice in registers (kw / 4 per thread), so wider slices leave
// room for fewer threads (splitk_max_warps).
inline constexpr std::array<int, 3> kSplitKKws = {64, 128, 256};
// The one (kw, accs) compiled with fragment-order weight loads
// (SplitKTactic::row_swizzle = false).
inline constexpr int kSplitKUnswizzledKw = 256;
inline constexpr int kSplitKUnswizzledAccs = 1;
// The row tiles per CTA with a compiled kernel (SplitKTactic::row_tiles).
inline constexpr std::array<int, 2> kSplitKRowTiles = {1, 2};
int splitk_max_warps(int kw, int row_tiles = 1);

// Launch shape of the split-K engine for one weight shape: S, kw and accs fix
// the summation order; the token tile and row tiles (per m) and the
// scheduling and load pattern do not (every value gives the same bits).
struct SplitKTactic {
  int splits = 1;  // S: CTAs of one cluster splitting K
  int kw = 256;    // consecutive K per warp
  int accs = 2;    // independent accumulator sets per warp
  // token_tile[m - 1]: the token tile (8 or 16) that serves a batch of m.
  std::array<int, kMaxBatch> token_tile = {8, 8, 8, 8, 8, 8, 8, 8, 16, 16, 16, 16, 16, 16, 16, 16};
  // row_tiles[m - 1]: 16-row MMA tiles per CTA (R, one of kSplitKRowTiles)
  // for a batch of m. R = 2 lets a CTA own 32 features and reuse each
  // activation fragment for both, halving the activation reads that bound
  // large batches, in half the CTAs.
  std::array<int, kMaxBatch> row_tiles = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  // Clusters (S > 1) launched with the load-balancing scheduling policy
  // instead of the default (spread): it places the next wave's clusters
  // sooner where a grid runs in two or more waves. Ignored at S = 1.
  bool cluster_balance = false;
  // Weight loads row-swizzled: each load instruction reads 4 rows x 128
  // contiguous bytes, and lanes exchange halves by shuffle before the MMA,
  // instead of 8 rows x 64 bytes in the MMA fragment's order. Compiled in
  // fragment order (false) for kw = 256, accs = 1 only.
  bool row_swizzle = true;

  int warps(int k) const { return k / (splits * kw); }
  std::string to_string() const;
  // Written out (not defaulted) so that the public headers stay C++17 for
  // C++17 consumers such as vLLM's extension; a new field joins it (the
  // static_assert below counts the bytes).
  bool operator==(const SplitKTactic& o) const {
    return splits == o.splits && kw == o.kw && accs == o.accs && token_tile == o.token_tile &&
           row_tiles == o.row_tiles && cluster_balance == o.cluster_balance && row_swizzle == o.row_swizzle;
  }
  bool operator!=(const SplitKTactic& o) const { return !(*this == o); }
};
static_assert(sizeof(SplitKTactic) == 3 * sizeof(int) + 2 * kMaxBatch * sizeof(int) + sizeof(int),  // + 2 bools, padded
              "a field was added to SplitKTactic: add it to operator== too");

// Why no split-K kernel launches for an [n, k] weight with K split over
// `splits` CTAs, `kw` K per warp and `accs` accumulators, or nullopt.
std::optional<std::string> launch_unsupported(int n, int k, int splits, int kw, int accs);
// The same, plus the token tiles (each 8 or 16, covering its m) and the row
// tiles (1; or 2 where N % 32 == 0, accs <= 2 and the partials fit).
std::optional<std::string> launch_unsupported(int n, int k, const SplitKTactic& tactic);

// Launch shape of the on-chip MMA engine (src/kernels/gemm/onchip_mma.cuh):
// the split-K engine's decomposition (grid (N / 16, S), cluster (1, S, 1),
// CTA (t, s) owning rows [16t, 16t + 16) and K slice [s K / S, (s + 1) K /
// S), warp w of it the kw consecutive K from s K / S + w kw), with the CTA's
// whole weight slice copied into its shared memory before
// griddepcontrol.wait. The copies are `stages` groups of one bulk copy per
// row, stage q holding the K of warps [q G, (q + 1) G), G = stage_warps;
// a warp multiplies as soon as its stage has landed.
//
// Its sum is the split-K engine's: each warp's MMA steps in K order into
// accumulator set step % accs, the sets in order, then the K / kw warp
// partials in K order at cluster rank 0. That order depends on (K, kw, accs)
// only, not on S (a partial's place in the sum is its K chunk, whichever CTA
// computed it), so at the split-K tactic's kw and accs this engine gives the
// split-K engine's bits at any S (docs/design.md, "Engines"; tested).
struct OnchipTactic {
  int splits = 1;  // S: CTAs of one cluster splitting K
  int kw = 256;    // consecutive K per warp
  int accs = 1;    // independent accumulator sets per warp
  // token_tile[m - 1]: the token tile (8 or 16) that serves a batch of m.
  std::array<int, kMaxBatch> token_tile = {8, 8, 8, 8, 8, 8, 8, 8, 16, 16, 16, 16, 16, 16, 16, 16};
  // row_tiles[m - 1]: 16-row MMA tiles per CTA (R: 1, or 2 where m's token
  // tile is 16) for a batch of m; R changes the grid (N / (16 R), S), not a
  // row's arithmetic, so it may change with m.
  std::array<int, kMaxBatch> row_tiles = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  // Clusters (S > 1) launched with the load-balancing scheduling policy.
  bool cluster_balance = false;
  // Warps per copy stage (G, a power of two dividing the warps per CTA):
  // each stage is 16 bulk copies of G kw consecutive K. Fewer, larger copies
  // cost the one issuing thread less and stream better; more stages let the
  // first warps multiply sooner. 0: the default, copies of at least
  // kOnchipCopyBytes where the warps allow.
  int stage_warps = 0;

  int warps(int k) const { return k / (splits * kw); }
  // stage_warps, with 0 resolved to the default for K = k.
  int stage_warps_for(int k) const;
  std::string to_string() const;
  // Written out for C++17 consumers (see SplitKTactic).
  bool operator==(const OnchipTactic& o) const {
    return splits == o.splits && kw == o.kw && accs == o.accs && token_tile == o.token_tile &&
           row_tiles == o.row_tiles && cluster_balance == o.cluster_balance && stage_warps == o.stage_warps;
  }
  bool operator!=(const OnchipTactic& o) const { return !(*this == o); }
};
static_assert(sizeof(OnchipTactic) == 3 * sizeof(int) + 2 * kMaxBatch * sizeof(int) + 2 * sizeof(int),  // bool padded
              "a field was added to OnchipTactic: add it to operator== too");

// The compiled on-chip kernels: kw in kOnchipKws, accs 1..kOnchipMaxAccs,
// token tiles 8 and 16, at most kOnchipMaxWarps warps per CTA.
inline constexpr std::array<int, 2> kOnchipKws = {128, 256};
inline constexpr int kOnchipMaxAccs = 2;
inline constexpr int kOnchipMaxWarps = 16;
// Row tiles per CTA (16 R rows sharing every x fragment): R = 1 at every
// token tile, R = 2 at token tile 16 only (where the x reads, one per CTA
// and token, would otherwise rival the weights' bytes), with at most
// kOnchipRowTiles2Warps warps (its lanes hold twice the accumulators).
inline constexpr int kOnchipMaxRowTiles = 2;
inline constexpr int kOnchipRowTiles2Warps = 8;
// The default tactic's grid: the least S that gives at least this many CTAs
// (about one per SM of an H100 / H200, 132 SMs) where one fits.
inline constexpr int kOnchipTargetCtas = 128;
// The default copy: G kw BF16 of one row, at least this many bytes.
inline constexpr int kOnchipCopyBytes = 2048;

// Why the on-chip engine cannot run [n, k] at `tactic`, or nullopt: n % 16,
// S in {1, 2, 4, 8}, the compiled kw and accs, K = S x warps x kw with 1..16
// warps, stage_warps a power of two dividing the warps, token tiles 8 or 16 covering each
// m, and the CTA's stages, partials and header within the shared memory of a
// block (kMaxSmemPerBlock; the device's own limit is checked at
// construction).
std::optional<std::string> onchip_unsupported(int n, int k, const OnchipTactic& tactic);

// Launch shape of the skinny GEMM: block_size threads per CTA over K,
// outputs_per_block columns per CTA, k_unroll 16-byte weight vectors per
// thread and output loaded together (one chunk).
struct PoolerGemmShape {
  int block_size = 512;
  int outputs_per_block = 4;
  int k_unroll = 2;
  std::string to_string() const;
  // Written out for C++17 consumers (see SplitKTactic).
  bool operator==(const PoolerGemmShape& o) const {
    return block_size == o.block_size && outputs_per_block == o.outputs_per_block && k_unroll == o.k_unroll;
  }
  bool operator!=(const PoolerGemmShape& o) const { return !(*this == o); }
};
static_assert(sizeof(PoolerGemmShape) == 3 * sizeof(int), "a field was added to PoolerGemmShape: add it to operator== too");

// The skinny shapes with a compiled kernel (each for row tiles 1, 2, 4, 8, 16).
const std::vector<PoolerGemmShape>& pooler_gemm_shapes();
// Why the skinny GEMM cannot run [n, k] at `shape` for m rows, or nullopt.
std::optional<std::string> pooler_gemm_unsupported(int n, int k, int m, const PoolerGemmShape& shape);

// The ring engine's granularity: rows per tile, and the K that every warp's
// 8 KiB stages divide (8 warps x 128 K).
inline constexpr int kRingRows = 32;
inline constexpr int kRingKMultiple = 1024;

// ---- the plan table -----------------------------------------------------------

// The boundary ops a plan row serves: the unpooler GEMM ([H/tp, P] weight),
// and the pooler (its GEMM over a [P/tp, H] weight, publish and consumer).
enum class PlanOp { unpooler, pooler };
const char* op_name(PlanOp op);
// How Pooler::run publishes the GEMM's output: from the GEMM's epilogue (one
// kernel fewer) or with the mailbox's publish kernel after it. The same bytes
// and stage word either way. (The unpooler's rows: epilogue, its zero-copy
// publish when it has a mailbox.)
enum class PublishRoute { epilogue, kernel };
// Where the pooler's fused consumer lets the next kernel (with programmatic
// dependent launch) launch: at its start, or once its data has arrived. The
// same bytes either way.
enum class ConsumerLaunch { early, late };

struct PlanRow {
  PlanOp op;
  int tp;
  int b_first, b_last;  // the batches this row serves, inclusive
  GemmEngine engine;
  // The split-K parameters of this row's batches: S, kw, accs, cluster
  // balance and row swizzle for the shape, the token tile and row tiles for
  // these b. Filled in every row, also where another engine serves: they are
  // what the split-K engine runs when a caller forces it (benchmarks, tests).
  // The on-chip engine runs the row's kw, accs and token tile too (the same
  // reduction order as the split-K engine at any S).
  int splits, kw, accs, token_tile, row_tiles;
  bool cluster_balance, row_swizzle;
  // Where the row names onchip_mma: the on-chip engine's S, warps per copy
  // stage (OnchipTactic::stage_warps), cluster policy and row tiles
  // (OnchipTactic::row_tiles) for these b; 0, 0, false, 0 elsewhere (a
  // forced on-chip engine then runs the shape's first on-chip row, or
  // onchip_tactic's default where there is none).
  int onchip_splits, onchip_stage_warps;
  bool onchip_cluster_balance;
  int onchip_row_tiles;
  PublishRoute publish;
  ConsumerLaunch consumer;
  const char* measured;  // the measurement that chose the row (file @ commit)
};

struct PlanTable {
  const char* machine;  // the machine kind it was measured on
  const PlanRow* rows;
  int size;
};

// The table of this machine kind. One kind is measured (nvidia-h200); every
// device uses it until another kind has its own.
const PlanTable& plan_table();
// Why `table` breaks a rule (an (op, tp, b) of the model served by no row or
// by two, two reduction orders within one (op, tp), split-K or on-chip
// parameters no kernel takes at the model's shape), or nullopt.
std::optional<std::string> plan_table_unsupported(const PlanTable& table);
// The row serving (op, tp, b) at the model's shapes, or nullptr.
const PlanRow* plan_row(PlanOp op, int tp, int b);
// The tp at which [n, k] is `op`'s model shape (unpooler: n = H / tp, k = P;
// pooler: n = P / tp, k = H), or 0.
int model_tp(PlanOp op, int n, int k);
// The split-K tactic for an [n, k] weight of `op`: the table's rows where
// [n, k] is a model shape, else a valid default (or, for a shape no tactic
// can run, one whose launch_unsupported() says why).
SplitKTactic splitk_tactic(PlanOp op, int n, int k);
// The on-chip tactic that serves m rows of an [n, k] weight of `op`: where
// [n, k] is a model shape and some of its rows name onchip_mma, the tactic of
// the row of m if it does, else of the shape's first such row (what a
// forced on-chip engine runs at that m); otherwise the kw and accs of
// splitk_tactic(op, n, k) (so the same bits as the split-K engine) where
// compiled, with the least S giving kOnchipTargetCtas CTAs that fits (else
// the valid S with the most CTAs), at every m; for a shape nothing takes, one
// whose onchip_unsupported() says why. A shape's rows share the reduction
// order (kw, accs) and may differ in S, copy stages, cluster policy and row
// tiles, which move work between CTAs, never the sum.
OnchipTactic onchip_tactic(PlanOp op, int n, int k, int m = 1);
// The table as text, one row per line, for logs and `spark-decode tactics`.
std::string format_plan_table();

}  // namespace spark_decode
