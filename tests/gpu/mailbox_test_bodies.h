// The mailbox's GPU test bodies, run by every rank of a group: in one process
// with a thread per GPU (test_mailbox.cu) and across processes with
// `mpirun -np 2` (test_mailbox_mpi.cu). A body throws std::runtime_error on
// the first mismatch; the caller reports it.
//
// Expected values never come from the code under test: payloads are a pure
// function of (seed, call, source, row, col) (src/reference/mailbox_payload.h),
// -0.0 must arrive as +0.0, call k of a fresh mailbox runs on stage k % 3,
// its layout is [3][tp][capacity][width] followed by the claims
// [3][tp][2] (call k's on stage k % 3: k << 16 | b_k and k << 16 | tag 0), and
// its state words are NEXT = (k + 1) << 16 | b_k and ACTIVE = k << 16 |
// b_{k-1} (the call counter, modulo 65535).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "reference/mailbox_payload.h"
#include "spark_decode/error.h"
#include "spark_decode/mailbox.h"

namespace spark_decode::testing::mailbox_tests {

using reference::arrived_bits;
using reference::payload_bits;

#define MB_REQUIRE(cond, ...)                                                              \
  do {                                                                                     \
    if (!(cond))                                                                           \
      throw std::runtime_error(::spark_decode::detail::concat("rank ", rank_for_errors, ": ", \
                                                              __VA_ARGS__));               \
  } while (0)

inline constexpr uint16_t kSentinelBits = 0x8000;
inline constexpr uint16_t kPoison = 0xffff;

class Stream {
 public:
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s_); }
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_;
};

// Rows [0, b) of rank `rank`'s block for payload call `call`, padded to
// `rows` rows (the pad is never published).
inline void fill_src(uint16_t* dst, uint64_t seed, int64_t call, int rank, int b, int width) {
  for (int row = 0; row < b; ++row)
    for (int col = 0; col < width; ++col)
      dst[size_t(row) * width + col] = payload_bits(seed, call, rank, row, col);
}

// out: `rows` rows of tp * width: rows < b hold every source's block, the
// rest the poison.
inline void check_rows(const uint16_t* out, int rows, uint64_t seed, int64_t call, int b, int tp,
                       int width, int rank_for_errors) {
  const int out_width = tp * width;
  for (int row = 0; row < rows; ++row)
    for (int c = 0; c < out_width; ++c) {
      const int q = c / width, col = c % width;
      const uint16_t want = row < b ? arrived_bits(payload_bits(seed, call, q, row, col)) : kPoison;
      const uint16_t got = out[size_t(row) * out_width + c];
      MB_REQUIRE(got == want, "call ", call, " b ", b, " output row ", row, " col ", c,
                 " (source ", q, "): got 0x", std::hex, got, " want 0x", want);
    }
}

