// The ring MMA engine: a streaming tensor-core GEMM for decode batches,
//   out[m, n] = x[m, k] @ W[n, k]^T     BF16 in and out, FP32 accumulation,
// whose weights reach mma.sync through a per-warp ring of shared-memory
// stages filled by cp.async (LDGSTS). The pooler GEMM's engine at tp 1.
//
// Why: the register engines (skinny, splitk_mma) hold every weight byte in
// flight in a register, so a warp can issue no load while it multiplies what
// arrived, and a CTA's stream stops between its loads and its exit; at b >= 2
// the split-K engine at tp 1 sits well above a plain streaming read of the
// same bytes (docs/perf/pooler_gemm.md). Here the copies land in shared
// memory without a register, so each warp keeps D - 1 stages in flight while
// it computes the oldest, and a CTA streams several row tiles back to back:
// one CTA per SM, one weight stream per warp that never stops until its last
// tile. (At the pooler's own shapes a CTA gets one tile: tp 1 has 128 on 132
// SMs; several where N > 32 x SMs.)
//
// Shape: 32-row tiles (two 16-row MMA tiles, RT = 2); CTA c owns tiles c,
// c + gridDim.x, ... (gridDim.x <= the SM count); its ring::kWarps (8) warps
// split K: warp w owns K [w K / 8, (w + 1) K / 8) of every tile. A stage is
// 8 KiB of a warp's rows (128 K of 32 rows): 16 copies of 16 bytes per lane,
// in the split-K engine's row-swizzled pattern (each instruction reads 4 rows
// x 128 contiguous bytes); a lane then reads the half its MMA fragment needs
// from its partner lane's slot, which replaces the split-K engine's shuffle.
// Stage j + D refills stage j's slot once stage j's MMAs are issued. The
// first D stages are issued before griddepcontrol.wait (weights; programmatic
// dependent launch streams them under the previous kernel's tail); x only
// after it, ahead of its MMAs (x's L2 latency would otherwise sit on every
// stage's critical path): at the 8-token tile into registers as many stages
// ahead as the weights, in a ring of register sets (x_sets); at the 16-token
// tile, where register sets cost too many registers, into shared memory by
// the same cp.async group as its stage's weights, the room taken from the
// weights (rings of depth 2 there; x_staged).
//
// Summation order (reproducible, batch invariant): a warp accumulates its K
// range in MMA steps in K order into accumulator set step % 2, the sets
// summed 0 then 1; a CTA's 8 warp partials are summed in warp order. Fixed by
// K alone: not by m, the other rows, the tile order or the grid. It differs
// from the other engines' orders (last bits).
//
// Fused publish (a.publish): the epilogue also writes each tile's y into
// the mailbox, the bytes and stage word the mailbox's own publisher writes.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/common/trace.cuh"
#include "kernels/common/limits.h"
#include "kernels/gemm/mma_fragment.cuh"

