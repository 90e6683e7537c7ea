// The tool's two GPU jobs end to end (tools/verify.h, bench/step.h), at the
// model's shapes: verify passes at tp 1 and at tp 2 as two ranks sharing one
// GPU, and fails on a corrupted reference; the whole decode step at tp 1 and
// at tp 2 sharing one GPU replays its graph 1000 times with identical final
// hidden rows, equal bit for bit to the stock-structure reference pass and
// within the bound of the cuBLAS stock path.
#include <gtest/gtest.h>

#include <cstdio>

#include "gpu_test_util.h"
#include "step.h"
#include "verify.h"

namespace sd = spark_decode;
using namespace sd::testing;

namespace {

sd::tool::VerifyReport verify_at(int tp, int gpus, bool corrupt = false) {
  sd::tool::VerifyOptions o;
  o.tp = tp;
  o.gpus = gpus;
  o.seed = test_seed("verify");
  o.corrupt_reference = corrupt;
  const sd::tool::VerifyReport r = sd::tool::verify_gpu(o);
  std::printf("%s", sd::tool::format_verify(r).c_str());
  return r;
}

void expect_every_check_ran_and_passed(const sd::tool::VerifyReport& r) {
  EXPECT_TRUE(r.gpu_ran);
  ASSERT_EQ(r.checks.size(), 10u);  // tools/verify_gpu.cpp, register_checks
  for (const auto& c : r.checks) {
    EXPECT_GT(c.elements, 0) << c.name << ": nothing compared";
    EXPECT_EQ(c.mismatches, 0) << c.name;
    EXPECT_LE(c.tolerated, c.tolerated_limit) << c.name;
  }
  EXPECT_TRUE(r.ok());
}

sd::bench::StepResult step_at(int tp, int gpus, int replays) {
  sd::bench::StepOptions o;
  o.tp = tp;
  o.gpus = gpus;
  o.bs = {1, 16};
  o.checked_replays = replays;
  o.repeats = 3;
  o.seed = test_seed("step");
  o.progress = [](const std::string& what) { std::printf("  step: %s\n", what.c_str()); };
  const sd::bench::StepResult r = sd::bench::run_step(o);
  std::printf("%s", sd::bench::step_summary(r).c_str());
  return r;
}

void expect_step_exact(const sd::bench::StepResult& r, int replays) {
  ASSERT_EQ(r.batches.size(), 2u);
  for (const auto& b : r.batches) {
    EXPECT_EQ(b.elements, int64_t(b.b) * sd::kMuseSpark.hidden * r.tp) << "b " << b.b << ": every rank's rows";
    EXPECT_EQ(b.reference_mismatches, 0) << "b " << b.b << ": the fast path differs from the stock-structure reference";
    EXPECT_EQ(b.replays, replays);
    EXPECT_EQ(b.replay_mismatches, 0) << "b " << b.b << ": a replay differs from the first";
    EXPECT_TRUE(b.stock_checked);
    EXPECT_LE(b.stock_update_ratio, sd::bench::kStockUpdateBound) << "b " << b.b << ": the cuBLAS stock path";
    // The cuBLAS path computes the same function with other GEMM bits: not
    // everything equal, not everything different.
    EXPECT_GT(b.stock_equal_elements, 0) << "b " << b.b;
  }
  EXPECT_TRUE(r.ok());
}

}  // namespace

TEST(ToolVerify, PassesAtTp1) {
  SKIP_WITHOUT_GPU(1);
  const auto r = verify_at(1, 1);
  EXPECT_FALSE(r.ranks_share_gpus);
  expect_every_check_ran_and_passed(r);
}

// Two ranks as threads on one GPU: every multi-rank path (stores into two
// copies, two sources per row, two ranks' stage words), kernels without PDL.
TEST(ToolVerify, PassesAtTp2OnOneGpu) {
  SKIP_WITHOUT_GPU(1);
  const auto r = verify_at(2, 1);
  EXPECT_TRUE(r.ranks_share_gpus);
  expect_every_check_ran_and_passed(r);
}

TEST(ToolVerify, PassesAtTp2OnTwoGpus) {
  const std::string why = peer_gpus_unavailable_reason(2);
  if (!why.empty()) GTEST_SKIP() << why;
  const auto r = verify_at(2, 2);
  EXPECT_FALSE(r.ranks_share_gpus);
  expect_every_check_ran_and_passed(r);
}

// The hook changes one code of one stock result: exactly that check fails,
// once per form (Pooler.run, project + publish + gather).
TEST(ToolVerify, ReportsACorruptedReference) {
  SKIP_WITHOUT_GPU(1);
  const auto r = verify_at(1, 1, /*corrupt=*/true);
  EXPECT_FALSE(r.ok());
  for (const auto& c : r.checks) {
    if (c.name == "Pooler, nvfp4")
      EXPECT_EQ(c.mismatches, 2) << c.name;
    else
      EXPECT_TRUE(c.pass()) << c.name;
  }
}

TEST(ToolStep, Tp1ReplaysAThousandTimesBitExact) {
  SKIP_WITHOUT_GPU(1);
  const auto r = step_at(1, 1, 1000);
  EXPECT_TRUE(r.timed);
  for (const auto& b : r.batches) EXPECT_GT(b.fast_us, 0) << "b " << b.b;
  expect_step_exact(r, 1000);
}

// tp 2 as two ranks sharing one GPU: the mailbox's and the zero-copy
// Unpooler's multi-rank paths in the whole step (correctness only; the stock
// path runs eagerly with its all-gather on the host, nothing is timed).
TEST(ToolStep, Tp2OnOneGpuReplaysAThousandTimesBitExact) {
  SKIP_WITHOUT_GPU(1);
  const auto r = step_at(2, 1, 1000);
  EXPECT_TRUE(r.ranks_share_gpus);
  EXPECT_FALSE(r.timed);
  expect_step_exact(r, 1000);
}

TEST(ToolStep, Tp2OnTwoGpusBitExact) {
  const std::string why = peer_gpus_unavailable_reason(2);
  if (!why.empty()) GTEST_SKIP() << why;
  const auto r = step_at(2, 2, 100);
  EXPECT_TRUE(r.timed);
  expect_step_exact(r, 100);
}
