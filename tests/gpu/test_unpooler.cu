// The Unpooler on one GPU: accuracy against the FP64 reference for every m,
// every element written, guards intact, bitwise reproducibility, batch
// invariance, CUDA-graph replay and PDL equal to eager.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "gpu_test_util.h"
#include "spark_decode/bf16.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/reference.h"
#include "spark_decode/unpooler.h"

namespace sd = spark_decode;
using namespace sd::testing;

namespace {

struct Shape {
  int n, k;
};

// The model's four unpooler shards (N = H / tp at K = P) and small shapes.
std::vector<Shape> model_shapes() {
  std::vector<Shape> s;
  for (int tp : sd::kTensorParallelSizes) s.push_back({sd::kMuseSpark.hidden / tp, sd::kMuseSpark.pooled});
  return s;
}
const Shape kSmallShapes[] = {{16, 256}, {48, 256}, {64, 1024}};

// Every model shape the split-K engine serves, with the plan table's tactic:
// the unpooler's [H/tp, P] and the pooler GEMM's [P/tp, H].
struct TableShape {
  int n, k;
  sd::SplitKTactic tactic;
  bool unpooler;
};
std::vector<TableShape> table_shapes() {
  std::vector<TableShape> s;
  for (int tp : sd::kTensorParallelSizes) {
    const int un = sd::kMuseSpark.hidden / tp, pn = sd::kMuseSpark.pooled / tp;
    s.push_back({un, sd::kMuseSpark.pooled, sd::splitk_tactic(sd::PlanOp::unpooler, un, sd::kMuseSpark.pooled), true});
    s.push_back({pn, sd::kMuseSpark.hidden, sd::splitk_tactic(sd::PlanOp::pooler, pn, sd::kMuseSpark.hidden), false});
  }
  return s;
}

// The FP64 reference of x[m, k] @ w[n, k]^T, row blocks of w over threads.
struct Reference {
  std::vector<double> exact, magnitude;
};
Reference reference(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w, int m, int n, int k) {
  const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  Reference r;
  r.exact.assign(static_cast<size_t>(m) * n, 0.0);
  r.magnitude.assign(static_cast<size_t>(m) * n, 0.0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const int n0 = static_cast<int>(int64_t{n} * t / threads), n1 = static_cast<int>(int64_t{n} * (t + 1) / threads);
      if (n1 == n0) return;
      std::vector<uint16_t> out(static_cast<size_t>(m) * (n1 - n0));
      std::vector<double> e, a;
      sd::reference::gemm_bf16(x.data(), w.data() + static_cast<size_t>(n0) * k, out.data(), m, n1 - n0, k, &e, &a);
      for (int i = 0; i < m; ++i)
        for (int j = n0; j < n1; ++j) {
          r.exact[static_cast<size_t>(i) * n + j] = e[static_cast<size_t>(i) * (n1 - n0) + j - n0];
          r.magnitude[static_cast<size_t>(i) * n + j] = a[static_cast<size_t>(i) * (n1 - n0) + j - n0];
        }
    });
  }
  for (auto& th : pool) th.join();
  return r;
}

// The bound every element must meet:
//   |out - exact| <= 2^-8 |exact| + K 2^-23 sum|x w| + 2^-126
// 2^-8: BF16's unit roundoff (the final rounding). K 2^-23: twice the FP32
// worst case K u_32 sum|x w| of summing K exact BF16 x BF16 products (the
// factor 2 covers the tensor cores' own accumulation rounding). 2^-126: the
// smallest FP32 normal, for results in the subnormal range.
struct Check {
  int bad = 0;
  double worst_ratio = 0;  // max |err| / bound
  std::string first;
};
Check check_rows(const std::vector<uint16_t>& out, const Reference& ref, int m, int n, int k) {
  Check c;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      const size_t o = static_cast<size_t>(i) * n + j;
      const uint16_t bits = out[o];
      const double got = sd::bf16_to_float(bits);
      const double want = ref.exact[o];
      const double bound = std::ldexp(std::fabs(want), -8) + k * std::ldexp(ref.magnitude[o], -23) +
                           std::ldexp(1.0, -126);
      const double err = std::fabs(got - want);
      const bool ok = bits != kPoisonBf16 && std::isfinite(got) && err <= bound;
      if (std::isfinite(err)) c.worst_ratio = std::max(c.worst_ratio, err / bound);
      if (!ok && c.bad++ == 0)
        c.first = "row " + std::to_string(i) + " col " + std::to_string(j) + ": got " +
                  std::to_string(got) + " (bits " + std::to_string(bits) + ") want " +
                  std::to_string(want) + " bound " + std::to_string(bound);
    }
  return c;
}

