// The on-chip MMA engine's launch shapes, checked without a GPU: every reason
// onchip_unsupported gives, the default tactics at the model's shapes (the
// grid that covers the SMs, the split-K engine's reduction order, the
// shared memory a CTA needs), the Unpooler's and the pooler GEMM's checks on
// it, and the plan table's rules for rows that name it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/gemm/onchip_mma_config.h"
#include "plan_test_util.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/plan.h"
#include "spark_decode/pooler_gemm.h"
#include "spark_decode/unpooler.h"

namespace sd = spark_decode;
using sd::testing::h200_rows;
using sd::testing::table_reason;
namespace onchip = sd::kernels::onchip;

namespace {

std::string reason(int n, int k, const sd::OnchipTactic& t) {
  const auto why = sd::onchip_unsupported(n, k, t);
  return why ? *why : "<supported>";
}

sd::OnchipTactic tactic(int s, int kw, int accs) {
  sd::OnchipTactic t;
  t.splits = s;
  t.kw = kw;
  t.accs = accs;
  return t;
}

}  // namespace

TEST(OnchipTactics, TheDeployedShapesTakeTheTablesTacticInTheTablesOrder) {
  // tp 4 and 8: the tactic of the table's on-chip row of each b (S, copy
  // stages, cluster policy, row tiles); at a b the split-K engine serves,
  // the shape's first on-chip row's; tp 1 and 2 (no on-chip row): the
  // default, the least S giving ~128 CTAs with 2 KiB copies, at every b.
  struct Want {
    sd::PlanOp op;
    int tp, b_first, b_last, splits, stage_warps;
    bool balance;
    int row_tiles;
  };
  const Want wants[] = {{sd::PlanOp::unpooler, 8, 1, 16, 4, 1, true, 1},  {sd::PlanOp::unpooler, 4, 1, 8, 4, 1, false, 1},
                        {sd::PlanOp::unpooler, 4, 9, 16, 2, 4, true, 2}, {sd::PlanOp::pooler, 8, 1, 16, 4, 2, true, 1},
                        {sd::PlanOp::pooler, 4, 1, 16, 4, 2, true, 1},   {sd::PlanOp::unpooler, 2, 1, 16, 1, 0, false, 1},
                        {sd::PlanOp::pooler, 2, 1, 16, 1, 0, false, 1}};
  for (const Want& w : wants)
    for (int b = w.b_first; b <= w.b_last; ++b) {
      const bool un = w.op == sd::PlanOp::unpooler;
      const int n = (un ? sd::kMuseSpark.hidden : sd::kMuseSpark.pooled) / w.tp;
      const int k = un ? sd::kMuseSpark.pooled : sd::kMuseSpark.hidden;
      const auto t = sd::onchip_tactic(w.op, n, k, b);
      const std::string what = std::string(sd::op_name(w.op)) + " tp " + std::to_string(w.tp) + " b " +
                               std::to_string(b) + " " + t.to_string();
      EXPECT_EQ(reason(n, k, t), "<supported>") << what;
      EXPECT_EQ(t.row_tiles[b - 1], w.row_tiles) << what;
      if (w.stage_warps) {
        EXPECT_EQ(t.splits, w.splits) << what;
        EXPECT_EQ(t.stage_warps, w.stage_warps) << what;
        EXPECT_EQ(t.cluster_balance, w.balance) << what;
        const sd::PlanRow* row = sd::plan_row(w.op, w.tp, b);
        ASSERT_NE(row, nullptr);
        if (row->engine == sd::GemmEngine::onchip_mma) {
          EXPECT_EQ(row->onchip_splits, t.splits) << what;
          EXPECT_EQ(row->onchip_stage_warps, t.stage_warps) << what;
          EXPECT_EQ(row->onchip_row_tiles, t.row_tiles[b - 1]) << what;
        }
      } else {
        EXPECT_EQ(t, sd::onchip_tactic(w.op, n, k)) << what;
        EXPECT_GE(n / sd::kSplitKTileN * t.splits, sd::kOnchipTargetCtas) << what;
        EXPECT_EQ(t.stage_warps_for(k), 4) << what;  // copies of 2 KiB (4 warps of kw = 256)
      }
      // The split-K engine's reduction order for the shape: its bits.
      const auto s = sd::splitk_tactic(w.op, n, k);
      EXPECT_EQ(t.kw, s.kw) << what;
      EXPECT_EQ(t.accs, s.accs) << what;
      EXPECT_EQ(t.token_tile, s.token_tile) << what;
      EXPECT_LE(onchip::smem_bytes(k, t.splits, t.kw, 16, t.row_tiles[b - 1]), sd::kernels::kMaxSmemPerBlock) << what;
    }
  // Every model shape has a valid on-chip tactic in the split-K order.
  for (int tp : sd::kTensorParallelSizes) {
    for (sd::PlanOp op : {sd::PlanOp::unpooler, sd::PlanOp::pooler}) {
      const bool un = op == sd::PlanOp::unpooler;
      const int n = (un ? sd::kMuseSpark.hidden : sd::kMuseSpark.pooled) / tp;
      const int k = un ? sd::kMuseSpark.pooled : sd::kMuseSpark.hidden;
      const auto t = sd::onchip_tactic(op, n, k);
      EXPECT_EQ(reason(n, k, t), "<supported>") << sd::op_name(op) << " tp " << tp;
      EXPECT_GE(n / sd::kSplitKTileN * t.splits, sd::kOnchipTargetCtas) << sd::op_name(op) << " tp " << tp;
      EXPECT_EQ(t.kw, sd::splitk_tactic(op, n, k).kw);
      EXPECT_EQ(t.accs, sd::splitk_tactic(op, n, k).accs);
    }
  }
}

