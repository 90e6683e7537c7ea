// The on-chip MMA engine on one GPU, through the Unpooler (Options::engine)
// and the pooler GEMM (Options::force), at the deployed tp 4 and tp 8 shapes
// of both ops and at small shapes: every m in 1..16 against the FP64
// reference (the bound of docs/design.md, "Exact semantics"), outputs
// poisoned (rows < m written, rows >= m untouched) and guard bytes intact;
// the split-K engine's bits at the same kw and accs, at every S and copy
// stage (its reduction order); PDL on equal to off along chains where each
// call reads the previous one's output; CUDA-graph replay equal to eager;
// and the refusals. Batch invariance at every b: test_batch_invariance.cu;
// the publishing epilogues: test_unpooler_publish.cu, test_pooler_fused.cu.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pooler_test_util.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/plan.h"
#include "spark_decode/pooler_gemm.h"
#include "spark_decode/unpooler.h"

namespace sd = spark_decode;
using namespace sd::testing;
using namespace sd::testing::pooler_tests;

namespace {

constexpr int M = sd::kMaxBatch;

sd::TensorRef weight_ref(const void* p, int n, int k) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  return sd::TensorRef::contiguous(const_cast<void*>(p), sd::DType::bf16, {n, k}, dev);
}

// out[m, n] = x[m, k] @ W^T by some engine, on the legacy stream.
using Gemm = std::function<void(const void* x, void* out, int m)>;

sd::Unpooler onchip_unpooler(const void* w, int n, int k, std::optional<sd::OnchipTactic> t = std::nullopt,
                             bool pdl = true) {
  sd::Unpooler::Options o;
  o.engine = sd::GemmEngine::onchip_mma;
  o.onchip = t;
  o.enable_pdl = pdl;
  return sd::Unpooler(weight_ref(w, n, k), o);
}

// A weight and 16 rows of x of one distribution, on the device.
struct Operands {
  int n, k;
  std::vector<uint16_t> w, x;
  DeviceBuffer dw, dx;
  Operands(int n_, int k_, Dist dist, uint64_t seed)
      : n(n_), k(k_), dw(size_t(n_) * k_ * 2), dx(size_t(M) * k_ * 2) {
    auto o = gemm_operands(n, k, M, dist, seed);
    w = std::move(o.w);
    x = std::move(o.x);
    dw.upload(w.data(), w.size() * 2);
    dx.upload(x.data(), x.size() * 2);
  }
};

// Runs `gemm` for m into a poisoned, guarded buffer: the m rows, after
// checking that rows >= m stayed poisoned and the guards held. Throws on a
// failure (POOLER_REQUIRE).
std::vector<uint16_t> run_rows(const std::string& what, const Gemm& gemm, const void* x, GuardedBuffer& out, int n,
                               int m) {
  poison_bf16(out);
  gemm(x, out.get(), m);
  CUDA_CHECK(cudaDeviceSynchronize());
  POOLER_REQUIRE(out.check_guards().empty(), what, " m ", m, ": guards ", out.check_guards());
  std::vector<uint16_t> all(size_t(M) * n);
  out.download(all.data(), all.size() * 2);
  for (size_t i = 0; i < all.size(); ++i) {
    const bool live = i < size_t(m) * n;
    POOLER_REQUIRE(live ? all[i] != kPoisonBf16 : all[i] == kPoisonBf16, what, " m ", m, " element ", i,
                   live ? " not written" : " written past m rows");
  }
  all.resize(size_t(m) * n);
  return all;
}

// Every m in 1..16 against the FP64 reference (of the rows of m = 16; each
// m's rows must equal those rows, so the reference serves every m), with a
// second run equal to the first.
void check_every_m(const std::string& what, const Operands& p, const Gemm& gemm) {
  GuardedBuffer out(size_t(M) * p.n * 2);
  const auto full = run_rows(what, gemm, p.dx.get(), out, p.n, M);
  const std::string bad = check_gemm(full, p.x.data(), p.w.data(), M, p.n, p.k);
  POOLER_REQUIRE(bad.empty(), what, " m 16: ", bad);
  POOLER_REQUIRE(run_rows(what, gemm, p.dx.get(), out, p.n, M) == full, what, ": a second run differs");
  for (int m = 1; m < M; ++m) {
    const auto rows = run_rows(what, gemm, p.dx.get(), out, p.n, m);
    POOLER_REQUIRE(std::equal(rows.begin(), rows.end(), full.begin()), what, " m ", m,
                   ": rows differ from the same rows at m = 16");
  }
}

