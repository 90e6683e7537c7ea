// The unpooler's launch-shape checks and tactic table (plain C++: they run
// and are tested on machines without a GPU).
#include <algorithm>
#include <sstream>

#include "kernels/unpooler/unpooler_config.h"
#include "spark_decode/error.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/unpooler.h"

namespace spark_decode {

int unpooler_max_warps(int kw, int row_tiles) { return kernels::unpooler_max_threads(kw, row_tiles) / 32; }

std::string UnpoolerTactic::to_string() const {
  std::ostringstream os;
  os << "S=" << splits << " kw=" << kw << " accs=" << accs << " tile16_from_m=";
  int from = 0;
  for (int m = 1; m <= kUnpoolerMaxM; ++m)
    if (token_tile[m - 1] == 16) {
      from = m;
      break;
    }
  if (from)
    os << from;
  else
    os << "never";
  // Row tiles only when used, so that SPEC §2.1's tactics print as before:
  // the m served with R tiles (16R rows per CTA), as ranges ("1-8,16").
  for (int rows : kUnpoolerRowTiles) {
    if (rows == 1) continue;
    std::ostringstream ranges;
    for (int m = 1; m <= kUnpoolerMaxM; ++m) {
      if (row_tiles[m - 1] != rows) continue;
      int last = m;
      while (last < kUnpoolerMaxM && row_tiles[last] == rows) ++last;
      if (ranges.tellp() > 0) ranges << ",";
      ranges << m;
      if (last > m) ranges << "-" << last;
      m = last;
    }
    if (ranges.tellp() > 0) os << " rows" << rows * kUnpoolerTileN << "_at_m=" << ranges.str();
  }
  if (cluster_balance && splits > 1) os << " cluster_balance";
  if (!row_swizzle) os << " unswizzled";
  return os.str();
}

std::optional<std::string> launch_unsupported(int n, int k, int splits, int kw, int accs) {
  using detail::concat;
  if (n <= 0 || n % kUnpoolerTileN || (splits != 1 && splits != 2 && splits != 4 && splits != 8) ||
      (accs != 1 && accs != 2 && accs != 4))
    return concat("unsupported shape or tactic n=", n, " splits=", splits, " accs=", accs);
  if (k <= 0 || kw <= 0 || k % (splits * kw) || kw % kUnpoolerBlockK)
    return concat("K=", k, " does not split into ", splits, " x warps x ", kw);
  const int warps = k / (splits * kw);
  if (warps < 1 || warps > 32) return concat(warps, " warps per CTA");
  if (std::find(kUnpoolerKws.begin(), kUnpoolerKws.end(), kw) == kUnpoolerKws.end()) {
    std::ostringstream os;
    os << "kw=" << kw << " has no compiled kernel (compiled:";
    for (int c : kUnpoolerKws) os << " " << c;
    os << ")";
    return os.str();
  }
  if (warps > unpooler_max_warps(kw))
    return concat("kw=", kw, " runs at most ", unpooler_max_warps(kw),
                  " warps per CTA (each lane holds kw/4 registers of weights), got ", warps);
  const int smem = kernels::unpooler_smem_bytes(k, kw, 16);
  if (smem > kernels::kMaxSmemPerBlock)
    return concat(k / kw, " warp partials need ", smem,
                  " bytes of shared memory at cluster rank 0, more than ",
                  kernels::kMaxSmemPerBlock);
  return std::nullopt;
}

std::optional<std::string> launch_unsupported(int n, int k, const UnpoolerTactic& tactic) {
  if (auto reason = launch_unsupported(n, k, tactic.splits, tactic.kw, tactic.accs)) return reason;
  if (!tactic.row_swizzle && (tactic.kw != kUnpoolerUnswizzledKw || tactic.accs != kUnpoolerUnswizzledAccs))
    return detail::concat("fragment-order (unswizzled) weight loads are compiled for kw=", kUnpoolerUnswizzledKw,
                          " accs=", kUnpoolerUnswizzledAccs, " only, got kw=", tactic.kw, " accs=", tactic.accs);
  for (int m = 1; m <= kUnpoolerMaxM; ++m) {
    const int tile = tactic.token_tile[m - 1], rows = tactic.row_tiles[m - 1];
    if ((tile != 8 && tile != 16) || tile < m)
      return detail::concat("token tiles (", tactic.to_string(), ") do not cover M 1..",
                            kUnpoolerMaxM, ": m=", m, " has tile ", tile);
    if (std::find(kUnpoolerRowTiles.begin(), kUnpoolerRowTiles.end(), rows) == kUnpoolerRowTiles.end())
      return detail::concat("m=", m, " has ", rows, " row tiles per CTA; 1 or 2 are compiled");
  }
  using detail::concat;
  // Every R > 1 the tactic uses must fit.
  for (int rows : kUnpoolerRowTiles) {
    if (rows == 1 || std::find(tactic.row_tiles.begin(), tactic.row_tiles.end(), rows) == tactic.row_tiles.end())
      continue;
    if (n % (rows * kUnpoolerTileN))
      return concat(rows, " row tiles per CTA need N % ", rows * kUnpoolerTileN, " == 0, got N=", n);
    if (tactic.accs * rows > 4)
      return concat(rows, " row tiles per CTA are compiled for accs <= ", 4 / rows, ", got accs=", tactic.accs);
    const int warps = tactic.warps(k);
    if (warps > unpooler_max_warps(tactic.kw, rows))
      return concat(rows, " row tiles per CTA run at most ", unpooler_max_warps(tactic.kw, rows),
                    " warps per CTA, got ", warps);
    const int smem = kernels::unpooler_smem_bytes(k, tactic.kw, 16, rows);
    if (smem > kernels::kMaxSmemPerBlock)
      return concat(k / tactic.kw, " warp partials of ", rows, " row tiles need ", smem,
                    " bytes of shared memory at cluster rank 0, more than ", kernels::kMaxSmemPerBlock);
  }
  return std::nullopt;
}

namespace {

// Two row tiles per CTA for m in [rows32_from, rows32_to] (default: none).
UnpoolerTactic make_tactic(int splits, int kw, int accs, int tile16_from, int rows32_from = 0,
                           int rows32_to = -1) {
  UnpoolerTactic t;
  t.splits = splits;
  t.kw = kw;
  t.accs = accs;
  for (int m = 1; m <= kUnpoolerMaxM; ++m) {
    t.token_tile[m - 1] = m >= tile16_from ? 16 : 8;
    t.row_tiles[m - 1] = m >= rows32_from && m <= rows32_to ? 2 : 1;
  }
  return t;
}

UnpoolerTactic balanced(UnpoolerTactic t) {
  t.cluster_balance = true;
  return t;
}

UnpoolerTactic unswizzled(UnpoolerTactic t) {
  t.row_swizzle = false;
  return t;
}

// A valid tactic for a shape the table does not list: a heuristic read off
// the H200 tune (bench/results/unpooler_tune_*.json): enough CTAs for about
// two per SM (the least S with (N / 16) * S >= 256), then the widest weight
// slice per warp that the register budget allows.
UnpoolerTactic default_tactic(int n, int k) {
  const int tiles = std::max(n / kUnpoolerTileN, 1);
  std::vector<int> order;
  for (int s : {1, 2, 4, 8})
    if (tiles * s >= 256 || s == 8) order.push_back(s);
  for (int s : {8, 4, 2, 1})
    if (std::find(order.begin(), order.end(), s) == order.end()) order.push_back(s);
  for (int s : order)
    for (int kw : {256, 128, 64})
      if (!launch_unsupported(n, k, s, kw, 2)) return make_tactic(s, kw, 2, 9);
  return make_tactic(1, kUnpoolerKws.front(), 1, 9);  // invalid: unsupported() says why
}

}  // namespace

const std::vector<UnpoolerTacticEntry>& unpooler_tactic_table() {
  // The unpooler's shapes: N = H / tp at K = P, for tp = 1, 2, 4, 8.
  // Chosen by `spark-decode tune unpooler` (every valid tactic, M = 1, 2, 4,
  // 8, 16, each with every compiled row tiling, CUDA graphs over cold
  // weights) twice: with PDL off (`graph`) and in a PDL chain (`--pdl`).
  // S, kw and accs fix the bits, so one choice serves both modes (PDL on
  // must equal off); it is the lowest sum of the two modes' mean time over
  // M, with at each M the row tiling of the lowest sum of the two modes
  // (one choice serves both; token tile 8 serves M 1..8, 16 serves 9..16):
  // tools/rank_tune.py. Figures below: PDL off / PDL chain, us, at M = 1 ..
  // 16 (or 4, 8, 16 at the pooler's shapes), from the row-swizzled kernel.
  static const char* kMeasured =
      "H200, 2026-12-02, unpooler_tune{,_pdl}_2026-12-02_d8f8ee3: lowest sum of the two modes' "
      "mean us over M 1, 2, 4, 8, 16";
  static const char* kMeasuredTp8 =
      "H200, 2026-12-02, unpooler_tune{,_pdl}_tp8_2026-12-02_b54ffc4 (with fragment-order loads): lowest "
      "sum of the two modes' mean us over M 1, 2, 4, 8, 16";
  static const char* kMeasuredPooler =
      "H200, 2026-12-02, unpooler_tune_pooler_shapes{,_pdl}_2026-12-02_d8f8ee3: lowest sum of "
      "the two modes' mean us over M 4, 8, 16";
  static const std::vector<UnpoolerTacticEntry> table = {
      // 18.28 / 15.51 at M = 1, 18.36 / 15.74 at 8, 20.19 / 16.86 at 16; accs=1
      // within 0.1 us (18.29 / 15.53 ... 20.19 / 16.88), not balanced 0.4-0.7 slower.
      {kMuseSpark.hidden / 1, kMuseSpark.pooled, balanced(make_tactic(2, 256, 2, 9, 1, 16)), kMeasured},
      // 10.31 / 7.87 at M = 1, 10.44 / 8.23 at 8, 11.50 / 9.02 at 16: the PDL
      // chain 0.3-0.8 us faster than accs=1 without balancing at equal PDL-off times.
      {kMuseSpark.hidden / 2, kMuseSpark.pooled, balanced(make_tactic(2, 256, 2, 9, 1, 16)), kMeasured},
      // One row tile but at M = 8: 6.77 / 5.15 at M = 1, 7.12 / 5.45 at 8 (one
      // tile 7.21 / 5.58), 7.94 / 6.34 at 16 (two: 7.87 / 7.05). M 5..7 were not
      // measured and keep one tile, which won at M = 4 (6.97 / 5.31 vs 7.04 / 5.34).
      // Checked in a bench run of this table: 7.09 / 5.36 at M = 8 against one
      // tile's 7.11-7.18 / 5.54-5.58 in earlier runs (unpooler_tp4_2026-12-02_ff6a400).
      {kMuseSpark.hidden / 4, kMuseSpark.pooled, balanced(make_tactic(2, 256, 1, 9, 8, 8)), kMeasured},
      // Fragment-order loads: 64 CTAs leave half the SMs idle, so the grid is
      // latency-bound and the row swizzle's exchange after griddepcontrol.wait
      // costs more than its coalescing gains. 4.86 / 3.06 at M = 1, 5.07 / 3.20
      // at 8, 5.97 / 4.65 at 16; swizzled 4.94 / 3.23, 5.25 / 3.26, 6.02 / 4.52;
      // the best swizzled tactic (S=4 kw=128 accs=2 balanced) 4.87 / 3.31,
      // 5.15 / 3.41, 5.87 / 3.69 (unpooler_tune{,_pdl}_tp8_2026-12-02_b54ffc4,
      // lowest sum of both modes with one row tiling per M for both).
      {kMuseSpark.hidden / 8, kMuseSpark.pooled, unswizzled(make_tactic(1, 256, 1, 9)), kMeasuredTp8},
      // The pooler GEMM's shapes N = P / tp at K = H, which the Pooler's MMA
      // engine serves from b = 2 on (b = 3 at tp 1): `tune unpooler
      // --pooler-shapes --m 4,8,16`, both modes, each clustered tactic under
      // both scheduling policies. At S = 2 a CTA of 16 warps fills an SM; at
      // S = 4 a CTA of 8 warps leaves room for a second, and load balancing
      // places the next cluster as soon as two half-free SMs exist.
      // tp 1: 18.23 / 15.75, 18.54 / 15.78, 20.30 / 17.30 (S=2: 19.27 / 15.85,
      // 19.56 / 16.20, 21.53 / 17.71).
      {kMuseSpark.pooled / 1, kMuseSpark.hidden, balanced(make_tactic(4, 256, 1, 9, 1, 16)), kMeasuredPooler},
      // tp 2: 10.50 / 8.24, 10.59 / 8.47, 11.86 / 8.79.
      {kMuseSpark.pooled / 2, kMuseSpark.hidden, balanced(make_tactic(4, 256, 1, 9, 1, 16)), kMeasuredPooler},
      // tp 4: 7.00 / 5.33, 7.27 / 5.60, 8.28 / 6.33.
      {kMuseSpark.pooled / 4, kMuseSpark.hidden, balanced(make_tactic(4, 256, 1, 9)), kMeasuredPooler},
      // tp 8: 5.46 / 3.20, 5.79 / 3.35, 6.68 / 4.87; S=4 balanced ties (sum 9.76 vs 9.78).
      {kMuseSpark.pooled / 8, kMuseSpark.hidden, make_tactic(2, 256, 1, 9), kMeasuredPooler},
  };
  return table;
}

UnpoolerTactic unpooler_tactic(int n, int k) {
  for (const auto& e : unpooler_tactic_table())
    if (e.n == n && e.k == k) return e.tactic;
  return default_tactic(n, k);
}

std::string format_unpooler_tactic_table() {
  std::ostringstream os;
  os << "unpooler tactics (N, K -> S, kw, accs, token tile, row tiles per CTA where not 1):\n";
  for (const auto& e : unpooler_tactic_table()) {
    const auto& r = e.tactic.row_tiles;
    os << "  N=" << e.n << " K=" << e.k << " -> " << e.tactic.to_string() << "  (" << e.tactic.warps(e.k)
       << " warps/CTA, grid";
    for (int rows : kUnpoolerRowTiles)
      if (std::find(r.begin(), r.end(), rows) != r.end())
        os << " " << e.n / (rows * kUnpoolerTileN) << "x" << e.tactic.splits;
    os << "; " << e.measured << ")\n";
  }
  return os.str();
}

}  // namespace spark_decode
