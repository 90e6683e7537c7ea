// `spark-decode bench pooler`: the Pooler against the stock path, and the
// pooler GEMM (every engine) against cuBLAS. docs/design.md, "Benchmark records" records.
#pragma once

#include <string>
#include <vector>

namespace spark_decode::bench {

struct PoolerBenchOptions {
  std::vector<int> tps{1, 2};          // Pooler.run vs stock (tp GPUs of this process)
  std::vector<int> gemm_tps{1, 2, 4, 8};  // pooler GEMM alone (one GPU)
  std::vector<int> bs{1, 4, 8, 16};
  int repeats = 20;
  bool gemm_only = false;  // `tune pooler`: the GEMM sweep alone
  // The GEMM sweep's engines by name prefix ("table", "mma", "skinny");
  // empty: all.
  std::vector<std::string> engines;
  // Pooler.run also with every layer's GEMM forced onto each engine named
  // here by prefix (empty: the table's choice only).
  std::vector<std::string> run_engines;
  std::string out_dir;
  // Non-empty: also record one replay of the Pooler.run graph and of the
  // three-kernel graph at the first b with spark_decode/trace.h (a library
  // built with -DSPARK_DECODE_TRACE=ON), one CSV per rank:
  // <trace>_tp<tp>_b<b>_rank<r>_{run,split}.csv. tools/trace_summary.py reads them.
  std::string trace;
  // The GEMM sweep's mode after_stream: the table's engine and the on-chip
  // engine, each call after a stand-in for the routed experts streaming this
  // many MiB (harness.h, StandIn) with this much shared memory per SM; 0 MiB:
  // not measured.
  int standin_mib = 64;
  int standin_smem_kib = 200;
};

// op "pooler_gemm": every engine at every shape it offers
// (pooler_gemm_candidates) and the table's choice against the fastest
// cuBLASLt algorithm, per tp and b (one GPU; this is also the sweep to
// choose the table from); op "pooler":
// Pooler.run over the 60 NVFP4 layers against cuBLAS + ncclAllGather +
// ExpertNorm + nvfp4_quantize, graph captured, per tp and b. Returns the
// JSON path.
std::string bench_pooler(const PoolerBenchOptions& options);

}  // namespace spark_decode::bench