sd::TensorRef weight_ref(const void* p, int n, int k) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  return sd::TensorRef::contiguous(p, sd::DType::bf16, {n, k}, dev);
}

struct Problem {
  int n, k;
  GuardedBuffer w, x, out;
  std::vector<uint16_t> hw, hx;
  Problem(int n_, int k_, Dist dist)
      : n(n_), k(k_),
        w(static_cast<size_t>(n_) * k_ * 2),
        x(static_cast<size_t>(sd::kMaxBatch) * k_ * 2),
        out(static_cast<size_t>(sd::kMaxBatch) * n_ * 2) {
    // Scaled: x large, w small, so that neither the products nor the sums
    // leave FP32's normal range.
    hw = random_bf16(static_cast<size_t>(n) * k, dist, dist == Dist::scaled ? -30 : 0);
    hx = random_bf16(static_cast<size_t>(sd::kMaxBatch) * k, dist, dist == Dist::scaled ? 20 : 0);
    w.upload(hw.data(), hw.size() * 2);
    x.upload(hx.data(), hx.size() * 2);
  }
  std::vector<uint16_t> run(sd::Unpooler& u, int m, const void* xp = nullptr) {
    poison_bf16(out);
    u.run(xp ? xp : x.get(), out.get(), m, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> h(static_cast<size_t>(m) * n);
    out.download(h.data(), h.size() * 2);
    return h;
  }
};

// Every m in 1..16 against the reference, every element, guards intact.
void check_all_m(int n, int k, Dist dist, const sd::SplitKTactic* tactic = nullptr) {
  Problem p(n, k, dist);
  sd::Unpooler::Options opt;
  if (tactic) opt.tactic = *tactic;
  sd::Unpooler u(weight_ref(p.w.get(), n, k), opt);
  // Rows are independent, so the reference of all 16 rows serves every m.
  const Reference ref = reference(p.hx, p.hw, sd::kMaxBatch, n, k);
  double worst = 0;
  for (int m = 1; m <= sd::kMaxBatch; ++m) {
    const auto out = p.run(u, m);
    const Check c = check_rows(out, ref, m, n, k);
    worst = std::max(worst, c.worst_ratio);
    ASSERT_EQ(c.bad, 0) << n << "x" << k << " " << dist_name(dist) << " m=" << m << " tactic "
                        << u.tactic().to_string() << ": " << c.bad << " bad, first " << c.first;
    // Rows past m stay poisoned: the kernel wrote no more than m rows.
    std::vector<uint16_t> all(static_cast<size_t>(sd::kMaxBatch) * n);
    p.out.download(all.data(), all.size() * 2);
    for (size_t i = static_cast<size_t>(m) * n; i < all.size(); ++i)
      ASSERT_EQ(all[i], kPoisonBf16) << "m=" << m << " wrote past row m at element " << i;
    ASSERT_EQ(p.out.check_guards(), "") << "m=" << m;
  }
  std::printf("  %5dx%-5d %-8s %-40s worst |err|/bound %.3f\n", n, k, dist_name(dist),
              u.tactic().to_string().c_str(), worst);
}

}  // namespace

TEST(UnpoolerGpu, ModelShapesEveryMEveryDistribution) {
  SKIP_WITHOUT_GPU(1);
  for (Shape s : model_shapes())
    for (Dist d : kAllDists) check_all_m(s.n, s.k, d);
}