// The deployed shapes: (name, n, k, op).
struct Deployed {
  const char* name;
  int n, k;
  sd::PlanOp op;
};
std::vector<Deployed> deployed() {
  std::vector<Deployed> out;
  for (int tp : {4, 8}) {
    out.push_back({tp == 4 ? "unpooler tp 4" : "unpooler tp 8", sd::kMuseSpark.hidden / tp, sd::kMuseSpark.pooled,
                   sd::PlanOp::unpooler});
    out.push_back({tp == 4 ? "pooler tp 4" : "pooler tp 8", sd::kMuseSpark.pooled / tp, sd::kMuseSpark.hidden,
                   sd::PlanOp::pooler});
  }
  return out;
}

// The engine of a deployed shape as its op runs it (forced onto onchip_mma).
Gemm deployed_gemm(const Deployed& d, const void* w, std::unique_ptr<sd::Unpooler>& u,
                   std::unique_ptr<sd::PoolerGemm>& g) {
  if (d.op == sd::PlanOp::unpooler) {
    u = std::make_unique<sd::Unpooler>(onchip_unpooler(w, d.n, d.k));
    if (u->engine() != sd::GemmEngine::onchip_mma) throw std::runtime_error("the Unpooler did not take onchip_mma");
    return [&u](const void* x, void* out, int m) { u->run(x, out, m, nullptr); };
  }
  sd::PoolerGemm::Options o;
  o.force = sd::PoolerGemmChoice{sd::GemmEngine::onchip_mma, {}};
  g = std::make_unique<sd::PoolerGemm>(weight_ref(w, d.n, d.k), sd::model_tp(d.op, d.n, d.k), o);
  return [&g](const void* x, void* out, int m) { g->run(x, out, m, nullptr); };
}

// A tactic with `rows` row tiles at the 16-token tile (m = 9..16).
sd::OnchipTactic tactic(int splits, int kw, int accs, int stage_warps, int rows) {
  sd::OnchipTactic t;
  t.splits = splits;
  t.kw = kw;
  t.accs = accs;
  t.stage_warps = stage_warps;
  for (int m = 9; m <= M; ++m) t.row_tiles[m - 1] = rows;
  return t;
}

void expect_no_throw(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
}

}  // namespace

TEST(OnchipMma, DeployedShapesEveryMAgainstTheReference) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("onchip deployed shapes");
  for (const Deployed& d : deployed())
    for (Dist dist : {Dist::normal, Dist::outliers, Dist::specials})
      expect_no_throw([&] {
        Operands p(d.n, d.k, dist, seed + d.n + int(dist));
        std::unique_ptr<sd::Unpooler> u;
        std::unique_ptr<sd::PoolerGemm> g;
        const Gemm gemm = deployed_gemm(d, p.dw.get(), u, g);
        check_every_m(std::string(d.name) + " " + dist_name(dist) + " " +
                          sd::onchip_tactic(d.op, d.n, d.k).to_string(),
                      p, gemm);
      });
}

// Small shapes, every distribution, and every compiled kernel (kw x accs x
// token tile x row tiles) at every S and copy stage that take the shape: one
// or many stages per CTA, one warp per CTA, clusters of 1 to 8.
TEST(OnchipMma, EveryCompiledVariantOnSmallShapes) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("onchip variants");
  int tested = 0;
  for (auto [n, k] : {std::pair{16, 256}, {48, 1024}, {96, 2048}, {32, 4096}})
    for (Dist dist : kAllDists) {
      Operands p(n, k, dist, seed + n + k + int(dist));
      for (int s : {1, 2, 4, 8})
        for (int kw : sd::kOnchipKws)
          for (int accs = 1; accs <= sd::kOnchipMaxAccs; ++accs)
            for (int g : {0, 1, 2, 16})
              for (int rows : {1, 2}) {
                const sd::OnchipTactic t = tactic(s, kw, accs, g, rows);
                if (sd::onchip_unsupported(n, k, t)) continue;
                // The normal distribution at every variant, the others at the
                // default stages only.
                if (dist != Dist::normal && g != 0) continue;
                expect_no_throw([&] {
                  auto u = onchip_unpooler(p.dw.get(), n, k, t);
                  check_every_m(std::to_string(n) + "x" + std::to_string(k) + " " + dist_name(dist) + " " +
                                    t.to_string(),
                                p, [&](const void* x, void* out, int m) { u.run(x, out, m, nullptr); });
                });
                ++tested;
              }
    }
  EXPECT_GE(tested, 100);
}

