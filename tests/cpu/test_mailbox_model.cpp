// The mailbox protocol on the CPU model: ranks as threads over host memory.
//
// Expected values come from the spec, not from protocol.h: call k runs on
// stage k % 3, the layout is [3][tp][capacity][width], NEXT after call k is
// ((k + 1) << 16) | b_k (the call counter, modulo 65535), -0.0 arrives as
// +0.0, everything else bit for bit.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "reference/mailbox_payload.h"
#include "reference/mailbox_model.h"
#include "test_seed.h"

namespace sd = spark_decode;
using sd::reference::MailboxModel;
using sd::reference::MailboxTimeout;
using sd::reference::arrived_bits;
using sd::reference::payload_bits;

namespace {

constexpr uint16_t kSentinel = 0x8000;

// The first failure of each rank, reported after the threads join (one
// message per rank instead of a flood).
struct Failures {
  std::mutex mu;
  std::vector<std::string> messages;
  void add(int rank, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    messages.push_back("rank " + std::to_string(rank) + ": " + what);
  }
};

std::string at(int64_t call, int stage, int source, int row, int col) {
  return "call " + std::to_string(call) + " stage " + std::to_string(stage) + " source " +
         std::to_string(source) + " row " + std::to_string(row) + " col " + std::to_string(col);
}

// Runs `calls` calls on every rank of a tp-rank model with random rows per
// call and random delays; each rank checks its output and its own copy after
// every call. Returns the failures.
std::vector<std::string> run_many_calls(int tp, int calls, int capacity, int width, uint64_t seed) {
  MailboxModel model(tp, capacity, width);
  std::mt19937_64 rng(seed);
  std::vector<int> rows(calls + 1);
  for (int& b : rows) b = std::uniform_int_distribution<int>(1, capacity)(rng);
  Failures failures;

  auto rank_main = [&](int rank) {
    std::mt19937 delay_rng(static_cast<uint32_t>(seed * 31 + rank));
    std::vector<uint16_t> src(size_t(capacity) * width), out(size_t(capacity) * tp * width);
    const int out_width = tp * width;
    for (int64_t k = 0; k < calls; ++k) {
      const int b = rows[k];
      const int stage = int(k % 3), next = int((k + 1) % 3), before = int((k + 2) % 3);
      // Random delays: ranks drift apart by up to a call (the protocol's bound).
      const int roll = int(delay_rng() % 32);
      if (roll == 0)
        std::this_thread::sleep_for(std::chrono::microseconds(delay_rng() % 300));
      else if (roll < 8)
        for (int i = int(delay_rng() % 4); i > 0; --i) std::this_thread::yield();

      for (int row = 0; row < b; ++row)
        for (int col = 0; col < width; ++col)
          src[size_t(row) * width + col] = payload_bits(seed, k, rank, row, col);
      model.publish(rank, src.data(), b);
      if (delay_rng() % 16 == 0) std::this_thread::yield();

      std::fill(out.begin(), out.end(), uint16_t(0x7fbf));  // poison; rows >= b must keep it
      try {
        model.consume(rank, out.data(), b, std::chrono::seconds(20));
      } catch (const std::exception& e) {
        failures.add(rank, std::string("consume threw: ") + e.what());
        return;
      }
      for (int row = 0; row < capacity; ++row)
        for (int c = 0; c < out_width; ++c) {
          const int q = c / width, col = c % width;
          const uint16_t want =
              row < b ? arrived_bits(payload_bits(seed, k, q, row, col)) : uint16_t(0x7fbf);
          if (out[size_t(row) * out_width + c] != want) {
            failures.add(rank, "output " + at(k, stage, q, row, col) + ": got " +
                                   std::to_string(out[size_t(row) * out_width + c]) +
                                   " want " + std::to_string(want));
            return;
          }
        }
      // Own copy. Stage of this call and of the call before: all sentinel
      // (the consumer cleared what it read). Stage of the next call: peers
      // may be writing rows < b_{k+1} now; rows >= b_{k+1} must still be
      // the sentinel.
      for (int q = 0; q < tp; ++q)
        for (int row = 0; row < capacity; ++row)
          for (int col = 0; col < width; ++col) {
            if (model.element(rank, stage, q, row, col) != kSentinel) {
              failures.add(rank, "not cleared: " + at(k, stage, q, row, col));
              return;
            }
            if (model.element(rank, before, q, row, col) != kSentinel) {
              failures.add(rank, "not cleared: " + at(k, before, q, row, col));
              return;
            }
            const uint16_t ahead = model.element(rank, next, q, row, col);
            const bool ok = ahead == kSentinel ||
                            (row < rows[k + 1] &&
                             ahead == arrived_bits(payload_bits(seed, k + 1, q, row, col)));
            if (!ok) {
              failures.add(rank, "stray write: " + at(k + 1, next, q, row, col));
              return;
            }
          }
      const uint32_t want_next = (uint32_t((k + 1) % 65535) << 16) | uint32_t(b);
      if (model.state_word(rank, 0) != want_next) {
        failures.add(rank, "NEXT after call " + std::to_string(k) + " = " +
                               std::to_string(model.state_word(rank, 0)) + " want " +
                               std::to_string(want_next));
        return;
      }
    }
  };

  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) threads.emplace_back(rank_main, r);
  for (auto& t : threads) t.join();
  return failures.messages;
}

