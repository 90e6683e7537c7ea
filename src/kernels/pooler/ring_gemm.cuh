// The pooler GEMM's ring engine: a streaming tensor-core GEMM for decode
// batches,
//   out[m, n] = x[m, k] @ W[n, k]^T     BF16 in and out, FP32 accumulation,
// whose weights reach mma.sync through a per-warp ring of shared-memory
// stages filled by cp.async (LDGSTS).
//
// Why: the register engines (the skinny GEMM, the Unpooler's MMA engine)
// hold every weight byte in flight in a register, so a warp can issue no
// load while it multiplies what arrived, and a CTA's stream stops between
// its loads and its exit; at b >= 2 the MMA engine at tp 1 sits 1-1.5 us
// above a plain streaming read of the same bytes (bench/NOTES.md). Here the
// copies land in shared memory without a register, so each warp keeps D - 1
// stages in flight while it computes the oldest, and a CTA streams several
// row tiles back to back: one CTA per SM, one weight stream per warp that
// never stops until its last tile. (At the pooler's own shapes a CTA gets
// one tile: tp 1 has 128 on 132 SMs; several where N > 32 x SMs.)
//
// Shape: tiles of RT 16-row MMA tiles. RT = 2, KS = 1 (split 1): 32-row
// tiles; CTA c owns tiles c, c + gridDim.x, ... (gridDim.x <= the SM count);
// its ring::kWarps (8) warps split K: warp w owns K [w K / 8, (w + 1) K / 8)
// of every tile. RT = 4, KS = 2 (split 2): 64-row tiles, each CTA reading x
// once per 64 rows instead of 32; to keep the SMs busy (tp 1: 64 tiles) a
// tile's K is split between the KS CTAs of a cluster (grid (tiles in flight,
// KS), cluster (1, KS, 1)): rank r's warp w owns the (r 8 + w)-th K / (8 KS).
// (KS = 4 passes the tests but is not compiled: only 30 clusters of four
// such CTAs fit an H200 at once, so the model's 32 or 64 tiles take two
// rounds; measured 2.5-4 us slower.) A stage is 8 KiB of a warp's rows (128
// K of 32 rows, 64 K of 64): 16 copies of 16 bytes per lane, in the
// Unpooler's row-swizzled pattern (each instruction reads 4 rows x 128
// contiguous bytes); a lane then reads the half its MMA fragment needs from
// its partner lane's slot, which replaces the Unpooler's shuffle.
// Stage j + D refills stage j's slot once stage j's MMAs are issued. The first D
// stages are issued before griddepcontrol.wait (weights; programmatic
// dependent launch streams them under the previous kernel's tail); x only
// after it, ahead of its MMAs (x's L2 latency would otherwise sit on every
// stage's critical path: measured, 0.3-1.9 us per call at b = 4..16): at the
// 8-token tile into registers as many stages ahead as the weights, in a ring
// of register sets (x_sets); at the 16-token tile, where register sets cost
// too many registers, into shared memory by the same cp.async group as its
// stage's weights, the room taken from the weights (rings of depth 2 there;
// x_staged).
//
// Summation order (reproducible, batch invariant): a warp accumulates its K
// range in MMA steps in K order into accumulator set step % 2, the sets
// summed 0 then 1; a CTA's 8 warp partials are summed in warp order; with a
// cluster, rank 0 adds the other ranks' CTA sums in rank order. Fixed by K
// alone: not by m, the other rows, the tile order or the grid. It differs
// between the splits and from the other engines' orders (last bits).
//
// The cluster's handshake (split 2), per tile: every CTA sums its warps;
// each rank > 0 waits at the cluster barrier (phase = tile), stores its sum
// into rank 0's shared memory with st.async on rank 0's mbarrier (phase =
// tile), and arrives for the next tile; rank 0 waits for the bytes, adds,
// re-arms its mbarrier and then arrives, so a sender never overwrites sums
// rank 0 has not read. A sender leaves after its last stores.
//
// Fused publish (args.publish): the epilogue also writes each tile's y into
// the mailbox, the bytes and stage word the mailbox's own publisher writes.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/common/trace.cuh"
#include "kernels/mailbox/mailbox_device.cuh"
#include "kernels/pooler/skinny_gemm.cuh"
#include "kernels/unpooler/unpooler_kernel.cuh"

