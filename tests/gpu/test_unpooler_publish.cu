// The zero-copy Unpooler on two GPUs of one process (one thread per GPU).
// The same bodies run across processes in test_mailbox_mpi.cu.
#include <gtest/gtest.h>

#include <algorithm>

#include "unpooler_publish_bodies.h"

namespace sd = spark_decode;
using namespace sd::testing;
using namespace sd::testing::publish_tests;

namespace {

constexpr int kTp = 2;
// This rank's unpooler shard at tp 2 (N = H / 2, K = P), and a small shape.
constexpr int kModelN = sd::kMuseSpark.hidden / kTp, kModelK = sd::kMuseSpark.pooled;

#define SKIP_WITHOUT_PEER_GPUS()                                  \
  do {                                                            \
    const std::string why_ = peer_gpus_unavailable_reason(kTp);   \
    if (!why_.empty()) GTEST_SKIP() << why_;                      \
  } while (0)

void expect_no_failures(const std::vector<std::string>& failures) {
  for (const auto& f : failures) ADD_FAILURE() << f;
}

uint64_t seed() { return test_seed("zero-copy"); }

}  // namespace

TEST(UnpoolerPublish, ZeroCopyEqualsPlainRunPlusPublish) {
  SKIP_WITHOUT_PEER_GPUS();
  const uint64_t s = seed();
  for (auto [n, k] : {std::pair{kModelN, kModelK}, std::pair{48, 256}})
    expect_no_failures(run_on_gpus(kTp, [&](sd::Group& g, int) { zero_copy_equals_publish(g, n, k, s); }));
  // Two row tiles in one-warp CTAs of an 8-CTA cluster: the 2 R m = 64
  // publishing items of m = 16 wrap around the 32 threads of rank 0.
  expect_no_failures(
      run_on_gpus(kTp, [&](sd::Group& g, int) { zero_copy_equals_publish(g, 96, 2048, s, one_warp_two_row_tiles()); }));
}

TEST(UnpoolerPublish, TenThousandConsecutiveBoundaries) {
  SKIP_WITHOUT_PEER_GPUS();
  const uint64_t s = seed();
  expect_no_failures(run_on_gpus(kTp, [&](sd::Group& g, int) { consecutive_boundaries(g, kModelN, kModelK, 10000, 500, s); }));
}

TEST(UnpoolerPublish, TicketModeOverManyCalls) {
  SKIP_WITHOUT_PEER_GPUS();
  const uint64_t s = seed();
  expect_no_failures(run_on_gpus(kTp, [&](sd::Group& g, int) { ticket_mode(g, kModelN, kModelK, 2000, 100, s); }));
}

TEST(UnpoolerPublish, GraphReplayEqualsEager) {
  SKIP_WITHOUT_PEER_GPUS();
  const uint64_t s = seed();
  expect_no_failures(run_on_gpus(kTp, [&](sd::Group& g, int) { graph_replay_equals_eager(g, kModelN, kModelK, 200, s); }));
}

TEST(UnpoolerPublish, RefusesBadMailboxesAndTickets) {
  SKIP_WITHOUT_GPU(1);
  expect_no_failures(run_on_gpus(1, [&](sd::Group& g, int dev) {
    GuardedBuffer w(size_t(64) * 256 * 2), ticket(8);
    const auto weight = sd::TensorRef::contiguous(w.get(), sd::DType::bf16, {64, 256}, dev);
    sd::LamportMailbox narrow(g, 1, 0, 16, 48, dev), small(g, 1, 0, 4, 64, dev);
    auto expect_reason = [&](sd::Unpooler::Options o, const std::string& reason) {
      try {
        sd::Unpooler u(weight, o);
        ADD_FAILURE() << "accepted; wanted: " << reason;
      } catch (const sd::InvalidArgument& e) {
        EXPECT_EQ(e.what(), reason);
      }
    };
    sd::Unpooler::Options o;
    o.mailbox = &narrow;
    expect_reason(o, "mailbox width 48 != unpooler N 64");
    o.mailbox = &small;
    o.ticket = sd::TensorRef::contiguous(ticket.get(), sd::DType::f32, {1}, dev);
    expect_reason(o, "the ticket must be int32 [1] on the mailbox");
    o.ticket = sd::TensorRef::contiguous(ticket.get(), sd::DType::i32, {2}, dev);
    expect_reason(o, "the ticket must be int32 [1] on the mailbox");
    o.mailbox = nullptr;
    o.ticket = sd::TensorRef::contiguous(ticket.get(), sd::DType::i32, {1}, dev);
    expect_reason(o, "a ticket stage needs a mailbox");
    // capacity 4: max_m is 4, and a larger m is refused before any launch.
    sd::Unpooler::Options ok;
    ok.mailbox = &small;
    sd::Unpooler u(weight, ok);
    EXPECT_EQ(u.max_m(), 4);
    GuardedBuffer x(size_t(16) * 256 * 2), out(size_t(16) * 64 * 2);
    EXPECT_THROW(u.run(x.get(), out.get(), 5, nullptr), sd::InvalidArgument);
    // out or x inside the mailbox, out over the weight: refused by name.
    auto reason_of = [&](const void* xp, void* op) {
      try {
        u.run(xp, op, 1, nullptr);
      } catch (const sd::InvalidArgument& e) {
        return std::string(e.what());
      }
      return std::string("accepted");
    };
    void* inside = static_cast<char*>(small.memory().local()) + small.memory().bytes() / 2 / 16 * 16;
    EXPECT_NE(reason_of(x.get(), inside).find("out may not overlap the mailbox"), std::string::npos);
    EXPECT_NE(reason_of(inside, out.get()).find("x may not overlap the mailbox"), std::string::npos);
    EXPECT_NE(reason_of(x.get(), w.get()).find("out may not overlap the weight"), std::string::npos);
    // The mailbox's own publish: src inside the mailbox.
    try {
      small.publish(inside, 1, nullptr);
      ADD_FAILURE() << "publish from inside the mailbox accepted";
    } catch (const sd::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("src may not overlap the mailbox"), std::string::npos) << e.what();
    }
  }));
}