namespace spark_decode::kernels {

namespace ring {
inline constexpr int kWarps = 8;                  // per CTA (one CTA per SM)
inline constexpr int kDepth = 3;                  // stages per warp's ring
inline constexpr int kStageBytes = 16 * 32 * 16;  // 8 KiB: 16 copies of 16 bytes per lane
inline constexpr int kRt = 2;                     // 16-row MMA tiles per 32-row tile
inline constexpr int kRows = 16 * kRt;
inline constexpr int kStageK = 256 / kRt;         // K of a stage: 8 KiB of the tile's rows
inline constexpr int kKMultiple = kWarps * kStageK;
// At the 16-token tile x is staged: copied into shared memory by the same
// cp.async group as its stage's weights, so it arrives with them (register
// sets ahead measured slower there, too many registers; x's L2 round trips
// in the stage loop were measured costly, docs/perf/pooler_gemm.md). The room comes
// from a shallower ring: two weight stages per warp instead of three.
__host__ __device__ constexpr bool x_staged(int tile) { return tile == 16; }
__host__ __device__ constexpr int depth(int tile) { return x_staged(tile) ? 2 : kDepth; }
// Register sets of x per warp: at the 8-token tile kDepth, x loaded as far
// ahead as the weights; staged, one set that holds the current stage's
// fragments.
__host__ __device__ constexpr int x_sets(int tile) { return x_staged(tile) ? 1 : kDepth; }
// FP32 warp partial of a tile, as the lanes hold the accumulators.
__host__ __device__ constexpr int partial_floats(int tile) { return kRt * 16 * tile; }
// Warp partial buffers: one per warp and tile parity.
inline constexpr int kPartialBuffers = 2 * kWarps;
// A staged x stage: [tile tokens][stage K] BF16.
__host__ __device__ constexpr int x_stage_bytes(int tile) { return x_staged(tile) ? tile * kStageK * 2 : 0; }
// Shared memory: the rings (weights, then staged x), the warp partials, the
// tile's y (BF16 [16][rows]).
__host__ __device__ constexpr int smem_bytes(int tile) {
  return kWarps * depth(tile) * (kStageBytes + x_stage_bytes(tile)) + kPartialBuffers * partial_floats(tile) * 4 +
         16 * kRows * 2;
}
static_assert(smem_bytes(8) <= kMaxSmemPerBlock && smem_bytes(16) <= kMaxSmemPerBlock,
              "a ring shape needs more shared memory than an H100/H200 CTA can have");
}  // namespace ring

template <int TILE>
__global__ void __launch_bounds__(32 * ring::kWarps, 1) ring_mma_kernel(const GemmArgs a) {
  SPARK_TRACE_CTA(kRingMma);
  constexpr bool XS = ring::x_staged(TILE);
  constexpr int W = ring::kWarps, D = ring::depth(TILE), R = ring::x_sets(TILE);
  static_assert(XS || R > 1, "x either staged or in register sets ahead");
  constexpr int RT = ring::kRt;
  constexpr int kNt = TILE / 8;
  constexpr int kRows = ring::kRows, kStageK = ring::kStageK;
  constexpr int kV = kStageK / kSplitKBlockK;  // vectors per row per stage (4 or 2)
  constexpr int kSlots = 2 * RT * kV;            // 16-byte copies per lane per stage
  static_assert(kSlots * 32 * 16 == ring::kStageBytes);
  constexpr int kPartial = ring::partial_floats(TILE);  // floats per warp partial of a tile
  extern __shared__ __align__(16) unsigned char smem[];     // 16-byte copies and reads only
  constexpr int kXStage = ring::x_stage_bytes(TILE);  // bytes (0: x in registers)
  constexpr int kXChunks = kStageK / 8;                    // 16-byte chunks per token of a staged x stage
  float* const partials = reinterpret_cast<float*>(smem + W * D * (ring::kStageBytes + kXStage));
  __nv_bfloat16* const y_tile = reinterpret_cast<__nv_bfloat16*>(partials + ring::kPartialBuffers * kPartial);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const bool odd = g & 1;
  const int k = a.k;
  const int kw = k / W;
  const int k0 = warp * kw;  // K offset of this warp's range
  const int spt = kw / kStageK;  // stages per tile
  const int tiles = a.n / kRows;
  const int my_tiles = blockIdx.x < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int total = my_tiles * spt;  // this warp's stages
  const uint64_t policy = ptx::l2_policy_evict_first();
  const uint32_t ring_base = ptx::smem_addr(smem) + warp * D * ring::kStageBytes;
  // Copy slot idx of stage slot s, lane ln: idx = (row tile r, vector v,
  // half ab: rows g or g + 8) as (r kV + v) 2 + ab; a slot is 32 lanes x 16
  // bytes, so a warp's reads of one slot are conflict-free.
  auto slot_addr = [&](int s, int idx, int ln) { return ring_base + (s * kSlots + idx) * 512 + ln * 16; };
  // Staged x: chunk c of token r of stage slot s, at chunk c ^ 4 (r & 1) of
  // the token's row, so that the 8 lanes of a quarter warp (tokens g, g + 1)
  // read 8 different bank groups.
  const uint32_t x_base = ptx::smem_addr(smem) + W * D * ring::kStageBytes + warp * D * kXStage;
  auto x_addr = [&](int s, int r, int c) { return x_base + s * kXStage + (r * kXChunks + (c ^ ((r & 1) << 2))) * 16; };
  auto idx_of = [](int r, int v, int ab) { return (r * kV + v) * 2 + ab; };

  // Stage j's weight copies. Lane (g, t) copies, as the split-K engine's swizzled
  // loads do, vector v + (g & 1) of row g / 2 and vector v + 1 - (g & 1) of
  // row 4 + g / 2 of each vector pair (rows 8 on for the second half).
  auto issue_w = [&](int j) {
    if (j < total) {
      const int tile = blockIdx.x + (j / spt) * gridDim.x, ks = j % spt;
      const size_t row0 = size_t(tile) * kRows;
      const int kb = k0 + ks * kStageK + t * 8;
      const __nv_bfloat16* w_p = a.w + (row0 + g / 2) * k + kb + (odd ? kSplitKBlockK : 0);
      const __nv_bfloat16* w_q = a.w + (row0 + 4 + g / 2) * k + kb + (odd ? 0 : kSplitKBlockK);
      const int s = j % D;
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int v = 0; v < kV; v += 2) {
          const size_t at = size_t(r) * 16 * k + v * kSplitKBlockK;
          ptx::cp_async_stream_16(slot_addr(s, idx_of(r, v, 0), lane), w_p + at, policy);
          ptx::cp_async_stream_16(slot_addr(s, idx_of(r, v, 1), lane), w_p + at + 8 * size_t(k), policy);
          ptx::cp_async_stream_16(slot_addr(s, idx_of(r, v + 1, 0), lane), w_q + at, policy);
          ptx::cp_async_stream_16(slot_addr(s, idx_of(r, v + 1, 1), lane), w_q + at + 8 * size_t(k), policy);
        }
    }
  };
  // Stage j's staged x (XS): the m tokens' rows of its K, coalesced; rows
  // past m are not copied (their fragments read as zero).
  auto issue_x = [&](int j) {
    if (j < total) {
      const int kx = k0 + (j % spt) * kStageK, s = j % D;
#pragma unroll
      for (int i = 0; i < TILE * kXChunks / 32; ++i) {
        const int idx = lane + 32 * i, r = idx / kXChunks, c = idx % kXChunks;
        if (r < a.m) ptx::cp_async_16(x_addr(s, r, c), a.x + size_t(r) * k + kx + c * 8);
      }
    }
  };
  // Stage j's group (an empty group past the end keeps the wait counts
  // uniform).
  auto issue = [&](int j) {
    issue_w(j);
    if constexpr (XS) issue_x(j);
    ptx::cp_async_commit();
  };

