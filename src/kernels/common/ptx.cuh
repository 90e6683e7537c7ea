// The PTX the kernels use, each wrapper named by what it guarantees.
//
// Every memory-ordering instruction of the library lives here, so that a
// reader can check the protocol's orderings in one place. The rules:
//   *_relaxed_*   atomic at that scope, no ordering with other accesses;
//   *_acquire_*   later accesses of this thread cannot move before it;
//   *_release_*   earlier accesses of this thread cannot move after it;
//   *_sys         scope .sys: other GPUs (peer-mapped memory over NVLink)
//                 and the host observe the access;
//   *_gpu         scope .gpu: this device only.
// Plain loads and stores (ld_stream_*) carry no ordering at all.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

namespace spark_decode::ptx {

// ---- programmatic dependent launch ---------------------------------------
// Both are no-ops when the kernel was launched without the PDL attribute, so
// kernels call them unconditionally.

// Blocks until every grid this one depends on has completed and its memory
// is visible. Nothing this grid reads that a predecessor writes may be read
// before it.
__device__ __forceinline__ void griddep_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

// Lets the dependent grid start launching (its pre-wait prologue may then
// overlap our tail). Has no effect on memory visibility: the dependent's
// griddep_wait still waits for this whole grid to finish.
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// ---- streaming loads -----------------------------------------------------

// An L2 policy that marks lines first to leave L2 (streamed weights).
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// 16 bytes of read-only data read once (weights): not kept in L1, and first
// to leave L2 under `policy`, so that weights streaming past do not evict the
// small activations every CTA re-reads. Only for data no grid writes while
// this one runs. A coherent load on purpose, not ld.global.nc: ptxas moves
// griddepcontrol.wait (SASS ACQBULK) above every .nc load, so weights read
// through the non-coherent path are not in flight before the previous grid
// completes, which defeats programmatic dependent launch; coherent loads keep
// their place. tools/check_sass.py (a CPU test) checks the built code.
__device__ __forceinline__ uint4 ld_stream_v4(const void* ptr, uint64_t policy) {
  uint4 v;
  asm volatile("ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr), "l"(policy));
  return v;
}

// 16 bytes of weights copied into this thread's shared memory without a
// register (cp.async, Ampere's LDGSTS): the copy stays in flight while the
// thread computes, so a ring of stages keeps the weight stream going through
// the MMAs. Same L2 policy as ld_stream_v4. Completes in commit groups:
// cp_async_commit() closes one, cp_async_wait<n>() waits until at most n of
// this thread's groups are pending; other threads see the bytes after a
// __syncwarp() (or a CTA barrier) that follows the copying thread's wait.
__device__ __forceinline__ void cp_async_stream_16(uint32_t dst, const void* src, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "l"(policy)
               : "memory");
}
// 16 bytes of activations (written by the previous grid: only after
// griddep_wait) copied the same way, with the default L2 policy: every CTA
// reads them, so they should stay in L2.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// 16 bytes of shared memory. Volatile asm with a memory clobber because
// cp.async writes are invisible to the compiler: a plain load could be
// merged with an earlier one or hoisted above cp_async_wait.
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}

// 16 bytes written by an earlier grid (activations). A plain C++ load, not
// asm: the compiler may batch and hoist these (volatile asm loads would be
// issued one dependent MMA at a time), yet never above griddep_wait, whose
// memory clobber orders every real memory access.
__device__ __forceinline__ uint4 ld_v4(const void* ptr) {
  return *static_cast<const uint4*>(ptr);
}

// ---- memory-ordering wrappers (system scope: peers over NVLink) -----------

__device__ __forceinline__ uint32_t ld_relaxed_sys_u32(const uint32_t* ptr) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}

__device__ __forceinline__ uint32_t ld_acquire_sys_u32(const uint32_t* ptr) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}

// 16 bytes, each 4-byte word single-copy atomic at system scope: a poller
// never sees a torn 32-bit word (a torn 16-byte vector is fine: it checks
// every BF16 lane for the sentinel).
__device__ __forceinline__ uint4 ld_volatile_v4(const void* ptr) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr)
               : "memory");
  return v;
}

