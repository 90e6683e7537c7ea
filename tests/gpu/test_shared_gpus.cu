// tp 4 and tp 8 on two GPUs: several ranks share a GPU (ranks r and r + 2,
// ... on GPU r % 2, one thread each, peers in one process). This exercises
// every tp-4/8 code path of the mailbox and the zero-copy Unpooler (slot
// arithmetic, stores into 4 or 8 copies, 4 or 8 sources per gathered row)
// where no four- or eight-GPU machine is at hand. It measures nothing: two
// ranks on one GPU share its bandwidth and SMs. (The zero-copy test was
// opt-in once: on two H200s it timed out after several correct calls, which
// was read as ranks starving each other's kernels; the cause was consumers
// queued in front of peers' publishers in a shared hardware queue, which the
// mailbox's host order of launches now prevents: docs/design.md, "Ranks
// sharing a GPU".)
//
// Where only one GPU is lent, tp 2 runs as two ranks on it (Tp2OnOneGpu): the
// multi-rank paths (stores into two copies, two sources per row, the stage
// words of two ranks) on one device. The zero-copy steps keep host barriers
// between them so that no rank spins on a peer that cannot be scheduled; the
// mailbox's own calls (small kernels) run concurrently across the two ranks.
#include <gtest/gtest.h>

#include "mailbox_test_bodies.h"
#include "unpooler_publish_bodies.h"

namespace sd = spark_decode;
using namespace sd::testing;

namespace {

constexpr int kGpus = 2;

void expect_no_failures(const std::vector<std::string>& failures) {
  for (const auto& f : failures) ADD_FAILURE() << f;
}

#define SKIP_WITHOUT_PEER_GPUS()                                   \
  do {                                                             \
    const std::string why_ = peer_gpus_unavailable_reason(kGpus);  \
    if (!why_.empty()) GTEST_SKIP() << why_;                       \
  } while (0)

}  // namespace

TEST(SharedGpus, MailboxAtTp4AndTp8) {
  SKIP_WITHOUT_PEER_GPUS();
  const uint64_t seed = test_seed("shared gpus");
  for (int tp : {4, 8}) {
    const int width = sd::kMuseSpark.pooled / tp;
    expect_no_failures(run_on_gpus(
        tp,
        [&](sd::Group& g, int device) {
          mailbox_tests::payloads_arrive_bit_for_bit(g, device, width, seed + tp);
          mailbox_tests::many_calls_random_rows(g, device, width, 2000, seed + tp);
        },
        kGpus));
  }
}

TEST(SharedGpus, ZeroCopyUnpoolerAtTp4AndTp8) {
  SKIP_WITHOUT_PEER_GPUS();
  const uint64_t seed = test_seed("shared gpus");
  for (int tp : {4, 8}) {
    const int n = sd::kMuseSpark.hidden / tp, k = sd::kMuseSpark.pooled;
    expect_no_failures(run_on_gpus(
        tp,
        [&](sd::Group& g, int) {
          publish_tests::zero_copy_equals_publish(g, n, k, seed + tp);
          publish_tests::consecutive_boundaries(g, n, k, 1000, 250, seed + tp);
        },
        kGpus));
  }
}

TEST(SharedGpus, Tp2OnOneGpu) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("shared gpus");
  const int width = sd::kMuseSpark.pooled / 2;
  expect_no_failures(run_on_gpus(
      2,
      [&](sd::Group& g, int device) {
        mailbox_tests::payloads_arrive_bit_for_bit(g, device, width, seed);
        mailbox_tests::many_calls_random_rows(g, device, width, 2000, seed);
        publish_tests::zero_copy_equals_publish(g, sd::kMuseSpark.hidden / 2, sd::kMuseSpark.pooled, seed);
        publish_tests::zero_copy_equals_publish(g, 96, 2048, seed, publish_tests::one_warp_two_row_tiles());
      },
      /*devices=*/1));
}

// The on-chip engine's zero-copy epilogue at the tp 4 and tp 8 widths (H/tp =
// 2048, 1024; stores into 4 or 8 copies), ranks sharing one GPU. Host
// barriers separate each step, so no rank spins on a peer that cannot be
// scheduled (and the mailbox runs every kernel without PDL there).
TEST(SharedGpus, OnchipZeroCopyUnpoolerAtTp4AndTp8OnOneGpu) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("shared gpus onchip");
  for (int tp : {4, 8}) {
    const int n = sd::kMuseSpark.hidden / tp, k = sd::kMuseSpark.pooled;
    expect_no_failures(run_on_gpus(
        tp,
        [&](sd::Group& g, int) {
          publish_tests::zero_copy_equals_publish(g, n, k, seed + tp, std::nullopt, sd::GemmEngine::onchip_mma);
        },
        /*devices=*/1));
  }
  // A small shape whose default takes clusters of 8 one-warp CTAs (N = 48,
  // K = 2048: S = 8): remote partials before the publishing epilogue.
  EXPECT_EQ(sd::onchip_tactic(sd::PlanOp::unpooler, 48, 2048).splits, 8);
  expect_no_failures(run_on_gpus(
      2,
      [&](sd::Group& g, int) {
        publish_tests::zero_copy_equals_publish(g, 48, 2048, seed, std::nullopt, sd::GemmEngine::onchip_mma);
      },
      /*devices=*/1));
}
