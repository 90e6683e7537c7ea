// The on-chip MMA engine: out[m, N] = x[m, K] @ W[N, K]^T for m <= 16, for
// shards small enough that every weight byte of a CTA fits its shared memory
// (the deployed tp 4 and tp 8 shapes: 8-16 MiB over ~128 CTAs).
//
// Why: at these sizes the GEMM is latency-bound, not bandwidth-bound. The
// split-K engine holds its weights in registers, so a CTA can have only
// what its registers hold in flight, and under programmatic dependent launch
// (PDL) only that much streams while the previous kernel finishes. Here the
// CTA's whole weight slice (64-128 KiB at the model's shapes) is requested
// with bulk copies into shared memory before griddepcontrol.wait; the copy
// engine needs no register per byte, so all of it is in flight (and, where
// two CTAs fit an SM, landed) while the previous kernel drains. Activations,
// written by the previous grid, are read only after the wait, into registers
// straight from L2 (they are tiny and every CTA reads them).
//
// Decomposition, the split-K engine's (splitk_mma.cuh): grid (N / 16R, S),
// cluster (1, S, 1); CTA (t, s) owns rows [16Rt, 16R(t + 1)) and K slice
// [s K / S, (s + 1) K / S); warp w owns the KW consecutive K from
// s K / S + w KW, of all 16R rows. R = 2 (two row tiles sharing every x
// fragment) halves the x bytes the grid reads from L2: one read per CTA and
// token, which at token tile 16 rivals the weights' own bytes (16 tokens of
// a K slice are as many bytes as 16 weight rows of it) and competes with
// their stream. The copies: `stages` groups of 16R bulk copies (one per row
// of G warps' K, G = stage_warps), issued by one thread in stage order, each
// group completing on its own mbarrier, so the copy engine fetches them
// roughly in that order and warp w multiplies as soon as stage w / G has
// landed while later stages still stream (the arithmetic of the first stages
// hides under the last ones' arrival). One issuing thread, not one per
// stage: cp.async.bulk takes uniform operands, so a warp issues one copy at a
// time whichever lanes hold them, and concurrent issuers would interleave
// the stages, so that every stage would complete near the end.
//
// A fragments come from shared memory in the MMA's fragment order (lane
// (g, t) reads 16 bytes of rows g and g + 8; onchip_mma_config.h lays rows
// out so that these reads are bank-conflict-free), B from the registers x
// was loaded into. The K permutation is the split-K engine's: lane (g, t)
// holds 8 consecutive K of its rows and of token g as one 16-byte vector and
// feeds K [8t, 8t + 4) to one MMA step and [8t + 4, 8t + 8) to the next, so
// each MMA step sums exactly the products the split-K engine's step does.
//
// Determinism: the split-K engine's order, step for step: a warp's MMA steps
// in K order into accumulator set step % ACCS, the sets summed 0..ACCS-1,
// then the K / KW warp partials summed in K order by cluster rank 0. It
// depends on (K, KW, ACCS) only (a partial's place in the sum is its K chunk,
// whatever S), so this kernel gives splitk_mma's bits at the same kw and accs
// (tested); a token's MMA column never mixes with another token's, so a row
// does not depend on the batch; nor on R, which only changes which CTA
// computes a row.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>

#include "kernels/common/ptx.cuh"
#include "kernels/common/trace.cuh"
#include "kernels/gemm/mma_fragment.cuh"
#include "kernels/gemm/onchip_mma_config.h"

