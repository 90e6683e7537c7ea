// A diagnostic kernel (`spark-decode bench unpooler --ring`), not a library
// engine: a streaming MMA GEMM for decode batches,
//   out[m, n] = x[m, k] @ W[n, k]^T     BF16 in and out, FP32 accumulation,
// whose weights reach the MMA through a per-warp ring of shared-memory
// stages filled by cp.async, so that no register holds a weight in flight
// and a warp's stream does not stop while it multiplies. It prices SPEC
// §2.1's "straight to registers" for the unpooler (which excludes it) and
// is a candidate pooler engine (§2.3 allows any faster kernel);
// bench/NOTES.md has the measurements.
//
// A CTA (one per SM) owns tiles of 32 rows (two 16-row MMA tiles): tile
// blockIdx.x, then blockIdx.x + gridDim.x, ...; its W warps split K: warp w
// owns K [w K / W, (w + 1) K / W) of every tile. A stage is 128 K of the
// tile's 32 rows for one warp (8 KiB): 16 copies of 16 bytes per lane, in the
// unpooler's row-swizzled pattern (each instruction 4 rows x 128 bytes); a
// lane reads the half its MMA fragment needs from its partner's slot, so the
// shuffle of the register kernel is not needed. The ring holds D stages per
// warp; stage j + D is issued as soon as stage j is in registers. XSPT > 0:
// the warp's whole x slice (m <= 8) is loaded into registers once, after
// griddepcontrol.wait, instead of per stage from L2.
//
// Summation order: a warp accumulates its K range in the unpooler's order
// (MMA steps in K order into accumulator set step % ACCS, sets summed in
// order), and the W warp partials are summed in warp order: fixed by
// (K, W, ACCS), independent of m and of the other rows. Not bitwise equal to
// the Unpooler (whose K split differs); the bench prints the largest
// difference.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/pooler/skinny_gemm.cuh"
#include "kernels/unpooler/unpooler_kernel.cuh"

namespace spark_decode::bench {
using kernels::PoolerGemmArgs;
using kernels::unpooler_row_of_group;
using kernels::word;

namespace ring {
inline constexpr int kRows = 32;        // rows per tile (two MMA tiles)
inline constexpr int kStageK = 128;     // K per stage
inline constexpr int kSlots = 16;       // 16-byte copies per lane per stage
inline constexpr int kStageBytes = kSlots * 32 * 16;
__host__ __device__ constexpr int partial_floats(int warps, int tile) { return warps * 2 * tile * 16; }
__host__ __device__ constexpr int smem_bytes(int warps, int depth, int tile) {
  return warps * depth * kStageBytes + 2 * partial_floats(warps, tile) * 4;  // the ring, two tiles of partials
}
}  // namespace ring

template <int W, int D, int TILE, int ACCS, int XSPT = 0>
__global__ void __launch_bounds__(32 * W, 1) ring_gemm_kernel(const PoolerGemmArgs a) {
  constexpr int kNt = TILE / 8;
  constexpr int kV = ring::kStageK / kUnpoolerBlockK;  // 4 vectors per row per stage
  constexpr int kFragment = TILE * 16;                 // floats per (row tile, warp)
  constexpr int kPartial = 2 * kFragment;              // floats per warp partial of a tile
  extern __shared__ __align__(128) unsigned char smem[];
  float* const partials = reinterpret_cast<float*>(smem + W * D * ring::kStageBytes);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const bool odd = g & 1;
  const int k = a.k;
  const int kw = k / W;
  const int spt = kw / ring::kStageK;  // stages per tile
  const int tiles = a.n / ring::kRows;
  const int my_tiles = blockIdx.x < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int total = my_tiles * spt;
  const uint64_t policy = ptx::l2_policy_evict_first();
  const uint32_t ring_base = ptx::smem_addr(smem) + warp * D * ring::kStageBytes;
  auto slot_addr = [&](int stage_slot, int idx, int ln) {
    return ring_base + (stage_slot * ring::kSlots + idx) * 512 + ln * 16;
  };
  // Slot index of (row tile r, vector v, half ab: 0 rows g, 1 rows g + 8).
  auto idx_of = [](int r, int v, int ab) { return (r * kV + v) * 2 + ab; };

  auto issue = [&](int j) {
    if (j < total) {
      const int tile = blockIdx.x + (j / spt) * gridDim.x, ks = j % spt;
      const size_t row0 = size_t(tile) * ring::kRows;
      const int kb = warp * kw + ks * ring::kStageK + t * 8;
      const __nv_bfloat16* w_p = a.w + (row0 + g / 2) * k + kb + (odd ? kUnpoolerBlockK : 0);
      const __nv_bfloat16* w_q = a.w + (row0 + 4 + g / 2) * k + kb + (odd ? 0 : kUnpoolerBlockK);
      const int s = j % D;
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int v = 0; v < kV; v += 2) {
          const size_t at = size_t(r) * 16 * k + v * kUnpoolerBlockK;
          ptx::cp_async_stream_16(slot_addr(s, idx_of(r, v, 0), lane), w_p + at, policy);
          ptx::cp_async_stream_16(slot_addr(s, idx_of(r, v, 1), lane), w_p + at + 8 * size_t(k), policy);
          ptx::cp_async_stream_16(slot_addr(s, idx_of(r, v + 1, 0), lane), w_q + at, policy);
          ptx::cp_async_stream_16(slot_addr(s, idx_of(r, v + 1, 1), lane), w_q + at + 8 * size_t(k), policy);
        }
    }
    ptx::cp_async_commit();  // empty groups too: the wait counts stay uniform
  };

#pragma unroll
  for (int j = 0; j < D; ++j) issue(j);

