// The streamed MMA pooler GEMM: out[m, n] = x[m, k] @ W[n, k]^T for m <= 16,
// BF16 in and out, FP32 accumulation, on tensor cores, with the weights
// streamed by the copy engine through a ring of shared-memory stages.
//
// Why a third engine: the register engines (skinny, and the Unpooler's MMA
// engine) can only have in flight what their registers hold, one wave of
// CTAs at a time, and every wave ends with the memory stream drained
// (bench/NOTES.md); the MMA engine also re-reads x once per 32 weight rows,
// which at m = 16 makes the L2, not HBM, its limit. Here persistent CTAs, one
// per SM, keep a ring of ~32 KiB stages in flight from start to end, filled
// before griddepcontrol.wait as well, and read x once, into shared memory.
// SPEC §2.3 lets any faster kernel serve a pooler batch; the Unpooler keeps
// SPEC §2.1's register design.
//
// Shape: clusters of S CTAs over K, grid (C, S), cluster (1, S, 1), C the
// clusters the GPU holds at once (a second wave of clusters would double
// the time). Cluster c owns the `per` groups of G weight rows [c per,
// (c + 1) per) (the last may own fewer); its rank s owns the K slice
// [s k / S, (s + 1) k / S) of them. Each stage is one group's slice:
// G rows x k / S columns, G = 16384 / (k / S), one contiguous bulk copy per
// row. The last warp produces: its lane 0 walks the groups, waits until a
// ring slot is free and has the copy engine fill it; it never waits for the
// previous grid (weights are parameters). Compute warp w takes stages w,
// w + W, ... whole (no reduction between warps), after thread 0 has had x's
// K slice (rows < m) copied into shared memory once, after the wait. The
// ring depth is a multiple of W, so that every slot has one consumer: a
// warp waiting on a slot's phase p + 1 while another warp's phase p is still
// open would see the wrong phase complete (an mbarrier only tells parity).
//
// The MMA is mma.sync.m16n8k16 with A = 16 tokens of x and B = 8 weight
// rows (n8: a stage is G / 8 n-tiles). The K permutation (as the
// Unpooler's): within each 64 columns, lane (g, t) reads 16-byte chunks 2t
// and 2t + 1 of tokens g, g + 8 and of weight row g, and feeds words 2h,
// 2h + 1 of chunk 2t + v to MMA step 2v + h as the logical K slots (2t,
// 2t + 1) and (2t + 8, 2t + 9): A and B give the same physical K to the same
// slot, so the product is the GEMM's. With rows padded by 16 bytes the eight
// rows a quarter-warp reads fall in different banks.
//
// Determinism (SPEC §5): each output sums, per CTA, its MMA steps in K order
// into accumulator set (step % 4), the sets added in order; then the S ranks'
// partials in rank order (group i of a cluster is reduced by rank i % S,
// which receives every rank's fragment of it over distributed shared
// memory). The order depends on (k, S) only. An MMA's token rows never mix,
// so a row's result does not depend on the batch; at m <= 8 tokens 8-15 are
// fed zeros, at m > 8 rows m..15 of x in shared memory hold whatever was
// there: either way they reach only output rows that are not stored.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/common/trace.cuh"
#include "kernels/mailbox/mailbox_device.cuh"
#include "kernels/pooler/stream_config.h"