TEST(UnpoolerGpu, SmallShapesEveryMEveryDistribution) {
  SKIP_WITHOUT_GPU(1);
  for (Shape s : kSmallShapes)
    for (Dist d : kAllDists) check_all_m(s.n, s.k, d);
}

// Every compiled kernel (kw x accs x both tiles x each compiled row tiling,
// row-swizzled or not) through every split that can take it, on a small shape.
TEST(UnpoolerGpu, EveryCompiledVariant) {
  SKIP_WITHOUT_GPU(1);
  const int n = 96, k = 2048;
  int tested = 0, tested_two_rows = 0, tested_unswizzled = 0;
  for (int s : {1, 2, 4, 8})
    for (int kw : sd::kSplitKKws)
      for (int accs : {1, 2, 4})
        for (int rows : sd::kSplitKRowTiles)
          for (bool swizzle : {true, false}) {
            sd::SplitKTactic t;
            t.splits = s;
            t.kw = kw;
            t.accs = accs;
            t.row_tiles.fill(rows);
            t.row_swizzle = swizzle;
            if (sd::launch_unsupported(n, k, t)) continue;
            check_all_m(n, k, Dist::normal, &t);
            ++tested;
            tested_two_rows += rows == 2;
            tested_unswizzled += !swizzle;
          }
  EXPECT_GE(tested - tested_two_rows, 18);
  EXPECT_GE(tested_two_rows, 12);
  EXPECT_GE(tested_unswizzled, 8);
}

// The row swizzle moves which lane loads which weight bytes and which
// logical MMA row a weight row occupies, never the arithmetic: swizzled and
// fragment-order loads give the same bits at every m, split and row tiling,
// on small shapes (kw = 256: four vector pairs per warp, one chunk at R = 1
// and two at R = 2; 1 to 8 warps per CTA) and at every table shape (its
// split; kw = 256, accs = 1, where both compile).
TEST(UnpoolerGpu, RowSwizzleGivesTheSameBits) {
  SKIP_WITHOUT_GPU(1);
  auto compare = [](int n, int k, sd::SplitKTactic t) {
    Problem p(n, k, Dist::outliers);
    t.kw = sd::kSplitKUnswizzledKw;
    t.accs = sd::kSplitKUnswizzledAccs;
    sd::SplitKTactic plain = t;
    t.row_swizzle = true;
    plain.row_swizzle = false;
    if (sd::launch_unsupported(n, k, t) || sd::launch_unsupported(n, k, plain)) return false;
    sd::Unpooler::Options o1, o2;
    o1.tactic = t;
    o2.tactic = plain;
    sd::Unpooler u1(weight_ref(p.w.get(), n, k), o1), u2(weight_ref(p.w.get(), n, k), o2);
    for (int m = 1; m <= sd::kMaxBatch; ++m) {
      const auto a = p.run(u1, m);
      EXPECT_EQ(p.out.check_guards(), "");
      const auto b = p.run(u2, m);
      EXPECT_EQ(p.out.check_guards(), "");
      EXPECT_EQ(std::count(a.begin(), a.end(), kPoisonBf16), 0) << t.to_string() << " m=" << m;
      EXPECT_EQ(a, b) << n << "x" << k << " m=" << m << ": " << t.to_string() << " vs " << plain.to_string();
      if (a != b) return true;
    }
    return true;
  };
  int compared = 0;
  for (int k : {256, 512, 1024, 2048})
    for (int s : {1, 2, 4, 8})
      for (int rows : sd::kSplitKRowTiles) {
        sd::SplitKTactic t;
        t.splits = s;
        t.row_tiles.fill(rows);
        compared += compare(96, k, t);
      }
  EXPECT_GE(compared, 12);
  int table_compared = 0;
  for (const auto& e : table_shapes()) table_compared += compare(e.n, e.k, e.tactic);
  EXPECT_EQ(table_compared, static_cast<int>(table_shapes().size()));
}

