// Every reason the Unpooler refuses a weight or a tactic, and its tactics,
// checked without a GPU.
#include <algorithm>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>

#include "spark_decode/error.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/unpooler.h"

namespace sd = spark_decode;

namespace {

// A device-looking view; unsupported() never dereferences it.
sd::TensorRef weight(int64_t n, int64_t k, uintptr_t address = 0x10000) {
  return sd::TensorRef::contiguous(reinterpret_cast<void*>(address), sd::DType::bf16, {n, k}, 0);
}

std::string reason(const sd::TensorRef& w, const sd::SplitKTactic& t) {
  auto r = sd::Unpooler::unsupported(w, t);
  return r ? *r : std::string("<supported>");
}

sd::SplitKTactic tactic(int s, int kw, int accs) {
  sd::SplitKTactic t;
  t.splits = s;
  t.kw = kw;
  t.accs = accs;
  return t;
}

bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

}  // namespace

TEST(UnpoolerValidation, AcceptsTheModelShapes) {
  for (int tp : sd::kTensorParallelSizes) {
    const int n = sd::kMuseSpark.hidden / tp, k = sd::kMuseSpark.pooled;
    EXPECT_EQ(reason(weight(n, k), sd::unpooler_tactic(n, k)), "<supported>") << "tp " << tp;
  }
}

TEST(UnpoolerValidation, ShardShapeDtypeLayout) {
  const auto t = tactic(1, 64, 1);
  auto w = weight(16, 256);
  w.ndim = 3;
  w.shape[2] = 1;
  EXPECT_EQ(reason(w, t), "unpooler shard must be 2-D, got [16, 256, 1] bf16 on cuda:0");

  const std::string needs = ": needs a contiguous, 16-byte aligned BF16 [N, K] with N % 16 == 0";
  auto f32 = weight(16, 256);
  f32.dtype = sd::DType::f32;
  EXPECT_EQ(reason(f32, t), "unpooler shard [16, 256] f32 on cuda:0" + needs);
  auto strided = weight(16, 256);
  strided.stride[0] = 512;
  EXPECT_EQ(reason(strided, t), "unpooler shard [16, 256] bf16 on cuda:0" + needs);
  EXPECT_EQ(reason(weight(16, 256, 0x10008), t), "unpooler shard [16, 256] bf16 on cuda:0" + needs);
  EXPECT_EQ(reason(weight(24, 256), t), "unpooler shard [24, 256] bf16 on cuda:0" + needs);
  auto host = weight(16, 256);
  host.device = -1;
  EXPECT_EQ(reason(host, t), "unpooler shard [16, 256] bf16 on host: needs device memory");
}

TEST(UnpoolerValidation, LaunchUnsupportedReasons) {
  EXPECT_EQ(*sd::launch_unsupported(0, 256, 1, 64, 1), "unsupported shape or tactic n=0 splits=1 accs=1");
  EXPECT_EQ(*sd::launch_unsupported(16, 256, 3, 64, 1), "unsupported shape or tactic n=16 splits=3 accs=1");
  EXPECT_EQ(*sd::launch_unsupported(16, 256, 1, 64, 3), "unsupported shape or tactic n=16 splits=1 accs=3");
  EXPECT_EQ(*sd::launch_unsupported(16, 250, 1, 64, 1), "K=250 does not split into 1 x warps x 64");
  EXPECT_EQ(*sd::launch_unsupported(16, 96, 1, 48, 1), "K=96 does not split into 1 x warps x 48");
  EXPECT_EQ(*sd::launch_unsupported(16, 64 * 33, 1, 64, 1), "33 warps per CTA");
  EXPECT_EQ(*sd::launch_unsupported(16, 320, 1, 32, 1),
            "kw=32 has no compiled kernel (compiled: 64 128 256)");
  EXPECT_EQ(*sd::launch_unsupported(16, 256 * 32, 1, 256, 1),
            "kw=256 runs at most 16 warps per CTA (each lane holds kw/4 registers of weights), got 32");
  // 8 x 32 x 64: 256 warp partials of [16][16] FP32 = 256 KiB at rank 0.
  EXPECT_EQ(*sd::launch_unsupported(16, 8 * 32 * 64, 8, 64, 1),
            "256 warp partials need 262672 bytes of shared memory at cluster rank 0, more than 232448");
  EXPECT_FALSE(sd::launch_unsupported(16, 256, 1, 64, 4));
  EXPECT_FALSE(sd::launch_unsupported(48, 256, 4, 64, 2));
}