namespace spark_decode::kernels {

// stage_shift: log2 of G, the warps per copy stage (a power of two dividing
// the CTA's warps: shifts, not divisions, on the way to a warp's stage).
template <int KW, int ACCS, int TILE, int R>
__global__ void __launch_bounds__(onchip::max_threads(R))
    onchip_mma_kernel(const GemmArgs args, const int stage_shift) {
  SPARK_TRACE_CTA(kOnchipMma);
  constexpr int kVecs = KW / kSplitKBlockK;  // 16-byte vectors per row per lane
  constexpr int kNt = TILE / 8;                // n8 MMAs per step
  constexpr int kRows = R * kSplitKTileN;      // rows per CTA
  constexpr int kPartial = onchip::partial_floats(TILE, R);
  static_assert(KW % kSplitKBlockK == 0 && (2 * kVecs) % ACCS == 0);
  static_assert(TILE == 8 || TILE == 16);
  static_assert(R == 1 || (R == 2 && TILE == 16), "two row tiles are compiled for token tile 16 only");
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t bars = ptx::smem_addr(smem);  // stage q's mbarrier at bars + 8 q
  const uint32_t partial_bar = bars + onchip::kPartialBar;
  __nv_bfloat16* const y_tile = reinterpret_cast<__nv_bfloat16*>(smem + onchip::kHeaderBytes);
  float* const partials = reinterpret_cast<float*>(smem + onchip::kPartialsOffset);
  unsigned char* const stage0 = smem + onchip::stages_offset(args.k, KW, TILE, R);

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int split = blockIdx.y, splits = gridDim.y;
  const int k_slice = args.k / splits;
  const int feature0 = blockIdx.x * kRows;
  const int stages = warps >> stage_shift;
  const int width = KW << stage_shift;  // K of one stage
  const int stage_size = onchip::stage_bytes(width, R);
  const int block_size = onchip::block_bytes(width);  // 16 rows of a stage

  // Every mbarrier initialised before any thread uses one: the stages' (one
  // arrival: the issuing thread's expect_tx; then the copies' bytes) and, at
  // rank 0 of a cluster, the partials' (one arrival and the other CTAs'
  // bytes). The fence makes the initialisation visible to the copy engine
  // and to the cluster; the senders use rank 0's only after the cluster
  // barrier below (a CTA not yet started has no shared memory).
  if (threadIdx.x == 0) {
    for (int q = 0; q < stages; ++q) ptx::mbarrier_init(bars + 8 * q, 1);
    if (splits > 1 && split == 0) {
      ptx::mbarrier_init(partial_bar, 1);
      ptx::mbarrier_arrive_expect_tx(partial_bar, (splits - 1) * warps * kPartial * static_cast<int>(sizeof(float)));
    }
    ptx::fence_mbarrier_init_cluster();
  }
  __syncthreads();

  // Weights first, all of them: they do not depend on the previous grid.
  // Stage q, row 16 rt + r: K [s K / S + q width, + width) of row
  // feature0 + 16 rt + r, into its row of block rt of stage q
  // (onchip_mma_config.h: row_offset). Nothing else
  // happens before the wait (tools/check_sass.py: bulk copies and mbarrier
  // setup only; a trace build adds mark 4's timer read).
  if (threadIdx.x == 0) {
    const uint64_t policy = ptx::l2_policy_evict_first();
    const uint32_t bytes = onchip::row_bytes(width);
    const __nv_bfloat16* src = args.w + static_cast<size_t>(feature0) * args.k + split * k_slice;
    uint32_t dst = ptx::smem_addr(stage0);
    for (int q = 0; q < stages; ++q, src += width, dst += stage_size) {
      ptx::mbarrier_arrive_expect_tx(bars + 8 * q, kRows * bytes);
#pragma unroll
      for (int rt = 0; rt < R; ++rt)
#pragma unroll
        for (int r = 0; r < 16; ++r)
          ptx::bulk_copy_g2s(dst + rt * block_size + onchip::row_offset(width, r),
                             src + static_cast<size_t>(16 * rt + r) * args.k, bytes, bars + 8 * q, policy);
    }
    SPARK_TRACE_MARK(4, 0);  // every copy issued
  }
  if (splits > 1) ptx::cluster_arrive_relaxed();

  // x is written by the previous grid.
  ptx::griddep_wait();
  SPARK_TRACE_WAITED();
  ptx::griddep_launch_dependents();

  // The zero-copy publish's stage, read now so that its latency hides under
  // the MMAs (as in the split-K engine); by the threads of rank 0 that store
  // y (2 R m of them, one per 8 of a token's 16 R features: with two row
  // tiles, the threads past 2 m store too, and would publish at stage 0).
  uint32_t stage = 0;
  if (args.publish.mode != mailbox_dev::Publish::kNone && split == 0 && threadIdx.x < 2 * R * args.m)
    stage = mailbox_dev::publish_stage(args.publish, threadIdx.x == 0 && blockIdx.x == 0);

  // This warp's x fragments, all of them at once: one L2 round trip, issued
  // while its stage may still be landing. Tokens past m are zeros.
  const int k_begin = split * k_slice + warp * KW + t * 8;
  uint4 xv[kVecs][kNt];
#pragma unroll
  for (int v = 0; v < kVecs; ++v)
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
      const int token = nt * 8 + g;
      const __nv_bfloat16* const at = args.x + static_cast<size_t>(token) * args.k + k_begin + v * kSplitKBlockK;
      xv[v][nt] = token < args.m ? ptx::ld_v4(at) : make_uint4(0, 0, 0, 0);
    }
  SPARK_TRACE_MARK(2, xv[0][0].x);  // thread 0's x fragments have arrived