class MailboxModelRanks : public ::testing::TestWithParam<int> {};

TEST_P(MailboxModelRanks, ThousandsOfCallsWithRandomRowsAndDelays) {
  const int tp = GetParam();
  const int calls = tp == 8 ? 2000 : 4000;
  const uint64_t seed = sd::testing::test_seed("mailbox model");
  const auto failures = run_many_calls(tp, calls, /*capacity=*/16, /*width=*/16, seed);
  for (const auto& f : failures) ADD_FAILURE() << f;
}

INSTANTIATE_TEST_SUITE_P(Tp, MailboxModelRanks, ::testing::Values(2, 4, 8));

TEST(MailboxModel, CapacityOfOneRowAndWideRows) {
  // The smallest capacity (every call b = 1) and rows of several vectors.
  const uint64_t seed = sd::testing::test_seed("mailbox model capacity 1");
  for (const auto& f : run_many_calls(2, 600, /*capacity=*/1, /*width=*/40, seed)) ADD_FAILURE() << f;
}

TEST(MailboxModel, FirstPublishLandsInTheSpecLayout) {
  // Sequential: rank 0 publishes 3 rows of stage 0; every other element of
  // both copies stays the sentinel. Offsets computed here from the spec's
  // [3][tp][capacity][width] layout.
  const int tp = 2, cap = 4, width = 8;
  MailboxModel model(tp, cap, width);
  std::vector<uint16_t> src(3 * width);
  for (size_t i = 0; i < src.size(); ++i) src[i] = uint16_t(0x3f80 + i);  // 1.0, then above
  src[5] = 0x8000;
  model.publish(0, src.data(), 3);
  for (int r = 0; r < tp; ++r)
    for (int s = 0; s < 3; ++s)
      for (int q = 0; q < tp; ++q)
        for (int row = 0; row < cap; ++row)
          for (int col = 0; col < width; ++col) {
            const bool written = s == 0 && q == 0 && row < 3;
            const uint16_t want = written ? (row * width + col == 5 ? 0 : src[row * width + col])
                                          : kSentinel;
            // docs/design.md's "The Lamport mailbox protocol" layout, written out here rather than taken from
            // the protocol's own offset().
            const int64_t flat = ((int64_t(s) * tp + q) * cap + row) * width + col;
            ASSERT_EQ(model.element_at(r, flat), want) << "copy " << r << " " << at(0, s, q, row, col);
            ASSERT_EQ(model.element(r, s, q, row, col), want) << "copy " << r << " " << at(0, s, q, row, col);
          }
  EXPECT_EQ(model.state_word(0, 1), 0u);  // ACTIVE = NEXT = 0 on the first call
}

