// Random seeds for every test, CPU and GPU: fresh each run, printed, and
// replayable. SPARK_TEST_SEED=N replays a run: each test's seed is derived
// from N and the test's own name (and a tag), not drawn in test order, so a
// test replays alone, under --gtest_filter, or in any order.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

namespace spark_decode::testing {

// SPARK_TEST_SEED, or fresh from std::random_device; printed once per process.
inline uint64_t test_base_seed() {
  static const uint64_t seed = [] {
    uint64_t s;
    if (const char* env = std::getenv("SPARK_TEST_SEED"))
      s = std::strtoull(env, nullptr, 0);
    else
      s = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    std::printf("[spark-decode tests] random seed %llu (SPARK_TEST_SEED to replay)\n",
                static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// The seed of `tag` within the running test: a hash of the base seed, the
// test's full name and the tag (FNV-1a, then splitmix64 to spread the bits).
inline uint64_t test_seed(const char* tag) {
  std::string name = tag;
  if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info())
    name = std::string(info->test_suite_name()) + "." + info->name() + "/" + tag;
  uint64_t h = 1469598103934665603ull ^ test_base_seed();
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  h += 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  h ^= h >> 31;
  std::printf("[%s] seed %llu\n", tag, static_cast<unsigned long long>(h));
  return h;
}

}  // namespace spark_decode::testing
