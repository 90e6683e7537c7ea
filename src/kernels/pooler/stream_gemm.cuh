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
// Shape: S CTAs over K per group of 8 weight rows, grid (C, S), cluster
// (1, S, 1) when S > 1, C the clusters (CTAs at S = 1) the GPU holds at once
// (a second wave would double the time). Cluster c owns the `per` groups
// [c per, (c + 1) per) (the last may own fewer); its rank s owns the K slice
// [s k / S, (s + 1) k / S) of them, streamed as k / S / 2048 stages of
// [8 rows][2048 columns] per group, one contiguous bulk copy per row. The
// last warp produces: its lane 0 walks the stages, waits until a ring slot
// is free and has the copy engine fill it; it never waits for the previous
// grid (weights are parameters). Each of the 4 compute warps takes a
// quarter of every stage's columns into registers (64 per lane) and
// releases the slot at once, so a slot is refilled while its MMAs run: the
// ring stays in flight (a version in which one warp computed a whole stage
// out of shared memory held each slot ~0.7 us and streamed 20% slower,
// bench/NOTES.md). x's K slice (rows < m) is copied into shared memory once,
// after the wait.
//
// The MMA is mma.sync.m16n8k16 with A = 16 tokens of x and B = 8 weight
// rows (n8). The K permutation (as the
// Unpooler's): within each 64 columns, lane (g, t) reads 16-byte chunks 2t
// and 2t + 1 of tokens g, g + 8 and of weight row g, and feeds words 2h,
// 2h + 1 of chunk 2t + v to MMA step 2v + h as the logical K slots (2t,
// 2t + 1) and (2t + 8, 2t + 9): A and B give the same physical K to the same
// slot, so the product is the GEMM's. With rows padded by 16 bytes the eight
// rows a quarter-warp reads fall in different banks.
//
// Determinism (SPEC §5): each output sums, per warp, its MMA steps in K
// order into accumulator set (step % 4), the sets added in order; then the
// 4 S warp partials in K order (rank by rank, warp by warp: group i of a
// cluster is reduced by rank i % S, which receives every warp's fragment of
// it, over distributed shared memory when S > 1). The order depends on
// (k, S) only. An MMA's token rows never mix, and tokens >= m are fed zeros,
// so a row's result does not depend on the batch.
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
  int stages;     // ring depth, kStreamMinStages..kStreamMaxStages
  int per;        // row groups per cluster, <= kStreamMaxPer
  int owned_max;  // ceil(per / S): groups one rank reduces at most
  mailbox_dev::PublishTarget publish;  // the fused publish (as PoolerGemmArgs::publish)
};

namespace stream {
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
}  // namespace stream