TEST(OnchipTactics, OtherShapesGetAValidDefaultOrAReason) {
  for (auto [n, k] : {std::pair{16, 256}, {48, 256}, {64, 1024}, {96, 2048}, {8192, 8192}, {96, 3072}}) {
    const auto t = sd::onchip_tactic(sd::PlanOp::pooler, n, k);
    EXPECT_EQ(reason(n, k, t), "<supported>") << n << "x" << k << " " << t.to_string();
  }
  // A small grid takes the S with the most CTAs that still has a warp.
  EXPECT_EQ(sd::onchip_tactic(sd::PlanOp::pooler, 48, 256).splits, 1);
  EXPECT_EQ(sd::onchip_tactic(sd::PlanOp::pooler, 64, 1024).kw * sd::onchip_tactic(sd::PlanOp::pooler, 64, 1024).splits,
            1024);
  // K = 100: no compiled kw divides it.
  const auto none = sd::onchip_tactic(sd::PlanOp::pooler, 64, 100);
  EXPECT_NE(reason(64, 100, none), "<supported>");
}

TEST(OnchipTactics, StageWarps) {
  auto t = tactic(1, 256, 1);
  EXPECT_EQ(t.stage_warps_for(256 * 16), 4);  // 2 KiB copies
  EXPECT_EQ(t.stage_warps_for(256 * 8), 4);
  EXPECT_EQ(t.stage_warps_for(256 * 6), 2);   // the largest power of two dividing 6
  EXPECT_EQ(t.stage_warps_for(256 * 1), 1);
  EXPECT_EQ(tactic(1, 128, 1).stage_warps_for(128 * 16), 8);
  t.stage_warps = 16;
  EXPECT_EQ(t.stage_warps_for(256 * 16), 16);
  EXPECT_EQ(reason(16, 256 * 16, t), "<supported>");
  EXPECT_EQ(t.to_string(), "S=1 kw=256 accs=1 tile16_from_m=9 stage_warps=16");
  t.stage_warps = 3;
  EXPECT_EQ(reason(16, 256 * 12, t),
            "on-chip MMA: stage_warps=3 is not a power of two dividing the 12 warps per CTA");
  t.stage_warps = 8;
  EXPECT_EQ(reason(16, 256 * 12, t),
            "on-chip MMA: stage_warps=8 is not a power of two dividing the 12 warps per CTA");
}

