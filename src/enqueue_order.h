// EnqueueOrder: where ranks share a GPU, every rank's publisher of a mailbox
// call is enqueued before any rank's consumer of that call (docs/design.md,
// "Ranks sharing a GPU").
//
// NOTES: a GPU runs its streams through a few hardware work queues
// (CUDA_DEVICE_MAX_CONNECTIONS, default 8), so two ranks' streams on one GPU
// may share one. A queue issues its work in order, and a kernel whose stream
// predecessor has not completed holds it. If rank r's consumer of call k and
// then r's next kernel stand in one queue before peer q's publisher of call
// k, the next kernel holds the queue until the consumer completes, which
// needs q's publisher behind it: the consumer spins until its timeout. With
// every publisher of call k enqueued before any consumer of call k, every
// kernel waits only on work enqueued before it (its stream's earlier kernels,
// its queue's earlier entries and, for a consumer, the publishers of its
// call; publishers wait on no peer), so by induction over the enqueue order
// all of it completes.
//
// The host can order only what it enqueues: the kernels of a replayed CUDA
// graph enter the queues at the replay, in an order no rank controls.
//
// The counters live in POSIX shared memory (ranks that share a GPU share a
// host, as threads or as processes): one per rank, the publishers it has
// enqueued.
#pragma once

#include <chrono>
#include <cstdint>

#include "spark_decode/group.h"

namespace spark_decode::detail {

class EnqueueOrder {
 public:
  // Collective over `group` (every rank constructs one). A consumer's wait
  // gives up after `timeout`.
  EnqueueOrder(Group& group, std::chrono::nanoseconds timeout);
  ~EnqueueOrder();
  EnqueueOrder(const EnqueueOrder&) = delete;
  EnqueueOrder& operator=(const EnqueueOrder&) = delete;

  // After this rank enqueued (or captured) a publisher of its next call.
  void published();
  // Before this rank enqueues (or captures) a consumer of its next call:
  // waits until every peer has enqueued its publisher of that call, unless
  // `capturing` (a capture launches nothing) or this rank published nothing
  // since its last consumer (the consumer fails at once on the device).
  // Returns false if a peer's publisher did not come within the timeout:
  // the consumer is then enqueued anyway and names the missing peer when
  // its own wait ends.
  bool before_consume(bool capturing);

  // The publishers rank q has enqueued (for tests).
  uint64_t published_by(int q) const;

 private:
  struct Counters;
  int rank_, size_;
  std::chrono::nanoseconds timeout_;
  Counters* counters_ = nullptr;  // mapped shared memory
  uint64_t consumed_ = 0;         // consumers this rank enqueued
};

}  // namespace spark_decode::detail