// This rank's whole allocation after call k (no peer ahead: the caller
// synchronised the group): guards; every stage all sentinel (the consumer
// cleared what it read, and no stray store landed anywhere); the state words.
inline void check_copy(const LamportMailbox& mb, int64_t k, int b, int b_prev) {
  const int rank_for_errors = mb.rank();
  const int tp = mb.tp(), cap = mb.capacity(), width = mb.width();
  const size_t bytes = mb.memory().bytes();
  std::vector<uint8_t> raw(bytes);
  CUDA_CHECK(cudaMemcpy(raw.data(), mb.memory().local(), bytes, cudaMemcpyDeviceToHost));
  const auto [data_begin, data_end, state_begin, state_end] = regions_of(mb);
  for (size_t i = 0; i < bytes; ++i) {
    if ((i >= data_begin && i < data_end) || (i >= state_begin && i < state_end)) continue;
    MB_REQUIRE(raw[i] == kMailboxGuardByte, "call ", k, ": byte ", i, " of the allocation (data [",
               data_begin, ", ", data_end, "), state at ", state_begin, ") was overwritten");
  }
  const auto* data = reinterpret_cast<const uint16_t*>(raw.data() + data_begin);
  for (int s = 0; s < 3; ++s)
    for (int q = 0; q < tp; ++q)
      for (int row = 0; row < cap; ++row)
        for (int col = 0; col < width; ++col) {
          const uint16_t got = data[((size_t(s) * tp + q) * cap + row) * width + col];
          MB_REQUIRE(got == kSentinelBits, "call ", k, ": copy stage ", s, " source ", q, " row ", row, " col ", col,
                     ": got 0x", std::hex, got, " want the sentinel");
        }
  uint32_t state[3];
  std::memcpy(state, raw.data() + state_begin, sizeof state);
  const auto* claims = reinterpret_cast<const uint32_t*>(raw.data() + data_begin + size_t(3) * tp * cap * width * 2);
  for (int q = 0; q < tp; ++q) {
    const uint32_t* c = claims + (size_t(k % 3) * tp + q) * 2;
    const uint32_t want_rows = (uint32_t(k % 65535) << 16) | uint32_t(b), want_tag = uint32_t(k % 65535) << 16;
    MB_REQUIRE(c[0] == want_rows && c[1] == want_tag, "call ", k, ": source ", q, "'s claim 0x", std::hex, c[0],
               " 0x", c[1], ", want 0x", want_rows, " 0x", want_tag);
  }
  const uint32_t next = (uint32_t((k + 1) % 65535) << 16) | uint32_t(b);
  const uint32_t active = (uint32_t(k % 65535) << 16) | uint32_t(b_prev);
  MB_REQUIRE(state[0] == next && state[1] == active && state[2] == 0, "call ", k, ": state NEXT 0x", std::hex,
             state[0], " ACTIVE 0x", state[1], " STATUS 0x", state[2], ", want 0x", next, " 0x", active, " 0");
}

// Every b from 1 to capacity, then random ones; publish and gather options
// varied per call; after every call the outputs, both buffers' guards and
// the whole mailbox allocation are checked on every rank.
inline void payloads_arrive_bit_for_bit(Group& group, int device, int width, uint64_t seed) {
  const int rank_for_errors = group.rank();
  const int tp = group.size(), cap = 16;
  LamportMailbox::Options options;
  options.guard_bytes = 4096;
  LamportMailbox mb(group, tp, group.rank(), cap, width, device, options);
  Stream stream;
  GuardedBuffer src(size_t(cap) * width * 2), out(size_t(cap) * tp * width * 2);
  std::mt19937_64 rows_rng(seed);
  std::vector<uint16_t> host_src(size_t(cap) * width), host_out(size_t(cap) * tp * width);
  const int threads[] = {32, 128, 256, 1024};
  int b_prev = 0;
  set_up_done(group);
  for (int64_t k = 0; k < cap + 12; ++k) {
    const int b = k < cap ? int(k) + 1 : int(rows_rng() % cap) + 1;
    fill_src(host_src.data(), seed, k, group.rank(), b, width);
    src.upload(host_src.data(), size_t(b) * width * 2);
    out.fill(0xff);  // done before the next launch (GuardedBuffer::fill)
    LamportMailbox::PublishOptions po;
    po.threads = threads[k % 4];
    po.enable_pdl = k % 2 == 0;
    LamportMailbox::GatherOptions go;
    go.threads = threads[(k + 1) % 4];
    go.enable_pdl = k % 5 != 2;
    mb.publish(TensorRef::contiguous(src.get(), DType::bf16, {b, width}, device), stream, po);
    mb.gather(TensorRef::contiguous(out.get(), DType::bf16, {b, int64_t(tp) * width}, device), stream,
              go);
    mb.synchronize(stream);
    group.barrier();  // every rank done with call k: nobody is ahead
    out.download(host_out.data(), out.bytes());
    check_rows(host_out.data(), cap, seed, k, b, tp, width, rank_for_errors);
    const std::string guards = src.check_guards() + out.check_guards();
    MB_REQUIRE(guards.empty(), "call ", k, ": ", guards);
    check_copy(mb, k, b, b_prev);
    group.barrier();  // nobody publishes call k + 1 while a peer checks its copy
    b_prev = b;
  }
  mb.barrier();
}

