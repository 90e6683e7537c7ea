// The split-K MMA engine: out[m, N] = x[m, K] @ W[N, K]^T for m <= 16 (the
// unpooler's engine, and the pooler GEMM's at tp >= 2).
//
// Grid (N / (16 R), S), cluster (1, S, 1). CTA (t, s) owns output features
// [16Rt, 16R(t + 1)) and the K slice [s K / S, (s + 1) K / S); warp w of it
// owns the KW consecutive K starting at s K / S + w KW. R = 1 is the design's
// base shape. R = 2 (two 16-row MMA tiles per warp sharing every activation
// fragment): each CTA reads its K slice of x once, so at m = 16 and R = 1
// the L2 serves as many x bytes as weight bytes and, not HBM, sets the pace;
// R = 2 halves that traffic, and half as many, larger CTAs fit the grid in
// fewer waves (docs/perf/unpooler.md). A row's arithmetic is the same for
// every R (below), so R may change with m.
//
// Why this shape: at m <= 16 the GEMM is a pure weight stream (16 bytes of W
// per 2..32 FLOP), so the kernel's only job is to keep enough weight bytes in
// flight. Each lane issues all of its weight loads (KW / 4 registers) before
// anything else, ahead of griddepcontrol.wait, so with programmatic dependent
// launch the whole weight read overlaps the previous kernel's tail. No shared
// memory staging: operands go from global memory straight into the
// registers mma.sync reads.
//
// The K permutation: an m16n8k16 MMA sums 16 K per step in an order the
// hardware fixes, and the sum does not care which physical K sits in which
// logical slot as long as A and B agree. Lane (g, t) holds 8 consecutive K of
// two weight rows and of token g as one 16-byte vector each, and feeds
// K [8t, 8t + 4) of the vector to one MMA step and [8t + 4, 8t + 8) to the
// next.
//
// The row swizzle (mma_fragment.cuh): each vector pair is loaded as 4 rows x
// 128 bytes per instruction and the halves are exchanged between lanes g and
// g ^ 1 just before use, instead of following the fragment (8 rows x 64
// bytes): coalesced loads for the same bytes, faster wherever the grid
// streams at bandwidth. SWIZZLE = false (fragment order, no exchange) gives
// the same bits; it stays for grids too small to be bandwidth-bound (tp 8's
// 64 CTAs), where the exchange's instructions after griddepcontrol.wait cost
// more than the coalescing gains.
//
// Determinism: every output is reduced in one fixed order: the warp's MMA
// steps in K order into accumulator set step % ACCS, the sets summed 0..ACCS-1,
// then the S * warps warp partials summed in K order by cluster rank 0. The
// order depends on (N, K, S, KW, ACCS) only, not on R or on how the loads are
// chunked; a token's column of an MMA never mixes with another token's, so a
// row's result does not depend on the batch.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

#include "kernels/common/ptx.cuh"
#include "kernels/common/trace.cuh"
#include "kernels/gemm/mma_fragment.cuh"
#include "kernels/gemm/splitk_mma_config.h"