  ptx::griddep_wait();
  ptx::griddep_launch_dependents();

  // XSPT > 0 (stages per tile, compile time): the warp's whole x slice held
  // in registers, loaded once after the wait.
  constexpr int kXv = XSPT > 0 ? XSPT * kV : 1;
  uint4 xr[kXv][kNt];
  // XSPT < 0: each stage's x loaded into registers one stage ahead: xb
  // holds the next stage's, copied into xa (this stage's) as it begins.
  uint4 xa[kV][kNt], xb[kV][kNt];
#define RING_LOAD_X(dst, jj)                                                                              \
  do {                                                                                                    \
    const int kx_ = warp * kw + ((jj) % spt) * ring::kStageK + t * 8;                                     \
    _Pragma("unroll") for (int v = 0; v < kV; ++v) _Pragma("unroll") for (int nt = 0; nt < kNt; ++nt) {  \
      const int token = nt * 8 + g;                                                                       \
      dst[v][nt] = (jj) < total && token < a.m ? ptx::ld_v4(a.x + size_t(token) * k + kx_ + v * kUnpoolerBlockK) \
                                               : make_uint4(0, 0, 0, 0);                                  \
    }                                                                                                     \
  } while (0)
  if constexpr (XSPT < 0) RING_LOAD_X(xb, 0);
  if constexpr (XSPT > 0) {
#pragma unroll
    for (int v = 0; v < kXv; ++v)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        const int token = nt * 8 + g;
        xr[v][nt] = token < a.m ? ptx::ld_v4(a.x + size_t(token) * k + warp * kw + t * 8 + v * kUnpoolerBlockK)
                                : make_uint4(0, 0, 0, 0);
      }
  }
  float acc[2][ACCS][kNt][4];
  constexpr int kInner = XSPT > 0 ? XSPT : 1;
  for (int jo = 0; jo < total; jo += kInner)
