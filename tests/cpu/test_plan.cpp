// The plan table, checked without a GPU: its rules (every (op, tp, b) of the
// model served by exactly one row, one reduction order per shape), what it
// holds (spelled out, so that a row that silently falls back fails here),
// and that the checker rejects tables that break each rule.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "plan_test_util.h"
#include "spark_decode/plan.h"
#include "spark_decode/pooler_gemm.h"
#include "spark_decode/unpooler.h"

namespace sd = spark_decode;
using sd::testing::h200_rows;
using sd::testing::table_reason;

TEST(PlanTable, TheMachinesTableKeepsItsRules) {
  EXPECT_STREQ(sd::plan_table().machine, "nvidia-h200");
  EXPECT_EQ(table_reason(h200_rows()), "(none)");
  for (int i = 0; i < sd::plan_table().size; ++i) EXPECT_NE(std::string(sd::plan_table().rows[i].measured), "");
}

TEST(PlanTable, EveryModelShapeAndBatchHasOneRow) {
  for (sd::PlanOp op : {sd::PlanOp::unpooler, sd::PlanOp::pooler})
    for (int tp : sd::kTensorParallelSizes)
      for (int b = 1; b <= sd::kMaxBatch; ++b) {
        const sd::PlanRow* row = sd::plan_row(op, tp, b);
        ASSERT_NE(row, nullptr) << sd::op_name(op) << " tp " << tp << " b " << b;
        EXPECT_TRUE(b >= row->b_first && b <= row->b_last);
      }
  EXPECT_EQ(sd::plan_row(sd::PlanOp::pooler, 3, 1), nullptr);
  EXPECT_EQ(sd::plan_row(sd::PlanOp::pooler, 1, 17), nullptr);
}

TEST(PlanTable, HoldsWhatWasMeasured) {
  // The choices measured on the H200 (docs/perf/): spelled out here so that
  // an edit of the table shows up in a test. The unpooler: the split-K
  // engine at tp 1, 2, the on-chip engine at tp 4 and 8; the pooler: the
  // ring at tp 1, the split-K engine at tp 2, the on-chip engine at tp 8 and
  // at tp 4 b <= 4 (one reduction order per shape: the split-K and on-chip
  // engines share theirs).
  const auto onchip = [](int tp, int) { return tp == 4 || tp == 8; };
  const auto pooler_onchip = [](int tp, int b) { return tp == 8 || (tp == 4 && b <= 4); };
  for (int tp : sd::kTensorParallelSizes)
    for (int b = 1; b <= sd::kMaxBatch; ++b) {
      const sd::PlanRow& u = *sd::plan_row(sd::PlanOp::unpooler, tp, b);
      EXPECT_EQ(u.engine, onchip(tp, b) ? sd::GemmEngine::onchip_mma : sd::GemmEngine::splitk_mma)
          << "tp " << tp << " b " << b;
      EXPECT_EQ(u.token_tile, b <= 8 ? 8 : 16);
      const sd::PlanRow& p = *sd::plan_row(sd::PlanOp::pooler, tp, b);
      EXPECT_EQ(p.engine, tp == 1                ? sd::GemmEngine::ring_mma
                          : pooler_onchip(tp, b) ? sd::GemmEngine::onchip_mma
                                                 : sd::GemmEngine::splitk_mma)
          << "tp " << tp << " b " << b;
      EXPECT_EQ(sd::pooler_gemm_choice(sd::kMuseSpark.pooled / tp, sd::kMuseSpark.hidden, tp, b).engine, p.engine);
      // Publish route: the epilogue but at tp 2 b = 1 and 9..16 (two H200s).
      EXPECT_EQ(p.publish, tp == 2 && (b == 1 || b >= 9) ? sd::PublishRoute::kernel : sd::PublishRoute::epilogue)
          << "tp " << tp << " b " << b;
      // The fused consumer's launch point: late where the ring runs its
      // 16-token tile, early everywhere else.
      EXPECT_EQ(p.consumer, tp == 1 && b >= 9 ? sd::ConsumerLaunch::late : sd::ConsumerLaunch::early)
          << "tp " << tp << " b " << b;
    }
  const auto u1 = sd::unpooler_tactic(8192, 4096);
  EXPECT_EQ(u1.splits, 2);
  EXPECT_EQ(u1.kw, 256);
  EXPECT_EQ(u1.accs, 2);
  EXPECT_TRUE(u1.cluster_balance);
  for (int m = 1; m <= sd::kMaxBatch; ++m) EXPECT_EQ(u1.row_tiles[m - 1], 2);
  const auto u4 = sd::unpooler_tactic(2048, 4096);
  for (int m = 1; m <= sd::kMaxBatch; ++m) EXPECT_EQ(u4.row_tiles[m - 1], m == 8 ? 2 : 1) << m;
  const auto u8 = sd::unpooler_tactic(1024, 4096);
  EXPECT_EQ(u8.splits, 1);
  EXPECT_FALSE(u8.row_swizzle);
  const auto p8 = sd::splitk_tactic(sd::PlanOp::pooler, 512, 8192);
  EXPECT_EQ(p8.splits, 2);
  EXPECT_FALSE(p8.cluster_balance);
  EXPECT_EQ(sd::splitk_tactic(sd::PlanOp::pooler, 2048, 8192).splits, 4);
}