namespace spark_decode::kernels {

template <int KW, int ACCS, int TILE, int R, bool SWIZZLE>
__global__ void __launch_bounds__(splitk_max_threads(KW, R))
    splitk_mma_kernel(const GemmArgs args) {
  SPARK_TRACE_CTA(kSplitKMma);
  constexpr int kVecs = KW / kSplitKBlockK;  // 16-byte vectors per row per lane
  constexpr int kNt = TILE / 8;                // n8 MMAs per step
  // Weight vectors are loaded kChunk at a time per row tile: all of them at
  // R = 1 (the whole slice in flight before griddepcontrol.wait); at R > 1
  // at most 8 / R, so that the R tiles hold no more registers than one R = 1
  // tile of KW = 256 (splitk_max_threads).
  constexpr int kChunk = R == 1 ? kVecs : (kVecs < 8 / R ? kVecs : 8 / R);
  constexpr int kChunks = kVecs / kChunk;
  constexpr int kRowsPerCta = R * kSplitKTileN;
  static_assert(KW % kSplitKBlockK == 0 && (2 * kVecs) % ACCS == 0 && kVecs % kChunk == 0);
  static_assert(!SWIZZLE || kChunk % 2 == 0, "the row swizzle loads vectors in pairs");
  static_assert(TILE == 8 || TILE == 16);
  static_assert(R == 1 || R == 2);
  // Dynamic shared memory: a header (the mbarrier the remote partials
  // complete on, and y of this CTA, [TILE][16 R] BF16), then one
  // [R][kNt][32 lanes][4] FP32 partial per warp of the cluster (the MMA
  // accumulator fragments as the lanes hold them, so each lane's share of a
  // fragment is one 16-byte store).
  extern __shared__ __align__(16) unsigned char smem[];
  uint64_t* const bar = reinterpret_cast<uint64_t*>(smem);
  __nv_bfloat16* const y_tile = reinterpret_cast<__nv_bfloat16*>(smem + kSplitKSmemBarrier);
  float* const partials = reinterpret_cast<float*>(smem + splitk_smem_header(R));
  constexpr int kFragment = TILE * kSplitKTileN;  // floats per (row tile, warp)
  constexpr int kPartial = R * kFragment;           // floats per warp partial
  static_assert(kSplitKSmemBarrier + TILE * kRowsPerCta * 2 <= splitk_smem_header(R));

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int split = blockIdx.y, splits = gridDim.y;
  const int k_begin = split * (args.k / splits) + warp * KW + t * 8;
  const int feature0 = blockIdx.x * kRowsPerCta;
  if (splits > 1) {
    // Rank 0 expects one partial from every warp of the other CTAs. Its
    // mbarrier is initialised before the cluster barrier's arrival, which the
    // senders wait on before their first store (a CTA not yet started has no
    // shared memory, and an uninitialised mbarrier takes no transactions).
    if (split == 0 && threadIdx.x == 0) {
      ptx::mbarrier_init(ptx::smem_addr(bar), 1);
      ptx::mbarrier_arrive_expect_tx(ptx::smem_addr(bar),
                                     (splits - 1) * warps * kPartial * static_cast<int>(sizeof(float)));
      ptx::fence_mbarrier_init_cluster();
    }
    ptx::cluster_arrive_relaxed();
  }

  // Weights first: they do not depend on the previous grid. Row tile r's
  // lane (g, t) ends up with rows 16r + perm(g) (wa) and 16r + 8 + perm(g)
  // (wb), perm the identity without SWIZZLE. Swizzled, it loads vector
  // 2q + (g & 1) of row g / 2 into wa[2q] and vector 2q + 1 - (g & 1) of row
  // 4 + g / 2 into wa[2q + 1] (wb: 8 rows on).
  const bool odd = g & 1;
  const size_t k_stride = args.k;
  const __nv_bfloat16* w_p = SWIZZLE ? args.w + (feature0 + g / 2) * k_stride + k_begin + (odd ? kSplitKBlockK : 0)
                                     : args.w + (feature0 + g) * k_stride + k_begin;
  const __nv_bfloat16* w_q = args.w + (feature0 + 4 + g / 2) * k_stride + k_begin + (odd ? 0 : kSplitKBlockK);
  const size_t tile_stride = kSplitKTileN * k_stride;
  const uint64_t policy = ptx::l2_policy_evict_first();
  uint4 wa[R][kChunk], wb[R][kChunk];
  auto load_chunk = [&](int c) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int v = 0; v < kChunk; v += SWIZZLE ? 2 : 1) {
        const size_t at = r * tile_stride + (c * kChunk + v) * kSplitKBlockK;
        wa[r][v] = ptx::ld_stream_v4(w_p + at, policy);
        wb[r][v] = ptx::ld_stream_v4(w_p + at + 8 * k_stride, policy);
        if constexpr (SWIZZLE) {
          wa[r][v + 1] = ptx::ld_stream_v4(w_q + at, policy);
          wb[r][v + 1] = ptx::ld_stream_v4(w_q + at + 8 * k_stride, policy);
        }
      }
  };
  load_chunk(0);

  // x is written by the previous grid.
  ptx::griddep_wait();
  SPARK_TRACE_WAITED();
  ptx::griddep_launch_dependents();

  // The zero-copy publish's stage, read now (after griddep_wait, like the
  // mailbox's own publisher) so that its latency hides under the weight
  // loads instead of adding to the CTA's tail; by the threads of rank 0 that
  // store y (2 R m of them, one per 8 features of a token, wrapping around
  // the block). ACTIVE may be written this early: its reader, the consumer,
  // runs in a later grid.
  uint32_t stage = 0;
  if (args.publish.mode != mailbox_dev::Publish::kNone && split == 0 && threadIdx.x < 2 * R * args.m)
    stage = mailbox_dev::publish_stage(args.publish, threadIdx.x == 0 && blockIdx.x == 0);

  float acc[R][ACCS][kNt][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int a = 0; a < ACCS; ++a)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[r][a][nt][i] = 0.0f;