TEST(MailboxModel, RefusesRowsOutsideCapacityWithoutWriting) {
  MailboxModel model(2, 4, 8);
  std::vector<uint16_t> buf(8 * 2 * 8, 0x1234);
  EXPECT_THROW(model.publish(0, buf.data(), 5), sd::InvalidArgument);
  EXPECT_THROW(model.publish(0, buf.data(), 0), sd::InvalidArgument);
  EXPECT_THROW(model.consume(0, buf.data(), 5, std::chrono::milliseconds(1)), sd::InvalidArgument);
  EXPECT_THROW(model.publish(2, buf.data(), 1), sd::InvalidArgument);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(model.state_word(r, 0), 0u);
    EXPECT_EQ(model.state_word(r, 1), 0xffffffffu);  // ACTIVE: never published
    EXPECT_EQ(model.state_word(r, 2), 0u);
    for (int s = 0; s < 3; ++s)
      for (int q = 0; q < 2; ++q)
        for (int row = 0; row < 4; ++row)
          for (int col = 0; col < 8; ++col) ASSERT_EQ(model.element(r, s, q, row, col), kSentinel);
  }
  EXPECT_THROW(MailboxModel(9, 4, 8), sd::InvalidArgument);
  EXPECT_THROW(MailboxModel(2, 4, 12), sd::InvalidArgument);
  EXPECT_THROW(MailboxModel(2, 0, 8), sd::InvalidArgument);
}