TEST(OnchipValidation, EveryReason) {
  EXPECT_EQ(reason(24, 256, tactic(1, 256, 1)), "on-chip MMA: N=24 is not a positive multiple of 16");
  EXPECT_EQ(reason(0, 256, tactic(1, 256, 1)), "on-chip MMA: N=0 is not a positive multiple of 16");
  EXPECT_EQ(reason(16, 512, tactic(3, 256, 1)), "on-chip MMA: splits=3 (S in 1, 2, 4, 8)");
  EXPECT_EQ(reason(16, 512, tactic(1, 64, 1)),
            "on-chip MMA: kw=64 accs=1 has no compiled kernel (kw: 128 256; accs 1..2)");
  EXPECT_EQ(reason(16, 512, tactic(1, 256, 4)),
            "on-chip MMA: kw=256 accs=4 has no compiled kernel (kw: 128 256; accs 1..2)");
  EXPECT_EQ(reason(16, 768, tactic(2, 256, 1)), "on-chip MMA: K=768 does not split into 2 x warps x 256");
  EXPECT_EQ(reason(16, 256 * 32, tactic(1, 256, 1)),
            "on-chip MMA: 32 warps per CTA (K / (S kw)), more than 16: take a larger S");
  auto t = tactic(1, 256, 1);
  t.token_tile[12] = 8;
  EXPECT_EQ(reason(16, 256, t),
            "on-chip MMA: token tiles (S=1 kw=256 accs=1 tile16_from_m=9) do not cover M 1..16: m=13 has tile 8");
  t.token_tile.fill(16);
  EXPECT_EQ(reason(16, 256, t), "<supported>");
  // K = 8 x 16 x 256: 128 KiB of weights per CTA and 128 warp partials of
  // [16][16] FP32 (128 KiB) at rank 0; with tile 8 only, half the partials.
  EXPECT_EQ(reason(16, 8 * 16 * 256, tactic(8, 256, 1)),
            "on-chip MMA: a CTA's 131072 weight bytes, 128 warp partials and header need 264448 bytes of shared "
            "memory, more than 232448");
  EXPECT_EQ(reason(16, 8 * 8 * 256, tactic(8, 256, 1)), "<supported>");
  EXPECT_EQ(reason(48, 256, tactic(1, 256, 2)), "<supported>");
  EXPECT_EQ(reason(48, 1024, tactic(4, 128, 2)), "<supported>");
  // Two row tiles: at token tile 16 only, N a multiple of 32, at most 8
  // warps, twice the slice and the partials within the shared memory.
  auto r2 = tactic(1, 256, 1);
  for (int m = 9; m <= 16; ++m) r2.row_tiles[m - 1] = 2;
  EXPECT_EQ(reason(32, 2048, r2), "<supported>");
  EXPECT_EQ(r2.to_string(), "S=1 kw=256 accs=1 tile16_from_m=9 rows32_at_m=9-16");
  EXPECT_EQ(reason(48, 2048, r2), "on-chip MMA: 2 row tiles per CTA need N % 32 == 0, got N=48");
  EXPECT_EQ(reason(32, 256 * 16, r2),
            "on-chip MMA: 2 row tiles per CTA run at most 8 warps per CTA, got 16: take a larger S");
  // 8 warps x 256 K x 32 rows (128 KiB) and 32 partials of [2][16][16]
  // FP32 (64 KiB): fits; at 16 KiB more of K per CTA it would not.
  EXPECT_EQ(reason(32, 8 * 256, r2), "<supported>");
  auto r2_wide = r2;
  r2_wide.splits = 2;
  EXPECT_EQ(reason(32, 2 * 8 * 256, r2_wide), "<supported>");
  auto r2_kw128 = tactic(1, 128, 1);
  for (int m = 9; m <= 16; ++m) r2_kw128.row_tiles[m - 1] = 2;
  EXPECT_EQ(reason(32, 12 * 128, r2_kw128),
            "on-chip MMA: 2 row tiles per CTA run at most 8 warps per CTA, got 12: take a larger S");
  r2.row_tiles[0] = 2;  // m = 1 has token tile 8
  EXPECT_EQ(reason(32, 2048, r2),
            "on-chip MMA: m=1 has 2 row tiles at token tile 8; 1, or 2 at token tile 16, are compiled");
  r2.row_tiles[0] = 3;
  EXPECT_EQ(reason(32, 2048, r2),
            "on-chip MMA: m=1 has 3 row tiles at token tile 8; 1, or 2 at token tile 16, are compiled");
}