#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    if (c > 0) load_chunk(c);
#pragma unroll
    for (int v = 0; v < kChunk; ++v) {
      if (SWIZZLE && v % 2 == 0)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          unswizzle_pair(wa[r][v], wa[r][v + 1], odd);
          unswizzle_pair(wb[r][v], wb[r][v + 1], odd);
        }
      const int step = 2 * (c * kChunk + v);  // the MMA step of this vector's first half
      uint4 xv[kNt];
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        const int token = nt * 8 + g;
        xv[nt] = token < args.m ? ptx::ld_v4(args.x + static_cast<size_t>(token) * args.k + k_begin +
                                             (c * kChunk + v) * kSplitKBlockK)
                                : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint32_t a[4] = {word(wa[r][v], 2 * h), word(wb[r][v], 2 * h), word(wa[r][v], 2 * h + 1),
                                 word(wb[r][v], 2 * h + 1)};
#pragma unroll
          for (int nt = 0; nt < kNt; ++nt)
            ptx::mma_m16n8k16_bf16(acc[r][(step + h) % ACCS][nt], a, word(xv[nt], 2 * h),
                                   word(xv[nt], 2 * h + 1));
        }
    }
  }

  // This warp's partial, reduced over its accumulator sets in order 0..ACCS-1,
  // into slot (split * warps + warp) of rank 0's shared memory.
  float part[R][kNt][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        part[r][nt][i] = acc[r][0][nt][i];
#pragma unroll
        for (int a = 1; a < ACCS; ++a) part[r][nt][i] += acc[r][a][nt][i];
      }
  float* mine = partials + (split * warps + warp) * kPartial + lane * 4;
  if (split == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
        *reinterpret_cast<float4*>(mine + (r * kNt + nt) * 32 * 4) =
            make_float4(part[r][nt][0], part[r][nt][1], part[r][nt][2], part[r][nt][3]);
  } else {
    ptx::cluster_wait_acquire();  // rank 0 has started and armed its mbarrier
    const uint32_t remote_bar = ptx::map_cluster_addr(ptx::smem_addr(bar), 0);
    const uint32_t remote = ptx::map_cluster_addr(ptx::smem_addr(mine), 0);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
        ptx::st_async_v4(remote + (r * kNt + nt) * 32 * 4 * sizeof(float), part[r][nt][0], part[r][nt][1],
                         part[r][nt][2], part[r][nt][3], remote_bar);
    // The sender may leave now, like any CTA whose last global stores are
    // still in flight: st.async takes its data from registers when it issues,
    // and the only shared memory written is rank 0's, which stays until its
    // mbarrier has counted every byte. Leaving early matters: the CTA's
    // registers go to the next CTA's weight loads instead of idling through
    // rank 0's reduction (a second barrier phase here was measured slower:
    // docs/perf/unpooler.md).
    return;
  }
  // Rank 0: its own warps' partials (shared memory, this CTA), then every
  // remote partial (the mbarrier's transactions); then release the senders.
  __syncthreads();
  if (splits > 1) {
    // Complete the one barrier phase this thread arrived at (a thread must
    // not leave a phase unfinished; barrier.cluster waits only for threads
    // that have not exited, so the senders that already left count as
    // arrived), then wait for every remote byte.
    ptx::cluster_wait_acquire();
    ptx::mbarrier_wait_parity(ptx::smem_addr(bar), 0);
  }

  // Partials in warp order w = 0, 1, ... (fragment layout: row tile, nt,
  // lane (g, t), register i).
  sum_partials_and_store<kNt, SWIZZLE, kRowsPerCta, kPartial>(args, stage, partials, splits * warps, y_tile,
                                                              feature0);
}

}  // namespace spark_decode::kernels