#pragma unroll
  for (int ji = 0; ji < kInner; ++ji) {
    const int j = jo + ji;
    const int ks = XSPT > 0 ? ji : j % spt, s = j % D;
    const int tile_i = j / spt;
    if constexpr (XSPT < 0) {
#pragma unroll
      for (int v = 0; v < kV; ++v)
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) xa[v][nt] = xb[v][nt];
      RING_LOAD_X(xb, j + 1);
    }
    if (ks == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int c = 0; c < ACCS; ++c)
#pragma unroll
          for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[r][c][nt][i] = 0.0f;
    }
    ptx::cp_async_wait<D - 1>();
    __syncwarp();
    const int kb = warp * kw + ks * ring::kStageK + t * 8;
#pragma unroll
    for (int q = 0; q < kV; q += 2) {
      uint4 wa[2][2], wb[2][2];  // [r][lo, hi]
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        wa[r][0] = ptx::ld_shared_v4(slot_addr(s, idx_of(r, q + odd, 0), lane));
        wa[r][1] = ptx::ld_shared_v4(slot_addr(s, idx_of(r, q + odd, 0), lane ^ 4));
        wb[r][0] = ptx::ld_shared_v4(slot_addr(s, idx_of(r, q + odd, 1), lane));
        wb[r][1] = ptx::ld_shared_v4(slot_addr(s, idx_of(r, q + odd, 1), lane ^ 4));
      }
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const int v = q + p;
        const int step = 2 * (ks * kV + v);
        uint4 xv[kNt];
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
          const int token = nt * 8 + g;
          if constexpr (XSPT > 0)
            xv[nt] = xr[ks * kV + v][nt];
          else if constexpr (XSPT < 0)
            xv[nt] = xa[v][nt];
          else
            xv[nt] = token < a.m ? ptx::ld_v4(a.x + size_t(token) * k + kb + v * kUnpoolerBlockK)
                                 : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const uint32_t am[4] = {word(wa[r][p], 2 * h), word(wb[r][p], 2 * h), word(wa[r][p], 2 * h + 1),
                                    word(wb[r][p], 2 * h + 1)};
#pragma unroll
            for (int nt = 0; nt < kNt; ++nt)
              ptx::mma_m16n8k16_bf16(acc[r][(step + h) % ACCS][nt], am, word(xv[nt], 2 * h),
                                     word(xv[nt], 2 * h + 1));
          }
      }
    }
    __syncwarp();  // every lane has read this slot (partners read each other's)
    issue(j + D);

    if (ks == spt - 1) {
      // The tile's warp partials, then the CTA sums them in warp order.
      float* mine = partials + ((tile_i & 1) * W + warp) * kPartial + lane * 4;
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
          float o[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            o[i] = acc[r][0][nt][i];
#pragma unroll
            for (int c = 1; c < ACCS; ++c) o[i] += acc[r][c][nt][i];
          }
          *reinterpret_cast<float4*>(mine + (r * kNt + nt) * 128) = make_float4(o[0], o[1], o[2], o[3]);
        }
      __syncthreads();
      const float* buf = partials + (tile_i & 1) * W * kPartial;
      const int tile = blockIdx.x + tile_i * gridDim.x;
      for (int e = threadIdx.x; e < kPartial; e += 32 * W) {
        const int i = e & 3, ln = (e >> 2) & 31, r = (e >> 7) / kNt, nt = (e >> 7) % kNt;
        const int token = nt * 8 + 2 * (ln & 3) + (i & 1);
        const int row = r * 16 + unpooler_row_of_group(ln >> 2) + (i >> 1) * 8;
        if (token >= a.m) continue;
        float sum = buf[e];
#pragma unroll 8
        for (int w2 = 1; w2 < W; ++w2) sum += buf[w2 * kPartial + e];
        a.out[size_t(token) * a.n + size_t(tile) * ring::kRows + row] = __float2bfloat16_rn(sum);
      }
    }
  }
  ptx::cp_async_wait<0>();
}

#undef RING_LOAD_X

}  // namespace spark_decode::bench