// The reduction order is the split-K engine's at the same kw and accs, and
// depends on neither engine's S (a partial's place in the sum is its K
// chunk) nor on the copy stages or row tiles: every valid (engine, S, stages) at one (kw,
// accs) gives the same bits, at every m, on data whose sums round
// differently in any other order (outliers). At the deployed shapes, the
// on-chip engine's default tactic against the plan table's split-K tactic
// (the bits the table's engine gives today), and the split-K engine at each
// S against its table S.
TEST(OnchipMma, SameBitsAsTheSplitKEngineAtEverySAndStage) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("onchip bits");
  auto compare = [&](const std::string& what, const Operands& p, const Gemm& want_gemm,
                     const std::vector<std::pair<std::string, Gemm>>& others) {
    GuardedBuffer out(size_t(M) * p.n * 2);
    for (int m : {1, 2, 7, 8, 9, 16}) {
      const auto want = run_rows(what + " reference engine", want_gemm, p.dx.get(), out, p.n, m);
      for (const auto& [name, gemm] : others)
        POOLER_REQUIRE(run_rows(what + " " + name, gemm, p.dx.get(), out, p.n, m) == want, what, " m ", m, ": ",
                       name, " differs from the split-K engine's bits");
    }
  };
  int compared = 0;
  // Small shapes: every (kw, accs) both engines compile.
  for (auto [n, k] : {std::pair{48, 2048}, {32, 4096}})
    expect_no_throw([&] {
      Operands p(n, k, Dist::outliers, seed + n);
      for (int kw : sd::kOnchipKws)
        for (int accs = 1; accs <= sd::kOnchipMaxAccs; ++accs) {
          sd::SplitKTactic base;
          base.splits = 1;
          base.kw = kw;
          base.accs = accs;
          std::vector<std::unique_ptr<sd::Unpooler>> keep;
          std::vector<std::pair<std::string, Gemm>> others;
          for (int s : {1, 2, 4, 8}) {
            sd::SplitKTactic st = base;
            st.splits = s;
            if (!sd::launch_unsupported(n, k, st)) {
              sd::Unpooler::Options o;
              o.tactic = st;
              keep.push_back(std::make_unique<sd::Unpooler>(weight_ref(p.dw.get(), n, k), o));
              sd::Unpooler* u = keep.back().get();
              others.push_back({"splitk_mma " + st.to_string(),
                                [u](const void* x, void* out, int m) { u->run(x, out, m, nullptr); }});
            }
            for (int g : {0, 1})
              for (int rows : {1, 2}) {
                const sd::OnchipTactic ot = tactic(s, kw, accs, g, rows);
                if (sd::onchip_unsupported(n, k, ot)) continue;
                keep.push_back(std::make_unique<sd::Unpooler>(onchip_unpooler(p.dw.get(), n, k, ot)));
                sd::Unpooler* u = keep.back().get();
                others.push_back({"onchip_mma " + ot.to_string(),
                                  [u](const void* x, void* out, int m) { u->run(x, out, m, nullptr); }});
              }
          }
          POOLER_REQUIRE(others.size() >= 4, n, "x", k, " kw ", kw, ": too few variants compared");
          compare(std::to_string(n) + "x" + std::to_string(k) + " kw " + std::to_string(kw) + " accs " +
                      std::to_string(accs),
                  p, others.front().second, others);
          ++compared;
        }
    });
  // Every model shape of both ops: the on-chip default against the table's
  // split-K tactic (the unpooler's own; the pooler GEMM forced onto it).
  for (int tp : sd::kTensorParallelSizes)
    for (sd::PlanOp op : {sd::PlanOp::unpooler, sd::PlanOp::pooler})
      expect_no_throw([&] {
        const bool un = op == sd::PlanOp::unpooler;
        const int n = (un ? sd::kMuseSpark.hidden : sd::kMuseSpark.pooled) / tp;
        const int k = un ? sd::kMuseSpark.pooled : sd::kMuseSpark.hidden;
        Operands p(n, k, Dist::outliers, seed + tp * 10 + un);
        sd::Unpooler::Options so;
        so.tactic = sd::splitk_tactic(op, n, k);
        sd::Unpooler splitk(weight_ref(p.dw.get(), n, k), so);
        auto onchip = onchip_unpooler(p.dw.get(), n, k, sd::onchip_tactic(op, n, k));
        std::vector<std::pair<std::string, Gemm>> others = {
            {"onchip_mma " + onchip.onchip_tactic().to_string(),
             [&](const void* x, void* out, int m) { onchip.run(x, out, m, nullptr); }}};
        // The pooler GEMM as the Pooler runs it on each engine.
        std::unique_ptr<sd::PoolerGemm> pg_splitk, pg_onchip;
        if (!un) {
          sd::PoolerGemm::Options po;
          po.force = sd::PoolerGemmChoice{sd::GemmEngine::splitk_mma, {}};
          pg_splitk = std::make_unique<sd::PoolerGemm>(weight_ref(p.dw.get(), n, k), tp, po);
          po.force = sd::PoolerGemmChoice{sd::GemmEngine::onchip_mma, {}};
          pg_onchip = std::make_unique<sd::PoolerGemm>(weight_ref(p.dw.get(), n, k), tp, po);
          others.push_back({"PoolerGemm splitk_mma", [&](const void* x, void* out, int m) {
                              pg_splitk->run(x, out, m, nullptr);
                            }});
          others.push_back({"PoolerGemm onchip_mma", [&](const void* x, void* out, int m) {
                              pg_onchip->run(x, out, m, nullptr);
                            }});
        }
        compare(std::string(sd::op_name(op)) + " tp " + std::to_string(tp), p,
                [&](const void* x, void* out, int m) { splitk.run(x, out, m, nullptr); }, others);
        ++compared;
      });
  EXPECT_EQ(compared, 2 * sd::kOnchipMaxAccs * 2 + 2 * 4);
}