  float acc[ACCS][R][kNt][4];
#pragma unroll
  for (int a = 0; a < ACCS; ++a)
#pragma unroll
    for (int rt = 0; rt < R; ++rt)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[a][rt][nt][i] = 0.0f;

  // This warp's stage has landed (the wait acquires the copy engine's
  // writes). Plain loads from here on: the wait's memory clobber keeps the
  // compiler from moving them above it, and leaves it free to batch them.
  const int q = warp >> stage_shift;
  ptx::mbarrier_wait_parity(bars + 8 * q, 0);
  const unsigned char* const mine_w =
      stage0 + q * stage_size + (warp - (q << stage_shift)) * onchip::row_bytes(KW) + t * 16;
  const unsigned char* const row_a = mine_w + onchip::row_offset(width, g);      // row g
  const unsigned char* const row_b = mine_w + onchip::row_offset(width, g + 8);  // row g + 8
  SPARK_TRACE_MARK(0, *reinterpret_cast<const uint32_t*>(row_a));  // warp 0's stage has landed
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    const int step = 2 * v;  // the MMA step of this vector's first half
#pragma unroll
    for (int rt = 0; rt < R; ++rt) {
      const uint4 wa = *reinterpret_cast<const uint4*>(row_a + rt * block_size + v * 2 * kSplitKBlockK);
      const uint4 wb = *reinterpret_cast<const uint4*>(row_b + rt * block_size + v * 2 * kSplitKBlockK);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t a[4] = {word(wa, 2 * h), word(wb, 2 * h), word(wa, 2 * h + 1), word(wb, 2 * h + 1)};
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt)
          ptx::mma_m16n8k16_bf16(acc[(step + h) % ACCS][rt][nt], a, word(xv[v][nt], 2 * h),
                                 word(xv[v][nt], 2 * h + 1));
      }
    }
  }

  // This warp's partial, reduced over its accumulator sets in order
  // 0..ACCS-1, into slot (split * warps + warp) of rank 0's shared memory:
  // its K chunk's place in the sum.
  // Fragment order [rt][nt][lane][4] (mma_fragment.cuh: fragment_element).
  float part[R * kNt][4];
#pragma unroll
  for (int rt = 0; rt < R; ++rt)
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        part[rt * kNt + nt][i] = acc[0][rt][nt][i];
#pragma unroll
        for (int a = 1; a < ACCS; ++a) part[rt * kNt + nt][i] += acc[a][rt][nt][i];
      }
  SPARK_TRACE_MARK(3, __float_as_uint(part[0][0]));  // thread 0's MMAs are done
  float* mine = partials + (split * warps + warp) * kPartial + lane * 4;
  if (split == 0) {
#pragma unroll
    for (int f = 0; f < R * kNt; ++f)
      *reinterpret_cast<float4*>(mine + f * 32 * 4) = make_float4(part[f][0], part[f][1], part[f][2], part[f][3]);
  } else {
    ptx::cluster_wait_acquire();  // rank 0 has started and armed its mbarrier
    const uint32_t remote_bar = ptx::map_cluster_addr(partial_bar, 0);
    const uint32_t remote = ptx::map_cluster_addr(ptx::smem_addr(mine), 0);
#pragma unroll
    for (int f = 0; f < R * kNt; ++f)
      ptx::st_async_v4(remote + f * 32 * 4 * sizeof(float), part[f][0], part[f][1], part[f][2], part[f][3],
                       remote_bar);
    // Leave now, as the split-K engine's senders do: st.async reads its
    // registers at issue, every copy into this CTA has landed (each warp
    // waited for its stage), and the SM's room goes to the next CTA.
    return;
  }
  // Rank 0: its own warps' partials, then every remote one (the mbarrier's
  // transactions), after completing the cluster barrier phase it arrived at.
  __syncthreads();
  if (splits > 1) {
    ptx::cluster_wait_acquire();
    ptx::mbarrier_wait_parity(partial_bar, 0);
  }
  SPARK_TRACE_MARK(1, __float_as_uint(partials[0]));  // every partial is here

  // Partials in K order (fragment layout: nt, lane (g, t), register i).
  [[maybe_unused]] const float summed =
      sum_partials<kNt, false, kRows, kPartial, true>(args, partials, splits * warps, y_tile);
  SPARK_TRACE_MARK(5, __float_as_uint(summed));  // thread 0 has summed its elements
  store_y_tile<kRows>(args, stage, y_tile, feature0);
}

}  // namespace spark_decode::kernels
