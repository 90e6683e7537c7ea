// The staged skinny GEMM: the skinny GEMM's arithmetic (block_size 256, bit
// for bit; skinny_gemm.cuh) with the weights streamed through shared memory
// instead of registers, for batches of at most 4 rows.
//
// Why: the register kernel can only have in flight what its registers hold
// (about 17 MB over the GPU), one wave of CTAs at a time; each wave ends with
// the memory stream drained, and under programmatic dependent launch only
// the first wave is loaded while the previous kernel finishes. Here
// persistent CTAs (one per SM, each a contiguous run of tiles) keep a ring
// of up to 16 shared-memory stages filled by the copy engine
// (cp.async.bulk), so loads stay in flight across tiles, and before
// griddepcontrol.wait the whole ring (up to ~25 MB over the GPU) streams
// while the previous kernel finishes.
//
// Warps 0-7 compute, warp 8 produces: its lane 0 walks the CTA's (tile,
// chunk) items in order, waits for the stage's `empty` barrier (all eight
// compute warps done with it), arms the `full` barrier with the stage's
// bytes and issues one bulk copy per weight row. The producer never waits on
// the previous grid (weights are parameters); the compute warps wait, then
// copy x (rows < m) into shared memory once, and for each item wait on
// `full`, accumulate exactly as the skinny kernel's thread t does for the
// same vectors (v = c * 256 * k_unroll + u * 256 + t, increasing v), and
// release the stage. A tile's sums end in skinny::finish_tile, so a row's
// result is the skinny GEMM's at block_size 256: reproducible and batch
// invariant.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/pooler/skinny_gemm.cuh"
#include "kernels/pooler/staged_config.h"

namespace spark_decode::kernels {

// Grid: any number of CTAs (one per SM is the intent), kStagedThreads
// threads, staged_smem_bytes(kOpb, kUnroll, kRows, k, stages) of dynamic
// shared memory. Host checks: n % kOpb == 0, k % staged_stage_cols(kUnroll)
// == 0, 1 <= m <= kRows <= kStagedMaxRows, kStagedMinStages <= stages <=
// kStagedMaxStages.
template <int kOpb, int kUnroll, int kRows>
__global__ void __launch_bounds__(kStagedThreads, 1) skinny_staged_kernel(const PoolerGemmArgs a, int stages) {
  SPARK_TRACE_CTA(kSkinnyGemm);
  constexpr int kWarps = kStagedBlock / 32;
  constexpr int kValues = kOpb * kRows;
  constexpr int kStageCols = staged_stage_cols(kUnroll);
  constexpr int kStageBytes = staged_stage_bytes(kOpb, kUnroll);
  static_assert(kValues <= 16 && kRows <= kStagedMaxRows, "the header holds 16 values per tile");
  static_assert(kOpb % 2 == 0, "the fused publish stores column pairs");
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t bars = ptx::smem_addr(smem);
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (kStagedMaxStages + s); };
  float* const partials = reinterpret_cast<float*>(smem + kStagedBarrierBytes);  // [2][kWarps][kValues]
  uint16_t* const y_pubs = reinterpret_cast<uint16_t*>(partials + 2 * kWarps * 16);  // [2][kValues]
  const int k = a.k;
  __nv_bfloat16* const xs = reinterpret_cast<__nv_bfloat16*>(smem + staged_x_offset());  // [m][k]
  unsigned char* const ring = smem + staged_ring_offset(kRows, k);

  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int tiles = a.n / kOpb;
  const int per_cta = (tiles + gridDim.x - 1) / gridDim.x;
  const int tile0 = blockIdx.x * per_cta;
  const int tile_end = min(tiles, tile0 + per_cta);
  const int chunks = k / kStageCols;
  const int items = tile_end > tile0 ? (tile_end - tile0) * chunks : 0;

  if (t == 0) {
    for (int s = 0; s < stages; ++s) {
      ptx::mbarrier_init(full(s), 1);
      ptx::mbarrier_init(empty(s), kWarps);
    }
    // The copy engine (async proxy) completes on these barriers.
    ptx::fence_mbarrier_init_cluster();
  }
  __syncthreads();

  if (warp == kWarps) {
    // The producer. Item i uses stage i % stages for the (i / stages)-th
    // time; from the second use on, the stage must first be released by
    // every compute warp (phase (i / stages) - 1 of `empty`).
    if (lane == 0) {
      const uint64_t policy = ptx::l2_policy_evict_first();
      for (int i = 0; i < items; ++i) {
        const int s = i % stages;
        if (i >= stages) ptx::mbarrier_wait_parity(empty(s), ((i / stages) - 1) & 1);
        ptx::mbarrier_arrive_expect_tx(full(s), kStageBytes);
        const int tile = tile0 + i / chunks, c = i % chunks;
        const __nv_bfloat16* src = a.w + int64_t(tile) * kOpb * k + int64_t(c) * kStageCols;
        const uint32_t dst = ptx::smem_addr(ring + s * kStageBytes);
#pragma unroll
        for (int o = 0; o < kOpb; ++o)
          ptx::bulk_copy_g2s(dst + o * kStageCols * 2, src + int64_t(o) * k, kStageCols * 2, full(s), policy);
      }
    }
    // Leaving is safe: every copy completes on a barrier the compute warps
    // wait on before the CTA can end.
    return;
  }

  // x comes from the previous grid.
  ptx::griddep_wait();
  SPARK_TRACE_WAITED();
  ptx::griddep_launch_dependents();
  const bool publishing = a.publish.mode != mailbox_dev::PublishTarget::kNone;
  uint32_t stage = 0;
  if (publishing && t < kValues / 2) stage = mailbox_dev::publish_stage(a.publish, t == 0 && blockIdx.x == 0);
  for (int v = t; v < a.m * k / 8; v += kStagedBlock)
    reinterpret_cast<uint4*>(xs)[v] = ptx::ld_v4(a.x + int64_t(v) * 8);
  ptx::named_barrier_sync(1, kStagedBlock);

  float acc[kOpb][kRows];
  for (int i = 0; i < items; ++i) {
    const int s = i % stages, c = i % chunks;
    if (c == 0) {
#pragma unroll
      for (int o = 0; o < kOpb; ++o)
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[o][r] = 0.0f;
    }
    ptx::mbarrier_wait_parity(full(s), (i / stages) & 1);
    const unsigned char* stage_w = ring + s * kStageBytes;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int vec = u * kStagedBlock + t;  // 16-byte vector within the stage's rows
      uint4 w[kOpb];
#pragma unroll
      for (int o = 0; o < kOpb; ++o) w[o] = *reinterpret_cast<const uint4*>(stage_w + (o * kStageCols + 8 * vec) * 2);
      const int col = c * kStageCols + 8 * vec;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < a.m) {
          float xf[8];
          skinny::unpack8(*reinterpret_cast<const uint4*>(xs + r * k + col), xf);
#pragma unroll
          for (int o = 0; o < kOpb; ++o) acc[o][r] = skinny::dot8(w[o], xf, acc[o][r]);
        }
      }
    }
    // This warp is done reading stage s (mbarrier.arrive releases its reads).
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(empty(s));
    if (c == chunks - 1) {
      // Tiles alternate between two partial buffers, so that a fast warp's
      // next tile never overwrites sums another thread is still adding.
      const int tile = tile0 + i / chunks, p = (i / chunks) & 1;
      skinny::finish_tile<kWarps>(acc, partials + p * kWarps * 16, y_pubs + p * 16, a, tile * kOpb, publishing, stage,
                                  [] { ptx::named_barrier_sync(1, kStagedBlock); });
    }
  }
}

}  // namespace spark_decode::kernels