// Chains of dependent calls, z_r = U(U(x_r)), PDL on against off: a call
// that read its x before griddepcontrol.wait returned would see poison or
// another link's rows. Square weights scaled by 1/sqrt(K) keep the values in
// range: [1024, 1024] (64 tiles x S = 2, clusters), [2048, 2048] (128 CTAs
// of 8 warps and 64 KiB, the deployed tp 8 CTA) and [4096, 4096] (the
// unpooler's tp 2 shape: 256 CTAs of 128 KiB, two waves).
TEST(OnchipMma, PdlOnEqualsOffAlongChains) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("onchip pdl");
  const int chain = 12;
  for (int n : {1024, 2048, 4096})
    expect_no_throw([&] {
      const auto w = normal_bf16(size_t(n) * n, seed + n, 1.0f / 64);
      const auto x = normal_bf16(size_t(M) * n * chain, seed + n + 1);
      DeviceBuffer dw(w.size() * 2), xs(x.size() * 2);
      dw.upload(w.data(), w.size() * 2);
      xs.upload(x.data(), x.size() * 2);
      GuardedBuffer ys(size_t(M) * n * 2 * chain), zs(size_t(M) * n * 2 * chain);
      auto on = onchip_unpooler(dw.get(), n, n, std::nullopt, true);
      auto off = onchip_unpooler(dw.get(), n, n, std::nullopt, false);
      TestStream stream;
      auto at = [&](const void* base, int r) {
        return static_cast<char*>(const_cast<void*>(base)) + size_t(M) * n * 2 * r;
      };
      for (int m : {1, 5, 16}) {
        std::vector<uint16_t> results[2];
        for (int pdl = 0; pdl < 2; ++pdl) {
          sd::Unpooler& u = pdl ? on : off;
          poison_bf16(ys);
          poison_bf16(zs);
          for (int r = 0; r < chain; ++r) {
            u.run(at(xs.get(), r), at(ys.get(), r), m, stream);
            u.run(at(ys.get(), r), at(zs.get(), r), m, stream);
          }
          CUDA_CHECK(cudaStreamSynchronize(stream));
          POOLER_REQUIRE(ys.check_guards().empty() && zs.check_guards().empty(), n, " m ", m, ": guards");
          results[pdl] = download<uint16_t>(zs.get(), size_t(M) * n * chain);
        }
        POOLER_REQUIRE(results[0] == results[1], n, "x", n, " m ", m, ": PDL on differs from off");
        for (int r = 0; r < chain; ++r) {
          const uint16_t* z = results[1].data() + size_t(M) * n * r;
          POOLER_REQUIRE(std::count(z, z + size_t(m) * n, kPoisonBf16) == 0, n, " m ", m, " link ", r, ": poison");
          if (r > 0)
            POOLER_REQUIRE(!std::equal(z, z + size_t(m) * n, z - size_t(M) * n), n, " m ", m, " link ", r,
                           ": equal to the previous link");
        }
      }
    });
}

