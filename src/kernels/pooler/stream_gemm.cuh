// The streamed MMA pooler GEMM: out[m, n] = x[m, k] @ W[n, k]^T for m <= 16,
// BF16 in and out, FP32 accumulation, on tensor cores, with the weights
// streamed by the copy engine through a ring of shared-memory stages.
//
// Why a third engine: the register engines (skinny, and the Unpooler's MMA
// engine) can only have in flight what their registers hold, one wave of
// CTAs at a time, and every wave ends with the memory stream drained
// (bench/NOTES.md); the MMA engine also re-reads x once per 32 weight rows,
// which at m = 16 makes the L2, not HBM, its limit. Here one CTA per SM keeps
// a ring of 32 KiB stages in flight from start to end (the copy engine
// streams 64 MiB in 16.4 us this way, bench unpooler's bulk read), filled
// before griddepcontrol.wait as well, and reads x once per 64 or 128 weight
// rows, from shared memory. SPEC §2.3 lets any faster kernel serve a pooler
// batch; the Unpooler itself keeps SPEC §2.1's register design.
//
// Shape: grid (n / RB, S), cluster (1, S, 1), S >= 2. CTA (b, s) owns weight
// rows [RB b, RB (b + 1)) and the K slice [s k / S, (s + 1) k / S). Warp w <
// RB / 16 computes the 16-row MMA tile w (A = 16 weight rows, B = 8 tokens,
// mma.sync.m16n8k16); the last warp produces: its lane 0 walks the slice's
// stages, waits until a ring slot is released by every compute warp, and has
// the copy engine load [RB rows][stage_k] of W into it (boxes of a 2-D tensor
// map, 128-byte swizzle). It never waits for the previous grid: weights are
// parameters. The compute warps wait, then thread 0 has x's K slice (rows <
// m) copied into shared memory once.
//
// The K permutation (as the Unpooler's): within a 64-column box, lane (g, t)
// reads 16-byte chunks 2t and 2t + 1 of weight rows g and g + 8 and of token
// g, and feeds words 2h, 2h + 1 of chunk 2t + v to MMA step 2v + h as the
// logical K slots (2t, 2t + 1) and (2t + 8, 2t + 9). A and B use the same
// physical K for the same slots, so the product is the GEMM's; chunks 2t are
// also what keeps the reads conflict-free (lanes 4 apart read rows of
// different swizzle phase or, for x, rows 16 bytes apart).
//
// Determinism (SPEC §5): each output sums, per CTA, its MMA steps in K order
// into accumulator set (step % 2), the sets added 0 + 1; then the S cluster
// ranks' partials in rank order (tile i is reduced by rank i % S, which
// receives every rank's fragment of it over distributed shared memory). The
// order depends on (k, RB, S) only. Token columns of an MMA never mix, and
// the 8-token tile is the 16-token tile's first half, so a row's result does
// not depend on the batch. Rows of x at or beyond m in shared memory hold
// whatever was there: they reach only output columns that are not stored.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/common/trace.cuh"
#include "kernels/mailbox/mailbox_device.cuh"
#include "kernels/pooler/stream_config.h"

namespace spark_decode::kernels {

struct StreamGemmArgs {
  CUtensorMap w_map;  // W [n, k] BF16: boxes [RB rows][kStreamBoxK], 128-byte swizzle
  const __nv_bfloat16* x;  // [m, k]
  __nv_bfloat16* out;      // [m, n]
  int n, k, m;
  int stages;  // ring depth, kStreamMinStages..kStreamMaxStages
  mailbox_dev::PublishTarget publish;  // the fused publish (as PoolerGemmArgs::publish)
};

namespace stream {
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}
}  // namespace stream