// Row tiles per CTA change which CTA computes a row, not how: every
// compiled R gives the same bits as 1, at every m, for every split, kw and
// accs that compile with two row tiles (a small shape: one, two or four
// weight chunks per tile), then for the table's shapes and tactics.
TEST(UnpoolerGpu, RowTilesGiveTheSameBits) {
  SKIP_WITHOUT_GPU(1);
  {
    const int n = 96, k = 2048;
    Problem p(n, k, Dist::outliers);
    int compared = 0;
    for (int s : {1, 2, 4, 8})
      for (int kw : sd::kSplitKKws)
        for (int accs : {1, 2}) {
          sd::SplitKTactic one;
          one.splits = s;
          one.kw = kw;
          one.accs = accs;
          sd::SplitKTactic two = one;
          two.row_tiles.fill(2);
          if (sd::launch_unsupported(n, k, two)) continue;
          sd::Unpooler::Options o1, o2;
          o1.tactic = one;
          o2.tactic = two;
          sd::Unpooler u1(weight_ref(p.w.get(), n, k), o1), u2(weight_ref(p.w.get(), n, k), o2);
          for (int m = 1; m <= sd::kMaxBatch; ++m) {
            const auto a = p.run(u1, m), b = p.run(u2, m);
            ASSERT_EQ(p.out.check_guards(), "");
            ASSERT_EQ(std::count(b.begin(), b.end(), kPoisonBf16), 0) << two.to_string() << " m=" << m;
            ASSERT_EQ(a, b) << "m=" << m << ": " << one.to_string() << " vs " << two.to_string();
          }
          ++compared;
        }
    EXPECT_GE(compared, 12);
  }
  int table_compared = 0;
  for (const auto& e : table_shapes()) {
    sd::SplitKTactic one = e.tactic;
    one.accs = std::min(one.accs, 2);  // every R compiles at accs <= 2
    one.row_tiles.fill(1);
    Problem p(e.n, e.k, Dist::outliers);
    sd::Unpooler::Options o1;
    o1.tactic = one;
    sd::Unpooler u1(weight_ref(p.w.get(), e.n, e.k), o1);
    std::vector<std::vector<uint16_t>> want;
    for (int m = 1; m <= sd::kMaxBatch; ++m) {
      want.push_back(p.run(u1, m));
      ASSERT_EQ(p.out.check_guards(), "");
    }
    for (int rows : sd::kSplitKRowTiles) {
      if (rows == 1) continue;
      sd::SplitKTactic t = one;
      t.row_tiles.fill(rows);
      if (auto why = sd::launch_unsupported(e.n, e.k, t)) {
        std::printf("  %dx%d: no %d-row-tile kernel (%s)\n", e.n, e.k, rows, why->c_str());
        continue;
      }
      sd::Unpooler::Options o;
      o.tactic = t;
      sd::Unpooler u(weight_ref(p.w.get(), e.n, e.k), o);
      for (int m = 1; m <= sd::kMaxBatch; ++m) {
        const auto got = p.run(u, m);
        ASSERT_EQ(p.out.check_guards(), "");
        ASSERT_EQ(std::count(got.begin(), got.end(), kPoisonBf16), 0) << e.n << "x" << e.k << " m=" << m;
        ASSERT_EQ(got, want[m - 1]) << e.n << "x" << e.k << " m=" << m << ": " << t.to_string() << " vs "
                                    << one.to_string();
      }
      ++table_compared;
    }
  }
  // Every table shape has a 2-row-tile kernel (N % 32 == 0 at the model's
  // shapes): a run that compared none would have tested nothing.
  EXPECT_GE(table_compared, static_cast<int>(table_shapes().size()));
}

TEST(UnpoolerGpu, TableTacticsAreTheDefaults) {
  SKIP_WITHOUT_GPU(1);
  for (const auto& e : table_shapes()) {
    if (!e.unpooler) continue;  // the pooler's shapes: its own tests
    GuardedBuffer w(static_cast<size_t>(e.n) * e.k * 2);
    sd::Unpooler u(weight_ref(w.get(), e.n, e.k));
    EXPECT_EQ(u.tactic(), e.tactic);
    // The on-chip tactic of each m: its table row's (S, copy stages and
    // row tiles may differ between a shape's rows: tp 4).
    for (int m = 1; m <= sd::kMaxBatch; ++m)
      EXPECT_TRUE(u.onchip_tactic(m) == sd::onchip_tactic(sd::PlanOp::unpooler, e.n, e.k, m))
          << e.n << " m " << m << ": " << u.onchip_tactic(m).to_string();
    if (e.n == sd::kMuseSpark.hidden / 4)
      EXPECT_NE(u.describe().find("onchip_mma S=2"), std::string::npos) << u.describe();
  }
}