// A graph of calls at every m of the deployed unpooler shapes, replayed,
// equals the eager calls.
TEST(OnchipMma, GraphReplayEqualsEager) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("onchip graph");
  for (int tp : {4, 8})
    expect_no_throw([&] {
      const int n = sd::kMuseSpark.hidden / tp, k = sd::kMuseSpark.pooled;
      Operands p(n, k, Dist::normal, seed + tp);
      auto u = onchip_unpooler(p.dw.get(), n, k);
      GuardedBuffer eager(size_t(M) * M * n * 2), replayed(size_t(M) * M * n * 2);
      auto row_of = [&](GuardedBuffer& b, int m) { return static_cast<char*>(b.get()) + size_t(M) * n * 2 * (m - 1); };
      TestStream stream;
      poison_bf16(eager);
      for (int m = 1; m <= M; ++m) u.run(p.dx.get(), row_of(eager, m), m, stream);
      CUDA_CHECK(cudaStreamSynchronize(stream));
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int m = 1; m <= M; ++m) u.run(p.dx.get(), row_of(replayed, m), m, stream);
      CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
      CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      const auto want = download<uint16_t>(eager.get(), eager.bytes() / 2);
      for (int rep = 0; rep < 3; ++rep) {
        poison_bf16(replayed);
        CUDA_CHECK(cudaGraphLaunch(exec, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        POOLER_REQUIRE(download<uint16_t>(replayed.get(), replayed.bytes() / 2) == want, "tp ", tp, " replay ", rep,
                       " differs from eager");
        POOLER_REQUIRE(replayed.check_guards().empty() && eager.check_guards().empty(), "guards");
      }
      CUDA_CHECK(cudaGraphExecDestroy(exec));
      CUDA_CHECK(cudaGraphDestroy(graph));
      for (int m = 1; m <= M; ++m) {
        const uint16_t* rows = want.data() + size_t(M) * n * (m - 1);
        POOLER_REQUIRE(std::count(rows, rows + size_t(m) * n, kPoisonBf16) == 0, "m ", m, ": not written");
      }
    });
}

TEST(OnchipMma, RefusesWhatItCannotRunAndPreparesLazily) {
  SKIP_WITHOUT_GPU(1);
  const int n = 48, k = 1024;
  Operands p(n, k, Dist::normal, 7);
  auto expect_invalid = [&](sd::Unpooler::Options o, const std::string& reason) {
    try {
      sd::Unpooler u(weight_ref(p.dw.get(), n, k), o);
      ADD_FAILURE() << "accepted; wanted: " << reason;
    } catch (const sd::InvalidArgument& e) {
      EXPECT_EQ(e.what(), reason);
    }
  };
  sd::Unpooler::Options o;
  o.engine = sd::GemmEngine::ring_mma;
  expect_invalid(o, "the unpooler runs splitk_mma or onchip_mma, not ring_mma");
  o.engine = sd::GemmEngine::onchip_mma;
  sd::OnchipTactic bad;
  bad.kw = 64;
  o.onchip = bad;
  expect_invalid(o, "on-chip MMA: kw=64 accs=1 has no compiled kernel (kw: 128 256; accs 1..2)");
  // Lazily prepared outside capture, refused under it.
  o.onchip.reset();
  o.rows = std::vector<int>{};
  sd::Unpooler lazy(weight_ref(p.dw.get(), n, k), o);
  EXPECT_EQ(lazy.engine(), sd::GemmEngine::onchip_mma);
  EXPECT_FALSE(lazy.prepared(8));
  EXPECT_FALSE(lazy.prepared(16));
  GuardedBuffer out(size_t(M) * n * 2);
  TestStream stream;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  EXPECT_THROW(lazy.run(p.dx.get(), out.get(), 3, stream), sd::InvalidArgument);
  cudaGraph_t graph;
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphDestroy(graph));
  EXPECT_NO_THROW(lazy.run(p.dx.get(), out.get(), 3, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_TRUE(lazy.prepared(8));
  EXPECT_FALSE(lazy.prepared(8, 2));  // one row tile only
  EXPECT_FALSE(lazy.prepared(16));
  EXPECT_NE(lazy.describe().find("onchip_mma S="), std::string::npos) << lazy.describe();
  EXPECT_EQ(check_gemm(download<uint16_t>(out.get(), size_t(3) * n), p.x.data(), p.w.data(), 3, n, k), "");
}
