// EnqueueOrder (src/enqueue_order.h): the host order of launches where ranks
// share a GPU, with ranks as threads over its POSIX shared memory.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cpu/run_threads.h"
#include "enqueue_order.h"
#include "spark_decode/group.h"
#include "test_seed.h"

namespace sd = spark_decode;
using sd::detail::EnqueueOrder;
using Clock = std::chrono::steady_clock;

namespace {

// fn(group, r, fail) on thread r; fail(text) records a failure of rank r.
template <typename Fn>
std::vector<std::string> run_ranks(int size, Fn fn) {
  auto shared = sd::InProcessGroup::make_shared(size, std::chrono::seconds(60));
  std::mutex mu;
  std::vector<std::string> failed;
  std::vector<std::string> failures = sd::testing::run_threads(size, [&](int r) {
    sd::InProcessGroup group(shared, r);
    fn(group, r, [&](const std::string& f) {
      std::lock_guard<std::mutex> lock(mu);
      failed.push_back("rank " + std::to_string(r) + ": " + f);
    });
  });
  failures.insert(failures.end(), failed.begin(), failed.end());
  return failures;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

// Every rank publishes then consumes, each after a random delay (some of
// milliseconds): a consumer's wait must return only once every rank has
// published that call, and never time out while every rank keeps calling.
TEST(EnqueueOrder, ConsumerWaitsForEveryPeersPublish) {
  const uint64_t seed = sd::testing::test_seed("enqueue order");
  for (int size : {2, 4, 8}) {
    const auto failures = run_ranks(size, [&](sd::Group& g, int r, auto fail) {
      EnqueueOrder order(g, std::chrono::seconds(20));
      std::mt19937_64 draw(seed ^ (uint64_t(size) << 32) ^ uint64_t(r));
      std::uniform_int_distribution<int> delay_us(0, 300);
      for (uint64_t call = 1; call <= 300; ++call) {
        if (call % 50 == uint64_t(r) % 50) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        std::this_thread::sleep_for(std::chrono::microseconds(delay_us(draw)));
        order.published();
        if (!order.before_consume(false)) return fail("timed out at call " + std::to_string(call));
        for (int q = 0; q < size; ++q)
          if (order.published_by(q) < call)
            return fail("consumer of call " + std::to_string(call) + " went on with rank " + std::to_string(q) +
                        " at " + std::to_string(order.published_by(q)) + " publishes");
      }
    });
    for (const auto& f : failures) ADD_FAILURE() << "tp " << size << ", " << f;
  }
}

// A peer that skips a call: the consumer gives up after the timeout and
// says so (the device consumer then names the missing peer).
TEST(EnqueueOrder, MissingPeerEndsAfterTheTimeout) {
  const auto timeout = std::chrono::milliseconds(200);
  const auto failures = run_ranks(2, [&](sd::Group& g, int r, auto fail) {
    EnqueueOrder order(g, timeout);
    if (r == 0) {
      order.published();
      const auto start = Clock::now();
      const bool ok = order.before_consume(false);
      const double waited = seconds_since(start);
      if (ok) fail("returned true with the peer's publish missing");
      if (waited < 0.2 || waited > 5.0) fail("gave up after " + std::to_string(waited) + " s, timeout 0.2 s");
    }
    g.barrier();
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

// No wait where the device fails at once or nothing launches: a consumer
// with no publish of its own since the last one, and one under capture.
TEST(EnqueueOrder, NoWaitWithoutOwnPublishOrUnderCapture) {
  const auto failures = run_ranks(2, [&](sd::Group& g, int r, auto fail) {
    EnqueueOrder order(g, std::chrono::seconds(30));
    if (r == 0) {
      auto start = Clock::now();
      if (!order.before_consume(false) || seconds_since(start) > 2.0) fail("waited with no publish of its own");
      order.published();
      start = Clock::now();
      if (!order.before_consume(true) || seconds_since(start) > 2.0) fail("waited under capture");
    }
    g.barrier();
    // Each mailbox its own counters: a second order starts at zero.
    EnqueueOrder second(g, std::chrono::seconds(30));
    if (second.published_by(0) != 0 || second.published_by(1) != 0) fail("a new order's counters are not zero");
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

// One rank per thread, many orders alive at once (a Pooler and the next
// boundary's mailbox each have one): counters do not mix.
TEST(EnqueueOrder, OrdersAreIndependent) {
  const auto failures = run_ranks(4, [&](sd::Group& g, int r, auto fail) {
    EnqueueOrder a(g, std::chrono::seconds(20)), b(g, std::chrono::seconds(20));
    for (int call = 0; call < 3; ++call) a.published();
    if (r == 0) b.published();
    g.barrier();
    for (int q = 0; q < 4; ++q) {
      if (a.published_by(q) != 3) fail("a: rank " + std::to_string(q) + " at " + std::to_string(a.published_by(q)));
      if (b.published_by(q) != (q == 0 ? 1u : 0u))
        fail("b: rank " + std::to_string(q) + " at " + std::to_string(b.published_by(q)));
    }
    g.barrier();
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}