// `calls` consecutive calls with b drawn per call, `chunk` calls enqueued
// between synchronisations (no barriers: the protocol alone keeps ranks in
// step), every call's output checked.
inline void many_calls_random_rows(Group& group, int device, int width, int calls, uint64_t seed) {
  const int rank_for_errors = group.rank();
  const int tp = group.size(), cap = 16, chunk = 250;
  LamportMailbox mb(group, tp, group.rank(), cap, width, device);
  Stream stream;
  const size_t src_call = size_t(cap) * width, out_call = size_t(cap) * tp * width;
  GuardedBuffer src(chunk * src_call * 2), out(chunk * out_call * 2);
  std::vector<uint16_t> host_src(chunk * src_call), host_out(chunk * out_call);
  std::mt19937_64 rows_rng(seed ^ 0x5bd1e995);
  std::vector<int> rows(calls);
  for (int& b : rows) b = int(rows_rng() % cap) + 1;
  set_up_done(group);
  for (int first = 0; first < calls; first += chunk) {
    const int n = std::min(chunk, calls - first);
    for (int j = 0; j < n; ++j)
      fill_src(host_src.data() + j * src_call, seed, first + j, group.rank(), rows[first + j], width);
    src.upload(host_src.data(), n * src_call * 2);
    out.fill(0xff);  // done before the next launch (GuardedBuffer::fill)
    for (int j = 0; j < n; ++j) {
      mb.publish(static_cast<uint16_t*>(src.get()) + j * src_call, rows[first + j], stream);
      mb.gather(static_cast<uint16_t*>(out.get()) + j * out_call, rows[first + j], stream);
    }
    mb.synchronize(stream);
    out.download(host_out.data(), n * out_call * 2);
    for (int j = 0; j < n; ++j)
      check_rows(host_out.data() + j * out_call, cap, seed, first + j, rows[first + j], tp, width,
                 rank_for_errors);
  }
  const std::string guards = src.check_guards() + out.check_guards();
  MB_REQUIRE(guards.empty(), guards);
  int32_t state[2];
  CUDA_CHECK(cudaMemcpy(state, mb.view().state, 8, cudaMemcpyDeviceToHost));
  const uint32_t next = (uint32_t(calls % 65535) << 16) | uint32_t(rows[calls - 1]);
  MB_REQUIRE(uint32_t(state[0]) == next, "NEXT after ", calls, " calls: 0x", std::hex, state[0],
             " want 0x", next);
  mb.barrier();
}