// TILE tokens: 8 (tokens 8-15 of the MMA are zeros) or 16.
template <int TILE>
__global__ void __launch_bounds__(kStreamThreads, 1) stream_gemm_kernel(const StreamGemmArgs a) {
  SPARK_TRACE_CTA(kSkinnyGemm);
  constexpr int kW = kStreamWarps;
  constexpr int kBlocks = kStreamStageK / kW / 64;  // 64-column blocks per warp and stage
  constexpr int kRow = stream_row_bytes(kStreamStageK);
  constexpr int kAccs = 4;
  static_assert(TILE == 8 || TILE == 16);
  static_assert(kBlocks * 2 * 4 == 64, "64 registers of weights per lane");

  extern __shared__ __align__(16) unsigned char smem[];
  const int splits = gridDim.y, split = blockIdx.y;  // cluster (1, S, 1): the rank is blockIdx.y
  const bool clustered = splits > 1;
  const int k_slice = a.k / splits, per_group = k_slice / kStreamStageK;  // stages per group
  const int x_row = stream_row_bytes(k_slice);
  const int groups = a.n / kStreamRows;
  const int g0 = blockIdx.x * a.per;
  const int count = max(0, min(a.per, groups - g0));  // this cluster's groups (the same on every rank)
  const int stages = count * per_group;
  const int owned = split < count ? (count - split + splits - 1) / splits : 0;
  const int k0 = split * k_slice;
  const int ring = a.stages;

  const uint32_t bars = ptx::smem_addr(smem);
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (kStreamMaxStages + s); };
  const uint32_t x_bar = bars + 8u * (2 * kStreamMaxStages);
  const uint32_t red_bar = x_bar + 8u;
  __nv_bfloat16* const y_tile = reinterpret_cast<__nv_bfloat16*>(smem + stream_y_offset());
  float* const partials = reinterpret_cast<float*>(smem + stream_partials_offset());
  unsigned char* const xs = smem + stream_x_offset();
  unsigned char* const ring_ptr = smem + stream_ring_offset(k_slice, a.m);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ring; ++s) {
      ptx::mbarrier_init(full(s), 1);
      ptx::mbarrier_init(empty(s), kW);  // every compute warp reads every stage
    }
    ptx::mbarrier_init(x_bar, 1);
    // This rank reduces `owned` groups: every warp's fragment of each.
    ptx::mbarrier_init(red_bar, 1);
    if (clustered) ptx::mbarrier_arrive_expect_tx(red_bar, splits * kW * owned * 512);
    // The copy engine and the other ranks' st.async complete on these.
    ptx::fence_mbarrier_init_cluster();
  }
  __syncthreads();
  if (clustered) ptx::cluster_arrive_relaxed();  // "every CTA has started" (see ptx.cuh)

  if (warp == kW) {
    // The producer. Stage i uses slot i % ring for the (i / ring)-th time;
    // from the second use on, every compute warp must have released it
    // (phase (i / ring) - 1 of `empty`).
    ptx::griddep_launch_dependents();  // this warp never waits: do not hold the next grid back
    if (lane == 0) {
      const uint64_t policy = ptx::l2_policy_evict_first();
      for (int i = 0; i < stages; ++i) {
        const int s = i % ring;
        if (i >= ring) ptx::mbarrier_wait_parity(empty(s), ((i / ring) - 1) & 1);
        ptx::mbarrier_arrive_expect_tx(full(s), kStreamRows * kStreamStageK * 2);
        const int group = g0 + i / per_group, part = (i + group) % per_group;
        const __nv_bfloat16* src =
            a.w + static_cast<size_t>(group) * kStreamRows * a.k + k0 + part * kStreamStageK;
        const uint32_t dst = ptx::smem_addr(ring_ptr + s * kStreamStageBytes);
#pragma unroll
        for (int r = 0; r < kStreamRows; ++r)
          ptx::bulk_copy_g2s(dst + r * kRow, src + static_cast<size_t>(r) * a.k, kStreamStageK * 2, full(s), policy);
      }
    }
    __syncwarp();
    // Complete the cluster phase this warp arrived at, then leave: every copy
    // completes on a barrier the compute warps wait on before the CTA ends.
    if (clustered) ptx::cluster_wait_acquire();
    return;
  }

  // x comes from the previous grid.
  ptx::griddep_wait();
  SPARK_TRACE_WAITED();
  ptx::griddep_launch_dependents();
  const mailbox_dev::PublishTarget& pub = a.publish;
  const int items = a.m * owned;  // 16-byte output vectors this CTA stores
  uint32_t stage = 0;
  if (pub.mode != mailbox_dev::PublishTarget::kNone && threadIdx.x < items)
    stage = mailbox_dev::publish_stage(pub, threadIdx.x == 0 && blockIdx.x == 0 && split == 0);
  if (threadIdx.x == 0) {
    const uint64_t keep = ptx::l2_policy_evict_last();
    ptx::mbarrier_arrive_expect_tx(x_bar, a.m * k_slice * 2);
    for (int r = 0; r < a.m; ++r)
      ptx::bulk_copy_g2s(ptx::smem_addr(xs + r * x_row), a.x + static_cast<size_t>(r) * a.k + k0, k_slice * 2, x_bar,
                         keep);
  }

  const int g = lane >> 2, t = lane & 3;
  const int kw0 = warp * kBlocks * 128;  // this warp's first column of a stage, in bytes
  if (clustered) ptx::cluster_wait_acquire();  // every rank has started and armed red_bar
  ptx::mbarrier_wait_parity(x_bar, 0);
  // Tokens g and g + 8 of x (zeros beyond m: they reach only unstored rows).
  const bool has_lo = g < a.m, has_hi = TILE == 16 && g + 8 < a.m;
  const unsigned char* const x_lo = xs + g * x_row + kw0;
  const unsigned char* const x_hi = xs + (g + 8) * x_row + kw0;

  float acc[kAccs][4];
  for (int i = 0; i < stages; ++i) {
    // Group g0 + i / per_group's stages start at part (g0 + i / per_group) %
    // per_group: CTAs that run in step read different column ranges of
    // their rows (the same offsets in every CTA would load the same DRAM
    // channels together). The order is fixed per group, not per launch.
    const int s = i % ring, first = i % per_group == 0, last = i % per_group == per_group - 1;
    const int part = (i + g0 + i / per_group) % per_group;
    ptx::mbarrier_wait_parity(full(s), (i / ring) & 1);
    // This warp's quarter of the stage: row g, chunks 2t, 2t + 1 of each of
    // its blocks, into registers; then the slot is free.
    const unsigned char* const wg = ring_ptr + s * kStreamStageBytes + g * kRow + kw0;
    uint4 wv[kBlocks][2];
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk)
#pragma unroll
      for (int v = 0; v < 2; ++v) wv[blk][v] = *reinterpret_cast<const uint4*>(wg + blk * 128 + (2 * t + v) * 16);
    // mbarrier.arrive releases: the reads above are done before the
    // producer can see the slot free.
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(empty(s));

    if (first) {
#pragma unroll
      for (int c = 0; c < kAccs; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[c][e] = 0.0f;
    }
    const int xoff = part * kStreamStageK * 2;
#pragma unroll
    for (int blk = 0; blk < kBlocks; ++blk) {
      uint4 xv[2][2];
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const int at = xoff + blk * 128 + (2 * t + v) * 16;
        xv[0][v] = has_lo ? *reinterpret_cast<const uint4*>(x_lo + at) : make_uint4(0, 0, 0, 0);
        xv[1][v] = has_hi ? *reinterpret_cast<const uint4*>(x_hi + at) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int v = j >> 1, h = j & 1;
        const uint32_t af[4] = {stream::word(xv[0][v], 2 * h), stream::word(xv[1][v], 2 * h),
                                stream::word(xv[0][v], 2 * h + 1), stream::word(xv[1][v], 2 * h + 1)};
        ptx::mma_m16n8k16_bf16(acc[j], af, stream::word(wv[blk][v], 2 * h), stream::word(wv[blk][v], 2 * h + 1));
      }
    }
    if (!last) continue;

    // The warp's partial of group i / per_group over its columns, to the
    // reducing rank's slot [split][warp][group / S] (st.async completes on
    // that rank's red_bar; our own rank included, through the same path).
    const int group = i / per_group, owner = group % splits, local = group / splits;
    float p[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) p[e] = ((acc[0][e] + acc[1][e]) + acc[2][e]) + acc[3][e];
    float* const dst = partials + ((split * kW + warp) * a.owned_max + local) * 128 + lane * 4;
    if (clustered)
      ptx::st_async_v4(ptx::map_cluster_addr(ptx::smem_addr(dst), owner), p[0], p[1], p[2], p[3],
                       ptx::map_cluster_addr(red_bar, owner));
    else
      *reinterpret_cast<float4*>(dst) = make_float4(p[0], p[1], p[2], p[3]);
  }
  // A rank that reduces nothing may leave (st.async took its registers).
  if (owned == 0) return;
  constexpr int kThreads = kW * 32;
  if (clustered)
    ptx::mbarrier_wait_parity(red_bar, 0);
  else
    ptx::named_barrier_sync(1, kThreads);

  // Element j of the owned fragments ([local][lane][e], as the lanes held
  // them: tokens (lane / 4) + 8 (e / 2), rows 2 (lane % 4) + e % 2): the
  // 4 S warp partials in K order, rounded once.
  const int y_stride = a.owned_max * kStreamRows;
  const int partial_stride = a.owned_max * 128;
  for (int j = threadIdx.x; j < owned * 128; j += kThreads) {
    const int e = j & 3, ln = (j >> 2) & 31, lt = j >> 7;
    const int token = (ln >> 2) + (e >> 1) * 8;
    if (token >= a.m) continue;
    float sum = partials[j];
    for (int q = 1; q < splits * kW; ++q) sum += partials[q * partial_stride + j];
    y_tile[token * y_stride + lt * kStreamRows + 2 * (ln & 3) + (e & 1)] = __float2bfloat16_rn(sum);
  }
  ptx::named_barrier_sync(1, kThreads);

  // Item (token, local group): 8 features of one token, one 16-byte vector.
  for (int item = threadIdx.x; item < items; item += kThreads) {
    const int token = item / owned, lt = item % owned;
    const int col = (g0 + lt * splits + split) * kStreamRows;
    const uint4 y = *reinterpret_cast<const uint4*>(y_tile + token * y_stride + lt * kStreamRows);
    *reinterpret_cast<uint4*>(a.out + static_cast<size_t>(token) * a.n + col) = y;
    if (pub.mode == mailbox_dev::PublishTarget::kNone) continue;
    // The fused publish: exactly what the mailbox's own publisher stores.
    mailbox_dev::store_to_all(pub.copies, pub.layout.tp, pub.rank, pub.layout.offset(stage, pub.rank, token, col),
                              mailbox_dev::publish_vec(y));
  }
}

}  // namespace spark_decode::kernels