// 8 bytes, each 4-byte word single-copy atomic at system scope (a mailbox
// claim: each of its two words names the call on its own).
__device__ __forceinline__ uint2 ld_volatile_v2(const void* ptr) {
  uint2 v;
  asm volatile("ld.volatile.global.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(ptr) : "memory");
  return v;
}

// Compare-and-swap, relaxed, system scope: returns the old value.
__device__ __forceinline__ uint32_t cas_relaxed_sys_u32(uint32_t* ptr, uint32_t expected, uint32_t desired) {
  uint32_t old;
  asm volatile("atom.relaxed.sys.global.cas.b32 %0, [%1], %2, %3;"
               : "=r"(old)
               : "l"(ptr), "r"(expected), "r"(desired)
               : "memory");
  return old;
}

__device__ __forceinline__ void st_relaxed_sys_u32(uint32_t* ptr, uint32_t v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(ptr), "r"(v) : "memory");
}

// 16 bytes to (possibly peer) global memory, each word written once: the
// poller tests every lane, so no ordering between the words is needed.
__device__ __forceinline__ void st_volatile_v4(void* ptr, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(ptr), "r"(v.x),
               "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// 8 bytes to (possibly peer) global memory, each word written once (a
// mailbox claim: the reader checks each word on its own).
__device__ __forceinline__ void st_volatile_v2(void* ptr, uint2 v) {
  asm volatile("st.volatile.global.v2.u32 [%0], {%1,%2};" ::"l"(ptr), "r"(v.x), "r"(v.y) : "memory");
}

// 4 bytes (two BF16 lanes) to (possibly peer) global memory: the size of
// the pollers' elements (mailbox_device.cuh, ordering 3).
__device__ __forceinline__ void st_volatile_u32(void* ptr, uint32_t v) {
  asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(ptr), "r"(v) : "memory");
}