template <int RB, int TILE>
__global__ void __launch_bounds__(stream_threads(RB), 1) stream_gemm_kernel(const __grid_constant__ StreamGemmArgs a) {
  SPARK_TRACE_CTA(kSkinnyGemm);
  constexpr int kTiles = RB / 16;  // compute warps
  constexpr int kComputeThreads = kTiles * 32;
  constexpr int kNt = TILE / 8;
  constexpr int kStageK = stream_stage_k(RB);
  constexpr int kBoxes = kStageK / kStreamBoxK;
  constexpr int kBoxBytes = RB * kStreamBoxK * 2;
  static_assert(RB == 64 || RB == 128, "RB rows per CTA: 64 or 128");
  static_assert(TILE == 8 || TILE == 16);
  static_assert(kBoxes * kBoxBytes == kStreamStageBytes);

  extern __shared__ __align__(16) unsigned char smem[];
  const int splits = gridDim.y, split = blockIdx.y;  // cluster (1, S, 1): the rank is blockIdx.y
  const int owned_max = stream_owned_max(RB, splits);
  const int owned = split < kTiles ? (kTiles - split + splits - 1) / splits : 0;
  const int k_slice = a.k / splits, k0 = split * k_slice;
  const int row0 = blockIdx.x * RB;
  const int total = k_slice / kStageK;
  const int ring = a.stages;
  const int x_stride = stream_x_stride_bytes(a.k, splits);

  const uint32_t bars = ptx::smem_addr(smem);
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (kStreamMaxStages + s); };
  const uint32_t x_bar = bars + 8u * (2 * kStreamMaxStages);
  const uint32_t red_bar = x_bar + 8u;
  __nv_bfloat16* const y_tile = reinterpret_cast<__nv_bfloat16*>(smem + stream_y_offset());  // [TILE][owned_max 16]
  float* const partials = reinterpret_cast<float*>(smem + stream_partials_offset(RB, splits, TILE));
  unsigned char* const xs = smem + stream_x_offset(RB, splits, TILE);
  const uint32_t ring_addr =
      (bars + stream_ring_offset(RB, splits, TILE, a.k) - kStreamAlignSlack + kStreamAlignSlack - 1) &
      ~uint32_t(kStreamAlignSlack - 1);
  const unsigned char* const ring_ptr = smem + (ring_addr - bars);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ring; ++s) {
      ptx::mbarrier_init(full(s), 1);
      ptx::mbarrier_init(empty(s), kTiles);
    }
    ptx::mbarrier_init(x_bar, 1);
    // This rank reduces `owned` tiles: every rank's fragment of each.
    ptx::mbarrier_init(red_bar, 1);
    ptx::mbarrier_arrive_expect_tx(red_bar, splits * owned * kNt * 512);
    // The copy engine and the other ranks' st.async complete on these.
    ptx::fence_mbarrier_init_cluster();
  }
  __syncthreads();
  ptx::cluster_arrive_relaxed();  // "every CTA has started" (see ptx.cuh)

  if (warp == kTiles) {
    // The producer. Stage i uses slot i % ring for the (i / ring)-th time;
    // from the second use on, every compute warp must have released it
    // (phase (i / ring) - 1 of `empty`).
    if (lane == 0) {
      ptx::prefetch_tensormap(&a.w_map);
      const uint64_t policy = ptx::l2_policy_evict_first();
      for (int i = 0; i < total; ++i) {
        const int s = i % ring;
        if (i >= ring) ptx::mbarrier_wait_parity(empty(s), ((i / ring) - 1) & 1);
        ptx::mbarrier_arrive_expect_tx(full(s), kStreamStageBytes);
#pragma unroll
        for (int b = 0; b < kBoxes; ++b)
          ptx::tma_load_2d(ring_addr + s * kStreamStageBytes + b * kBoxBytes, &a.w_map,
                           k0 + i * kStageK + b * kStreamBoxK, row0, full(s), policy);
      }
    }
    __syncwarp();
    // Complete the cluster phase this warp arrived at, then leave: every copy
    // completes on a barrier the compute warps wait on before the CTA ends.
    ptx::cluster_wait_acquire();
    return;
  }

  // x comes from the previous grid.
  ptx::griddep_wait();
  SPARK_TRACE_WAITED();
  ptx::griddep_launch_dependents();
  const mailbox_dev::PublishTarget& pub = a.publish;
  const int items = a.m * owned * 2;  // 16-byte output vectors this CTA stores
  uint32_t stage = 0;
  if (pub.mode != mailbox_dev::PublishTarget::kNone && threadIdx.x < items)
    stage = mailbox_dev::publish_stage(pub, threadIdx.x == 0 && blockIdx.x == 0 && split == 0);
  if (threadIdx.x == 0) {
    const uint64_t keep = ptx::l2_policy_evict_last();
    ptx::mbarrier_arrive_expect_tx(x_bar, a.m * k_slice * 2);
    for (int r = 0; r < a.m; ++r)
      ptx::bulk_copy_g2s(ptx::smem_addr(xs + r * x_stride), a.x + static_cast<size_t>(r) * a.k + k0, k_slice * 2,
                         x_bar, keep);
  }

  const int g = lane >> 2, t = lane & 3;
  const int tile = warp;
  const int row_lo = tile * 16 + g;  // and row_lo + 8: the same swizzle phase
  const int phase = row_lo & 7;
  float acc[2][kNt][4];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[h][nt][i] = 0.0f;
  ptx::mbarrier_wait_parity(x_bar, 0);

  for (int i = 0; i < total; ++i) {
    const int s = i % ring;
    ptx::mbarrier_wait_parity(full(s), (i / ring) & 1);
    const unsigned char* const st = ring_ptr + s * kStreamStageBytes;
#pragma unroll
    for (int b = 0; b < kBoxes; ++b) {
      const unsigned char* const box = st + b * kBoxBytes;
      const int kx = (i * kStageK + b * kStreamBoxK) * 2;  // byte offset of the box in x's K slice
      uint4 wa[2], wb[2], xv[kNt][2];
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const int chunk = 2 * t + v;
        const int at = ((chunk ^ phase) * 16);
        wa[v] = *reinterpret_cast<const uint4*>(box + row_lo * 128 + at);
        wb[v] = *reinterpret_cast<const uint4*>(box + (row_lo + 8) * 128 + at);
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt)
          xv[nt][v] = *reinterpret_cast<const uint4*>(xs + (nt * 8 + g) * x_stride + kx + chunk * 16);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int v = j >> 1, h = j & 1;
        const uint32_t af[4] = {stream::word(wa[v], 2 * h), stream::word(wb[v], 2 * h),
                                stream::word(wa[v], 2 * h + 1), stream::word(wb[v], 2 * h + 1)};
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt)
          ptx::mma_m16n8k16_bf16(acc[h][nt], af, stream::word(xv[nt][v], 2 * h), stream::word(xv[nt][v], 2 * h + 1));
      }
    }
    // This warp is done reading slot s (mbarrier.arrive releases its reads).
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(empty(s));
  }

  // The tile's partial over this K slice, to its reducing rank's slot
  // [split][tile / S] (st.async completes on that rank's red_bar; our own
  // rank included, through the same path).
  const int owner = tile % splits, local = tile / splits;
  ptx::cluster_wait_acquire();  // every rank has started and armed red_bar
  const uint32_t remote_bar = ptx::map_cluster_addr(red_bar, owner);