  // The first D stages' weights before the wait. Staged x only after it:
  // group 0 then holds the first D stages' weights and stage 0's x, group j
  // < D stage j's x, and from there group j stage j's weights and x, so that
  // waiting for group j still finds all of stage j.
#pragma unroll
  for (int j = 0; j < D; ++j) {
    issue_w(j);
    if constexpr (!XS) ptx::cp_async_commit();
  }

  // x is written by the previous grid.
  ptx::griddep_wait();
  SPARK_TRACE_WAITED();
  ptx::griddep_launch_dependents();
  if constexpr (XS) {
#pragma unroll
    for (int j = 0; j < D; ++j) {
      issue_x(j);
      ptx::cp_async_commit();
    }
  }
  const bool publishing = a.publish.mode != mailbox_dev::Publish::kNone;
  constexpr int kItems = kRows / 8;  // 16-byte vectors of y per token and tile
  uint32_t stage = 0;
  if (publishing && threadIdx.x < kItems * a.m)
    stage = mailbox_dev::publish_stage(a.publish, threadIdx.x == 0 && blockIdx.x == 0);

  // x of stage jj (the same K for every tile) into a register set.
  using XSet = uint4[kV][kNt];
  auto load_x = [&](XSet& dst, int jj) {
    const int kx = k0 + (jj % spt) * kStageK + t * 8;
#pragma unroll
    for (int v = 0; v < kV; ++v)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        const int token = nt * 8 + g;
        dst[v][nt] = jj < total && token < a.m ? ptx::ld_v4(a.x + size_t(token) * k + kx + v * kSplitKBlockK)
                                               : make_uint4(0, 0, 0, 0);
      }
  };
  // In registers (!XS): set u holds stage j's x for j = u (mod R), reloaded
  // with stage j + R's once stage j's MMAs are issued. Staged: xr[0] takes
  // each stage's fragments from shared memory after its wait.
  XSet xr[R];
  if constexpr (!XS) {
#pragma unroll
    for (int u = 0; u < R; ++u) load_x(xr[u], u);
  }

  // Item (token, c): features [8c, 8c + 8) of the tile for one token, from
  // y_tile to out (and the mailbox).
  auto store_y = [&](int tile_i) {
    const int col0 = (blockIdx.x + tile_i * gridDim.x) * kRows;
    if (threadIdx.x < kItems * a.m) {
      const int token = threadIdx.x / kItems, col = col0 + (threadIdx.x % kItems) * 8;
      store_y_vec(a, stage, token, col, *reinterpret_cast<const uint4*>(y_tile + threadIdx.x * 8));
    }
  };

  // acc[r][h]: the MMA steps of a vector's halves h = 0, 1 are 2 (ks kV + v)
  // + h, and a step's accumulator set is step % 2 (the header's order): h.
  float acc[RT][2][kNt][4];
  // Unrolled by R so that every register set's index is a constant.
  for (int j0 = 0; j0 < total; j0 += R)
