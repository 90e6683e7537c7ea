// The pooler GEMM's launch-shape checks and tactic table (plain C++: they run
// and are tested on machines without a GPU).
#include <sstream>

#include "spark_decode/error.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/pooler_gemm.h"

namespace spark_decode {

std::string PoolerGemmShape::to_string() const {
  std::ostringstream os;
  os << "skinny(block_size=" << block_size << ", outputs_per_block=" << outputs_per_block
     << ", k_unroll=" << k_unroll << ")";
  return os.str();
}

const char* engine_name(PoolerGemmEngine engine) {
  switch (engine) {
    case PoolerGemmEngine::skinny: return "skinny";
    case PoolerGemmEngine::mma: return "mma";
    case PoolerGemmEngine::ring: return "ring";
  }
  return "?";
}

std::string PoolerGemmChoice::to_string() const {
  switch (engine) {
    case PoolerGemmEngine::skinny: return shape.to_string();
    case PoolerGemmEngine::mma: return "mma(Unpooler engine)";
    case PoolerGemmEngine::ring:
      return ring_split == 1 ? "ring(cp.async stages)"
                             : detail::concat("ring(64-row tiles, K split over ", ring_split, " CTAs)");
  }
  return "?";
}

const std::vector<PoolerGemmShape>& pooler_gemm_shapes() {
  // Keep in step with the instantiations in src/pooler_gemm.cu. Each
  // shape's k_unroll makes K = H = 8192 one chunk (8 * block_size *
  // k_unroll), so a thread's whole weight slice is loaded before
  // griddepcontrol.wait; outputs_per_block * 16 rows <= 64 accumulators.
  static const std::vector<PoolerGemmShape> shapes = {
      {256, 2, 4},
      {256, 4, 4},
      {512, 2, 2},
      {512, 4, 2},
  };
  return shapes;
}

namespace {
std::optional<std::string> batch_unsupported(int m) {
  if (m < 1 || m > kPoolerMaxBatch) return detail::concat("pooler GEMM: m = ", m, " outside [1, ", kPoolerMaxBatch, "]");
  return std::nullopt;
}
}  // namespace

std::optional<std::string> pooler_gemm_unsupported(int n, int k, int m, const PoolerGemmShape& s) {
  bool compiled = false;
  for (const auto& c : pooler_gemm_shapes()) compiled |= c == s;
  if (!compiled) {
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
  if (n / s.outputs_per_block > 0x7fffffff / 2)
    return detail::concat("pooler GEMM: N = ", n, " too large");
  return std::nullopt;
}

std::optional<std::string> pooler_choice_unsupported(int n, int k, int m, const PoolerGemmChoice& c) {
  if (c.engine == PoolerGemmEngine::skinny) return pooler_gemm_unsupported(n, k, m, c.shape);
  if (c.engine == PoolerGemmEngine::ring) {
    if (auto why = batch_unsupported(m)) return why;
    const int split = c.ring_split;
    if (split != 1 && split != 2)
      return detail::concat("pooler GEMM ring engine: split ", split, " is not 1 or 2");
    const int rows = pooler_ring_rows(split), km = pooler_ring_k_multiple(split);
    if (n <= 0 || n % rows)
      return detail::concat("pooler GEMM ring engine: N = ", n, " is not a positive multiple of ", rows, " (split ",
                            split, ")");
    if (k <= 0 || k % km)
      return detail::concat("pooler GEMM ring engine: K = ", k, " is not a positive multiple of ", km, " (8 warps x ",
                            split, " CTAs x ", km / (8 * split), " K, split ", split, ")");
  }
  return std::nullopt;
}

std::vector<PoolerGemmChoice> pooler_gemm_candidates() {
  std::vector<PoolerGemmChoice> out;
  PoolerGemmChoice c;
  c.engine = PoolerGemmEngine::mma;
  out.push_back(c);
  c.engine = PoolerGemmEngine::ring;
  for (int split : {1, 2}) {
    c.ring_split = split;
    out.push_back(c);
  }
  c.ring_split = 1;
  c.engine = PoolerGemmEngine::skinny;
  for (const auto& s : pooler_gemm_shapes()) {
    c.shape = s;
    out.push_back(c);
  }
  return out;
}

namespace {

PoolerGemmChoice skinny(int block_size, int opb, int k_unroll) {
  PoolerGemmChoice c;
  c.engine = PoolerGemmEngine::skinny;
  c.shape = {block_size, opb, k_unroll};
  return c;
}

PoolerGemmChoice mma() {
  PoolerGemmChoice c;
  c.engine = PoolerGemmEngine::mma;
  return c;
}

PoolerGemmChoice ring(int split) {
  PoolerGemmChoice c;
  c.engine = PoolerGemmEngine::ring;
  c.ring_split = split;
  return c;
}

// Measured on an H200 (bench/results/pooler_tune_2026-12-02_c5a28e4, `tune
// pooler --b 1,2,3,4,6`, the MMA engine at its tactic-table rows, with the
// row-swizzled weight loads; the ring engine:
// pooler_engines_2026-12-02_d2436d0, _bf38560,
// pooler_2026-12-02_{e1d3297,8036fc5_run_engines,9c57432,b924dc3,5eb740d}).
// The engines give different bits, and PDL on must equal off, so one choice
// serves both modes: the one with the lowest sum of the GEMM's time with PDL
// off, in a PDL chain, and Pooler.run's (a PDL chain through the whole
// boundary, `bench pooler --run-engines`; tools/rank_pooler.py).
//
// tp 1: the ring engine at split 1 for every b. At b = 9..16 (its 16-token
// tile, x staged through shared memory since ad4445e) it hides the second n8
// MMA that costs the MMA engine ~2 us: 5eb740d, PDL off / chain / Pooler.run,
// b = 9 18.37 / 16.11 / 21.37 us against 20.24 / 17.17 / 21.95, b = 16 18.56 /
// 16.23 / 21.57 against 20.48 / 17.30 / 22.38 (cuBLAS 18.87-18.99 at b = 9..15,
// 20.56 at 16); split 2 0.3-0.5 slower in each. At b <= 8 (8-token tile, x in
// registers three stages ahead) it leads by the sum in the three runs that
// timed Pooler.run on every engine: b = 1 51.07 us against the skinny GEMM's
// 52.18 and the MMA engine's 52.10 (5eb740d; b924dc3: 52.51, 52.78, 52.84;
// 71c8bea: 51.05, 52.19, 52.17), b = 4 52.06 against 53.44 (53.59 against
// 54.15; 52.13 against 53.60), b = 8 54.11 against 54.75 (55.35 against 55.37;
// 54.05 against 54.77), b = 2, 3, 5..7 by 0.7-1.4 at 71c8bea; split 2 within
// 0.1-0.4 of it at b = 6..8 either way. The skinny GEMM keeps the lowest PDL-off time at b = 1
// (16.76 against 17.45 us), but is slower in a chain (15.93 against 14.90)
// and in Pooler.run (19.49 against 18.72). One engine at every b also makes
// tp 1's pooler GEMM batch invariant across b.
//
// tp 2..8: at b = 1 the skinny GEMM (tp 4 and 8 in both modes; tp 2 9.4 / 8.7
// against the MMA engine's 10.2 / 7.8 us, a tie by the sum); from b = 2 on the
// MMA engine (its time flat in b while the skinny GEMM's CUDA-core FMAs and
// its per-4-rows re-reads of x grow with b). The ring's 64 tiles at tp 2 leave
// half the SMs idle: 1-3 us slower (16-row tiles on 128 CTAs were no faster).
PoolerGemmChoice table_entry(int tp, int b) {
  if (tp == 1) return ring(1);
  if (b == 1) return skinny(512, 4, 2);
  return mma();
}
}  // namespace

PoolerGemmChoice pooler_gemm_choice(int n, int k, int tp, int b) {
  if (k == kMuseSpark.hidden && tp >= 1 && n * tp == kMuseSpark.pooled) {
    PoolerGemmChoice c = table_entry(tp, b);
    if (!pooler_choice_unsupported(n, k, b, c)) return c;
  }
  for (const auto& s : pooler_gemm_shapes())
    if (!pooler_gemm_unsupported(n, k, b, s)) return skinny(s.block_size, s.outputs_per_block, s.k_unroll);
  return mma();
}

// Measured on two H200s (bench/results/pooler_2026-12-01_6cde81d and
// _4777a2c: Pooler.run against project + publish + gather, b = 1, 4, 8, 16):
// at tp 1 the fused publish wins at every b (0.2-0.7 us); at tp 2 the
// publish kernel wins at b = 1 (0.5-0.8 us) and 16 (1.1 us), ties at 8 and
// loses at 4. Between the measured b: the skinny GEMM's b (1) and the
// 16-token tiles (9-16) follow b = 1 and 16, the MMA engine's 8-token tiles
// (2-8 since the engine table moved b = 2 to it) b = 4. Unmeasured tp keep
// the fused publish. (Measured before the weight loads were made coherent;
// to be re-measured on two GPUs.)
bool pooler_fused_publish(int tp, int b) {
  if (tp != 2) return true;
  return b >= 2 && b <= 8;
}

// Measured on one H200 (tp 1, 2026-12-02, the ring at every b; bench pooler's
// forced-trigger rows at 71b6a85, twice, pooler_2026-12-02_71b6a85{,_rep2}):
// Pooler.run at b = 9, 12, 16 20.51-20.53 / 20.85-20.89 / 20.74 us with the
// late trigger against 21.59-21.60 / 21.78-21.79 / 21.77 early (the ring's
// 16-token tile, whose CTA takes 225 KiB of shared memory); at b = 1, 2, 4, 8
// (its 8-token tile, 209 KiB) 19.69-19.79 / 19.86-19.95 / 20.06-20.11 / 20.47
// late against 19.08-19.13 / 19.08-19.20 / 19.45-19.49 / 20.20-20.24 early. At
// tp 2..8 (the MMA engine from b = 2; two GPUs for Pooler.run) not measured:
// early, as before.
bool pooler_consumer_launches_early(int tp, int b) { return !(tp == 1 && b >= 9); }

std::string format_pooler_gemm_table() {
  std::ostringstream os;
  os << "pooler GEMM (N = P/tp, K = H; by tp and b; H200 2026-12-02, GEMM in both modes and Pooler.run, b = 1, 4, 8..16):\n";
  for (int tp : kTensorParallelSizes) {
    const int n = kMuseSpark.pooled / tp, k = kMuseSpark.hidden;
    os << "  tp " << tp << " N=" << n << " K=" << k << ":";
    std::string last;
    int from = 1;
    for (int b = 1; b <= kPoolerMaxBatch + 1; ++b) {
      const std::string c = b <= kPoolerMaxBatch ? pooler_gemm_choice(n, k, tp, b).to_string() : "";
      if (b == 1) {
        last = c;
        continue;
      }
      if (c != last) {
        os << " b " << from << ".." << b - 1 << " -> " << last << ";";
        from = b;
        last = c;
      }
    }
    os << "\n    Pooler.run publishes from the GEMM's epilogue at b";
    for (int b = 1; b <= kPoolerMaxBatch; ++b)
      if (pooler_fused_publish(tp, b)) os << " " << b;
    os << "; with the publish kernel at the others\n";
    os << "    its fused consumer lets the next kernel launch once its data has arrived at b";
    bool any = false;
    for (int b = 1; b <= kPoolerMaxBatch; ++b)
      if (!pooler_consumer_launches_early(tp, b)) {
        os << " " << b;
        any = true;
      }
    if (!any) os << " (none)";
    os << ", at its start at the others\n";
  }
  return os.str();
}

}  // namespace spark_decode
