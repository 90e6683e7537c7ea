// Entry points of `spark-decode bench ...` and `spark-decode tune ...`.
#pragma once

#include <string>
#include <vector>

namespace spark_decode::bench {

struct UnpoolerBenchOptions {
  std::vector<int> tps{1, 2, 4, 8};
  std::vector<int> ms{1, 2, 4, 8, 16};
  int repeats = 20;
  std::string out_dir;  // where the JSON and markdown go
  // tune / profile: only these launch-shape values (empty: all)
  std::vector<int> splits, kws, accs;
};

// Ours (graph and pdl_chain) against the fastest cuBLASLt algorithm, per tp
// and m; returns the JSON path.
std::string bench_unpooler(const UnpoolerBenchOptions& options);

// Every valid tactic of every tp's shape at the given m; prints the ranking
// and writes it as JSON (op "unpooler", variant = the tactic).
std::string tune_unpooler(const UnpoolerBenchOptions& options);

// A few eager calls of one tactic on cold weights, for Nsight Compute.
void profile_unpooler(const UnpoolerBenchOptions& options);

}  // namespace spark_decode::bench