#pragma unroll
    for (int u = 0; u < R; ++u) {
      const int j = j0 + u;
      if (j >= total) break;
      const int ks = j % spt, s = j % D, tile_i = j / spt;
      if (ks == 0) {
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int c = 0; c < 2; ++c)
#pragma unroll
            for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
              for (int i = 0; i < 4; ++i) acc[r][c][nt][i] = 0.0f;
      }
      // Stage j's copies are this thread's group j; the partner's, after the
      // __syncwarp that follows its own wait.
      ptx::cp_async_wait<D - 1>();
      __syncwarp();
      if constexpr (XS) {
        // The stage's x fragments: lane (g, t) takes the 16 bytes at K v 32 +
        // 8 t of token nt 8 + g, as load_x would.
#pragma unroll
        for (int v = 0; v < kV; ++v)
#pragma unroll
          for (int nt = 0; nt < kNt; ++nt) {
            const int r = nt * 8 + g;
            xr[0][v][nt] = r < a.m ? ptx::ld_shared_v4(x_addr(s, r, v * 4 + t)) : make_uint4(0, 0, 0, 0);
          }
      }
#pragma unroll
      for (int q = 0; q < kV; q += 2) {
        // Vectors q and q + 1 of rows perm(g), perm(g) + 8 (perm as in the
        // row swizzle, mma_fragment.cuh): slot q + (g & 1) of this lane holds vector
        // q of them and the same slot of its partner g ^ 1 vector q + 1 (what
        // the split-K engine's unswizzle_pair exchanges by shuffle).
        uint4 wa[RT][2], wb[RT][2];  // [r][0]: vector q, [r][1]: vector q + 1
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          wa[r][0] = ptx::ld_shared_v4(slot_addr(s, idx_of(r, q + odd, 0), lane));
          wa[r][1] = ptx::ld_shared_v4(slot_addr(s, idx_of(r, q + odd, 0), lane ^ 4));
          wb[r][0] = ptx::ld_shared_v4(slot_addr(s, idx_of(r, q + odd, 1), lane));
          wb[r][1] = ptx::ld_shared_v4(slot_addr(s, idx_of(r, q + odd, 1), lane ^ 4));
        }
#pragma unroll
        for (int p = 0; p < 2; ++p) {
          const int v = q + p;
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int r = 0; r < RT; ++r) {
              const uint32_t am[4] = {word(wa[r][p], 2 * h), word(wb[r][p], 2 * h), word(wa[r][p], 2 * h + 1),
                                      word(wb[r][p], 2 * h + 1)};
#pragma unroll
              for (int nt = 0; nt < kNt; ++nt)
                ptx::mma_m16n8k16_bf16(acc[r][h][nt], am, word(xr[u][v][nt], 2 * h), word(xr[u][v][nt], 2 * h + 1));
            }
        }
      }
      // x before the weight copies: measured faster only in that order, which
      // tools/check_sass.py (X_BEFORE_COPIES) checks in the machine code.
      // The __syncwarp between them keeps ptxas from moving the x loads
      // behind the copies (a memory barrier for the warp; without it the
      // order followed unrelated code in the epilogue).
      if constexpr (!XS) load_x(xr[u], j + R);
      __syncwarp();  // every lane has read slot s (partners read each other's)
      issue(j + D);

      if (ks == spt - 1) {
        // The tile's warp partials, each as its lanes hold the accumulators.
        auto write_partial = [&](float* buf) {
          float* mine = buf + lane * 4;
#pragma unroll
          for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int nt = 0; nt < kNt; ++nt) {
              float o[4];
#pragma unroll
              for (int i = 0; i < 4; ++i) o[i] = acc[r][0][nt][i] + acc[r][1][nt][i];
              *reinterpret_cast<float4*>(mine + (r * kNt + nt) * 128) = make_float4(o[0], o[1], o[2], o[3]);
            }
        };
        // Summed in warp order. (Two buffers by tile parity, as measured; one
        // would do, since the second barrier below already orders this tile's
        // reads before the next tile's writes.)
        write_partial(partials + ((tile_i & 1) * W + warp) * kPartial);
        __syncthreads();
        const float* buf = partials + (tile_i & 1) * W * kPartial;
        for (int e = threadIdx.x; e < kPartial; e += 32 * W) {
          const auto [token, row] = fragment_element<kNt>(e);
          if (token >= a.m) continue;
          float sum = buf[e];
#pragma unroll
          for (int w2 = 1; w2 < W; ++w2) sum += buf[w2 * kPartial + e];
          y_tile[token * kRows + row] = __float2bfloat16_rn(sum);
        }
        __syncthreads();
        // (y_tile is rewritten only after the next tile's first barrier, which
        // every thread reaches after these reads.)
        store_y(tile_i);
      }
    }
  ptx::cp_async_wait<0>();  // the empty trailing groups
}

}  // namespace spark_decode::kernels