TEST(PlanTable, ShapesOutsideTheTableGetOneEngineForEveryB) {
  // A shape no row names: the compiled skinny shape where it fits, else the
  // split-K engine; the same for every b.
  for (int b = 1; b <= sd::kMaxBatch; ++b) {
    const auto c = sd::pooler_gemm_choice(64, 8192, 2, b);
    ASSERT_EQ(c.engine, sd::GemmEngine::skinny);
    EXPECT_FALSE(sd::pooler_gemm_unsupported(64, 8192, b, c.shape));
    EXPECT_EQ(sd::pooler_gemm_choice(64, 4096, 2, b).engine, sd::GemmEngine::splitk_mma);
  }
  // The model's shape asked at another tp is not the table's.
  EXPECT_EQ(sd::model_tp(sd::PlanOp::pooler, 2048, 8192), 2);
  EXPECT_EQ(sd::model_tp(sd::PlanOp::unpooler, 2048, 4096), 4);
  EXPECT_EQ(sd::model_tp(sd::PlanOp::unpooler, 2048, 8192), 0);
  EXPECT_FALSE(sd::launch_unsupported(1024, 2048, sd::splitk_tactic(sd::PlanOp::pooler, 1024, 2048)));
}

TEST(PlanTable, TheCheckerRejectsEachBrokenRule) {
  auto rows = h200_rows();
  auto find = [&](sd::PlanOp op, int tp, int b) -> sd::PlanRow& {
    for (auto& r : rows)
      if (r.op == op && r.tp == tp && b >= r.b_first && b <= r.b_last) return r;
    throw std::runtime_error("no row");
  };
  {
    auto saved = rows;
    find(sd::PlanOp::pooler, 4, 9).b_first = 10;  // b = 9 uncovered
    EXPECT_NE(table_reason(rows).find("pooler tp 4 b 9 has no row"), std::string::npos) << table_reason(rows);
    rows = saved;
  }
  {
    auto saved = rows;
    find(sd::PlanOp::pooler, 4, 9).b_first = 8;  // b = 8 twice
    EXPECT_NE(table_reason(rows).find("pooler tp 4 b 8 has two rows"), std::string::npos) << table_reason(rows);
    rows = saved;
  }
  {
    auto saved = rows;
    find(sd::PlanOp::pooler, 2, 1).engine = sd::GemmEngine::skinny;  // b = 1 on another engine
    EXPECT_NE(table_reason(rows).find("two reduction orders for one shape"), std::string::npos) << table_reason(rows);
    rows = saved;
  }
  {
    auto saved = rows;
    find(sd::PlanOp::unpooler, 1, 9).accs = 1;  // another split-K order at b >= 9
    EXPECT_NE(table_reason(rows).find("changes the split-K S, kw or accs"), std::string::npos) << table_reason(rows);
    rows = saved;
  }
  {
    auto saved = rows;
    find(sd::PlanOp::unpooler, 8, 1).token_tile = 16;  // valid but another tile at b <= 8: fine
    EXPECT_EQ(table_reason(rows), "(none)");
    for (auto* r : {&find(sd::PlanOp::unpooler, 1, 1), &find(sd::PlanOp::unpooler, 1, 9)}) r->kw = 96;
    EXPECT_NE(table_reason(rows).find("unpooler tp 1: K=4096 does not split"), std::string::npos)
        << table_reason(rows);
    rows = saved;
  }
  EXPECT_EQ(table_reason(rows), "(none)");
}

TEST(PlanTable, PrintsEveryRow) {
  const std::string text = sd::format_plan_table();
  EXPECT_NE(text.find("nvidia-h200"), std::string::npos);
  EXPECT_NE(text.find("pooler tp 1 b 9..16 -> ring_mma"), std::string::npos) << text;
  EXPECT_NE(text.find("unpooler tp 8 b 1..8 -> onchip_mma S=4 kw=256 accs=1 tile=8 rows=16 stage_warps=1 cluster_balance"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("publish kernel, consumer early"), std::string::npos) << text;
}