TEST(OnchipValidation, SharedMemoryLayout) {
  // Stages after the partials; the whole slice plus one skew per warp.
  EXPECT_EQ(onchip::stages_offset(4096, 256, 16), onchip::kPartialsOffset + 16 * 16 * 16 * 4);
  EXPECT_EQ(onchip::smem_bytes(4096, 1, 256, 16), onchip::stages_offset(4096, 256, 16) + 16 * 4096 * 2 + 16 * 64);
  // Two row tiles: twice the partials, the rows and the skews; blocks of 16
  // rows one after the other in a stage; the y tile holds 32 rows.
  EXPECT_EQ(onchip::stages_offset(4096, 256, 16, 2), onchip::kPartialsOffset + 16 * 2 * 16 * 16 * 4);
  EXPECT_EQ(onchip::smem_bytes(4096, 4, 256, 16, 2),
            onchip::stages_offset(4096, 256, 16, 2) + 32 * 1024 * 2 + 2 * 4 * 64);
  EXPECT_EQ(onchip::stage_bytes(512, 2), 2 * onchip::block_bytes(512));
  EXPECT_GE(onchip::kYTileBytes, sd::kMaxBatch * 32 * 2);
  EXPECT_EQ(onchip::stages_offset(4096, 256, 16, 2) % 128, 0);  // the stages' bank argument needs 128-byte blocks
  // Rows g and g + 1 of a stage 64 bytes apart modulo 128 (opposite bank
  // halves), rows g and g + 2 a multiple of 128 apart.
  for (int width : {128, 256, 512, 1024, 2048, 4096})
    for (int g = 0; g < 8; ++g) {
      EXPECT_EQ((onchip::row_offset(width, 2 * (g / 2) + 1) - onchip::row_offset(width, 2 * (g / 2))) % 128, 64);
      EXPECT_EQ(onchip::row_offset(width, g + 8) - onchip::row_offset(width, g), 4 * onchip::row_bytes(width));
      EXPECT_EQ(onchip::row_offset(width, g) % 16, 0);
    }
}

TEST(OnchipValidation, TheUnpoolerAndThePoolerGemmAskTheEngine) {
  const auto w = [](int64_t n, int64_t k) {
    return sd::TensorRef::contiguous(reinterpret_cast<void*>(0x10000), sd::DType::bf16, {n, k}, 0);
  };
  EXPECT_FALSE(sd::Unpooler::unsupported(w(1024, 4096), sd::onchip_tactic(sd::PlanOp::unpooler, 1024, 4096)));
  EXPECT_EQ(*sd::Unpooler::unsupported(w(1024, 4096), tactic(1, 256, 4)),
            "on-chip MMA: kw=256 accs=4 has no compiled kernel (kw: 128 256; accs 1..2)");
  EXPECT_EQ(*sd::Unpooler::unsupported(w(24, 256), tactic(1, 256, 1)),
            "unpooler shard [24, 256] bf16 on cuda:0: needs a contiguous, 16-byte aligned BF16 [N, K] with N % 16 "
            "== 0");
  // The Unpooler's engine of each m is its table row's; other shapes: split-K.
  for (int tp : sd::kTensorParallelSizes)
    for (int m = 1; m <= sd::kMaxBatch; ++m)
      EXPECT_EQ(sd::unpooler_engine(sd::kMuseSpark.hidden / tp, sd::kMuseSpark.pooled, m),
                sd::plan_row(sd::PlanOp::unpooler, tp, m)->engine)
          << "tp " << tp << " m " << m;
  EXPECT_EQ(sd::unpooler_engine(1024, 2048, 1), sd::GemmEngine::splitk_mma);
  const sd::PoolerGemmChoice on{sd::GemmEngine::onchip_mma, {}};
  EXPECT_EQ(on.to_string(), "onchip_mma");
  EXPECT_STREQ(sd::engine_name(sd::GemmEngine::onchip_mma), "onchip_mma");
  for (int tp : sd::kTensorParallelSizes)
    for (int b = 1; b <= sd::kMaxBatch; ++b)
      EXPECT_FALSE(sd::pooler_choice_unsupported(sd::kMuseSpark.pooled / tp, sd::kMuseSpark.hidden, b, on))
          << "tp " << tp << " b " << b;
  EXPECT_EQ(*sd::pooler_choice_unsupported(512, 8192, 17, on), "pooler GEMM: m = 17 outside [1, 16]");
  EXPECT_EQ(*sd::pooler_choice_unsupported(24, 8192, 1, on),
            "pooler GEMM: on-chip MMA: N=24 is not a positive multiple of 16");
}

