// Ranks as threads in the CPU tests: fn(r) on thread r, each thread's
// exception kept as a failure naming its rank.
#pragma once

#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace spark_decode::testing {

template <typename Fn>
std::vector<std::string> run_threads(int size, Fn fn) {
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back("rank " + std::to_string(r) + " threw: " + e.what());
      }
    });
  for (auto& t : threads) t.join();
  return failures;
}

}  // namespace spark_decode::testing