TEST(UnpoolerValidation, TokenTilesMustCoverEveryM) {
  auto t = tactic(1, 64, 1);
  t.token_tile[12] = 8;  // m = 13 in a tile of 8
  EXPECT_EQ(reason(weight(16, 256), t),
            "token tiles (S=1 kw=64 accs=1 tile16_from_m=9) do not cover M 1..16: m=13 has tile 8");
  t.token_tile[12] = 12;
  EXPECT_NE(reason(weight(16, 256), t).find("m=13 has tile 12"), std::string::npos);
  auto all16 = tactic(1, 64, 1);
  all16.token_tile.fill(16);
  EXPECT_EQ(reason(weight(16, 256), all16), "<supported>");
}

TEST(UnpoolerValidation, RowTilesReasons) {
  auto t = tactic(1, 64, 1);
  t.row_tiles[15] = 2;  // m = 16 with two row tiles
  EXPECT_EQ(t.to_string(), "S=1 kw=64 accs=1 tile16_from_m=9 rows32_at_m=16");
  EXPECT_EQ(reason(weight(32, 256), t), "<supported>");
  EXPECT_EQ(reason(weight(48, 256), t), "2 row tiles per CTA need N % 32 == 0, got N=48");
  t.row_tiles[3] = 3;
  EXPECT_EQ(reason(weight(32, 256), t), "m=4 has 3 row tiles per CTA; 1 or 2 are compiled");
  t.row_tiles[3] = 4;
  EXPECT_EQ(reason(weight(64, 256), t), "m=4 has 4 row tiles per CTA; 1 or 2 are compiled");
  t.row_tiles[3] = 2;
  EXPECT_EQ(t.to_string(), "S=1 kw=64 accs=1 tile16_from_m=9 rows32_at_m=4,16");
  t.row_tiles[4] = t.row_tiles[5] = 2;
  EXPECT_EQ(t.to_string(), "S=1 kw=64 accs=1 tile16_from_m=9 rows32_at_m=4-6,16");
  t.accs = 2;
  EXPECT_EQ(reason(weight(32, 256), t), "<supported>");
  t.accs = 4;
  EXPECT_EQ(reason(weight(32, 256), t), "2 row tiles per CTA are compiled for accs <= 2, got accs=4");
  // 32 warps of kw = 64 fit one row tile's budget (1024 threads), not two's.
  auto wide = tactic(1, 64, 1);
  wide.row_tiles.fill(2);
  EXPECT_EQ(reason(weight(32, 64 * 32), tactic(1, 64, 1)), "<supported>");
  EXPECT_EQ(reason(weight(32, 64 * 32), wide), "2 row tiles per CTA run at most 16 warps per CTA, got 32");
  // 8 x 16 x 64: 128 warp partials of [2][16][16] FP32 = 256 KiB at rank 0.
  auto split8 = tactic(8, 64, 1);
  split8.row_tiles.fill(2);
  EXPECT_EQ(reason(weight(32, 8 * 16 * 64), tactic(8, 64, 1)), "<supported>");
  EXPECT_EQ(reason(weight(32, 8 * 16 * 64), split8),
            "128 warp partials of 2 row tiles need 263184 bytes of shared memory at cluster rank 0, more "
            "than 232448");
}

TEST(UnpoolerTactics, TheModelShapesRunThePlanTablesTactics) {
  // Every tp's unpooler shape [H/tp, P] and pooler GEMM shape [P/tp, H] (the
  // split-K engine at tp >= 2) has a valid tactic from the plan table's rows
  // (tests/cpu/test_plan.cpp checks the rows themselves).
  for (int tp : sd::kTensorParallelSizes) {
    const int un = sd::kMuseSpark.hidden / tp, pn = sd::kMuseSpark.pooled / tp;
    const auto u = sd::unpooler_tactic(un, sd::kMuseSpark.pooled);
    EXPECT_EQ(u, sd::splitk_tactic(sd::PlanOp::unpooler, un, sd::kMuseSpark.pooled));
    EXPECT_FALSE(sd::launch_unsupported(un, sd::kMuseSpark.pooled, u)) << "unpooler tp " << tp;
    const auto* row = sd::plan_row(sd::PlanOp::unpooler, tp, 1);
    ASSERT_NE(row, nullptr);
    EXPECT_EQ(u.splits, row->splits);
    EXPECT_EQ(u.kw, row->kw);
    EXPECT_EQ(u.accs, row->accs);
    const auto p = sd::splitk_tactic(sd::PlanOp::pooler, pn, sd::kMuseSpark.hidden);
    EXPECT_FALSE(sd::launch_unsupported(pn, sd::kMuseSpark.hidden, p)) << "pooler tp " << tp;
  }
}