// A CUDA graph of `per_graph` publish + gather calls (b random per call)
// captured once and replayed `replays` times with fresh source rows before
// each replay; the stage advances on the device across replays.
inline void graph_replays(Group& group, int device, int width, int per_graph, int replays,
                          uint64_t seed) {
  const int rank_for_errors = group.rank();
  const int tp = group.size(), cap = 16;
  LamportMailbox mb(group, tp, group.rank(), cap, width, device);
  mb.warm_up(Stream());  // one call: the graph's calls start at call 1
  Stream stream;
  const size_t src_call = size_t(cap) * width, out_call = size_t(cap) * tp * width;
  GuardedBuffer src(per_graph * src_call * 2), out(per_graph * out_call * 2);
  std::vector<uint16_t> host_src(per_graph * src_call), host_out(per_graph * out_call);
  std::mt19937_64 rows_rng(seed ^ 0x27d4eb2f);
  std::vector<int> rows(per_graph);
  for (int& b : rows) b = int(rows_rng() % cap) + 1;

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int j = 0; j < per_graph; ++j) {
    mb.publish(static_cast<uint16_t*>(src.get()) + j * src_call, rows[j], stream);
    mb.gather(static_cast<uint16_t*>(out.get()) + j * out_call, rows[j], stream);
  }
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  set_up_done(group);
  try {
    for (int r = 0; r < replays; ++r) {
      for (int j = 0; j < per_graph; ++j)
        fill_src(host_src.data() + j * src_call, seed, int64_t(r) * per_graph + j, group.rank(),
                 rows[j], width);
      CUDA_CHECK(cudaMemcpyAsync(src.get(), host_src.data(), host_src.size() * 2,
                                 cudaMemcpyHostToDevice, stream));
      CUDA_CHECK(cudaMemsetAsync(out.get(), 0xff, out.bytes(), stream));
      CUDA_CHECK(cudaGraphLaunch(exec, stream));
      mb.synchronize(stream);
      out.download(host_out.data(), out.bytes());
      for (int j = 0; j < per_graph; ++j)
        check_rows(host_out.data() + j * out_call, cap, seed, int64_t(r) * per_graph + j, rows[j],
                   tp, width, rank_for_errors);
    }
  } catch (...) {
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    throw;
  }
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  const std::string guards = src.check_guards() + out.check_guards();
  MB_REQUIRE(guards.empty(), guards);
  int32_t state[2];
  CUDA_CHECK(cudaMemcpy(state, mb.view().state, 8, cudaMemcpyDeviceToHost));
  const int64_t total = 1 + int64_t(replays) * per_graph;  // warm-up included
  const uint32_t next = (uint32_t(total % 65535) << 16) | uint32_t(rows[per_graph - 1]);
  MB_REQUIRE(uint32_t(state[0]) == next, "NEXT after ", total, " calls: 0x", std::hex, state[0],
             " want 0x", next);
  mb.barrier();
}

// Every rank runs four good calls; then rank 0 runs call 4 and every other
// rank skips it. Rank 0's consumer must end in the spin-timeout error, not a
// hang. Returns rank 0's error text and how long it waited (other ranks: "",
// -1). With OnFailure::trap the trap poisons rank 0's CUDA context: run it
// last in a process. With OnFailure::poison rank 0 also checks that the
// columns of the missing sources hold the poison, those of its own block
// the payload, and that every entry point now refuses with the failure.
// `calls` good calls of zero rows (b = 1, 2, ...) before a misuse, every
// rank alike, then a barrier: the misuse meets a protocol in step.
inline void good_calls_first(Group& group, LamportMailbox& mb, GuardedBuffer& src, GuardedBuffer& out, int calls,
                             cudaStream_t stream) {
  src.fill(0);
  set_up_done(group);
  for (int k = 0; k < calls; ++k) {
    mb.publish(src.get(), 1 + k, stream);
    mb.gather(out.get(), 1 + k, stream);
  }
  mb.synchronize(stream);
  group.barrier();
}

// The misuse bodies' set-up: a mailbox of kMisuseCap rows of kMisuseWidth
// columns with the given spin timeout and failure mode, a stream, one
// call's source and output, and `good` good calls every rank makes first
// (good_calls_first).
inline constexpr int kMisuseCap = 16, kMisuseWidth = 256;
struct MisuseSetup {
  LamportMailbox mb;
  Stream stream;
  GuardedBuffer src, out;
  MisuseSetup(Group& group, int device, double timeout_s, int good,
              LamportMailbox::OnFailure on_failure = LamportMailbox::OnFailure::poison)
      : mb(group, group.size(), group.rank(), kMisuseCap, kMisuseWidth, device, options(timeout_s, on_failure)),
        src(kMisuseCap * kMisuseWidth * 2),
        out(size_t(kMisuseCap) * group.size() * kMisuseWidth * 2) {
    good_calls_first(group, mb, src, out, good, stream);
  }
  static LamportMailbox::Options options(double timeout_s, LamportMailbox::OnFailure on_failure) {
    LamportMailbox::Options o;
    o.spin_timeout_s = timeout_s;
    o.on_failure = on_failure;
    return o;
  }
};

