// The Lamport mailbox on GPUs of one process: one thread per GPU over an
// InProcessGroup (peer access, direct pointers). Bodies shared with the MPI
// test are in mailbox_test_bodies.h.
//
// The tests of the trap mode (LamportMailbox::OnFailure::trap) poison GPU
// 0's CUDA context for the rest of the process: they come last in this file
// (Zz), and ctest runs every test in its own process anyway.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "mailbox_test_bodies.h"
#include "spark_decode/group.h"
#include "spark_decode/mailbox.h"

namespace sd = spark_decode;
using namespace sd::testing;
using namespace sd::testing::mailbox_tests;

namespace {

#define SKIP_WITHOUT_TWO_PEER_GPUS()            \
  do {                                          \
    const std::string why_ = peer_gpus_unavailable_reason(2);  \
    if (!why_.empty()) GTEST_SKIP() << why_;    \
  } while (0)

TEST(Mailbox, OneRankPublishesToItself) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("mailbox tp1");
  const auto failures = run_on_gpus(1, [&](sd::Group& g, int r) {
    for (int width : {8, 2048}) payloads_arrive_bit_for_bit(g, r, width, seed + width);
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

TEST(Mailbox, RefusesBadArgumentsBeforeLaunching) {
  SKIP_WITHOUT_GPU(1);
  const auto failures = run_on_gpus(1, [&](sd::Group& g, int r) {
    EXPECT_THROW(sd::LamportMailbox(g, 2, 0, 16, 64, r), sd::InvalidArgument);  // tp != size
    EXPECT_THROW(sd::LamportMailbox(g, 1, 0, 16, 60, r), sd::InvalidArgument);  // width % 8
    EXPECT_THROW(sd::LamportMailbox(g, 1, 0, 0, 64, r), sd::InvalidArgument);
    sd::LamportMailbox mb(g, 1, 0, 4, 64, r);
    GuardedBuffer src(16 * 64 * 2), out(16 * 64 * 2);
    EXPECT_THROW(mb.publish(src.get(), 5, nullptr), sd::InvalidArgument);  // b > capacity
    EXPECT_THROW(mb.publish(src.get(), 0, nullptr), sd::InvalidArgument);
    EXPECT_THROW(mb.gather(out.get(), 5, nullptr), sd::InvalidArgument);
    EXPECT_THROW(mb.publish(static_cast<char*>(src.get()) + 2, 1, nullptr), sd::InvalidArgument);
    EXPECT_THROW(mb.gather(mb.view().local, 1, nullptr), sd::InvalidArgument);  // out inside the mailbox
    sd::LamportMailbox::PublishOptions po;
    po.threads = 48;
    EXPECT_THROW(mb.publish(src.get(), 1, nullptr, po), sd::InvalidArgument);
    EXPECT_THROW(mb.publish(sd::TensorRef::contiguous(src.get(), sd::DType::bf16, {5, 64}, r), nullptr),
                 sd::InvalidArgument);
    EXPECT_THROW(mb.gather(sd::TensorRef::contiguous(out.get(), sd::DType::bf16, {2, 56}, r), nullptr),
                 sd::InvalidArgument);
    // Nothing ran: the state is still the initial one and the data all
    // sentinel (check_copy of "call -1" would not fit; check directly).
    CUDA_CHECK(cudaDeviceSynchronize());
    int32_t state[3];
    CUDA_CHECK(cudaMemcpy(state, mb.view().state, sizeof state, cudaMemcpyDeviceToHost));
    EXPECT_EQ(state[0], 0);
    EXPECT_EQ(uint32_t(state[1]), sd::mailbox::kNeverPublished);
    EXPECT_EQ(state[2], 0);
    // The data (3 stages x 1 source x 4 rows x 64) then the claims.
    std::vector<uint16_t> data(size_t(3) * 4 * 64);
    std::vector<uint32_t> claims(size_t(3) * 2);
    CUDA_CHECK(cudaMemcpy(data.data(), mb.view().local, data.size() * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(claims.data(), mb.view().local + data.size(), claims.size() * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], 0x8000) << i;
    for (size_t i = 0; i < claims.size(); ++i) ASSERT_EQ(claims[i], sd::mailbox::kNoClaim) << i;
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

// Construction is collective, and so is its failure: a rank that refuses
// its own arguments, or ranks that disagree on the layout, end every rank's
// construction with an error instead of leaving the others in the exchange.
// Two ranks on one GPU (threads; nothing here runs a kernel across them).
TEST(Mailbox, OneRanksRefusalFailsEveryRank) {
  SKIP_WITHOUT_GPU(1);
  std::mutex mu;
  std::vector<std::string> seen(4);
  const auto failures = run_on_gpus(
      2,
      [&](sd::Group& g, int d) {
        const int r = g.rank();
        auto attempt = [&](int slot, int capacity, int width) {
          std::string what = "built";
          try {
            sd::LamportMailbox mb(g, 2, r, capacity, width, d);
          } catch (const sd::InvalidArgument& e) {
            what = std::string("InvalidArgument: ") + e.what();
          } catch (const sd::RuntimeError& e) {
            what = std::string("RuntimeError: ") + e.what();
          }
          std::lock_guard<std::mutex> lock(mu);
          seen[slot + r] = what;
        };
        attempt(0, 16, r == 1 ? 60 : 64);           // rank 1's width is no multiple of 8
        attempt(2, r == 0 ? 16 : 32, r == 0 ? 1024 : 512);  // the same bytes, another layout
        sd::LamportMailbox fine(g, 2, r, 4, 64, d);  // the group still works
        fine.barrier();
      },
      1);
  for (const auto& f : failures) ADD_FAILURE() << f;
  EXPECT_NE(seen[0].find("RuntimeError: mailbox: construction: rank(s) 1 failed"), std::string::npos) << seen[0];
  EXPECT_NE(seen[1].find("InvalidArgument: mailbox: width 60"), std::string::npos) << seen[1];
  for (int slot : {2, 3})
    EXPECT_NE(seen[slot].find("every rank must build the same mailbox"), std::string::npos) << seen[slot];
}

TEST(Mailbox, PayloadsArriveBitForBitOnTwoGpus) {
  SKIP_WITHOUT_TWO_PEER_GPUS();
  const uint64_t seed = test_seed("mailbox payloads");
  // P / tp and H / tp at tp 2, and small widths that leave CTAs part-full.
  const auto failures = run_on_gpus(2, [&](sd::Group& g, int r) {
    for (int width : {2048, 4096, 8, 24, 1032}) payloads_arrive_bit_for_bit(g, r, width, seed + width);
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

TEST(Mailbox, TenThousandCallsWithRandomRows) {
  SKIP_WITHOUT_TWO_PEER_GPUS();
  const uint64_t seed = test_seed("mailbox 10k calls");
  const auto failures =
      run_on_gpus(2, [&](sd::Group& g, int r) { many_calls_random_rows(g, r, 512, 10000, seed); });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

TEST(Mailbox, GraphOf16CallsReplayed1000Times) {
  SKIP_WITHOUT_TWO_PEER_GPUS();
  const uint64_t seed = test_seed("mailbox graph");
  const auto failures =
      run_on_gpus(2, [&](sd::Group& g, int r) { graph_replays(g, r, 512, 16, 1000, seed); });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

TEST(Mailbox, HundredCreateDestroyCyclesLeakNothing) {
  SKIP_WITHOUT_TWO_PEER_GPUS();
  const auto failures = run_on_gpus(2, [&](sd::Group& g, int r) {
    auto cycle = [&](int i) {
      sd::LamportMailbox mb(g, 2, r, 16, 4096, r);
      if (i % 10 == 0) mb.warm_up(nullptr);  // and it works
      mb.barrier();  // no peer still writes into this copy
    };
    cycle(0);  // first-use allocations (context, modules) happen here
    CUDA_CHECK(cudaDeviceSynchronize());
    size_t free_before = 0, free_after = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
    for (int i = 0; i < 100; ++i) cycle(i);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
    // One mailbox here is 3 * 2 * 16 * 4096 * 2 B = 768 KiB (a 2 MiB
    // granule): leaking even a tenth of them shows as 20 MiB and more.
    const long long lost = static_cast<long long>(free_before) - static_cast<long long>(free_after);
    if (lost > (8ll << 20))
      throw std::runtime_error("100 mailboxes lost " + std::to_string(lost) + " bytes of cuda:" +
                               std::to_string(r));
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

// A missing peer with two ranks sharing the one GPU (the mailbox then
// launches without programmatic dependent launch, so rank 0's consumer
// spinning never stops the other rank from running), and tp 4 likewise:
// rank 0 gets the timeout, poisoned outputs, refusals; then every rank goes
// on with new mailboxes and meets a gather without publish.
TEST(Mailbox, SkippedCallIsSurvivedTp2Tp4OnOneGpu) {
  SKIP_WITHOUT_GPU(1);
  for (const int tp : {2, 4}) {
    const double timeout_s = 0.5;
    TimeoutOutcome rank0;
    const auto failures = run_on_gpus(
        tp,
        [&](sd::Group& g, int r) {
          const TimeoutOutcome o = skipped_call_times_out(g, r, timeout_s, sd::LamportMailbox::OnFailure::poison);
          if (g.rank() == 0) rank0 = o;
          failure_is_survived(g, r, 2.0);
        },
        1);
    for (const auto& f : failures) ADD_FAILURE() << "tp " << tp << ": " << f;
    expect_timeout_outcome(rank0, timeout_s, tp);
  }
}

// A b differing across ranks, and a second publish of one call: every rank
// fails at once by name (the claims), at tp 2 and 4 sharing one GPU.
TEST(Mailbox, RanksDisagreeingOnBFailAtOnceByNameTp2Tp4OnOneGpu) {
  SKIP_WITHOUT_GPU(1);
  for (const int tp : {2, 4}) {
    std::vector<std::string> errors(tp);
    const auto failures = run_on_gpus(
        tp, [&](sd::Group& g, int r) { errors[g.rank()] = ranks_disagree_on_b(g, r, 2.0); }, 1);
    for (const auto& f : failures) ADD_FAILURE() << "tp " << tp << ": " << f;
    for (int r = 0; r < tp; ++r) std::printf("tp %d, b differing across ranks, rank %d: %s\n", tp, r, errors[r].c_str());
  }
}

TEST(Mailbox, SecondPublishFailsEveryRankTp2Tp4OnOneGpu) {
  SKIP_WITHOUT_GPU(1);
  for (const int tp : {2, 4}) {
    std::vector<std::string> errors(tp);
    const auto failures = run_on_gpus(
        tp, [&](sd::Group& g, int r) { errors[g.rank()] = second_publish_fails_every_rank(g, r, 2.0); }, 1);
    for (const auto& f : failures) ADD_FAILURE() << "tp " << tp << ": " << f;
    for (int r = 0; r < tp; ++r) std::printf("tp %d, second publish, rank %d: %s\n", tp, r, errors[r].c_str());
  }
}

TEST(Mailbox, GatherWithoutPublishIsSurvived) {
  SKIP_WITHOUT_GPU(1);
  const auto failures = run_on_gpus(1, [&](sd::Group& g, int r) { failure_is_survived(g, r, 2.0); });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

// Last: traps on GPU 0 (see the file comment).
TEST(Mailbox, ZzSkippedCallTrapsWithTheReport) {
  SKIP_WITHOUT_TWO_PEER_GPUS();
  const double timeout_s = 0.5;
  TimeoutOutcome rank0;
  const auto failures = run_on_gpus(2, [&](sd::Group& g, int r) {
    const TimeoutOutcome o = skipped_call_times_out(g, r, timeout_s, sd::LamportMailbox::OnFailure::trap);
    if (r == 0) rank0 = o;
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
  expect_timeout_outcome(rank0, timeout_s);
}

// The same where one GPU is lent: two ranks sharing it.
TEST(Mailbox, ZzSkippedCallTrapsWithTheReportTp2OnOneGpu) {
  SKIP_WITHOUT_GPU(1);
  const double timeout_s = 0.5;
  TimeoutOutcome rank0;
  const auto failures = run_on_gpus(
      2,
      [&](sd::Group& g, int r) {
        const TimeoutOutcome o = skipped_call_times_out(g, r, timeout_s, sd::LamportMailbox::OnFailure::trap);
        if (g.rank() == 0) rank0 = o;
      },
      1);
  for (const auto& f : failures) ADD_FAILURE() << f;
  expect_timeout_outcome(rank0, timeout_s);
}

// A gather with no publish since the last one must not return the last
// call's rows: in the trap mode it ends in the named protocol error (and
// traps: the last test of this process).
TEST(Mailbox, ZzGatherWithoutPublishTrapsWithTheReport) {
  SKIP_WITHOUT_GPU(1);
  auto shared = sd::InProcessGroup::make_shared(1);
  sd::InProcessGroup g(shared, 0);
  sd::LamportMailbox::Options options;
  options.on_failure = sd::LamportMailbox::OnFailure::trap;
  sd::LamportMailbox mb(g, 1, 0, 16, 256, 0, options);
  GuardedBuffer src(16 * 256 * 2), out(16 * 256 * 2);
  src.fill(0);
  for (int k = 0; k < 3; ++k) {
    mb.publish(src.get(), 2, nullptr);
    mb.gather(out.get(), 2, nullptr);
  }
  mb.synchronize(nullptr);
  mb.gather(out.get(), 2, nullptr);  // no publish
  std::string error;
  try {
    mb.synchronize(nullptr);
  } catch (const sd::RuntimeError& e) {
    error = e.what();
  }
  std::printf("gather without publish: %s\n", error.c_str());
  EXPECT_NE(error.find("no publish since the last consume"), std::string::npos) << error;
  EXPECT_NE(error.find("rank 0"), std::string::npos) << error;
  EXPECT_NE(error.find("trapped"), std::string::npos) << error;
}

}  // namespace