TEST(UnpoolerGpu, BitwiseReproducibleOver100Runs) {
  SKIP_WITHOUT_GPU(1);
  for (Shape s : {Shape{4096, 4096}, Shape{1024, 4096}}) {
    Problem p(s.n, s.k, Dist::outliers);
    sd::Unpooler u(weight_ref(p.w.get(), s.n, s.k));
    for (int m : {1, 7, 16}) {
      const auto first = p.run(u, m);
      // Every element written (p.run poisons out first): identical poison
      // would make the runs agree without computing anything.
      ASSERT_EQ(std::count(first.begin(), first.end(), kPoisonBf16), 0) << s.n << " m=" << m;
      for (int r = 1; r < 100; ++r) ASSERT_EQ(p.run(u, m), first) << s.n << " m=" << m << " run " << r;
    }
  }
}

// Row i computed in a batch of m equals row i computed alone, bit for bit.
TEST(UnpoolerGpu, BatchInvariance) {
  SKIP_WITHOUT_GPU(1);
  for (Shape s : model_shapes()) {
    Problem p(s.n, s.k, Dist::normal);
    sd::Unpooler u(weight_ref(p.w.get(), s.n, s.k));
    std::vector<std::vector<uint16_t>> alone;
    for (int i = 0; i < sd::kMaxBatch; ++i) {
      alone.push_back(p.run(u, 1, static_cast<const char*>(p.x.get()) + static_cast<size_t>(i) * s.k * 2));
      ASSERT_EQ(std::count(alone.back().begin(), alone.back().end(), kPoisonBf16), 0) << "row " << i << " alone";
    }
    for (int m = 1; m <= sd::kMaxBatch; ++m) {
      const auto batch = p.run(u, m);
      for (int i = 0; i < m; ++i)
        ASSERT_TRUE(std::equal(alone[i].begin(), alone[i].end(), batch.begin() + static_cast<size_t>(i) * s.n))
            << s.n << "x" << s.k << ": row " << i << " of a batch of " << m << " differs from it alone";
    }
  }
}

TEST(UnpoolerGpu, GraphReplayEqualsEager) {
  SKIP_WITHOUT_GPU(1);
  const int n = 2048, k = 4096;
  Problem p(n, k, Dist::normal);
  sd::Unpooler u(weight_ref(p.w.get(), n, k));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int m : {1, 8, 9, 16}) {
    const auto eager = p.run(u, m);
    ASSERT_EQ(std::count(eager.begin(), eager.end(), kPoisonBf16), 0) << "m=" << m << ": eager left poison";
    poison_bf16(p.out);
    CUDA_CHECK(cudaDeviceSynchronize());
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    u.run(p.x.get(), p.out.get(), m, stream);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 3; ++r) {
      poison_bf16(p.out);
      CUDA_CHECK(cudaGraphLaunch(exec, stream));
      CUDA_CHECK(cudaStreamSynchronize(stream));
      std::vector<uint16_t> h(static_cast<size_t>(m) * n);
      p.out.download(h.data(), h.size() * 2);
      ASSERT_EQ(h, eager) << "m=" << m << " replay " << r;
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
}