__device__ __forceinline__ void st_v4(void* ptr, uint4 v) {
  asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(ptr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

// Orders this thread's earlier memory accesses before its later ones as
// seen from every GPU and the host.
__device__ __forceinline__ void fence_acq_rel_sys() {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
}

__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- tensor cores -----------------------------------------------------------

// D = A(16x16, row) * B(16x8, col) + D, BF16 in, FP32 accumulate.
// Fragment ownership for lane (g = lane / 4, t = lane % 4):
//   a[0]: A[g][2t..2t+1]     a[1]: A[g+8][2t..2t+1]
//   a[2]: A[g][2t+8..2t+9]   a[3]: A[g+8][2t+8..2t+9]
//   b[0]: B[2t..2t+1][g]     b[1]: B[2t+8..2t+9][g]
//   d[0..1]: D[g][2t..2t+1]  d[2..3]: D[g+8][2t..2t+1]
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4],
                                                  uint32_t b0, uint32_t b1) {
  // Not volatile: a pure register operation the compiler may schedule
  // around the loads.
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace spark_decode::ptx

// ---- NVFP4 conversions and fast reciprocal (the Pooler) ----------------------
// The exact instructions vLLM's scaled_fp4_quant uses, so that our kernels
// round exactly as it does (docs/design.md, "Exact semantics"). Composed into
// the NVFP4 steps in kernels/nvfp4/nvfp4.cuh. Not volatile: pure register
// operations the compiler may schedule freely.
namespace spark_decode::ptx {

// 1/a to about 1 ulp (not correctly rounded); subnormal inputs and results
// flush to sign-preserving zero (.ftz): rcp(subnormal) is +-Inf.
__device__ __forceinline__ float rcp_approx_ftz_f32(float a) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}

// |a| (abs.f32: clears the sign bit, NaN stays NaN).
__device__ __forceinline__ float abs_f32(float a) {
  float r;
  asm("abs.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}

// max(a, b) (max.f32: a NaN operand yields the other operand).
__device__ __forceinline__ float max_f32(float a, float b) {
  float r;
  asm("max.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// Two floats to two E2M1 codes in one byte, round to nearest even,
// saturating to +-6: `hi` in bits 4..7, `lo` in bits 0..3. The instruction
// exists only on the family-specific Blackwell targets (sm_100a and later,
// as cuda_fp4.h tests it); elsewhere (sm_90a) kernels/nvfp4/e2m1.h
// computes the same code in software (kernels/nvfp4/nvfp4.cuh chooses).
#if defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000 && \
    __CUDA_ARCH_FAMILY_SPECIFIC__ < 1300
#define SPARK_PTX_HAS_CVT_E2M1 1
#else
#define SPARK_PTX_HAS_CVT_E2M1 0
#endif
#if SPARK_PTX_HAS_CVT_E2M1
__device__ __forceinline__ uint32_t cvt_rn_satfinite_e2m1x2_f32(float hi, float lo) {
  uint32_t r;
  asm("{\n"
      "  .reg .b8 byte0;\n"
      "  cvt.rn.satfinite.e2m1x2.f32 byte0, %1, %2;\n"
      "  cvt.u32.u8 %0, byte0;\n"
      "}\n"
      : "=r"(r)
      : "f"(hi), "f"(lo));
  return r;
}
#endif

// Two floats to two E4M3 values (round to nearest even, saturating to
// +-448, NaN to NaN): `hi` in bits 8..15, `lo` in bits 0..7.
__device__ __forceinline__ uint32_t cvt_rn_satfinite_e4m3x2_f32(float hi, float lo) {
  uint32_t r;
  asm("{\n"
      "  .reg .b16 pair;\n"
      "  cvt.rn.satfinite.e4m3x2.f32 pair, %1, %2;\n"
      "  cvt.u32.u16 %0, pair;\n"
      "}\n"
      : "=r"(r)
      : "f"(hi), "f"(lo));
  return r;
}

// Two E4M3 values (bits 0..7 and 8..15 of `pair`) to two halves, exactly
// (every E4M3 value is an FP16 value): the low byte's half in bits 0..15.
__device__ __forceinline__ uint32_t cvt_rn_f16x2_e4m3x2(uint32_t pair) {
  uint32_t r;
  asm("{\n"
      "  .reg .b16 pair16;\n"
      "  cvt.u16.u32 pair16, %1;\n"
      "  cvt.rn.f16x2.e4m3x2 %0, pair16;\n"
      "}\n"
      : "=r"(r)
      : "r"(pair));
  return r;
}

// The low half of a half2 register to float (exact).
__device__ __forceinline__ float cvt_f32_f16_lo(uint32_t h2) {
  float r;
  asm("{\n"
      "  .reg .b16 lo, hi;\n"
      "  mov.b32 {lo, hi}, %1;\n"
      "  cvt.f32.f16 %0, lo;\n"
      "}\n"
      : "=f"(r)
      : "r"(h2));
  return r;
}

}  // namespace spark_decode::ptx

// ---- thread-block clusters: split barriers, mbarriers, st.async ------------
//
// Why split arrive / wait: distributed shared memory may only be touched once
// every CTA of the cluster has started (a CTA that has not started has no
// shared memory yet). Arriving at kernel entry and waiting just before the
// first remote store costs nothing: the wait is long satisfied by then.

namespace spark_decode::ptx {

// Arrive without ordering any memory access (the "all CTAs started" barrier).
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
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
// receiver's mbarrier. No fence: the mbarrier's transaction count orders the
// data for the receiver. The receiver must not exit before its mbarrier has
// every byte (its shared memory is the destination); a sender may leave once
// its stores are issued (st.async reads its registers at issue, as any store
// does). The unpooler relies on that to free its senders early.

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

// One arrival on this CTA's mbarrier (release: this thread's earlier shared
// memory reads are done before the phase can complete).
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// `bytes` (a multiple of 16, 16-byte aligned at both ends) of global memory
// into this CTA's shared memory by the copy engine, completing as
// transactions on `bar`, under the L2 eviction `policy`. The copy runs in the
// async proxy: never for what this grid's predecessor wrote before
// griddep_wait.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                              uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
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