namespace spark_decode::kernels {

struct StreamGemmArgs {
  const __nv_bfloat16* w;  // [n, k]
  const __nv_bfloat16* x;  // [m, k]
  __nv_bfloat16* out;      // [m, n]
  int n, k, m;
  int stages;     // ring depth, kStreamMinStages..kStreamMaxStages, a multiple of the compute warps
  int per;        // row groups per cluster
  int owned_max;  // ceil(per / S): groups one rank reduces at most
  mailbox_dev::PublishTarget publish;  // the fused publish (as PoolerGemmArgs::publish)
};

namespace stream {
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
}  // namespace stream

// G rows per group (8: k / S = 2048; 16: k / S = 1024), TILE tokens (8, 16).
template <int G, int TILE>
__global__ void __launch_bounds__(9 * 32, 1) stream_gemm_kernel(const StreamGemmArgs a) {
  SPARK_TRACE_CTA(kSkinnyGemm);
  constexpr int kKs = kStreamStageElems / G;  // K slice
  constexpr int kNt = G / 8;                  // n8 tiles per group
  constexpr int kRow = stream_row_bytes(kKs);
  constexpr int kStage = stream_stage_bytes(kKs);
  constexpr int kAccs = 4;
  static_assert(G == 8 || G == 16);
  static_assert(TILE == 8 || TILE == 16);

  extern __shared__ __align__(16) unsigned char smem[];
  const int warps = blockDim.x / 32 - 1;  // compute warps
  const int splits = gridDim.y, split = blockIdx.y;  // cluster (1, S, 1): the rank is blockIdx.y
  const int groups = a.n / G;
  const int g0 = blockIdx.x * a.per;
  const int count = max(0, min(a.per, groups - g0));  // this cluster's groups (the same on every rank)
  const int owned = split < count ? (count - split + splits - 1) / splits : 0;
  const int k0 = split * kKs;
  const int ring = a.stages;

  const uint32_t bars = ptx::smem_addr(smem);
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (kStreamMaxStages + s); };
  const uint32_t x_bar = bars + 8u * (2 * kStreamMaxStages);
  const uint32_t red_bar = x_bar + 8u;
  __nv_bfloat16* const y_tile = reinterpret_cast<__nv_bfloat16*>(smem + stream_y_offset());
  float* const partials = reinterpret_cast<float*>(smem + stream_partials_offset(kKs, a.owned_max));
  unsigned char* const xs = smem + stream_x_offset(kKs, splits, a.owned_max);
  unsigned char* const ring_ptr = smem + stream_ring_offset(kKs, splits, a.owned_max, TILE);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ring; ++s) {
      ptx::mbarrier_init(full(s), 1);
      ptx::mbarrier_init(empty(s), 1);  // the one warp that consumed the stage
    }
    ptx::mbarrier_init(x_bar, 1);
    // This rank reduces `owned` groups: every rank's fragments of each.
    ptx::mbarrier_init(red_bar, 1);
    ptx::mbarrier_arrive_expect_tx(red_bar, splits * owned * kNt * 512);
    // The copy engine and the other ranks' st.async complete on these.
    ptx::fence_mbarrier_init_cluster();
  }
  __syncthreads();
  ptx::cluster_arrive_relaxed();  // "every CTA has started" (see ptx.cuh)

  if (warp == warps) {
    // The producer. Stage i uses slot i % ring for the (i / ring)-th time;
    // from the second use on, its consumer must have released it (phase
    // (i / ring) - 1 of `empty`).
    ptx::griddep_launch_dependents();  // this warp never waits: do not hold the next grid back
    if (lane == 0) {
      const uint64_t policy = ptx::l2_policy_evict_first();
      for (int i = 0; i < count; ++i) {
        const int s = i % ring;
        if (i >= ring) ptx::mbarrier_wait_parity(empty(s), ((i / ring) - 1) & 1);
        ptx::mbarrier_arrive_expect_tx(full(s), G * kKs * 2);
        const __nv_bfloat16* src = a.w + static_cast<size_t>(g0 + i) * G * a.k + k0;
        const uint32_t dst = ptx::smem_addr(ring_ptr + s * kStage);
#pragma unroll
        for (int r = 0; r < G; ++r)
          ptx::bulk_copy_g2s(dst + r * kRow, src + static_cast<size_t>(r) * a.k, kKs * 2, full(s), policy);
      }
    }
    __syncwarp();
    // Complete the cluster phase this warp arrived at, then leave: every copy
    // completes on a barrier a compute warp waits on before the CTA ends.
    ptx::cluster_wait_acquire();
    return;
  }

  // x comes from the previous grid.
  ptx::griddep_wait();
  SPARK_TRACE_WAITED();
  ptx::griddep_launch_dependents();
  const mailbox_dev::PublishTarget& pub = a.publish;
  const int items = a.m * owned * kNt;  // 16-byte output vectors this CTA stores
  uint32_t stage = 0;
  if (pub.mode != mailbox_dev::PublishTarget::kNone && threadIdx.x < items)
    stage = mailbox_dev::publish_stage(pub, threadIdx.x == 0 && blockIdx.x == 0 && split == 0);
  if (threadIdx.x == 0) {
    const uint64_t keep = ptx::l2_policy_evict_last();
    ptx::mbarrier_arrive_expect_tx(x_bar, a.m * kKs * 2);
    for (int r = 0; r < a.m; ++r)
      ptx::bulk_copy_g2s(ptx::smem_addr(xs + r * kRow), a.x + static_cast<size_t>(r) * a.k + k0, kKs * 2, x_bar,
                         keep);
  }

  const int g = lane >> 2, t = lane & 3;
  ptx::cluster_wait_acquire();  // every rank has started and armed red_bar
  ptx::mbarrier_wait_parity(x_bar, 0);
  const unsigned char* const xa = xs + g * kRow;  // token g; token g + 8 is 8 rows on

  for (int i = warp; i < count; i += warps) {
    const int s = i % ring;
    float acc[kAccs][kNt][4];
#pragma unroll
    for (int c = 0; c < kAccs; ++c)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[c][nt][e] = 0.0f;
    ptx::mbarrier_wait_parity(full(s), (i / ring) & 1);
    const unsigned char* const wg = ring_ptr + s * kStage + g * kRow;  // weight row g of n-tile 0
#pragma unroll 4
    for (int blk = 0; blk < kKs / 64; ++blk) {
      uint4 xv[2][2], wv[kNt][2];
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const int at = blk * 128 + (2 * t + v) * 16;
        xv[0][v] = *reinterpret_cast<const uint4*>(xa + at);
        xv[1][v] = TILE == 16 ? *reinterpret_cast<const uint4*>(xa + 8 * kRow + at) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) wv[nt][v] = *reinterpret_cast<const uint4*>(wg + nt * 8 * kRow + at);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int v = j >> 1, h = j & 1;
        const uint32_t af[4] = {stream::word(xv[0][v], 2 * h), stream::word(xv[1][v], 2 * h),
                                stream::word(xv[0][v], 2 * h + 1), stream::word(xv[1][v], 2 * h + 1)};
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt)
          ptx::mma_m16n8k16_bf16(acc[j][nt], af, stream::word(wv[nt][v], 2 * h), stream::word(wv[nt][v], 2 * h + 1));
      }
    }
    // This warp is done reading slot s (mbarrier.arrive releases its reads).
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(empty(s));

    // The group's partial over this K slice, to its reducing rank's slot
    // [split][i / S] (st.async completes on that rank's red_bar; our own rank
    // included, through the same path).
    const int owner = i % splits, local = i / splits;
    const uint32_t remote_bar = ptx::map_cluster_addr(red_bar, owner);
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) p[e] = ((acc[0][nt][e] + acc[1][nt][e]) + acc[2][nt][e]) + acc[3][nt][e];
      const int slot = ((split * a.owned_max + local) * kNt + nt) * 128 + lane * 4;
      ptx::st_async_v4(ptx::map_cluster_addr(ptx::smem_addr(partials + slot), owner), p[0], p[1], p[2], p[3],
                       remote_bar);
    }
  }
  // A rank that reduces nothing may leave (st.async took its registers).
  if (owned == 0) return;
  ptx::mbarrier_wait_parity(red_bar, 0);

  // Element j of the owned fragments ([local][nt][lane][e], as the lanes held
  // them: tokens (lane / 4) + 8 (e / 2), rows nt 8 + 2 (lane % 4) + e % 2):
  // the S partials in rank order, rounded once.
  const int threads = warps * 32;
  const int y_stride = a.owned_max * G;
  for (int j = threadIdx.x; j < owned * kNt * 128; j += threads) {
    const int e = j & 3, ln = (j >> 2) & 31, nt = (j >> 7) % kNt, lt = (j >> 7) / kNt;
    const int token = (ln >> 2) + (e >> 1) * 8;
    if (token >= a.m) continue;
    float sum = partials[j];
    for (int r = 1; r < splits; ++r) sum += partials[r * a.owned_max * kNt * 128 + j];
    y_tile[token * y_stride + lt * G + nt * 8 + 2 * (ln & 3) + (e & 1)] = __float2bfloat16_rn(sum);
  }
  ptx::named_barrier_sync(1, threads);

  // Item (token, local group, n-tile): 8 features of one token, one 16-byte vector.
  for (int item = threadIdx.x; item < items; item += threads) {
    const int token = item / (owned * kNt), c = item % (owned * kNt), lt = c / kNt, nt = c % kNt;
    const int col = (g0 + lt * splits + split) * G + nt * 8;
    const uint4 y = *reinterpret_cast<const uint4*>(y_tile + token * y_stride + lt * G + nt * 8);
    *reinterpret_cast<uint4*>(a.out + static_cast<size_t>(token) * a.n + col) = y;
    if (pub.mode == mailbox_dev::PublishTarget::kNone) continue;
    // The fused publish: exactly what the mailbox's own publisher stores.
    mailbox_dev::store_to_all(pub.copies, pub.layout.tp, pub.rank, pub.layout.offset(stage, pub.rank, token, col),
                              mailbox_dev::publish_vec(y));
  }
}

}  // namespace spark_decode::kernels
