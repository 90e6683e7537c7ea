// Thread-block-cluster barriers, split into arrive and wait so that a kernel
// can arrive early and wait only where it must.
//
// Why split: distributed shared memory may only be touched once every CTA of
// the cluster has started (a CTA that has not started has no shared memory
// yet). Arriving at kernel entry and waiting just before the first remote
// store costs nothing: the wait is long satisfied by then.
#pragma once

namespace spark_decode::ptx {

// Arrive without ordering any memory access (the "all CTAs started" barrier).
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

// Arrive, releasing this thread's earlier shared::cluster stores to the CTAs
// that wait on the same phase.
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}

// Wait for every thread of the cluster to arrive at the current phase, then
// acquire what they released.
__device__ __forceinline__ void cluster_wait_acquire() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

}  // namespace spark_decode::ptx
