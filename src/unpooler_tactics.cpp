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
  // Row tiles only when used, so that SPEC §2.1's tactics print as before.
  for (int m = 1; m <= kUnpoolerMaxM; ++m)
    if (row_tiles[m - 1] != 1) {
      os << " rows32_at_m=";
      bool first = true;
      for (int j = m; j <= kUnpoolerMaxM; ++j)
        if (row_tiles[j - 1] != 1) {
          os << (first ? "" : ",") << j;
          first = false;
        }
      break;
    }
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
  bool two_row_tiles = false;
  for (int m = 1; m <= kUnpoolerMaxM; ++m) {
    const int tile = tactic.token_tile[m - 1], rows = tactic.row_tiles[m - 1];
    if ((tile != 8 && tile != 16) || tile < m)
      return detail::concat("token tiles (", tactic.to_string(), ") do not cover M 1..",
                            kUnpoolerMaxM, ": m=", m, " has tile ", tile);
    if (rows != 1 && rows != 2)
      return detail::concat("m=", m, " has ", rows, " row tiles per CTA; 1 or 2 are compiled");
    two_row_tiles |= rows == 2;
  }
  if (!two_row_tiles) return std::nullopt;
  using detail::concat;
  if (n % (2 * kUnpoolerTileN)) return concat("two row tiles per CTA need N % 32 == 0, got N=", n);
  if (tactic.accs > 2) return concat("two row tiles per CTA are compiled for accs 1 and 2, got accs=", tactic.accs);
  const int warps = tactic.warps(k);
  if (warps > unpooler_max_warps(tactic.kw, 2))
    return concat("two row tiles per CTA run at most ", unpooler_max_warps(tactic.kw, 2),
                  " warps per CTA, got ", warps);
  const int smem = kernels::unpooler_smem_bytes(k, tactic.kw, 16, 2);
  if (smem > kernels::kMaxSmemPerBlock)
    return concat(k / tactic.kw, " warp partials of two row tiles need ", smem,
                  " bytes of shared memory at cluster rank 0, more than ", kernels::kMaxSmemPerBlock);
  return std::nullopt;
}

namespace {

// rows32_from: the least m served with two row tiles per CTA (17: none).
UnpoolerTactic make_tactic(int splits, int kw, int accs, int tile16_from, int rows32_from = kUnpoolerMaxM + 1) {
  UnpoolerTactic t;
  t.splits = splits;
  t.kw = kw;
  t.accs = accs;
  for (int m = 1; m <= kUnpoolerMaxM; ++m) {
    t.token_tile[m - 1] = m >= tile16_from ? 16 : 8;
    t.row_tiles[m - 1] = m >= rows32_from ? 2 : 1;
  }
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
  // 8, 16, CUDA graphs over cold weights): the lowest mean time over M.
  static const char* kMeasured = "H200, 2026-12-01, unpooler_tune_2026-12-01: lowest mean us over M 1..16";
  static const char* kMeasuredPooler =
      "H200, 2026-12-01, unpooler_tune_pooler_shapes_2026-12-01: lowest mean us over M 4, 8, 16";
  static const std::vector<UnpoolerTacticEntry> table = {
      {kMuseSpark.hidden / 1, kMuseSpark.pooled, make_tactic(4, 128, 1, 9), kMeasured},
      {kMuseSpark.hidden / 2, kMuseSpark.pooled, make_tactic(2, 256, 1, 9), kMeasured},
      {kMuseSpark.hidden / 4, kMuseSpark.pooled, make_tactic(2, 256, 1, 9), kMeasured},
      {kMuseSpark.hidden / 8, kMuseSpark.pooled, make_tactic(1, 256, 1, 9), kMeasured},
      // The pooler GEMM's shapes N = P / tp at K = H, which the Pooler's MMA
      // engine serves from b = 4 on: `tune unpooler --pooler-shapes --m 4,8,16`.
      {kMuseSpark.pooled / 1, kMuseSpark.hidden, make_tactic(8, 256, 1, 9), kMeasuredPooler},
      {kMuseSpark.pooled / 2, kMuseSpark.hidden, make_tactic(2, 256, 4, 9), kMeasuredPooler},
      {kMuseSpark.pooled / 4, kMuseSpark.hidden, make_tactic(2, 256, 4, 9), kMeasuredPooler},
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
  os << "unpooler tactics (N, K -> S, kw, accs, token tile):\n";
  for (const auto& e : unpooler_tactic_table())
    os << "  N=" << e.n << " K=" << e.k << " -> " << e.tactic.to_string() << "  ("
       << e.tactic.warps(e.k) << " warps/CTA, grid " << e.n / kUnpoolerTileN << "x"
       << e.tactic.splits << "; " << e.measured << ")\n";
  return os.str();
}

}  // namespace spark_decode
