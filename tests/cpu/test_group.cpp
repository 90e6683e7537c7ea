// InProcessGroup: ranks as threads.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/run_threads.h"
#include "reference/mailbox_payload.h"
#include "spark_decode/error.h"
#include "spark_decode/group.h"
#include "test_seed.h"

namespace sd = spark_decode;
using sd::reference::splitmix64;

namespace {

// Rank r's bytes in round `round`: a pure function, so each rank can check
// every other rank's piece.
std::vector<uint8_t> piece(uint64_t seed, int rank, int round, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i)
    v[i] = uint8_t(splitmix64(seed ^ (uint64_t(rank) << 48) ^ (uint64_t(round) << 24) ^ i));
  return v;
}

TEST(InProcessGroup, AllGatherAndBarrierOverManyRounds) {
  const uint64_t seed = sd::testing::test_seed("group");
  for (int size : {1, 2, 4, 8}) {
    auto shared = sd::InProcessGroup::make_shared(size, std::chrono::seconds(30));
    std::atomic<int> arrivals{0};
    std::mutex mu;
    std::vector<std::string> mismatches;
    const auto failures = sd::testing::run_threads(size, [&](int r) {
      sd::InProcessGroup group(shared, r);
      ASSERT_EQ(group.rank(), r);
      ASSERT_EQ(group.size(), size);
      for (int round = 0; round < 200; ++round) {
        const size_t bytes = splitmix64(seed + round) % 300;  // same on every rank, 0 included
        const auto mine = piece(seed, r, round, bytes);
        const auto all = group.all_gather(mine.data(), bytes);
        bool ok = all.size() == bytes * size;
        for (int q = 0; ok && q < size; ++q)
          ok = std::equal(all.begin() + q * bytes, all.begin() + (q + 1) * bytes,
                          piece(seed, q, round, bytes).begin());
        arrivals.fetch_add(1);
        group.barrier();
        // Nobody leaves a barrier before everyone has entered it.
        const int seen = arrivals.load();
        if (!ok || seen < size * (round + 1)) {
          std::lock_guard<std::mutex> lock(mu);
          mismatches.push_back("size " + std::to_string(size) + " rank " + std::to_string(r) +
                               " round " + std::to_string(round) + (ok ? " barrier" : " gather"));
          return;
        }
        group.barrier();  // the counter check above must not see the next round
      }
    });
    for (const auto& f : failures) ADD_FAILURE() << f;
    for (const auto& f : mismatches) ADD_FAILURE() << f;
  }
}

TEST(InProcessGroup, UnequalSizesAreRefusedOnEveryRank) {
  auto shared = sd::InProcessGroup::make_shared(3, std::chrono::seconds(30));
  std::atomic<int> refused{0};
  const auto failures = sd::testing::run_threads(3, [&](int r) {
    sd::InProcessGroup group(shared, r);
    std::vector<uint8_t> data(8 + (r == 1));
    try {
      group.all_gather(data.data(), data.size());
    } catch (const sd::InvalidArgument&) {
      refused.fetch_add(1);
    }
    group.barrier();  // the group still works afterwards
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
  EXPECT_EQ(refused.load(), 3);
}

TEST(InProcessGroup, MissingRankTimesOutNamingIt) {
  auto shared = sd::InProcessGroup::make_shared(3, std::chrono::milliseconds(200));
  std::vector<std::string> errors(3);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)  // rank 2 never comes
    threads.emplace_back([&, r] {
      sd::InProcessGroup group(shared, r);
      try {
        group.barrier();
      } catch (const sd::RuntimeError& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(errors[r].find("rank(s) 2 never arrived"), std::string::npos) << errors[r];
  // Broken for good: a late rank fails at once instead of waiting.
  sd::InProcessGroup late(shared, 2);
  EXPECT_THROW(late.barrier(), sd::RuntimeError);
}

// One rank's failure in a collective step becomes every rank's: the rank
// that failed rethrows its own exception (type and text), the others throw
// RuntimeError naming it; and a step where all succeed throws nowhere, with
// the group still usable after a failed one.
TEST(AllOkOrThrow, OneRanksFailureIsEveryRanks) {
  for (int size : {1, 3}) {
    auto shared = sd::InProcessGroup::make_shared(size, std::chrono::seconds(30));
    std::mutex mu;
    std::vector<std::string> seen(size);
    const auto failures = sd::testing::run_threads(size, [&](int r) {
      sd::InProcessGroup group(shared, r);
      sd::all_ok_or_throw(group, nullptr, "step 0");  // nobody failed
      const int failing = size - 1;
      std::exception_ptr mine;
      if (r == failing) mine = std::make_exception_ptr(sd::InvalidArgument("rank-local reason"));
      try {
        sd::all_ok_or_throw(group, mine, "step 1");
        std::lock_guard<std::mutex> lock(mu);
        seen[r] = "no throw";
      } catch (const sd::InvalidArgument& e) {
        std::lock_guard<std::mutex> lock(mu);
        seen[r] = std::string("InvalidArgument: ") + e.what();
      } catch (const sd::RuntimeError& e) {
        std::lock_guard<std::mutex> lock(mu);
        seen[r] = std::string("RuntimeError: ") + e.what();
      }
      group.barrier();  // still usable
    });
    EXPECT_TRUE(failures.empty()) << failures.front();
    for (int r = 0; r < size; ++r) {
      if (r == size - 1)
        EXPECT_EQ(seen[r], "InvalidArgument: rank-local reason") << "size " << size;
      else
        EXPECT_EQ(seen[r], "RuntimeError: step 1: rank(s) " + std::to_string(size - 1) +
                               " failed (their own errors say why); no rank goes on")
            << "size " << size << " rank " << r;
    }
  }
}

TEST(InProcessGroup, RefusesBadConstruction) {
  EXPECT_THROW(sd::InProcessGroup::make_shared(0), sd::InvalidArgument);
  auto shared = sd::InProcessGroup::make_shared(2);
  EXPECT_THROW(sd::InProcessGroup(shared, 2), sd::InvalidArgument);
  EXPECT_THROW(sd::InProcessGroup(nullptr, 0), sd::InvalidArgument);
}

}  // namespace