struct TimeoutOutcome {
  std::string error;
  double waited_s = -1;
};
inline TimeoutOutcome skipped_call_times_out(Group& group, int device, double timeout_s,
                                             LamportMailbox::OnFailure on_failure) {
  const int rank = group.rank(), tp = group.size(), rank_for_errors = rank, cap = kMisuseCap, width = kMisuseWidth;
  MisuseSetup set(group, device, timeout_s, 4, on_failure);
  auto& [mb, stream, src, out] = set;
  TimeoutOutcome outcome;
  if (rank == 0) {
    const uint64_t seed = test_seed("mailbox skipped call");
    std::vector<uint16_t> host_src(size_t(cap) * width), host_out(size_t(cap) * tp * width);
    fill_src(host_src.data(), seed, 4, rank, 3, width);
    src.upload(host_src.data(), host_src.size() * 2);
    out.fill(0x11);
    const auto start = std::chrono::steady_clock::now();
    mb.publish(src.get(), 3, stream);
    mb.gather(out.get(), 3, stream);
    try {
      mb.synchronize(stream);
    } catch (const RuntimeError& e) {
      outcome.error = e.what();
    }
    outcome.waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (on_failure == LamportMailbox::OnFailure::poison) {
      out.download(host_out.data(), out.bytes());
      for (int row = 0; row < cap; ++row)
        for (int c = 0; c < tp * width; ++c) {
          const uint16_t got = host_out[size_t(row) * tp * width + c];
          const uint16_t want = row >= 3           ? uint16_t(0x1111)
                                : c / width == 0 ? arrived_bits(payload_bits(seed, 4, 0, row, c))
                                                 : uint16_t(0xffff);
          MB_REQUIRE(got == want, "after the timeout, output row ", row, " col ", c, ": got 0x", std::hex, got,
                     " want 0x", want);
        }
      for (int entry = 0; entry < 3; ++entry) {
        std::string refused;
        try {
          if (entry == 0) mb.publish(src.get(), 1, stream);
          if (entry == 1) mb.gather(out.get(), 1, stream);
          if (entry == 2) mb.check();
        } catch (const RuntimeError& e) {
          refused = e.what();
        }
        MB_REQUIRE(refused.find("spin timeout on rank 0") != std::string::npos &&
                       refused.find("destroy this mailbox") != std::string::npos,
                   "entry point ", entry, " after the failure: '", refused, "'");
      }
    }
  }
  // The skipping ranks keep their copies mapped (rank 0's publish writes into
  // them) until rank 0 has its error.
  group.barrier();
  return outcome;
}

