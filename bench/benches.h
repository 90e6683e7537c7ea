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
  // tune: the pooler's GEMM shapes (N = P / tp, K = H, the Pooler's MMA
  // engine) instead of the unpooler's (N = H / tp, K = P)
  bool pooler_shapes = false;
  // tune: time each tactic in a PDL chain (mode pdl_chain) instead of with
  // PDL off: what a caller that launches with PDL gets, weights prefetched
  // during the previous kernel's tail.
  bool pdl = false;
  // tune --onchip: time each tactic behind the stand-in below (mode
  // after_stream, PDL on) instead.
  bool after_stream = false;
  // tune: the on-chip engine's tactics (S, kw, accs, copy stages, cluster
  // policy, row tiles at token tile 16; filtered by splits, kws, accs,
  // stage_warps, onchip_rows) instead of the split-K engine's; written as
  // onchip_tune[_pooler_shapes][_pdl].
  bool onchip = false;
  std::vector<int> stage_warps, onchip_rows;
  // bench: non-empty: also record one replay of the table's graphs of each
  // tp and m (spark_decode/trace.h; a -DSPARK_DECODE_TRACE=ON build): the PDL
  // chain into <trace>_unpooler_tp<tp>_m<m>.csv, PDL off into
  // <trace>_unpooler_graph_tp..., behind the stand-in into
  // <trace>_unpooler_after_tp... (where standin_mib > 0).
  std::string trace;
  // bench: mode after_stream: each call of the table's engine and of the
  // on-chip engine follows a stand-in for the routed experts streaming this
  // many MiB (harness.h, StandIn) holding this much shared memory per SM;
  // 0 MiB: not measured.
  int standin_mib = 64;
  int standin_smem_kib = 200;
};

// Ours (graph and pdl_chain; the table's engine and the on-chip engine)
// against the fastest cuBLASLt algorithm, per tp and m, and both engines
// behind a bandwidth-heavy predecessor (after_stream); returns the JSON path.
std::string bench_unpooler(const UnpoolerBenchOptions& options);

// Every valid tactic of every tp's shape at the given m; prints the ranking
// and writes it as JSON (op "unpooler", variant = the tactic).
std::string tune_unpooler(const UnpoolerBenchOptions& options);

// A few eager calls of one tactic on cold weights, for Nsight Compute.
void profile_unpooler(const UnpoolerBenchOptions& options);

}  // namespace spark_decode::bench

namespace spark_decode::bench {

struct GatherBenchOptions {
  int tp = 2;
  std::vector<int> bs{1, 4, 8, 16};
  std::vector<int> widths;  // per-rank column widths; default P/tp and H/tp
  int calls = 100;          // calls per graph
  int repeats = 20;
  std::string out_dir;
};

// publish + gather of the Lamport mailbox against ncclAllGather of the same
// bytes, both captured in CUDA graphs, tp GPUs of this process; plus the
// one-way peer store latency. Returns the JSON path.
std::string bench_gather(const GatherBenchOptions& options);

}  // namespace spark_decode::bench

namespace spark_decode::bench {

struct ConsumerBenchOptions {
  std::vector<int> tps{1, 2, 4, 8};
  std::vector<int> bs{1, 2, 4, 8, 16};
  int calls = 62;   // calls per graph
  int repeats = 20;  // graph replays per round (median)
  int rounds = 7;    // interleaved rounds (median)
  std::string out_dir;
};

// The Pooler's fused consumer in each output format against the mailbox's
// plain gather, at the mailbox layouts of tp 1, 2, 4, 8, on one GPU (the tp
// ranks share it; every consumer runs over data already present). Returns
// the JSON path.
std::string bench_consumer(const ConsumerBenchOptions& options);

}  // namespace spark_decode::bench

namespace spark_decode::bench {

// `spark-decode bench unpooler --publish`: at tp GPUs of this process, per m:
// zero-copy GEMM + gather, plain GEMM + publish + gather, the GEMMs alone,
// and cuBLAS + ncclAllGather; all CUDA graphs over cold weights. Returns the
// JSON path.
std::string bench_unpooler_publish(const UnpoolerBenchOptions& options, int tp);

}  // namespace spark_decode::bench
