// The skinny GEMM engine: a CUDA-core GEMM for decode batches,
//   out[m, n] = x[m, k] @ W[n, k]^T     BF16 in and out, FP32 accumulation,
// with the original design's launch shape (block_size, outputs_per_block,
// k_unroll).
//
// CTA j owns the kOpb output columns [j kOpb, (j + 1) kOpb) for every row;
// its kBlock threads split K: thread t owns the 16-byte vectors (8 values)
// v = c * kBlock * kUnroll + u * kBlock + t of every weight row, u < kUnroll,
// for chunks c = 0, 1, ... (consecutive threads read consecutive 16 bytes:
// coalesced). A chunk's kUnroll x kOpb weight vectors are loaded into
// registers together; the first chunk is loaded BEFORE griddepcontrol.wait
// (weights are parameters no grid writes), so with programmatic dependent
// launch the weight stream starts while the previous kernel finishes; x is
// read only after the wait. At K = 8 kBlock kUnroll (the table's shapes
// for H = 8192) the whole weight slice of a thread is in flight at once.
//
// Summation order (reproducible and batch invariant; docs/design.md, "Exact
// semantics"): each thread
// accumulates its vectors in increasing v, the 8 values of a vector left to
// right, with fused multiply-adds; the 32 lanes of a warp are combined by a
// tree that first adds lanes differing in bit 4 of the lane index, then bit
// 3, ..., bit 0 (a reduce-scatter, so that each lane ends up holding a share
// of the kOpb x kRows sums instead of all of them); the warp sums are added
// in warp order. Floating-point addition is commutative, so which lane of a
// pair performs an addition does not change a bit: the result of row i
// depends on (K, kBlock) alone, not on the row tile, the other rows, or kOpb.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/common/trace.cuh"
#include "kernels/gemm/mma_fragment.cuh"

namespace spark_decode::kernels {

namespace skinny {

// acc += dot(w[0..8), x[0..8)) left to right, w and x packed BF16 pairs.
__device__ __forceinline__ float dot8(const uint4& w, const float (&x)[8], float acc) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = __fmaf_rn(__uint_as_float(ws[i] << 16), x[2 * i], acc);
    acc = __fmaf_rn(__uint_as_float(ws[i] & 0xffff0000u), x[2 * i + 1], acc);
  }
  return acc;
}

__device__ __forceinline__ void unpack8(const uint4& v, float (&f)[8]) {
  const uint32_t vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(vs[i] << 16);
    f[2 * i + 1] = __uint_as_float(vs[i] & 0xffff0000u);
  }
}

// One step of the warp reduction at lane mask kMask over kCount values per
// lane (see the file comment); `base` collects the index of the lane's first
// remaining value.
template <int kCount, int kMask>
__device__ __forceinline__ void reduce_scatter(float* v, int lane, int& base) {
  if constexpr (kMask > 0) {
    if constexpr (kCount > 1) {
      constexpr int kHalf = kCount / 2;
      const bool upper = (lane & kMask) != 0;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? v[i] : v[kHalf + i];
        const float keep = upper ? v[kHalf + i] : v[i];
        v[i] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, kMask));
      }
      if (upper) base += kHalf;
      reduce_scatter<kHalf, kMask / 2>(v, lane, base);
    } else {
      v[0] = __fadd_rn(v[0], __shfl_xor_sync(0xffffffffu, v[0], kMask));
      reduce_scatter<1, kMask / 2>(v, lane, base);
    }
  }
}

}  // namespace skinny