// After a failure with OnFailure::poison the process goes on: a new mailbox
// on the same group runs calls bit for bit, and a gather with no publish
// since the last one then ends at once (the other consumers stop at STATUS,
// long before the timeout) in the named error with its whole output
// poisoned, never the last call's rows. Then the protocol goes on in a
// third mailbox.
inline void failure_is_survived(Group& group, int device, double timeout_s) {
  const int rank = group.rank(), tp = group.size(), rank_for_errors = rank;
  const int cap = 16, width = 256;
  const uint64_t seed = test_seed("mailbox survives a failure");
  LamportMailbox::Options options;
  options.spin_timeout_s = timeout_s;
  Stream stream;
  GuardedBuffer src(cap * width * 2), out(size_t(cap) * tp * width * 2);
  std::vector<uint16_t> host_src(size_t(cap) * width), host_out(size_t(cap) * tp * width);
  auto good_calls = [&](LamportMailbox& mb, int calls) {
    for (int k = 0; k < calls; ++k) {
      const int b = 1 + (k * 5) % cap;
      fill_src(host_src.data(), seed, k, rank, b, width);
      src.upload(host_src.data(), size_t(b) * width * 2);
      out.fill(0xff);
      mb.publish(src.get(), b, stream);
      mb.gather(out.get(), b, stream);
      mb.synchronize(stream);
      out.download(host_out.data(), out.bytes());
      check_rows(host_out.data(), cap, seed, k, b, tp, width, rank_for_errors);
    }
  };
  {
    LamportMailbox mb(group, tp, rank, cap, width, device, options);
    good_calls(mb, 5);
    group.barrier();
    out.fill(0x11);
    const auto start = std::chrono::steady_clock::now();
    mb.gather(out.get(), 4, stream);  // no publish
    std::string error;
    try {
      mb.synchronize(stream);
    } catch (const RuntimeError& e) {
      error = e.what();
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    MB_REQUIRE(error.find("no publish since the last consume") != std::string::npos, "second gather: '", error,
               "'");
    MB_REQUIRE(waited < timeout_s / 2, "the second gather's error took ", waited, " s (timeout ", timeout_s, ")");
    out.download(host_out.data(), out.bytes());
    for (size_t i = 0; i < host_out.size(); ++i)
      MB_REQUIRE(host_out[i] == (i < size_t(4) * tp * width ? 0xffff : 0x1111), "second gather: output element ",
                 i, " = 0x", std::hex, host_out[i]);
    if (rank == 0) std::printf("gather without publish, surviving: %s (%.3f s)\n", error.c_str(), waited);
    group.barrier();
  }
  LamportMailbox mb(group, tp, rank, cap, width, device, options);
  good_calls(mb, 4);
  mb.barrier();
}

// What rank 0's outcome must show: the error within the timeout, naming call
// 4's stage (4 % 3) and one of the skipping sources 1..tp-1 (the first
// consumer thread to give up reports); any of its 3 rows.
inline void expect_timeout_outcome(const TimeoutOutcome& o, double timeout_s, int tp = 2) {
  std::printf("timeout error after %.3f s: %s\n", o.waited_s, o.error.c_str());
  EXPECT_NE(o.error.find("spin timeout on rank 0"), std::string::npos) << o.error;
  bool named = false;
  for (int q = 1; q < tp; ++q)
    named = named || o.error.find("stage 1, source " + std::to_string(q) + ", row ") != std::string::npos;
  EXPECT_TRUE(named) << "no skipping source (1.." << tp - 1 << ") named: " << o.error;
  EXPECT_GE(o.waited_s, timeout_s);
  EXPECT_LT(o.waited_s, timeout_s + 10.0);
}

// The output of a call that failed by name (out was filled with 0x11 before
// it): rows [made, cap) untouched; in rows [0, made) the columns of every
// source for which `poisoned(q)` holds are poison, and those of the other
// sources (whose claims matched) hold their rows (zeros here) or the
// poison, as their threads took them before or after the failure was seen.
template <typename Poisoned>
void check_failed_call_output(const GuardedBuffer& out, int cap, int tp, int width, int made, Poisoned poisoned,
                              int rank_for_errors) {
  std::vector<uint16_t> host_out(size_t(cap) * tp * width);
  out.download(host_out.data(), out.bytes());
  for (int row = 0; row < cap; ++row)
    for (int c = 0; c < tp * width; ++c) {
      const uint16_t got = host_out[size_t(row) * tp * width + c];
      const int q = c / width;
      const bool ok = row >= made ? got == 0x1111 : poisoned(q) ? got == 0xffff : got == 0xffff || got == 0;
      MB_REQUIRE(ok, "output row ", row, " col ", c, " (source ", q, ") = 0x", std::hex, got);
    }
}

// Ranks that disagree on b (a caller's bug): rank 0 runs b = 2, the others
// b = 4. Every rank must end at once (well within the timeout) in the named
// protocol error, from the claims: rank 0's names a peer's b = 4, every
// other rank's rank 0's b = 2. Returns this rank's error.
inline std::string ranks_disagree_on_b(Group& group, int device, double timeout_s) {
  const int rank = group.rank(), tp = group.size(), rank_for_errors = rank, cap = kMisuseCap, width = kMisuseWidth;
  MisuseSetup set(group, device, timeout_s, 3);
  auto& [mb, stream, src, out] = set;
  std::string error;
  out.fill(0x11);
  const auto start = std::chrono::steady_clock::now();
  const int b = rank == 0 ? 2 : 4;
  try {
    mb.publish(src.get(), b, stream);
    mb.gather(out.get(), b, stream);
    mb.synchronize(stream);
  } catch (const RuntimeError& e) {
    error = e.what();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MB_REQUIRE(!error.empty(), "a call with b differing across ranks ended without an error");
  const std::string want = rank == 0 ? "published stage 0 with b = 4" : "rank 0 published stage 0 with b = 2";
  MB_REQUIRE(error.find("protocol error on rank " + std::to_string(rank)) != std::string::npos &&
                 error.find(want) != std::string::npos && error.find("destroy this mailbox") != std::string::npos,
             "'", error, "' (want '", want, "')");
  MB_REQUIRE(waited < timeout_s / 2, "the error took ", waited, " s (timeout ", timeout_s, ")");
  // Nothing of a differing source came out. Sources that claimed this
  // rank's b: its own, and at tp 4 the other b = 4 ranks.
  check_failed_call_output(out, cap, tp, width, b, [&](int q) { return (q == 0) != (rank == 0); }, rank_for_errors);
  // The mailbox stays failed: the next call is refused on the host.
  bool refused = false;
  try {
    mb.publish(src.get(), b, stream);
  } catch (const RuntimeError&) {
    refused = true;
  }
  MB_REQUIRE(refused, "a publish after the failure was not refused");
  group.barrier();  // no peer still writes into this rank's copy
  return error;
}

// A second publish of one call (its stores may replace rows a peer already
// took): the publishing rank's next host check names it, and every peer
// fails at that call through rank 0's claim, at once, with poison where rank
// 0's rows would be. Rank 0 publishes twice before the peers start the call,
// so that no peer can take the first publish's claim.
inline std::string second_publish_fails_every_rank(Group& group, int device, double timeout_s) {
  const int rank = group.rank(), tp = group.size(), rank_for_errors = rank, cap = kMisuseCap, width = kMisuseWidth;
  MisuseSetup set(group, device, timeout_s, 3);
  auto& [mb, stream, src, out] = set;
  out.fill(0x11);
  std::string error;
  double waited = 0;
  if (rank == 0) {
    try {
      mb.publish(src.get(), 3, stream);
      mb.publish(src.get(), 3, stream);
      mb.synchronize(stream);
    } catch (const RuntimeError& e) {
      error = e.what();
    }
    group.barrier();
  } else {
    group.barrier();
    const auto start = std::chrono::steady_clock::now();
    try {
      mb.publish(src.get(), 3, stream);
      mb.gather(out.get(), 3, stream);
      mb.synchronize(stream);
    } catch (const RuntimeError& e) {
      error = e.what();
    }
    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const std::string want = rank == 0 ? "was published twice" : "rank 0's mailbox had failed";
  MB_REQUIRE(error.find(want) != std::string::npos, "'", error, "' (want '", want, "')");
  MB_REQUIRE(waited < timeout_s / 2, "the error took ", waited, " s (timeout ", timeout_s, ")");
  // A peer's columns of rank 0 are poison. Rank 0 ran no consumer.
  check_failed_call_output(out, cap, tp, width, rank == 0 ? 0 : 3, [](int q) { return q == 0; }, rank_for_errors);
  group.barrier();
  return error;
}

}  // namespace spark_decode::testing::mailbox_tests