TEST(MailboxModel, RankThatStopsPublishingTimesOutTheOthers) {
  const int tp = 4, stop_at = 37, cap = 8, width = 8;
  const auto timeout = std::chrono::milliseconds(150);
  const uint64_t seed = sd::testing::test_seed("mailbox model timeout");
  MailboxModel model(tp, cap, width);
  std::mt19937_64 rng(seed);
  std::vector<int> rows(stop_at + 1);
  for (int& b : rows) b = std::uniform_int_distribution<int>(1, cap)(rng);
  Failures failures;
  std::vector<int> timed_out(tp, 0);

  auto rank_main = [&](int rank) {
    std::vector<uint16_t> src(cap * width), out(cap * tp * width);
    // Rank tp - 1 goes silent at call stop_at; the others run one call more.
    const int last = rank == tp - 1 ? stop_at - 1 : stop_at;
    for (int k = 0; k <= last; ++k) {
      for (int i = 0; i < rows[k] * width; ++i) src[i] = payload_bits(seed, k, rank, i / width, i % width);
      model.publish(rank, src.data(), rows[k]);
      const auto start = std::chrono::steady_clock::now();
      try {
        model.consume(rank, out.data(), rows[k], timeout);
        if (k == stop_at) failures.add(rank, "call " + std::to_string(k) + " did not time out");
      } catch (const MailboxTimeout& e) {
        const auto waited = std::chrono::steady_clock::now() - start;
        const std::string what = e.what();
        if (k != stop_at || e.rank != rank || e.source != tp - 1 || e.stage != stop_at % 3 ||
            e.row < 0 || e.row >= rows[k] || waited < timeout || waited > timeout + std::chrono::seconds(5) ||
            what.find("rank " + std::to_string(rank)) == std::string::npos ||
            what.find("source " + std::to_string(tp - 1)) == std::string::npos ||
            what.find("stage " + std::to_string(stop_at % 3)) == std::string::npos)
          failures.add(rank, "wrong timeout at call " + std::to_string(k) + ": " + what);
        timed_out[rank] = 1;
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r) threads.emplace_back(rank_main, r);
  for (auto& t : threads) t.join();
  for (const auto& f : failures.messages) ADD_FAILURE() << f;
  for (int r = 0; r < tp - 1; ++r) EXPECT_EQ(timed_out[r], 1) << "rank " << r;
  EXPECT_EQ(timed_out[tp - 1], 0);
}

}  // namespace

namespace {

// The words and records against the spec's bit layout, written out here.
TEST(MailboxProtocol, WordsAndTimeoutRecordsFollowTheSpecLayout) {
  namespace mb = sd::mailbox;
  for (uint32_t call : {0u, 1u, 2u, 3u, 100u, 65533u, 65534u})
    for (int rows : {0, 1, 16, 65535}) {
      const uint32_t w = mb::make_word(call, rows);
      EXPECT_EQ(w, (call << 16) | uint32_t(rows));
      EXPECT_EQ(mb::word_call(w), call);
      EXPECT_EQ(mb::word_stage(w), int(call % 3));
      EXPECT_EQ(mb::word_rows(w), rows);
      // The counter wraps at 65535 = 3 x 21845: the stage still rotates.
      const uint32_t after = call == 65534u ? 0u : call + 1;
      EXPECT_EQ(mb::advance_word(w, 7), (after << 16) | 7u);
      EXPECT_EQ(mb::word_stage(mb::advance_word(w, 7)), int((call % 3 + 1) % 3));
    }
  // Claims: both words name the call; "pending" for any other call.
  EXPECT_EQ(mb::claim_rows_word(5, 9), (5u << 16) | 9u);
  EXPECT_EQ(mb::claim_tag_word(5, 61), (5u << 16) | 61u);
  EXPECT_EQ(mb::check_claim(mb::claim_rows_word(5, 9), mb::claim_tag_word(5, 61), 5, 9, 61), mb::kClaimMatches);
  EXPECT_EQ(mb::check_claim(mb::claim_rows_word(2, 9), mb::claim_tag_word(2, 61), 5, 9, 61), mb::kClaimPending);
  EXPECT_EQ(mb::check_claim(mb::claim_rows_word(5, 9), mb::claim_tag_word(2, 61), 5, 9, 61), mb::kClaimPending);
  EXPECT_EQ(mb::check_claim(0xffffffffu, 0xffffffffu, 0, 1, 0), mb::kClaimPending);  // the initial claim
  EXPECT_EQ(mb::check_claim(mb::claim_rows_word(5, 8), mb::claim_tag_word(5, 61), 5, 9, 61), mb::kClaimRowsDiffer);
  EXPECT_EQ(mb::check_claim(mb::claim_rows_word(5, 9), mb::claim_tag_word(5, 60), 5, 9, 61), mb::kClaimTagDiffer);
  EXPECT_EQ(mb::check_claim(mb::claim_rows_word(5, 0), mb::claim_tag_word(5, 61), 5, 9, 61), mb::kClaimPeerFailed);
  const mb::Layout C{4, 16, 24};
  EXPECT_EQ(C.claims_byte_offset(), int64_t(3 * 4 * 16 * 24) * 2);
  EXPECT_EQ(C.claim_index(2, 3), (2 * 4 + 3) * 2);
  EXPECT_EQ(C.claim_words(), 3 * 4 * 2);
  const mb::Layout L{4, 16, 24};
  EXPECT_EQ(L.copy_elems(), 3 * 4 * 16 * 24);
  EXPECT_EQ(L.offset(2, 3, 15, 23), ((2 * 4 + 3) * 16 + 15) * 24 + 23);
  for (int rank : {0, 7})
    for (int stage : {0, 2})
      for (int source : {0, 5, 7})
        for (int row : {0, 9, 65535}) {
          const uint32_t r = mb::make_timeout_record(rank, stage, source, row);
          EXPECT_TRUE(mb::record_valid(r));
          EXPECT_EQ(mb::record_rank(r), rank);
          EXPECT_EQ(mb::record_stage(r), stage);
          EXPECT_EQ(mb::record_source(r), source);
          EXPECT_EQ(mb::record_row(r), row);
        }
  EXPECT_FALSE(mb::record_valid(0));
  // The documented bit layout (bit 31 valid, 24..27 rank, 20..21 stage,
  // 16..19 source, 0..15 row), written out by hand: the host decodes words
  // a trapped kernel wrote.
  EXPECT_EQ(mb::make_timeout_record(7, 2, 5, 9), 0x80000000u | 0x07000000u | 0x00200000u | 0x00050000u | 9u);
  EXPECT_EQ(mb::make_timeout_record(0, 0, 0, 65535), 0x8000ffffu);
  // -0.0 only becomes +0.0; the sentinel test is on raw bits, per lane.
  EXPECT_EQ(mb::publish_pair(0x80008000u), 0u);
  EXPECT_EQ(mb::publish_pair(0x80018001u), 0x80018001u);
  EXPECT_EQ(mb::publish_pair(0x7fc08000u), 0x7fc00000u);
  EXPECT_TRUE(mb::vec_has_sentinel(0, 0, 0, 0x00008000u));
  EXPECT_TRUE(mb::vec_has_sentinel(0x80000000u, 0, 0, 0));
  EXPECT_FALSE(mb::vec_has_sentinel(0x80018001u, 0, 0xffffffffu, 0x7f807f80u));
}

}  // namespace

// A consume with no publish since the last one (a skipped publish, a second
// gather) is refused by name instead of returning the last call's rows.
TEST(MailboxModel, ConsumeWithoutPublishIsNamed) {
  sd::reference::MailboxModel m(1, 4, 8);
  std::vector<uint16_t> src(4 * 8, 0x3f80), out(4 * 8);
  m.publish(0, src.data(), 2);
  m.consume(0, out.data(), 2, std::chrono::milliseconds(100));
  try {
    m.consume(0, out.data(), 2, std::chrono::milliseconds(100));
    FAIL() << "a second consume without a publish returned";
  } catch (const sd::reference::MailboxNoPublish& e) {
    EXPECT_EQ(e.rank, 0);
    EXPECT_EQ(e.stage, 0);
    EXPECT_NE(std::string(e.what()).find("no publish since the last consume"), std::string::npos) << e.what();
  }
  // The mailbox stays failed (as on the device, where the host's next check
  // raises): a later call gives no rows, stale or new.
  m.publish(0, src.data(), 3);
  EXPECT_EQ(m.claim_word(0, 1, 0, 0), (1u << 16) | 0u);  // its claim says "failed", not b = 3
  EXPECT_THROW(m.consume(0, out.data(), 3, std::chrono::milliseconds(100)), sd::reference::MailboxFailed);
  const uint32_t r = sd::mailbox::make_record(sd::mailbox::kNoPublish, 3, 2, 0, 0);
  EXPECT_EQ(sd::mailbox::record_kind(r), sd::mailbox::kNoPublish);
  EXPECT_EQ(sd::mailbox::record_rank(r), 3);
  EXPECT_EQ(sd::mailbox::record_kind(sd::mailbox::make_timeout_record(3, 2, 1, 7)), sd::mailbox::kTimeout);
}

namespace {

using sd::reference::MailboxFailed;
constexpr auto kShort = std::chrono::milliseconds(200);

// Runs one call on every rank of `model` in its own thread with rank r's
// (b, tag); returns what each rank's consume threw ("" if it returned).
std::vector<std::string> one_call(MailboxModel& model, const std::vector<int>& b, const std::vector<uint32_t>& tag,
                                  std::vector<uint32_t>* kinds = nullptr) {
  const int tp = model.layout().tp;
  std::vector<std::string> what(tp);
  if (kinds) kinds->assign(tp, 0xffffffffu);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r)
    threads.emplace_back([&, r] {
      std::vector<uint16_t> src(size_t(model.layout().capacity) * model.layout().width, 0x3f80);
      std::vector<uint16_t> out(size_t(model.layout().capacity) * tp * model.layout().width);
      model.publish(r, src.data(), b[r], tag[r]);
      try {
        model.consume(r, out.data(), b[r], kShort, tag[r]);
      } catch (const MailboxFailed& e) {
        what[r] = e.what();
        if (kinds) (*kinds)[r] = e.kind;
      } catch (const std::exception& e) {
        what[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return what;
}

// Every rank fails at once when one calls with another b: the claims name
// it, no rank waits for the timeout, none returns rows.
TEST(MailboxModel, RanksWithDifferentRowsFailByName) {
  for (int tp : {2, 4, 8}) {
    MailboxModel model(tp, 8, 16);
    std::vector<int> b(tp, 4);
    std::vector<uint32_t> tag(tp, 0), kinds;
    ASSERT_EQ(one_call(model, b, tag), std::vector<std::string>(tp));  // a good call first
    b[tp - 1] = 6;
    const auto start = std::chrono::steady_clock::now();
    const auto what = one_call(model, b, tag, &kinds);
    EXPECT_LT(std::chrono::steady_clock::now() - start, kShort) << "tp " << tp << ": waited for the timeout";
    for (int r = 0; r < tp; ++r) {
      EXPECT_EQ(kinds[r], sd::mailbox::kRowsDiffer) << "tp " << tp << " rank " << r << ": " << what[r];
      const std::string want = r == tp - 1 ? "claims b = 4" : "source " + std::to_string(tp - 1) + " claims b = 6";
      EXPECT_NE(what[r].find(want), std::string::npos) << what[r];
    }
  }
}

// A rank calling another layer (the Pooler's tag) fails every rank by name.
TEST(MailboxModel, RanksOnDifferentLayersFailByName) {
  MailboxModel model(4, 8, 16);
  std::vector<int> b(4, 3);
  std::vector<uint32_t> kinds;
  ASSERT_EQ(one_call(model, b, {7, 7, 7, 7}), std::vector<std::string>(4));
  const auto what = one_call(model, b, {8, 8, 9, 8}, &kinds);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(kinds[r], sd::mailbox::kTagDiffer) << "rank " << r << ": " << what[r];
    EXPECT_NE(what[r].find(r == 2 ? "claims tag 8" : "source 2 claims tag 9"), std::string::npos) << what[r];
  }
}

// A second publish of one call (whose rows could replace what a peer took)
// fails its rank, and its failed claim fails the peers at that call.
TEST(MailboxModel, SecondPublishOfACallFailsEveryRank) {
  MailboxModel model(2, 4, 8);
  std::vector<uint16_t> src(4 * 8, 0x3f80), out(4 * 2 * 8);
  model.publish(0, src.data(), 2);
  model.publish(0, src.data(), 2);
  EXPECT_EQ(sd::mailbox::record_kind(model.state_word(0, 2)), sd::mailbox::kDoublePublish);
  model.publish(1, src.data(), 2);
  try {
    model.consume(1, out.data(), 2, kShort);
    FAIL() << "rank 1 took rows of a twice-published call";
  } catch (const MailboxFailed& e) {
    EXPECT_EQ(e.kind, sd::mailbox::kPeerFailed);
    EXPECT_EQ(e.source, 0);
  }
  EXPECT_THROW(model.consume(0, out.data(), 2, kShort), MailboxFailed);
}

// A failure on one rank reaches its peers at their next call through its
// claim (they fail by name instead of waiting for the timeout), and no rank
// ever returns rows again.
TEST(MailboxModel, FailureReachesPeersThroughTheClaim) {
  MailboxModel model(2, 4, 8);
  std::vector<uint16_t> src(4 * 8, 0x3f80), out(4 * 2 * 8);
  for (int r = 0; r < 2; ++r) model.publish(r, src.data(), 1);
  for (int r = 0; r < 2; ++r) model.consume(r, out.data(), 1, kShort);
  // Call 1: rank 1 skips its publish.
  model.publish(0, src.data(), 1);
  EXPECT_THROW(model.consume(1, out.data(), 1, kShort), sd::reference::MailboxNoPublish);
  model.publish(1, src.data(), 1);  // rank 1's next call: it claims failure
  const auto start = std::chrono::steady_clock::now();
  try {
    model.consume(0, out.data(), 1, kShort);
    FAIL() << "rank 0 returned rows";
  } catch (const MailboxFailed& e) {
    EXPECT_EQ(e.kind, sd::mailbox::kPeerFailed);
    EXPECT_EQ(e.source, 1);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, kShort);
  for (int r = 0; r < 2; ++r) EXPECT_THROW(model.consume(r, out.data(), 1, kShort), MailboxFailed);
}

// The call counter wraps at 65535 calls (a multiple of 3: the stages rotate
// on across the wrap) and every call still returns its own rows.
TEST(MailboxModel, CallCounterWraps) {
  MailboxModel model(1, 1, 8);
  std::vector<uint16_t> src(8), out(8);
  for (int k = 0; k < 65540; ++k) {
    for (int i = 0; i < 8; ++i) src[i] = uint16_t(0x3000 + (k * 8 + i) % 0x4000);
    model.publish(0, src.data(), 1);
    model.consume(0, out.data(), 1, kShort);
    ASSERT_EQ(out, src) << "call " << k;
    ASSERT_EQ(model.state_word(0, 0), (uint32_t((k + 1) % 65535) << 16) | 1u) << "call " << k;
  }
}

}  // namespace
