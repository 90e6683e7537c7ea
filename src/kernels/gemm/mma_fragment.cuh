// What the GEMM engines share: their arguments, the mma.sync fragment
// helpers (the row swizzle's lane map and exchange), and the epilogue store
// that also publishes into a mailbox (docs/design.md, "Zero-copy publish and
// the ticket stage").
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/mailbox/device.cuh"
#include "spark_decode/plan.h"

namespace spark_decode::kernels {

// out[m, n] = x[m, k] @ w[n, k]^T, BF16, for every engine.
struct GemmArgs {
  const __nv_bfloat16* w;  // [n, k]
  const __nv_bfloat16* x;  // [m, k]
  __nv_bfloat16* out;      // [m, n]
  int n, k, m;
  // The epilogue's publish (kNone: out only): out also goes into this rank's
  // slot of every copy of the mailbox, as its own publish kernel would put it.
  mailbox_dev::Publish publish;
};

// Word i of a 16-byte vector (four packed BF16 pairs).
__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The row swizzle (docs/design.md, "Engines"): mma.sync wants the 4 lanes of
// group g to hold one A row; a load instruction that reads 4 rows x 128
// contiguous bytes instead gives lane g the vector pair of physical row
// row_of_group(g) after one exchange between lanes g and g ^ 1. Which
// logical A row a physical row occupies changes no arithmetic.
__host__ __device__ constexpr int row_of_group(int g) { return 4 * (g & 1) + g / 2; }

// The exchange for one vector pair. On entry, lane g holds lo = vector
// 2q + (g & 1) of row g / 2 and hi = vector 2q + 1 - (g & 1) of row 4 + g / 2
// (two 4-row x 128-byte loads); on exit lo and hi are vectors 2q and 2q + 1
// of row row_of_group(g). Each lane sends the half its partner g ^ 1 owns:
// the even lane's row-(4 + j) half, the odd lane's row-j half.
__device__ __forceinline__ void unswizzle_pair(uint4& lo, uint4& hi, bool odd) {
  const uint4 p = lo, q = hi;
  const uint4 send = odd ? p : q;
  const uint4 recv = make_uint4(__shfl_xor_sync(0xffffffffu, send.x, 4), __shfl_xor_sync(0xffffffffu, send.y, 4),
                                __shfl_xor_sync(0xffffffffu, send.z, 4), __shfl_xor_sync(0xffffffffu, send.w, 4));
  lo = odd ? q : p;
  hi = recv;
}

// Element e of a warp partial stored in the MMA accumulators' order ([row
// tile][n8 tile][lane][4]) is output (token, row) of the tile: the inverse
// of the fragment layout, for the engines' reductions.
struct FragmentElement {
  int token, row;
};
template <int kNt, bool SWIZZLE = true>
__device__ __forceinline__ FragmentElement fragment_element(int e) {
  const int i = e & 3, ln = (e >> 2) & 31, r = (e >> 7) / kNt, nt = (e >> 7) % kNt;
  return {nt * 8 + 2 * (ln & 3) + (i & 1), r * kSplitKTileN + (SWIZZLE ? row_of_group(ln >> 2) : ln >> 2) + (i >> 1) * 8};
}

// The epilogue of the tensor-core engines: 8 features [col, col + 8) of one
// token, a 16-byte vector of y, stored to out and, when publishing, exactly
// what the mailbox's own publisher stores (the same vector, -0.0 as +0.0,
// into this rank's slot of every copy at `stage`).
__device__ __forceinline__ void store_y_vec(const GemmArgs& a, uint32_t stage, int token, int col, uint4 y) {
  *reinterpret_cast<uint4*>(a.out + static_cast<size_t>(token) * a.n + col) = y;
  if (a.publish.mode == mailbox_dev::Publish::kNone) return;
  const MailboxView& mb = a.publish.mailbox;
  mailbox_dev::store_to_all(mb, mailbox_dev::layout_of(mb).offset(stage, mb.rank, token, col),
                            mailbox_dev::publish_vec(y));
}

// The split-K engines' reduction and epilogue (splitk_mma and onchip_mma
// share its order, so their sums are bit-identical), once every warp
// partial [kPartial floats, fragment order] of the CTA's kRows rows is in
// `partials`, `total` of them in K order. Thread j sums element j of every
// partial in that order (j in the fragment layout), so its shared-memory
// reads are conflict-free. y goes to shared memory first, to leave as
// 16-byte rows (store_y_tile). Returns the thread's last sum (0 if none): a
// value a trace mark can wait on.
//
// NOTES: in the on-chip engine the sum is on every call's critical path
// (rank 0 starts it when the last partial lands; the grid ends when it has
// stored), and its cost is load latency, not adds. With kBatched a
// thread's partials are loaded kSumBatch at a time, predicated past
// `total`, all in flight before the first add: one shared-memory round trip
// per batch (total is 16-64 at the model's shapes), where a runtime trip
// count unrolled by 8 leaves its remainder as dependent load / add pairs.
// The split-K engine keeps that loop: the batch's registers cost one of its
// variants occupancy, and it measured slower (docs/perf/onchip.md, "The
// sum's loads in flight"). Either way the adds run in K order from partial
// 0 itself (0 + p0 would turn a -0.0 sum into +0.0): the same bits.
inline constexpr int kSumBatch = 16;
template <int kNt, bool SWIZZLE, int kRows, int kPartial, bool kBatched>
__device__ __forceinline__ float sum_partials(const GemmArgs& args, const float* partials, int total,
                                              __nv_bfloat16* y_tile) {
  float last = 0.0f;
  for (int j = threadIdx.x; j < kPartial; j += blockDim.x) {
    const auto [token, row] = fragment_element<kNt, SWIZZLE>(j);
    if (token >= args.m) continue;
    float s;
    if constexpr (kBatched) {
      float v[kSumBatch];
      const auto load_batch = [&](int w0) {
#pragma unroll
        for (int i = 0; i < kSumBatch; ++i) v[i] = w0 + i < total ? partials[(w0 + i) * kPartial + j] : 0.0f;
      };
      load_batch(0);
      s = v[0];
#pragma unroll
      for (int i = 1; i < kSumBatch; ++i)
        if (i < total) s += v[i];
      for (int w0 = kSumBatch; w0 < total; w0 += kSumBatch) {
        load_batch(w0);
#pragma unroll
        for (int i = 0; i < kSumBatch; ++i)
          if (w0 + i < total) s += v[i];
      }
    } else {
      s = partials[j];
#pragma unroll 8
      for (int w = 1; w < total; ++w) s += partials[w * kPartial + j];
    }
    y_tile[token * kRows + row] = __float2bfloat16_rn(s);
    last = s;
  }
  return last;
}

// The epilogue after sum_partials: item (token, c) is features [8c, 8c + 8)
// of the CTA's rows for one token, one 16-byte store (and, with a mailbox,
// the zero-copy publish at `stage`, NEXT's or the ticket's).
template <int kRows>
__device__ __forceinline__ void store_y_tile(const GemmArgs& args, uint32_t stage, const __nv_bfloat16* y_tile,
                                             int feature0) {
  __syncthreads();
  constexpr int kVecsPerToken = kRows / 8;
  for (int item = threadIdx.x; item < kVecsPerToken * args.m; item += blockDim.x) {
    const int token = item / kVecsPerToken, col = feature0 + (item % kVecsPerToken) * 8;
    store_y_vec(args, stage, token, col, *reinterpret_cast<const uint4*>(y_tile + item * 8));
  }
}

template <int kNt, bool SWIZZLE, int kRows, int kPartial>
__device__ __forceinline__ void sum_partials_and_store(const GemmArgs& args, uint32_t stage, const float* partials,
                                                       int total, __nv_bfloat16* y_tile, int feature0) {
  sum_partials<kNt, SWIZZLE, kRows, kPartial, false>(args, partials, total, y_tile);
  store_y_tile<kRows>(args, stage, y_tile, feature0);
}

}  // namespace spark_decode::kernels
