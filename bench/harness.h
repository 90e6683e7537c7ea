// The benchmark method of docs/design.md, "Benchmark records", shared by every `spark-decode bench`:
// CUDA events over CUDA-graph replays, distinct weights per call so that L2
// is cold, the median of repeats, and the HBM read bandwidth measured in the
// same run for the floor.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "spark_decode/error.h"

namespace spark_decode {
class Group;
}

namespace spark_decode::bench {

struct Record {
  std::string op, impl, variant, mode;
  int tp = 1, m = 0, n = 0, k = 0;
  double us = 0, floor_us = 0;
};

struct Report {
  std::string gpu, date, commit;
  double hbm_read_TBps = 0;
  std::vector<Record> records;
  std::vector<std::string> notes;  // printed under the markdown table

  // Writes <dir>/<stem>.json and <dir>/<stem>.md; returns the JSON path.
  std::string write(const std::string& dir, const std::string& stem) const;
  std::string markdown() const;
};

// Streams `bytes` of device memory through a read-only kernel; the median
// of `repeats` in TB/s (10^12 bytes per second).
double measure_hbm_read_TBps(size_t bytes = size_t{4} << 30, int repeats = 20);

// The median (of an even count, the mean of the middle two).
double median(std::vector<double> v);

// Microseconds to read `bytes` at `tbps` TB/s: a record's floor_us.
inline double floor_us(size_t bytes, double tbps) { return bytes / (tbps * 1e12) * 1e6; }

// How many distinct weight copies a benchmark rotates through: at least
// `min_calls`, and together more than 4x the L2 so no call finds its
// weights cached.
int cold_copies(size_t bytes_per_copy, int min_calls = 62);

// Captures `calls` consecutive enqueue(stream, i) into one graph, replays it
// `repeats` times (after warm-up) and returns the median microseconds per
// call (replay time / calls).
double time_graph(const std::function<void(cudaStream_t, int)>& enqueue, int calls, int repeats,
                  cudaStream_t stream);

// Replays `exec` (which holds `calls` calls) `repeats` times after three
// warm-up replays, each timed with events on `stream`; before_each runs on
// the host before every replay. The median microseconds per call.
double replay_us(cudaGraphExec_t exec, cudaStream_t stream, int calls, int repeats,
                 const std::function<void()>& before_each = {});

// Multi-GPU timing (one thread per rank): replays `exec` `repeats` times on
// every rank at once (a group barrier before each replay keeps the ranks
// within a launch of each other) and returns this rank's median microseconds
// per call.
double time_replays(Group& group, cudaGraphExec_t exec, cudaStream_t stream, int calls, int repeats);

// One replay of `exec` with spark_decode/trace.h recording on the current
// device, written as CSV to `path` (tools/trace_summary.py reads it);
// `before` runs on the host first (a group barrier for multi-GPU graphs).
// Needs a -DSPARK_DECODE_TRACE=ON build.
void trace_replay(cudaGraphExec_t exec, cudaStream_t stream, const std::string& path,
                  const std::function<void()>& before = {});
// `calls` calls of one_call() captured on `stream` into an executable graph.
cudaGraphExec_t capture_graph(cudaStream_t stream, int calls, const std::function<void()>& one_call);
// Runs fn(group, rank) on `tp` threads, thread r with GPU r % devices current
// (devices = 0: one GPU per rank; fewer GPUs than ranks: ranks share them),
// over one InProcessGroup; rethrows the first rank's exception after all
// joined.
void run_ranks(int tp, const std::function<void(Group&, int)>& fn, int devices = 0);

// Device name, today's date, and the commit (SPARK_DECODE_COMMIT, else the
// configure-time git hash).
Report new_report();

// A device allocation freed at scope exit.
class DeviceMemory {
 public:
  explicit DeviceMemory(size_t bytes);
  ~DeviceMemory();
  DeviceMemory(DeviceMemory&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  DeviceMemory(const DeviceMemory&) = delete;
  void* get() const { return p_; }
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
};

// `count` elements of T at device address p, copied to the host on
// `stream` (synchronised: the vector is complete on return).
template <typename T>
std::vector<T> download(const void* p, size_t count, cudaStream_t stream) {
  std::vector<T> v(count);
  CUDA_CHECK(cudaMemcpyAsync(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  return v;
}

// A non-blocking stream destroyed at scope exit.
class Stream {
 public:
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_;
};

// The on-chip engine's copy pattern with nothing computed (a diagnostic: the
// bound of onchip_mma at this tactic): grid (n / 16, S), cluster (1, S, 1),
// the kernel's shared memory at the 8-token tile; one thread per CTA issues
// every stage's 16 row copies before griddepcontrol.wait, each warp waits
// for its stage after it, and the CTA leaves. With `pdl`, launched with
// programmatic dependent launch like the GEMMs. Call prepare_onchip_stream()
// once per device first (not under capture).
void prepare_onchip_stream();
void enqueue_onchip_stream(const void* w, int n, int k, int splits, int kw, int stage_warps, bool pdl,
                           cudaStream_t stream);

// The bound of an engine that stages its shard through shared memory: the
// shard's `bytes` streamed with nothing computed, one CTA per SM, each
// requesting its whole contiguous chunk with bulk copies before
// griddepcontrol.wait (the best copy pattern measured, docs/perf/onchip.md);
// with `pdl`, launched with programmatic dependent launch like the GEMMs.
// flat_stream_fits: whether one SM's share of `bytes` fits its shared memory
// (the tp 4 and tp 8 shards do; larger ones are skipped). Call
// prepare_flat_stream() once per device first (not under capture).
bool flat_stream_fits(size_t bytes);
void prepare_flat_stream();
void enqueue_flat_stream(const void* p, size_t bytes, bool pdl, cudaStream_t stream);

// Records op's bound at this shard (impl "bound", m 0, modes graph and
// pdl_chain): the flat stream of copy(c)'s `bytes` over `copies` cold copies,
// in the same graph method as the GEMMs; prints it. Nothing where the shard
// does not fit (flat_stream_fits).
void record_stream_bound(Report& report, const std::string& op, int tp, int n, int k,
                         const std::function<const void*(int)>& copy, int copies, int repeats, cudaStream_t stream);

// A bandwidth-heavy predecessor standing in for the routed experts: each call
// streams `bytes` of one of kBuffers distinct buffers (together more than the
// L2), one CTA per SM holding `smem_bytes` of shared memory as an expert
// GEMM's pipeline would (so a following kernel's CTAs find room on an SM only
// as its CTA there leaves). Launched with programmatic dependent launch: it
// calls griddepcontrol.wait first (a PDL kernel between two of ours must,
// docs/design.md, "The Lamport mailbox protocol", ordering 6) and then lets
// the next kernel launch, which is as early as an expert GEMM could.
class StandIn {
 public:
  static constexpr int kBuffers = 4;
  StandIn(size_t bytes, int smem_bytes);
  // Call i's predecessor on `stream` (buffer i % kBuffers).
  void enqueue(cudaStream_t stream, int i) const;
  // The stand-ins alone, chained as the pairs below are (PDL): median
  // microseconds per stand-in over a graph of `calls`.
  double time_alone(int calls, int repeats, cudaStream_t stream) const;
  // Mode after_stream: the median microseconds per (stand-in, call) pair of
  // a graph of `calls` pairs, less `alone_us` (the stand-ins' own chain,
  // time_graph of enqueue): what each call adds behind this predecessor.
  double time_behind(const std::function<void(cudaStream_t, int)>& call, double alone_us, int calls, int repeats,
                     cudaStream_t stream) const;
  size_t bytes() const { return bytes_; }
  std::string describe() const;

 private:
  size_t bytes_;
  int smem_bytes_;
  DeviceMemory memory_;
};

// Diagnostics: an empty kernel, and a plain streaming read of `bytes` (what
// a GEMV could at best do with the same bytes, launch included).
void enqueue_empty(cudaStream_t stream);
void enqueue_read(const void* p, size_t bytes, cudaStream_t stream);
// The same bytes streamed by the copy engine (cp.async.bulk of `copy` bytes
// into a shared-memory ring, ctas_per_sm CTAs per SM), nothing computed: the
// bandwidth a shared-memory-staged kernel could reach. Call
// prepare_bulk_read() once per device first (not under capture).
void prepare_bulk_read();
// rows > 1: each buffer is the same copy-byte range of `rows` consecutive
// rows of row_bytes (strided pieces, as a GEMM stage), not one contiguous copy.
void enqueue_bulk_read(const void* p, size_t bytes, int copy, int ctas_per_sm, cudaStream_t stream, int rows = 1,
                       int row_bytes = 0);

// Fills `count` BF16 at `p` with N(0,1) draws (device-side, fast), times
// `scale` before the one rounding to BF16.
void fill_random_bf16(void* p, size_t count, uint64_t seed, cudaStream_t stream = nullptr, float scale = 1.0f);

}  // namespace spark_decode::bench