TEST(UnpoolerTactics, DefaultsAreValidForOtherShapes) {
  for (int n : {16, 48, 64, 1024, 3072, 8192, 12288})
    for (int k : {256, 512, 1024, 2048, 4096, 7168, 8192}) {
      const auto t = sd::unpooler_tactic(n, k);
      EXPECT_FALSE(sd::launch_unsupported(n, k, t)) << n << "x" << k << ": " << t.to_string();
    }
  // No compiled kernel splits K = 96: the default says why instead of lying.
  EXPECT_TRUE(sd::launch_unsupported(16, 96, sd::unpooler_tactic(16, 96)));
}

TEST(UnpoolerConstruction, WithoutAGpuSaysSo) {
  if (has_gpu()) GTEST_SKIP() << "a GPU is present; the GPU tests construct real Unpoolers";
  try {
    sd::Unpooler u(weight(16, 256));
    FAIL() << "constructed without a GPU";
  } catch (const sd::RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("needs a CUDA GPU"), std::string::npos) << e.what();
  }
}

TEST(UnpoolerConstruction, BadWeightsThrowBeforeTouchingTheGpu) {
  EXPECT_THROW(sd::Unpooler(weight(24, 256)), sd::InvalidArgument);
  sd::Unpooler::Options bad_rows;
  bad_rows.rows = {17};
  bad_rows.tactic = tactic(1, 64, 1);
  EXPECT_THROW(sd::Unpooler(weight(16, 256), bad_rows), sd::InvalidArgument);
  EXPECT_THROW(sd::Unpooler::from_moe(weight(48, 256), 5, 0), sd::InvalidArgument);
  EXPECT_THROW(sd::Unpooler::from_moe(weight(48, 256), 3, 3), sd::InvalidArgument);
}

TEST(UnpoolerValidation, ClusterBalanceIsPrintedOnlyWithClusters) {
  auto t = tactic(1, 64, 1);
  t.cluster_balance = true;  // ignored without a cluster
  EXPECT_EQ(t.to_string(), "S=1 kw=64 accs=1 tile16_from_m=9");
  t.splits = 2;
  EXPECT_EQ(t.to_string(), "S=2 kw=64 accs=1 tile16_from_m=9 cluster_balance");
  // Where it was measured faster (the plan table): the unpooler at tp 1, 2
  // and 4 and the pooler GEMM's split-K engine at tp 1, 2 and 4; not at tp 8.
  for (int n : {8192, 4096, 2048}) EXPECT_TRUE(sd::unpooler_tactic(n, 4096).cluster_balance) << n;
  EXPECT_FALSE(sd::unpooler_tactic(1024, 4096).cluster_balance);
  for (int n : {4096, 2048, 1024}) EXPECT_TRUE(sd::splitk_tactic(sd::PlanOp::pooler, n, 8192).cluster_balance) << n;
  EXPECT_FALSE(sd::splitk_tactic(sd::PlanOp::pooler, 512, 8192).cluster_balance);
}

TEST(UnpoolerValidation, UnswizzledLoadsOnlyWhereCompiled) {
  auto t = tactic(2, 256, 1);
  EXPECT_EQ(t.to_string(), "S=2 kw=256 accs=1 tile16_from_m=9");
  t.row_swizzle = false;
  EXPECT_EQ(t.to_string(), "S=2 kw=256 accs=1 tile16_from_m=9 unswizzled");
  EXPECT_EQ(reason(weight(32, 4096), t), "<supported>");
  t.row_tiles.fill(2);
  EXPECT_EQ(reason(weight(32, 4096), t), "<supported>");
  t.accs = 2;
  EXPECT_EQ(reason(weight(32, 4096), t),
            "fragment-order (unswizzled) weight loads are compiled for kw=256 accs=1 only, got kw=256 accs=2");
  t.accs = 1;
  t.kw = 128;
  EXPECT_EQ(reason(weight(32, 4096), t),
            "fragment-order (unswizzled) weight loads are compiled for kw=256 accs=1 only, got kw=128 accs=1");
  t.row_swizzle = true;
  EXPECT_EQ(reason(weight(32, 4096), t), "<supported>");
  // The tensor-parallel size whose small grid it serves: tp 8's unpooler.
  EXPECT_FALSE(sd::unpooler_tactic(1024, 4096).row_swizzle);
  for (int n : {8192, 4096, 2048}) EXPECT_TRUE(sd::unpooler_tactic(n, 4096).row_swizzle) << n;
}
