// The plan table: the engines' launch-shape checks, the table of this machine
// kind, its rules, and the lookups the constructors make. Plain C++: it runs
// and is tested on machines without a GPU.
#include <algorithm>
#include <sstream>

#include "kernels/gemm/onchip_mma_config.h"
#include "kernels/gemm/splitk_mma_config.h"
#include "spark_decode/error.h"
#include "spark_decode/plan.h"
#include "spark_decode/pooler_gemm.h"

namespace spark_decode {

const char* engine_name(GemmEngine engine) {
  switch (engine) {
    case GemmEngine::splitk_mma: return "splitk_mma";
    case GemmEngine::ring_mma: return "ring_mma";
    case GemmEngine::skinny: return "skinny";
    case GemmEngine::onchip_mma: return "onchip_mma";
  }
  return "?";
}

const char* op_name(PlanOp op) { return op == PlanOp::unpooler ? "unpooler" : "pooler"; }

// ---- the split-K engine's launch shapes --------------------------------------------

int splitk_max_warps(int kw, int row_tiles) { return kernels::splitk_max_threads(kw, row_tiles) / 32; }

// The least m a token tile of 16 serves ("never" if none): how the split-K
// and on-chip tactics print their tiles.
static std::string first_tile16_m(const std::array<int, kMaxBatch>& token_tile) {
  for (int m = 1; m <= kMaxBatch; ++m)
    if (token_tile[m - 1] == 16) return std::to_string(m);
  return "never";
}

// Row tiles only where used: the m served with 2 tiles (32 rows per CTA), as
// ranges (" rows32_at_m=1-8,16"); "" where every m has one.
static std::string row_tiles_used(const std::array<int, kMaxBatch>& row_tiles) {
  std::ostringstream os;
  for (int rows : kSplitKRowTiles) {
    if (rows == 1) continue;
    std::ostringstream ranges;
    for (int m = 1; m <= kMaxBatch; ++m) {
      if (row_tiles[m - 1] != rows) continue;
      int last = m;
      while (last < kMaxBatch && row_tiles[last] == rows) ++last;
      if (ranges.tellp() > 0) ranges << ",";
      ranges << m;
      if (last > m) ranges << "-" << last;
      m = last;
    }
    if (ranges.tellp() > 0) os << " rows" << rows * kSplitKTileN << "_at_m=" << ranges.str();
  }
  return os.str();
}

std::string SplitKTactic::to_string() const {
  std::ostringstream os;
  os << "S=" << splits << " kw=" << kw << " accs=" << accs << " tile16_from_m=" << first_tile16_m(token_tile)
     << row_tiles_used(row_tiles);
  if (cluster_balance && splits > 1) os << " cluster_balance";
  if (!row_swizzle) os << " unswizzled";
  return os.str();
}

std::optional<std::string> launch_unsupported(int n, int k, int splits, int kw, int accs) {
  using detail::concat;
  if (n <= 0 || n % kSplitKTileN || (splits != 1 && splits != 2 && splits != 4 && splits != 8) ||
      (accs != 1 && accs != 2 && accs != 4))
    return concat("unsupported shape or tactic n=", n, " splits=", splits, " accs=", accs);
  if (k <= 0 || kw <= 0 || k % (splits * kw) || kw % kSplitKBlockK)
    return concat("K=", k, " does not split into ", splits, " x warps x ", kw);
  const int warps = k / (splits * kw);
  if (warps < 1 || warps > 32) return concat(warps, " warps per CTA");
  if (std::find(kSplitKKws.begin(), kSplitKKws.end(), kw) == kSplitKKws.end()) {
    std::ostringstream os;
    os << "kw=" << kw << " has no compiled kernel (compiled:";
    for (int c : kSplitKKws) os << " " << c;
    os << ")";
    return os.str();
  }
  if (warps > splitk_max_warps(kw))
    return concat("kw=", kw, " runs at most ", splitk_max_warps(kw),
                  " warps per CTA (each lane holds kw/4 registers of weights), got ", warps);
  const int smem = kernels::splitk_smem_bytes(k, kw, 16);
  if (smem > kernels::kMaxSmemPerBlock)
    return concat(k / kw, " warp partials need ", smem, " bytes of shared memory at cluster rank 0, more than ",
                  kernels::kMaxSmemPerBlock);
  return std::nullopt;
}

std::optional<std::string> launch_unsupported(int n, int k, const SplitKTactic& tactic) {
  using detail::concat;
  if (auto reason = launch_unsupported(n, k, tactic.splits, tactic.kw, tactic.accs)) return reason;
  if (!tactic.row_swizzle && (tactic.kw != kSplitKUnswizzledKw || tactic.accs != kSplitKUnswizzledAccs))
    return concat("fragment-order (unswizzled) weight loads are compiled for kw=", kSplitKUnswizzledKw,
                  " accs=", kSplitKUnswizzledAccs, " only, got kw=", tactic.kw, " accs=", tactic.accs);
  for (int m = 1; m <= kMaxBatch; ++m) {
    const int tile = tactic.token_tile[m - 1], rows = tactic.row_tiles[m - 1];
    if ((tile != 8 && tile != 16) || tile < m)
      return concat("token tiles (", tactic.to_string(), ") do not cover M 1..", kMaxBatch, ": m=", m, " has tile ",
                    tile);
    if (std::find(kSplitKRowTiles.begin(), kSplitKRowTiles.end(), rows) == kSplitKRowTiles.end())
      return concat("m=", m, " has ", rows, " row tiles per CTA; 1 or 2 are compiled");
  }
  // Every R > 1 the tactic uses must fit.
  for (int rows : kSplitKRowTiles) {
    if (rows == 1 || std::find(tactic.row_tiles.begin(), tactic.row_tiles.end(), rows) == tactic.row_tiles.end())
      continue;
    if (n % (rows * kSplitKTileN))
      return concat(rows, " row tiles per CTA need N % ", rows * kSplitKTileN, " == 0, got N=", n);
    if (tactic.accs * rows > 4)
      return concat(rows, " row tiles per CTA are compiled for accs <= ", 4 / rows, ", got accs=", tactic.accs);
    const int warps = tactic.warps(k);
    if (warps > splitk_max_warps(tactic.kw, rows))
      return concat(rows, " row tiles per CTA run at most ", splitk_max_warps(tactic.kw, rows), " warps per CTA, got ",
                    warps);
    const int smem = kernels::splitk_smem_bytes(k, tactic.kw, 16, rows);
    if (smem > kernels::kMaxSmemPerBlock)
      return concat(k / tactic.kw, " warp partials of ", rows, " row tiles need ", smem,
                    " bytes of shared memory at cluster rank 0, more than ", kernels::kMaxSmemPerBlock);
  }
  return std::nullopt;
}

// ---- the on-chip engine's launch shapes -----------------------------------------------

int OnchipTactic::stage_warps_for(int k) const {
  if (stage_warps > 0) return stage_warps;
  // The least power-of-two divisor G of the warps whose copies (G kw BF16 of
  // a row) reach kOnchipCopyBytes, else the largest: few copies for the one
  // issuing thread, yet several stages, so that the first warps multiply
  // while the last stages land.
  const int w = kw > 0 && splits > 0 ? warps(k) : 0;
  int g = 1;
  while (w > 0 && w % (2 * g) == 0 && 2 * g * kw < kOnchipCopyBytes) g *= 2;
  return g;
}

std::string OnchipTactic::to_string() const {
  std::ostringstream os;
  os << "S=" << splits << " kw=" << kw << " accs=" << accs << " tile16_from_m=" << first_tile16_m(token_tile)
     << row_tiles_used(row_tiles);
  if (stage_warps > 0) os << " stage_warps=" << stage_warps;
  if (cluster_balance && splits > 1) os << " cluster_balance";
  return os.str();
}

std::optional<std::string> onchip_unsupported(int n, int k, const OnchipTactic& t) {
  using detail::concat;
  if (n <= 0 || n % kSplitKTileN)
    return concat("on-chip MMA: N=", n, " is not a positive multiple of ", kSplitKTileN);
  if (t.splits != 1 && t.splits != 2 && t.splits != 4 && t.splits != 8)
    return concat("on-chip MMA: splits=", t.splits, " (S in 1, 2, 4, 8)");
  if (std::find(kOnchipKws.begin(), kOnchipKws.end(), t.kw) == kOnchipKws.end() || t.accs < 1 ||
      t.accs > kOnchipMaxAccs) {
    std::ostringstream os;
    os << "on-chip MMA: kw=" << t.kw << " accs=" << t.accs << " has no compiled kernel (kw:";
    for (int c : kOnchipKws) os << " " << c;
    os << "; accs 1.." << kOnchipMaxAccs << ")";
    return os.str();
  }
  if (k <= 0 || k % (t.splits * t.kw))
    return concat("on-chip MMA: K=", k, " does not split into ", t.splits, " x warps x ", t.kw);
  const int warps = t.warps(k);
  if (warps > kOnchipMaxWarps)
    return concat("on-chip MMA: ", warps, " warps per CTA (K / (S kw)), more than ", kOnchipMaxWarps,
                  ": take a larger S");
  const int g = t.stage_warps_for(k);
  if (g < 1 || (g & (g - 1)) || warps % g)
    return concat("on-chip MMA: stage_warps=", t.stage_warps, " is not a power of two dividing the ", warps,
                  " warps per CTA");
  for (int m = 1; m <= kMaxBatch; ++m) {
    const int tile = t.token_tile[m - 1], rows = t.row_tiles[m - 1];
    if ((tile != 8 && tile != 16) || tile < m)
      return concat("on-chip MMA: token tiles (", t.to_string(), ") do not cover M 1..", kMaxBatch, ": m=", m,
                    " has tile ", tile);
    if (rows != 1 && (rows != 2 || tile != 16))
      return concat("on-chip MMA: m=", m, " has ", rows, " row tiles at token tile ", tile,
                    "; 1, or 2 at token tile 16, are compiled");
  }
  // Each (token tile, row tiles) the tactic uses must fit.
  for (int m = 1; m <= kMaxBatch; ++m) {
    const int tile = t.token_tile[m - 1], rows = t.row_tiles[m - 1];
    if (rows == 2) {
      if (n % (2 * kSplitKTileN))
        return concat("on-chip MMA: 2 row tiles per CTA need N % ", 2 * kSplitKTileN, " == 0, got N=", n);
      if (warps > kOnchipRowTiles2Warps)
        return concat("on-chip MMA: 2 row tiles per CTA run at most ", kOnchipRowTiles2Warps, " warps per CTA, got ",
                      warps, ": take a larger S");
    }
    const int smem = kernels::onchip::smem_bytes(k, t.splits, t.kw, tile, rows);
    if (smem > kernels::kMaxSmemPerBlock)
      return concat("on-chip MMA: a CTA's ", 16 * rows * (k / t.splits) * 2, " weight bytes, ", k / t.kw,
                    " warp partials and header need ", smem, " bytes of shared memory, more than ",
                    kernels::kMaxSmemPerBlock);
  }
  return std::nullopt;
}

// ---- the skinny GEMM's and the ring's shapes --------------------------------------

std::string PoolerGemmShape::to_string() const {
  std::ostringstream os;
  os << "skinny(block_size=" << block_size << ", outputs_per_block=" << outputs_per_block
     << ", k_unroll=" << k_unroll << ")";
  return os.str();
}

const std::vector<PoolerGemmShape>& pooler_gemm_shapes() {
  // Keep in step with src/engines/skinny.cu. K = H = 8192 is one chunk (8 *
  // block_size * k_unroll), so a thread's whole weight slice is loaded before
  // griddepcontrol.wait.
  static const std::vector<PoolerGemmShape> shapes = {{512, 4, 2}};
  return shapes;
}

namespace {
std::optional<std::string> batch_unsupported(int m) {
  if (m < 1 || m > kMaxBatch) return detail::concat("pooler GEMM: m = ", m, " outside [1, ", kMaxBatch, "]");
  return std::nullopt;
}
}  // namespace

std::optional<std::string> pooler_gemm_unsupported(int n, int k, int m, const PoolerGemmShape& s) {
  if (std::find(pooler_gemm_shapes().begin(), pooler_gemm_shapes().end(), s) == pooler_gemm_shapes().end()) {
    std::ostringstream os;
    os << s.to_string() << " has no compiled kernel (compiled:";
    for (const auto& c : pooler_gemm_shapes()) os << " " << c.to_string();
    os << ")";
    return os.str();
  }
  if (auto why = batch_unsupported(m)) return why;
  if (n <= 0 || n % s.outputs_per_block)
    return detail::concat("pooler GEMM: N = ", n, " is not a positive multiple of outputs_per_block ",
                          s.outputs_per_block);
  if (k <= 0 || k % (8 * s.block_size * s.k_unroll))
    return detail::concat("pooler GEMM: K = ", k, " is not a positive multiple of 8 * block_size * k_unroll = ",
                          8 * s.block_size * s.k_unroll);
  if (n / s.outputs_per_block > 0x7fffffff / 2) return detail::concat("pooler GEMM: N = ", n, " too large");
  return std::nullopt;
}

std::string PoolerGemmChoice::to_string() const {
  switch (engine) {
    case GemmEngine::skinny: return shape.to_string();
    case GemmEngine::splitk_mma: return "splitk_mma";
    case GemmEngine::ring_mma: return "ring_mma";
    case GemmEngine::onchip_mma: return "onchip_mma";
  }
  return "?";
}

std::vector<PoolerGemmChoice> pooler_gemm_candidates() {
  std::vector<PoolerGemmChoice> out = {
      {GemmEngine::splitk_mma, {}}, {GemmEngine::ring_mma, {}}, {GemmEngine::onchip_mma, {}}};
  for (const auto& s : pooler_gemm_shapes()) out.push_back({GemmEngine::skinny, s});
  return out;
}

std::optional<std::string> pooler_choice_unsupported(int n, int k, int m, const PoolerGemmChoice& c) {
  if (c.engine == GemmEngine::skinny) return pooler_gemm_unsupported(n, k, m, c.shape);
  if (c.engine == GemmEngine::ring_mma) {
    if (auto why = batch_unsupported(m)) return why;
    if (n <= 0 || n % kRingRows)
      return detail::concat("pooler GEMM ring engine: N = ", n, " is not a positive multiple of ", kRingRows);
    if (k <= 0 || k % kRingKMultiple)
      return detail::concat("pooler GEMM ring engine: K = ", k, " is not a positive multiple of ", kRingKMultiple,
                            " (8 warps x ", kRingKMultiple / 8, " K)");
  }
  if (c.engine == GemmEngine::onchip_mma) {
    if (auto why = batch_unsupported(m)) return why;
    if (auto why = onchip_unsupported(n, k, onchip_tactic(PlanOp::pooler, n, k, m))) return "pooler GEMM: " + *why;
  }
  return std::nullopt;
}

// ---- the table --------------------------------------------------------------------

namespace {

constexpr PlanOp unpooler = PlanOp::unpooler, pooler = PlanOp::pooler;
constexpr GemmEngine splitk_mma = GemmEngine::splitk_mma, ring_mma = GemmEngine::ring_mma,
                     onchip_mma = GemmEngine::onchip_mma;
constexpr PublishRoute epilogue = PublishRoute::epilogue, kernel = PublishRoute::kernel;
constexpr ConsumerLaunch early = ConsumerLaunch::early, late = ConsumerLaunch::late;

constexpr PlanRow kH200Rows[] = {
#include "tuning/h200.inc"
};

SplitKTactic make_tactic(int splits, int kw, int accs, int tile16_from, bool balance) {
  SplitKTactic t;
  t.splits = splits;
  t.kw = kw;
  t.accs = accs;
  t.cluster_balance = balance;
  for (int m = 1; m <= kMaxBatch; ++m) t.token_tile[m - 1] = m >= tile16_from ? 16 : 8;
  return t;
}

// A valid tactic for a shape the table does not list, a heuristic read off
// the H200 tunes: enough CTAs for about two per SM (the least S with (N / 16)
// S >= 256), then the widest weight slice per warp the register budget allows.
SplitKTactic default_tactic(int n, int k) {
  const int tiles = std::max(n / kSplitKTileN, 1);
  std::vector<int> order;
  for (int s : {1, 2, 4, 8})
    if (tiles * s >= 256 || s == 8) order.push_back(s);
  for (int s : {8, 4, 2, 1})
    if (std::find(order.begin(), order.end(), s) == order.end()) order.push_back(s);
  for (int s : order)
    for (int kw : {256, 128, 64})
      if (!launch_unsupported(n, k, s, kw, 2)) return make_tactic(s, kw, 2, 9, false);
  return make_tactic(1, kSplitKKws.front(), 1, 9, false);  // invalid: launch_unsupported() says why
}

// The split-K tactic of the rows of (op, tp) in `table` (every b covered).
SplitKTactic tactic_of_rows(const PlanTable& table, PlanOp op, int tp) {
  SplitKTactic t;
  for (int i = 0; i < table.size; ++i) {
    const PlanRow& r = table.rows[i];
    if (r.op != op || r.tp != tp) continue;
    t.splits = r.splits;
    t.kw = r.kw;
    t.accs = r.accs;
    t.cluster_balance = r.cluster_balance;
    t.row_swizzle = r.row_swizzle;
    for (int b = std::max(r.b_first, 1); b <= std::min(r.b_last, kMaxBatch); ++b) {
      t.token_tile[b - 1] = r.token_tile;
      t.row_tiles[b - 1] = r.row_tiles;
    }
  }
  return t;
}

// The on-chip row of (op, tp) in `table` whose tactic serves b: the row of b
// where it names onchip_mma, else the shape's first such row (what a forced
// on-chip engine runs at a b the split-K engine serves); nullptr if none.
const PlanRow* onchip_row_for(const PlanTable& table, PlanOp op, int tp, int b) {
  const PlanRow* first = nullptr;
  for (int i = 0; i < table.size; ++i) {
    const PlanRow& r = table.rows[i];
    if (r.op != op || r.tp != tp || r.engine != GemmEngine::onchip_mma) continue;
    if (b >= r.b_first && b <= r.b_last) return &r;
    if (!first || r.b_first < first->b_first) first = &r;
  }
  return first;
}

bool same_onchip_launch(const PlanRow& a, const PlanRow& b) {
  return a.onchip_splits == b.onchip_splits && a.onchip_stage_warps == b.onchip_stage_warps &&
         a.onchip_cluster_balance == b.onchip_cluster_balance;
}

// The on-chip tactic of `row`, an on-chip row of its (op, tp) in `table`: the
// shape's reduction order and token tiles, the row's S, copy stages and
// cluster policy, and the row tiles of every on-chip row of the shape with
// that same S, copy stages and policy (one elsewhere). Rows of one shape may
// differ in these (the tile-16 batches may take another S than the tile-8
// ones): they move work between CTAs and copies, never the sum.
OnchipTactic onchip_of_row(const PlanTable& table, const PlanRow& row) {
  const SplitKTactic s = tactic_of_rows(table, row.op, row.tp);
  OnchipTactic t;
  t.kw = s.kw;
  t.accs = s.accs;
  t.token_tile = s.token_tile;
  t.splits = row.onchip_splits;
  t.stage_warps = row.onchip_stage_warps;
  t.cluster_balance = row.onchip_cluster_balance;
  for (int i = 0; i < table.size; ++i) {
    const PlanRow& r = table.rows[i];
    if (r.op != row.op || r.tp != row.tp || r.engine != GemmEngine::onchip_mma || !same_onchip_launch(r, row))
      continue;
    for (int b = std::max(r.b_first, 1); b <= std::min(r.b_last, kMaxBatch); ++b)
      t.row_tiles[b - 1] = r.onchip_row_tiles;
  }
  return t;
}

// The default on-chip tactic (see onchip_tactic): the split-K tactic's
// reduction order where compiled, else every compiled one; at each, the
// least S reaching kOnchipTargetCtas CTAs, else the valid S with the most.
OnchipTactic default_onchip(int n, int k, const SplitKTactic& splitk) {
  OnchipTactic t;
  t.token_tile = splitk.token_tile;
  std::vector<std::pair<int, int>> orders = {{splitk.kw, splitk.accs}};
  for (int kw : {256, 128})
    for (int accs = 1; accs <= kOnchipMaxAccs; ++accs) orders.push_back({kw, accs});
  const int tiles = std::max(n / kSplitKTileN, 1);
  for (const auto& [kw, accs] : orders) {
    t.kw = kw;
    t.accs = accs;
    int best = 0;
    for (int s : {1, 2, 4, 8}) {
      t.splits = s;
      if (onchip_unsupported(n, k, t)) continue;
      best = s;
      if (tiles * s >= kOnchipTargetCtas) break;
    }
    if (best) {
      t.splits = best;
      return t;
    }
  }
  t.kw = splitk.kw;
  t.accs = splitk.accs;
  t.splits = 1;
  return t;  // invalid: onchip_unsupported() says why
}

}  // namespace

OnchipTactic onchip_tactic(PlanOp op, int n, int k, int m) {
  if (const int tp = model_tp(op, n, k))
    if (const PlanRow* row = onchip_row_for(plan_table(), op, tp, std::clamp(m, 1, kMaxBatch)))
      return onchip_of_row(plan_table(), *row);
  return default_onchip(n, k, splitk_tactic(op, n, k));
}

const PlanTable& plan_table() {
  static const PlanTable table{"nvidia-h200", kH200Rows, static_cast<int>(std::size(kH200Rows))};
  return table;
}

int model_tp(PlanOp op, int n, int k) {
  const int full = op == PlanOp::unpooler ? kMuseSpark.hidden : kMuseSpark.pooled;
  const int depth = op == PlanOp::unpooler ? kMuseSpark.pooled : kMuseSpark.hidden;
  for (int tp : kTensorParallelSizes)
    if (k == depth && n * tp == full) return tp;
  return 0;
}

std::optional<std::string> plan_table_unsupported(const PlanTable& table) {
  using detail::concat;
  for (PlanOp op : {PlanOp::unpooler, PlanOp::pooler})
    for (int tp : kTensorParallelSizes) {
      const int full = op == PlanOp::unpooler ? kMuseSpark.hidden : kMuseSpark.pooled;
      const int depth = op == PlanOp::unpooler ? kMuseSpark.pooled : kMuseSpark.hidden;
      const PlanRow* first = nullptr;
      for (int b = 1; b <= kMaxBatch; ++b) {
        const PlanRow* row = nullptr;
        for (int i = 0; i < table.size; ++i) {
          const PlanRow& r = table.rows[i];
          if (r.op != op || r.tp != tp || b < r.b_first || b > r.b_last) continue;
          if (row) return concat(table.machine, ": ", op_name(op), " tp ", tp, " b ", b, " has two rows");
          row = &r;
        }
        if (!row) return concat(table.machine, ": ", op_name(op), " tp ", tp, " b ", b, " has no row");
        if (!first) first = row;
        // The split-K and the on-chip engines sum in one order (see
        // OnchipTactic): a shape may mix them, no other engine.
        const auto family = [](GemmEngine e) { return e == GemmEngine::onchip_mma ? GemmEngine::splitk_mma : e; };
        if (family(row->engine) != family(first->engine))
          return concat(table.machine, ": ", op_name(op), " tp ", tp, " runs ", engine_name(first->engine), " at b ",
                        first->b_first, " and ", engine_name(row->engine), " at b ", b,
                        ": two reduction orders for one shape");
        if (row->splits != first->splits || row->kw != first->kw || row->accs != first->accs)
          return concat(table.machine, ": ", op_name(op), " tp ", tp,
                        " changes the split-K S, kw or accs between b ", first->b_first, " and b ", b,
                        ": two reduction orders for one shape");
        if (row->cluster_balance != first->cluster_balance || row->row_swizzle != first->row_swizzle)
          return concat(table.machine, ": ", op_name(op), " tp ", tp,
                        " changes the cluster policy or row swizzle within the shape (b ", b, ")");
        const bool onchip = row->engine == GemmEngine::onchip_mma;
        if (!onchip &&
            (row->onchip_splits || row->onchip_stage_warps || row->onchip_cluster_balance || row->onchip_row_tiles))
          return concat(table.machine, ": ", op_name(op), " tp ", tp, " b ", b, " runs ", engine_name(row->engine),
                        " but sets the on-chip fields (0, 0, false, 0 there)");
        if (onchip)
          if (auto why = onchip_unsupported(full / tp, depth, onchip_of_row(table, *row)))
            return concat(table.machine, ": ", op_name(op), " tp ", tp, " b ", b, ": ", *why);
        if (op == PlanOp::unpooler && row->engine != GemmEngine::splitk_mma && row->engine != GemmEngine::onchip_mma)
          return concat(table.machine, ": the unpooler runs the split-K or the on-chip engine only (tp ", tp, ")");
      }
      if (auto why = launch_unsupported(full / tp, depth, tactic_of_rows(table, op, tp)))
        return concat(table.machine, ": ", op_name(op), " tp ", tp, ": ", *why);
      if (op == PlanOp::pooler && first->engine != GemmEngine::splitk_mma && first->engine != GemmEngine::onchip_mma)
        for (int b = 1; b <= kMaxBatch; ++b)
          if (auto why = pooler_choice_unsupported(full / tp, depth, b, {first->engine, {}}))
            return concat(table.machine, ": pooler tp ", tp, ": ", *why);
    }
  return std::nullopt;
}

const PlanRow* plan_row(PlanOp op, int tp, int b) {
  const PlanTable& table = plan_table();
  for (int i = 0; i < table.size; ++i) {
    const PlanRow& r = table.rows[i];
    if (r.op == op && r.tp == tp && b >= r.b_first && b <= r.b_last) return &r;
  }
  return nullptr;
}

SplitKTactic splitk_tactic(PlanOp op, int n, int k) {
  if (const int tp = model_tp(op, n, k)) return tactic_of_rows(plan_table(), op, tp);
  return default_tactic(n, k);
}

PoolerGemmChoice pooler_gemm_choice(int n, int k, int tp, int b) {
  if (model_tp(PlanOp::pooler, n, k) == tp)
    if (const PlanRow* row = plan_row(PlanOp::pooler, tp, b)) return {row->engine, {}};
  // Other shapes: one engine for every b (the same bits at every b).
  for (const auto& s : pooler_gemm_shapes())
    if (!pooler_gemm_unsupported(n, k, 1, s)) return {GemmEngine::skinny, s};
  return {GemmEngine::splitk_mma, {}};
}

std::string format_plan_table() {
  const PlanTable& table = plan_table();
  std::ostringstream os;
  os << "plan table (" << table.machine << "): op, tp, b -> engine; split-K S, kw, accs, token tile, row tiles"
     << "; pooler: publish route, consumer launch\n";
  for (int i = 0; i < table.size; ++i) {
    const PlanRow& r = table.rows[i];
    os << "  " << op_name(r.op) << " tp " << r.tp << " b " << r.b_first;
    if (r.b_last != r.b_first) os << ".." << r.b_last;
    os << " -> " << engine_name(r.engine);
    if (r.engine == GemmEngine::splitk_mma) {
      os << " S=" << r.splits << " kw=" << r.kw << " accs=" << r.accs << " tile=" << r.token_tile
         << " rows=" << r.row_tiles * kSplitKTileN;
      if (r.cluster_balance && r.splits > 1) os << " cluster_balance";
      if (!r.row_swizzle) os << " unswizzled";
    } else if (r.engine == GemmEngine::onchip_mma) {
      os << " S=" << r.onchip_splits << " kw=" << r.kw << " accs=" << r.accs << " tile=" << r.token_tile
         << " rows=" << r.onchip_row_tiles * kSplitKTileN << " stage_warps=" << r.onchip_stage_warps;
      if (r.onchip_cluster_balance && r.onchip_splits > 1) os << " cluster_balance";
    } else if (r.engine == GemmEngine::ring_mma) {
      os << " tile=" << (r.b_last <= 8 ? 8 : 16);
    }
    if (r.op == PlanOp::pooler)
      os << "; publish " << (r.publish == PublishRoute::epilogue ? "epilogue" : "kernel") << ", consumer "
         << (r.consumer == ConsumerLaunch::early ? "early" : "late");
    os << "  (" << r.measured << ")\n";
  }
  return os.str();
}

}  // namespace spark_decode