// kRows: the row tile (1, 2, 4, 8 or 16); rows >= m are neither read nor
// stored. kOpb * kRows must be a power of two (the reduce-scatter halves it).
// Host checks: n % kOpb == 0, k % (8 kBlock kUnroll) == 0, 1 <= m <= kRows.
template <int kBlock, int kOpb, int kUnroll, int kRows>
__global__ void __launch_bounds__(kBlock) skinny_gemm_kernel(const GemmArgs a) {
  SPARK_TRACE_CTA(kSkinny);
  constexpr int kWarps = kBlock / 32;
  constexpr int kValues = kOpb * kRows;
  static_assert(kBlock % 32 == 0 && kBlock <= 1024, "whole warps");
  static_assert((kValues & (kValues - 1)) == 0, "kOpb * kRows must be a power of two");
  static_assert(kOpb % 2 == 0, "the fused publish stores column pairs");
  __shared__ float partial[kWarps][kValues];

  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int n0 = blockIdx.x * kOpb;
  const int k = a.k;
  constexpr int kChunkVecs = kBlock * kUnroll;
  const int chunks = k / (8 * kChunkVecs);
  const uint64_t policy = ptx::l2_policy_evict_first();

  uint4 w[kUnroll][kOpb];
  const __nv_bfloat16* wbase = a.w + int64_t(n0) * k + 8 * t;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
#pragma unroll
    for (int o = 0; o < kOpb; ++o) w[u][o] = ptx::ld_stream_v4(wbase + int64_t(o) * k + 8 * u * kBlock, policy);

  // x comes from the previous grid.
  ptx::griddep_wait();
  SPARK_TRACE_WAITED();
  ptx::griddep_launch_dependents();
  // The fused publish's stage, read after the wait as the mailbox's own
  // publisher reads it, and now, so that its latency hides under the loads.
  const bool publishing = a.publish.mode != mailbox_dev::Publish::kNone;
  uint32_t stage = 0;
  if (publishing && t < kValues / 2) stage = mailbox_dev::publish_stage(a.publish, t == 0 && blockIdx.x == 0);

  float acc[kOpb][kRows];
#pragma unroll
  for (int o = 0; o < kOpb; ++o)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[o][r] = 0.0f;

  const __nv_bfloat16* xbase = a.x + 8 * t;
  for (int c = 0; c < chunks; ++c) {
    if (c > 0) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int o = 0; o < kOpb; ++o)
          w[u][o] = ptx::ld_stream_v4(wbase + int64_t(o) * k + 8 * (c * kChunkVecs + u * kBlock), policy);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int col = 8 * (c * kChunkVecs + u * kBlock);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r < a.m) {
          float xf[8];
          skinny::unpack8(ptx::ld_v4(xbase + int64_t(r) * k + col), xf);
#pragma unroll
          for (int o = 0; o < kOpb; ++o) acc[o][r] = skinny::dot8(w[u][o], xf, acc[o][r]);
        }
      }
    }
  }

  float v[kValues];
#pragma unroll
  for (int o = 0; o < kOpb; ++o)
#pragma unroll
    for (int r = 0; r < kRows; ++r) v[o * kRows + r] = acc[o][r];
  int base = 0;
  skinny::reduce_scatter<kValues, 16>(v, lane, base);
  if constexpr (kValues >= 32) {
#pragma unroll
    for (int i = 0; i < kValues / 32; ++i) partial[warp][base + i] = v[i];
  } else {
    // 32 / kValues lanes hold each sum (the butterfly's tail): the one whose
    // low lane bits are zero stores it.
    if ((lane & (32 / kValues - 1)) == 0) partial[warp][base] = v[0];
  }
  __syncthreads();
  // y in shared memory too when publishing: the mailbox takes BF16 pairs.
  __shared__ uint16_t y_pub[kValues];
  if (t < kValues) {
    const int o = t / kRows, r = t % kRows;
    if (r < a.m) {
      float s = partial[0][t];
#pragma unroll
      for (int wi = 1; wi < kWarps; ++wi) s = __fadd_rn(s, partial[wi][t]);
      const __nv_bfloat16 y = __float2bfloat16_rn(s);
      a.out[int64_t(r) * a.n + n0 + o] = y;
      if (publishing) y_pub[t] = __bfloat16_as_ushort(y);
    }
  }
  if (!publishing) return;
  __syncthreads();
  // Columns (2p, 2p + 1) of row r go out as one 32-bit word: the pollers
  // load the mailbox as 32-bit elements (a 16-byte vector is four of them
  // in the PTX memory model), and a store of the same size and alignment
  // keeps the race between them inside the model (a 2-byte store racing a
  // 4-byte load is a mixed-size race, which the model leaves undefined).
  if (t < kValues / 2) {
    const int p = t / kRows, r = t % kRows;
    if (r < a.m) {
      const uint32_t pair = uint32_t(y_pub[(2 * p) * kRows + r]) | uint32_t(y_pub[(2 * p + 1) * kRows + r]) << 16;
      const MailboxView& mb = a.publish.mailbox;
      mailbox_dev::store_pair_to_all(mb, mailbox_dev::layout_of(mb).offset(stage, mb.rank, r, n0 + 2 * p), pair);
    }
  }
}

}  // namespace spark_decode::kernels