#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
    const int slot = ((split * owned_max + local) * kNt + nt) * 128 + lane * 4;
    ptx::st_async_v4(ptx::map_cluster_addr(ptx::smem_addr(partials + slot), owner), acc[0][nt][0] + acc[1][nt][0],
                     acc[0][nt][1] + acc[1][nt][1], acc[0][nt][2] + acc[1][nt][2], acc[0][nt][3] + acc[1][nt][3],
                     remote_bar);
  }
  // A rank that reduces nothing may leave (st.async took its registers).
  if (owned == 0) return;
  ptx::mbarrier_wait_parity(red_bar, 0);

  // Element j of the owned fragments ([local][nt][lane][i], as the lanes held
  // them): the S partials in rank order, rounded once.
  for (int j = threadIdx.x; j < owned * kNt * 128; j += kComputeThreads) {
    const int e = j & 127, i = j & 3, ln = e >> 2, nt = (j >> 7) % kNt, lt = (j >> 7) / kNt;
    const int token = nt * 8 + 2 * (ln & 3) + (i & 1);
    if (token >= a.m) continue;
    float sum = partials[(lt * kNt + nt) * 128 + e];
    for (int r = 1; r < splits; ++r) sum += partials[((r * owned_max + lt) * kNt + nt) * 128 + e];
    y_tile[token * owned_max * 16 + lt * 16 + (ln >> 2) + (i >> 1) * 8] = __float2bfloat16_rn(sum);
  }
  ptx::named_barrier_sync(1, kComputeThreads);

  // Item (token, local tile, half): 8 features of one token, one 16-byte vector.
  for (int item = threadIdx.x; item < items; item += kComputeThreads) {
    const int token = item / (2 * owned), c = item % (2 * owned), lt = c >> 1, half = c & 1;
    const int col = row0 + (lt * splits + split) * 16 + half * 8;
    const uint4 y = *reinterpret_cast<const uint4*>(y_tile + token * owned_max * 16 + lt * 16 + half * 8);
    *reinterpret_cast<uint4*>(a.out + static_cast<size_t>(token) * a.n + col) = y;
    if (pub.mode == mailbox_dev::PublishTarget::kNone) continue;
    // The fused publish: exactly what the mailbox's own publisher stores.
    mailbox_dev::store_to_all(pub.copies, pub.layout.tp, pub.rank, pub.layout.offset(stage, pub.rank, token, col),
                              mailbox_dev::publish_vec(y));
  }
}

}  // namespace spark_decode::kernels