namespace spark_decode::kernels {

namespace ring {
inline constexpr int kWarps = 8;                  // per CTA (one CTA per SM)
inline constexpr int kDepth = 3;                  // stages per warp's ring
inline constexpr int kStageBytes = 16 * 32 * 16;  // 8 KiB: 16 copies of 16 bytes per lane
// At the 16-token tile x is staged: copied into shared memory by the same
// cp.async group as its stage's weights, so it arrives with them (register
// sets ahead measured 0.3-1.3 us slower there, too many registers; x's L2
// round trips in the stage loop cost 1-1.7 us, bench/NOTES.md). The room
// comes from a shallower ring: two weight stages per warp instead of three.
__host__ __device__ constexpr bool x_staged(int tile) { return tile == 16; }
__host__ __device__ constexpr int depth(int tile) { return x_staged(tile) ? 2 : kDepth; }
// Register sets of x per warp: at the 8-token tile kDepth, x loaded as far
// ahead as the weights (measured at kDepth = 3, one H200, bench/NOTES.md);
// staged, one set that holds the current stage's fragments.
__host__ __device__ constexpr int x_sets(int tile) { return x_staged(tile) ? 1 : kDepth; }
// A tile is RT 16-row MMA tiles (RT = 2: 32 rows, one CTA each; RT = 4: 64
// rows, K split over the KS CTAs of a cluster). A stage is 8 KiB of a warp's
// rows whatever their number: 256 / RT K.
__host__ __device__ constexpr int rows(int rt) { return 16 * rt; }
__host__ __device__ constexpr int stage_k(int rt) { return 256 / rt; }
__host__ __device__ constexpr int k_multiple(int rt, int ks) { return kWarps * ks * stage_k(rt); }
// FP32 warp partial of a tile, as the lanes hold the accumulators.
__host__ __device__ constexpr int partial_floats(int tile, int rt) { return rt * 16 * tile; }
// Warp partial buffers: RT = 2 keeps one per warp and tile parity (as
// measured); RT = 4 sums them in two rounds of 4 warps to leave room for the
// other CTAs' partials beside the rings (227 KiB per CTA at most).
__host__ __device__ constexpr int partial_buffers(int rt) { return rt == 2 ? 2 * kWarps : kWarps / 2; }
// A staged x stage: [tile tokens][stage K] BF16.
__host__ __device__ constexpr int x_stage_bytes(int tile, int rt) { return x_staged(tile) ? tile * stage_k(rt) * 2 : 0; }
// Shared memory: the rings (weights, then staged x), the warp partials, the
// other ranks' CTA partials and an mbarrier (cluster rank 0), the tile's y
// (BF16 [16][rows]).
__host__ __device__ constexpr int smem_bytes(int tile, int rt, int ks) {
  return kWarps * depth(tile) * (kStageBytes + x_stage_bytes(tile, rt)) +
         partial_buffers(rt) * partial_floats(tile, rt) * 4 + (ks - 1) * partial_floats(tile, rt) * 4 +
         (ks > 1 ? 16 : 0) + 16 * rows(rt) * 2;
}
// Rank 0's mbarrier for the other ranks' partials: initialised, armed for
// the first tile's `bytes`, and made visible to the cluster. Not inlined: as
// a predicated block in the kernel, ptxas issues the one thread's init on the
// warp's uniform datapath with all lanes active, which compute-sanitizer's
// racecheck reports as a race between another lane's init and the arm; a
// call is a real branch that only the calling thread takes.
__device__ __noinline__ void init_cluster_mbarrier(uint32_t bar, int bytes) {
  ptx::mbarrier_init(bar, 1);
  ptx::mbarrier_arrive_expect_tx(bar, bytes);
  ptx::fence_mbarrier_init_cluster();
}
}  // namespace ring

template <int TILE, int RT, int KS>
__global__ void __launch_bounds__(32 * ring::kWarps, 1) ring_gemm_kernel(const PoolerGemmArgs a) {
  SPARK_TRACE_CTA(kRingGemm);
  constexpr bool XS = ring::x_staged(TILE);
  constexpr int W = ring::kWarps, D = ring::depth(TILE), R = ring::x_sets(TILE);
  static_assert(XS || R > 1, "x either staged or in register sets ahead");
  static_assert((RT == 2 && KS == 1) || (RT == 4 && (KS == 2 || KS == 4)), "the ring's shapes (see above)");
  constexpr int kNt = TILE / 8;
  constexpr int kRows = ring::rows(RT), kStageK = ring::stage_k(RT);
  constexpr int kV = kStageK / kUnpoolerBlockK;  // vectors per row per stage (4 or 2)
  constexpr int kSlots = 2 * RT * kV;            // 16-byte copies per lane per stage
  static_assert(kSlots * 32 * 16 == ring::kStageBytes);
  constexpr int kPartial = ring::partial_floats(TILE, RT);  // floats per warp partial of a tile
  extern __shared__ __align__(16) unsigned char smem[];     // 16-byte copies and reads only
  constexpr int kXStage = ring::x_stage_bytes(TILE, RT);  // bytes (0: x in registers)
  constexpr int kXChunks = kStageK / 8;                    // 16-byte chunks per token of a staged x stage
  float* const partials = reinterpret_cast<float*>(smem + W * D * (ring::kStageBytes + kXStage));
  float* const remote_partials = partials + ring::partial_buffers(RT) * kPartial;  // [KS - 1][kPartial]
  uint64_t* const bar = reinterpret_cast<uint64_t*>(remote_partials + (KS - 1) * kPartial);
  __nv_bfloat16* const y_tile =
      reinterpret_cast<__nv_bfloat16*>(reinterpret_cast<unsigned char*>(bar) + (KS > 1 ? 16 : 0));

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const bool odd = g & 1;
  const int k = a.k;
  const int kw = k / (W * KS);
  // K offset of this warp's range: with a cluster, rank blockIdx.y owns the
  // rank-th K / KS of every tile of cluster blockIdx.x.
  const int k0 = KS > 1 ? (int(blockIdx.y) * W + warp) * kw : warp * kw;
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

  const bool rank0 = KS == 1 || blockIdx.y == 0;
  if constexpr (KS > 1) {
    // Rank 0 receives the other ranks' CTA partials of each tile on its
    // mbarrier (phase = tile index). Initialised and armed for the first
    // tile before the cluster barrier's first arrival, which the senders wait
    // on before their first store.
    if (rank0 && threadIdx.x == 0) ring::init_cluster_mbarrier(ptx::smem_addr(bar), (KS - 1) * kPartial * 4);
    ptx::cluster_arrive_relaxed();
  }

  // Stage j's weight copies. Lane (g, t) copies, as the Unpooler's swizzled
  // loads do, vector v + (g & 1) of row g / 2 and vector v + 1 - (g & 1) of
  // row 4 + g / 2 of each vector pair (rows 8 on for the second half).
  auto issue_w = [&](int j) {
    if (j < total) {
      const int tile = blockIdx.x + (j / spt) * gridDim.x, ks = j % spt;
      const size_t row0 = size_t(tile) * kRows;
      const int kb = k0 + ks * kStageK + t * 8;
      const __nv_bfloat16* w_p = a.w + (row0 + g / 2) * k + kb + (odd ? kUnpoolerBlockK : 0);
      const __nv_bfloat16* w_q = a.w + (row0 + 4 + g / 2) * k + kb + (odd ? 0 : kUnpoolerBlockK);
      const int s = j % D;
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int v = 0; v < kV; v += 2) {
          const size_t at = size_t(r) * 16 * k + v * kUnpoolerBlockK;
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
  const bool publishing = a.publish.mode != mailbox_dev::PublishTarget::kNone;
  constexpr int kItems = kRows / 8;  // 16-byte vectors of y per token and tile
  uint32_t stage = 0;
  if (publishing && rank0 && threadIdx.x < kItems * a.m)
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
        dst[v][nt] = jj < total && token < a.m ? ptx::ld_v4(a.x + size_t(token) * k + kx + v * kUnpoolerBlockK)
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
      const uint4 y = *reinterpret_cast<const uint4*>(y_tile + threadIdx.x * 8);
      *reinterpret_cast<uint4*>(a.out + size_t(token) * a.n + col) = y;
      if (publishing)
        mailbox_dev::store_to_all(a.publish.copies, a.publish.layout.tp, a.publish.rank,
                                  a.publish.layout.offset(stage, a.publish.rank, token, col),
                                  mailbox_dev::publish_vec(y));
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
        // Unpooler's row swizzle): slot q + (g & 1) of this lane holds vector
        // q of them and the same slot of its partner g ^ 1 vector q + 1 (what
        // the Unpooler's unswizzle_pair exchanges by shuffle).
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
      __syncwarp();  // every lane has read slot s (partners read each other's)
      // x before the weight copies: measured faster only in that order, which
      // tools/check_sass.py (X_BEFORE_COPIES) checks in the machine code.
      if constexpr (!XS) load_x(xr[u], j + R);
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
        if constexpr (KS == 1) {
          // Summed in warp order. (Two buffers by tile parity, as measured; one
          // would do, since the second barrier below already orders this tile's
          // reads before the next tile's writes.)
          write_partial(partials + ((tile_i & 1) * W + warp) * kPartial);
          __syncthreads();
          const float* buf = partials + (tile_i & 1) * W * kPartial;
          for (int e = threadIdx.x; e < kPartial; e += 32 * W) {
            const int i = e & 3, ln = (e >> 2) & 31, r = (e >> 7) / kNt, nt = (e >> 7) % kNt;
            const int token = nt * 8 + 2 * (ln & 3) + (i & 1);
            const int row = r * 16 + unpooler_row_of_group(ln >> 2) + (i >> 1) * 8;
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
        } else {
          // Thread e4 owns floats [4 e4, 4 e4 + 4) of the tile's partial (one
          // lane's share of one fragment: one 16-byte read per buffer). The CTA's
          // partial is summed in warp order, in two rounds of W / 2 warps
          // through the same W / 2 buffers (the order is the same as in one);
          // rank 0 then adds the other ranks' in rank order.
          const int e4 = threadIdx.x;
          const bool owner = 4 * e4 < kPartial;
          float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int round = 0; round < 2; ++round) {
            if (warp / (W / 2) == round) write_partial(partials + (warp % (W / 2)) * kPartial);
            __syncthreads();
            if (owner)
#pragma unroll
              for (int w2 = 0; w2 < W / 2; ++w2) {
                const float4 p = *reinterpret_cast<const float4*>(partials + w2 * kPartial + 4 * e4);
                if (round == 0 && w2 == 0) {
                  sum[0] = p.x, sum[1] = p.y, sum[2] = p.z, sum[3] = p.w;
                } else {
                  sum[0] += p.x, sum[1] += p.y, sum[2] += p.z, sum[3] += p.w;
                }
              }
            __syncthreads();  // the buffers are rewritten by the next round or tile
          }
          const bool more = tile_i + 1 < my_tiles;
          // Cluster barrier phase tile_i: every CTA of the cluster has started
          // and rank 0 has read the previous tile's remote partials and armed its
          // mbarrier for this one.
          ptx::cluster_wait_acquire();
          if (!rank0) {
            if (owner) {
              const uint32_t remote =
                  ptx::map_cluster_addr(ptx::smem_addr(remote_partials + (blockIdx.y - 1) * kPartial + 4 * e4), 0);
              ptx::st_async_v4(remote, sum[0], sum[1], sum[2], sum[3], ptx::map_cluster_addr(ptx::smem_addr(bar), 0));
            }
            // A sender leaves after its last tile's stores are issued (st.async
            // reads its registers at issue), freeing its SM for the next grid.
            if (more) ptx::cluster_arrive_relaxed();
          } else {
            ptx::mbarrier_wait_parity(ptx::smem_addr(bar), tile_i & 1);
            if (owner) {
#pragma unroll
              for (int rk = 0; rk < KS - 1; ++rk) {
                const float4 p = *reinterpret_cast<const float4*>(remote_partials + rk * kPartial + 4 * e4);
                sum[0] += p.x, sum[1] += p.y, sum[2] += p.z, sum[3] += p.w;
              }
              const int ln = e4 & 31, r = (e4 >> 5) / kNt, nt = (e4 >> 5) % kNt;
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const int token = nt * 8 + 2 * (ln & 3) + (i & 1);
                const int row = r * 16 + unpooler_row_of_group(ln >> 2) + (i >> 1) * 8;
                if (token < a.m) y_tile[token * kRows + row] = __float2bfloat16_rn(sum[i]);
              }
            }
            if (more) {
              // The next tile's phase: armed once this one completed (this thread
              // waited for it); the senders store again only after every thread
              // here has arrived, i.e. has read this tile's remote partials.
              if (threadIdx.x == 0)
                ptx::mbarrier_arrive_expect_tx(ptx::smem_addr(bar), (KS - 1) * kPartial * int(sizeof(float)));
              ptx::cluster_arrive_release();
            }
            __syncthreads();
            store_y(tile_i);
            // (y_tile is rewritten only after the next tile's round barriers,
            // which every thread reaches after these reads.)
          }
        }
      }
    }
  ptx::cp_async_wait<0>();  // the empty trailing groups
}

}  // namespace spark_decode::kernels
