// Thread-block-cluster barriers, split into arrive and wait so that a kernel
// can arrive early and wait only where it must.
//
// Why split: distributed shared memory may only be touched once every CTA of
// the cluster has started (a CTA that has not started has no shared memory
// yet). Arriving at kernel entry and waiting just before the first remote
// store costs nothing: the wait is long satisfied by then.
#pragma once

#include <cstdint>

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

namespace spark_decode::ptx {

// ---- mbarrier + st.async: one-way pushes into another CTA's shared memory ---
// A receiver inits an mbarrier, announces the bytes it expects, and waits;
// senders push with st.async, each store completing its bytes on the
// receiver's mbarrier. No fence and no second cluster barrier: the
// mbarrier's transaction count is the only synchronisation, and a sender may
// exit as soon as it has issued its stores.

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The shared::cluster address of `local_addr` in the CTA of cluster rank `rank`.
__device__ __forceinline__ uint32_t map_cluster_addr(uint32_t local_addr, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local_addr), "r"(rank));
  return remote;
}

__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
}

// Makes an mbarrier's initialisation visible to the other CTAs of the cluster
// (before the cluster barrier that lets them use it).
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival, plus `bytes` more expected on the current phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

// Spins until the phase of parity `parity` has completed; acquires what the
// completing stores wrote.
__device__ __forceinline__ void mbarrier_wait_parity(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      "  .reg .pred done;\n"
      "WAIT_%=:\n"
      "  mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "  @!done bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// 16 bytes into another CTA's shared memory, completing on its mbarrier.
__device__ __forceinline__ void st_async_v4(uint32_t remote_addr, float a, float b, float c, float d,
                                            uint32_t remote_bar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
          remote_addr),
      "f"(a), "f"(b), "f"(c), "f"(d), "r"(remote_bar)
      : "memory");
}

}  // namespace spark_decode::ptx