// Chains y_r = U(x_r), z_r = U(y_r) back to back with programmatic dependent
// launch: each second GEMM must read y_r only after the first finished
// writing it. Every x_r is distinct and every y_r is poisoned first, so a
// read too early sees poison or another iteration's rows and changes z_r.
TEST(UnpoolerGpu, PdlOnEqualsOff) {
  SKIP_WITHOUT_GPU(1);
  const int n = 4096, k = 4096, chain = 20;
  Problem p(n, k, Dist::normal);
  const size_t rows = static_cast<size_t>(sd::kMaxBatch);
  GuardedBuffer xs(rows * k * 2 * chain), ys(rows * n * 2 * chain), zs(rows * n * 2 * chain);
  const auto hx = random_bf16(rows * k * chain, Dist::normal);
  xs.upload(hx.data(), hx.size() * 2);
  sd::Unpooler::Options on, off;
  on.enable_pdl = true;
  off.enable_pdl = false;
  sd::Unpooler u_on(weight_ref(p.w.get(), n, k), on), u_off(weight_ref(p.w.get(), n, k), off);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto at = [&](GuardedBuffer& b, int r, int width) { return static_cast<char*>(b.get()) + rows * width * 2 * r; };
  for (int m : {1, 5, 16}) {
    std::vector<uint16_t> results[2];
    for (int pdl = 0; pdl < 2; ++pdl) {
      sd::Unpooler& u = pdl ? u_on : u_off;
      poison_bf16(ys);
      poison_bf16(zs);
      for (int r = 0; r < chain; ++r) {
        u.run(at(xs, r, k), at(ys, r, n), m, stream);
        u.run(at(ys, r, n), at(zs, r, n), m, stream);
      }
      CUDA_CHECK(cudaStreamSynchronize(stream));
      results[pdl].resize(rows * n * chain);
      zs.download(results[pdl].data(), results[pdl].size() * 2);
    }
    ASSERT_EQ(results[0], results[1]) << "m=" << m;
    for (int r = 0; r < chain; ++r) {
      const auto* z = results[0].data() + rows * n * r;
      ASSERT_EQ(std::count(z, z + static_cast<size_t>(m) * n, kPoisonBf16), 0) << "m=" << m << " link " << r;
      if (r > 0)  // distinct inputs give distinct outputs: a stale read would show
        ASSERT_FALSE(std::equal(z, z + static_cast<size_t>(m) * n, z - rows * n)) << "m=" << m << " link " << r;
    }
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(UnpoolerGpu, RunValidatesAndLaunchesNothingOnBadInput) {
  SKIP_WITHOUT_GPU(1);
  const int n = 48, k = 256;
  Problem p(n, k, Dist::normal);
  sd::Unpooler::Options only_small;
  only_small.rows = {1, 2, 3};
  sd::Unpooler u(weight_ref(p.w.get(), n, k), only_small);
  EXPECT_TRUE(u.prepared(8));
  EXPECT_FALSE(u.prepared(16));
  poison_bf16(p.out);
  EXPECT_THROW(u.run(p.x.get(), p.out.get(), 0, nullptr), sd::InvalidArgument);
  EXPECT_THROW(u.run(p.x.get(), p.out.get(), 17, nullptr), sd::InvalidArgument);
  EXPECT_THROW(u.run(static_cast<char*>(p.x.get()) + 2, p.out.get(), 1, nullptr), sd::InvalidArgument);
  auto x = sd::TensorRef::contiguous(p.x.get(), sd::DType::bf16, {2, k}, 0);
  auto out = sd::TensorRef::contiguous(p.out.get(), sd::DType::bf16, {2, n}, 0);
  auto bad = out;
  bad.dtype = sd::DType::f32;
  EXPECT_THROW(u.run(x, bad, nullptr), sd::InvalidArgument);
  bad = out;
  bad.shape[0] = 3;
  EXPECT_THROW(u.run(x, bad, nullptr), sd::InvalidArgument);
  EXPECT_THROW(u.run(x, x, nullptr), sd::InvalidArgument);  // out's shape
  // out of the right shape over x's bytes: refused for the overlap alone,
  // through either overload.
  const auto over_x = sd::TensorRef::contiguous(p.x.get(), sd::DType::bf16, {2, n}, 0);
  EXPECT_THROW(u.run(x, over_x, nullptr), sd::InvalidArgument);
  EXPECT_THROW(u.run(p.x.get(), p.x.get(), 1, nullptr), sd::InvalidArgument);
  EXPECT_THROW(u.run(p.x.get(), static_cast<char*>(p.x.get()) + 16, 1, nullptr), sd::InvalidArgument);
  // out over the weight: refused by name, the weight intact (below).
  try {
    u.run(p.x.get(), static_cast<char*>(p.w.get()) + 256, 2, nullptr);
    ADD_FAILURE() << "out over the weight accepted";
  } catch (const sd::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("out may not overlap the weight"), std::string::npos) << e.what();
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> h(static_cast<size_t>(sd::kMaxBatch) * n);
  p.out.download(h.data(), h.size() * 2);
  EXPECT_EQ(std::count(h.begin(), h.end(), kPoisonBf16), static_cast<long>(h.size()))
      << "a refused call wrote output";
  std::vector<uint16_t> hw(p.hw.size());
  p.w.download(hw.data(), hw.size() * 2);
  EXPECT_EQ(hw, p.hw) << "a refused call wrote the weight";

  // The tile of m = 9 was not prepared: refused under capture...
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  EXPECT_THROW(u.run(p.x.get(), p.out.get(), 9, stream), sd::InvalidArgument);
  cudaGraph_t graph;
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphDestroy(graph));
  // ...and prepared on first use outside capture.
  EXPECT_NO_THROW(u.run(p.x.get(), p.out.get(), 9, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_TRUE(u.prepared(16, u.tactic().row_tiles[8]));

  // An empty rows (rows=() in Python) prepares nothing; the first eager run
  // of each tile prepares it.
  sd::Unpooler::Options none;
  none.rows = std::vector<int>{};
  sd::Unpooler lazy(weight_ref(p.w.get(), n, k), none);
  for (int tile : {8, 16})
    for (int r : sd::kSplitKRowTiles) EXPECT_FALSE(lazy.prepared(tile, r)) << tile << " x" << r;
  EXPECT_NO_THROW(lazy.run(p.x.get(), p.out.get(), 1, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  EXPECT_TRUE(lazy.prepared(lazy.tactic().token_tile[0], lazy.tactic().row_tiles[0]));
  CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(UnpoolerGpu, FromMoeTakesThisRanksRows) {
  SKIP_WITHOUT_GPU(1);
  const int h = 256, k = 512, tp = 4;
  Problem full(h, k, Dist::normal);
  GuardedBuffer out(static_cast<size_t>(sd::kMaxBatch) * h * 2);
  const int m = 3;
  // The full weight and every rank's rows at one tactic: a row's bits depend
  // on (K, S, kw, accs) only, so each rank's output must be its columns of
  // the full product, bit for bit.
  sd::Unpooler::Options same;
  same.tactic = sd::unpooler_tactic(h / tp, k);
  auto u_full = sd::Unpooler(weight_ref(full.w.get(), h, k), same);
  const auto all = full.run(u_full, m);
  ASSERT_EQ(std::count(all.begin(), all.end(), kPoisonBf16), 0);
  for (int rank = 0; rank < tp; ++rank) {
    auto u = sd::Unpooler::from_moe(weight_ref(full.w.get(), h, k), tp, rank, same);
    ASSERT_EQ(u.n(), h / tp);
    const Reference ref = reference(full.hx, std::vector<uint16_t>(full.hw.begin() + static_cast<size_t>(rank) * (h / tp) * k,
                                                                 full.hw.begin() + static_cast<size_t>(rank + 1) * (h / tp) * k),
                                     m, h / tp, k);
    poison_bf16(out);
    u.run(full.x.get(), out.get(), m, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> got(static_cast<size_t>(m) * (h / tp));
    out.download(got.data(), got.size() * 2);
    const Check c = check_rows(got, ref, m, h / tp, k);
    EXPECT_EQ(c.bad, 0) << "rank " << rank << ": " << c.first;
    for (int r = 0; r < m; ++r)
      for (int j = 0; j < h / tp; ++j)
        ASSERT_EQ(got[static_cast<size_t>(r) * (h / tp) + j], all[static_cast<size_t>(r) * h + rank * (h / tp) + j])
            << "rank " << rank << " row " << r << " col " << j << ": differs from the full weight's product";
  }
}