TEST(OnchipPlanTable, RowsNamingTheEngineKeepTheRules) {
  auto rows = h200_rows();
  auto rows_of = [&](sd::PlanOp op, int tp) {
    std::vector<sd::PlanRow*> out;
    for (auto& r : rows)
      if (r.op == op && r.tp == tp) out.push_back(&r);
    return out;
  };
  auto expect_reason = [&](const std::string& want) {
    EXPECT_NE(table_reason(rows).find(want), std::string::npos) << table_reason(rows) << "\nwant: " << want;
  };
  // The table mixes the engines within a shape (the pooler at tp 4: on
  // chip at b <= 4, split-K above), one order for both.
  ASSERT_EQ(rows_of(sd::PlanOp::pooler, 4).front()->engine, sd::GemmEngine::onchip_mma);
  ASSERT_EQ(rows_of(sd::PlanOp::pooler, 4).back()->engine, sd::GemmEngine::splitk_mma);
  // And its on-chip rows' launches within a shape (the unpooler at tp 4: S 4
  // at b <= 8, S 2 with two row tiles above), one order for all.
  ASSERT_NE(rows_of(sd::PlanOp::unpooler, 4).front()->onchip_splits,
            rows_of(sd::PlanOp::unpooler, 4).back()->onchip_splits);
  EXPECT_EQ(table_reason(rows), "(none)");
  const auto saved = rows;
  // Another order at b >= 5 (accs 2 on the split-K rows).
  rows_of(sd::PlanOp::pooler, 4).back()->accs = 2;
  expect_reason("pooler tp 4 changes the split-K S, kw or accs between b 1 and b 9");
  rows = saved;
  // Another on-chip S, copy stage or policy at some b: valid.
  rows_of(sd::PlanOp::unpooler, 8).back()->onchip_splits = 2;
  rows_of(sd::PlanOp::pooler, 8).back()->onchip_stage_warps = 4;
  EXPECT_EQ(table_reason(rows), "(none)");
  rows = saved;
  // ... but each on-chip row's tactic must be one the shape can take: two
  // row tiles with 16 warps per CTA (S 1 at tp 4) cannot.
  rows_of(sd::PlanOp::unpooler, 4).back()->onchip_splits = 1;
  expect_reason("unpooler tp 4 b 9: on-chip MMA: 2 row tiles per CTA run at most 8 warps per CTA, got 16");
  rows = saved;
  // A split-K row with on-chip fields.
  rows_of(sd::PlanOp::unpooler, 1).front()->onchip_splits = 2;
  expect_reason("unpooler tp 1 b 1 runs splitk_mma but sets the on-chip fields");
  rows = saved;
  // Another engine beside the on-chip one: another order.
  rows_of(sd::PlanOp::pooler, 8).back()->engine = sd::GemmEngine::ring_mma;
  rows_of(sd::PlanOp::pooler, 8).back()->onchip_splits = 0;
  rows_of(sd::PlanOp::pooler, 8).back()->onchip_stage_warps = 0;
  rows_of(sd::PlanOp::pooler, 8).back()->onchip_cluster_balance = false;
  expect_reason("pooler tp 8 runs onchip_mma at b 1 and ring_mma at b 9: two reduction orders for one shape");
  rows = saved;
  // accs = 4: the split-K engine has it, the on-chip engine not.
  for (auto* r : rows_of(sd::PlanOp::unpooler, 8)) r->accs = 4, r->row_swizzle = true;
  expect_reason("unpooler tp 8 b 1: on-chip MMA: kw=256 accs=4 has no compiled kernel");
  rows = saved;
  // An on-chip S the shape cannot take.
  for (auto* r : rows_of(sd::PlanOp::unpooler, 8)) r->onchip_splits = 3;
  expect_reason("unpooler tp 8 b 1: on-chip MMA: splits=3");
  rows = saved;
  for (auto* r : rows_of(sd::PlanOp::unpooler, 2)) r->engine = sd::GemmEngine::ring_mma;
  expect_reason("the unpooler runs the split-K or the on-chip engine only");
  rows = saved;
  EXPECT_EQ(table_reason(rows), "(none)");
}
