// The Pooler's fused consumer: gather + pre_expert_norm (+ NVFP4) over the
// Lamport mailbox, in the layer's output format: the normed BF16 rows, or
// their NVFP4 codes with linear or swizzled block scales (docs/design.md,
// "The Pooler", "Exact semantics"). The mailbox steps
// (read ACTIVE, advance, poll and clear) are mailbox/device.cuh's, the norm is norm/rms.cuh's and the
// quantizer nvfp4/nvfp4.cuh's: this kernel only wires them together, so its
// bytes equal the stock gather + ExpertNorm + nvfp4_quantize by
// construction (and the GPU tests check it).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common/trace.cuh"
#include "kernels/mailbox/device.cuh"
#include "kernels/norm/rms.cuh"
#include "kernels/nvfp4/nvfp4.cuh"
#include "kernels/nvfp4/scale_layout.h"

namespace spark_decode::kernels {

// The output formats (spark_decode::OutputFormat's values).
inline constexpr int kFormatBf16 = 0, kFormatNvfp4 = 1, kFormatNvfp4Swizzled = 2;

struct GatherNormArgs {
  MailboxView mailbox;
  const __nv_bfloat16* weight;  // [tp * width] norm weight
  const float* global_scale;    // [1] (NVFP4 formats)
  __nv_bfloat16* normed;        // bf16: [b, P]
  uint8_t* a;                   // NVFP4: [b, P / 2]
  uint8_t* a_sf;                // NVFP4: linear [b, P / 16]; swizzled [round_up(b, 128), P / 16]
  int b;
  float eps, gain_center;
  // Where this grid lets the next one launch (griddepcontrol.launch_dependents):
  // at its start (1), so the next layer's GEMM streams its weights under this
  // kernel, or once this thread's data has arrived (0). Either is correct
  // (device.cuh, ordering 6); the plan table's consumer launch point picks by
  // measurement (docs/perf/consumer.md).
  int launch_next_early;
  // The swizzled scales' padding stored before the wait (1) or after it (0).
  // Before is safe only where the previous grid is the Pooler's own GEMM or
  // publish (Pooler::run): it triggers this grid only after its own
  // griddepcontrol.wait, so every grid before it, among them any reader of
  // the call before's outputs, has completed (docs/design.md, "Outputs before
  // the wait").
  // After a caller's kernel, which may trigger at its start and still read
  // those outputs, the padding waits like every other store.
  int pad_before_wait;
  int pad_ctas;  // the swizzled format's pad CTAs (kSwizzlePadCtas)
};

// Grid (b), plus kSwizzlePadCtas for the swizzled scales' padding; block
// P / 16 = tp * width / 16: thread t of CTA i owns columns
// [16t, 16t + 16) of row i, which lie in one source's block (width % 16 ==
// 0): it takes their two vectors from the mailbox (poll, then clear), joins
// the row's mean(x^2), normalises and stores its 16 normed values or
// quantizes them as one NVFP4 block (with the swizzled scales, the zeros of
// rows i + 32, + 64, + 96 beside row i's scales; the other padding is the
// extra CTAs'). Every output store follows griddepcontrol.wait (the
// previous grid may still read the outputs of the call before), but the
// padding's where pad_before_wait lets it precede the wait. A row any of
// whose vectors could not be read (the mailbox failed: device.cuh,
// record_failure) is stored poisoned: BF16 NaN (0xFFFF) in every normed
// value, or every scale byte of the row kPoisonScale (E4M3 NaN) over its
// NVFP4 codes.
inline constexpr uint8_t kPoisonScale = 0x7f;
// The swizzled format's extra CTAs, past the b row CTAs: they store the
// scale tiles' zero padding. Eight spread its stores over as many SMs; in
// Pooler::run they store it before the wait, while the GEMM before them
// still runs, and leave, so they hold nothing up (docs/perf/consumer.md,
// "Output formats").
inline constexpr int kSwizzlePadCtas = 8;

// The zero padding of the swizzled scales, by pad CTA `pad` of
// a.pad_ctas: no data of this call goes into it. The swizzled tile of
// scale columns [4q, 4q + 4) (512 bytes) holds row r's 4 bytes at
// 16 (r % 32) + 4 ((r % 128) / 32): with b <= 32 (checked on the host)
// 16-byte piece j < b is row j's 4 scales then zeros (rows j + 32, + 64,
// + 96: padding, stored with the scales by row j's CTA), and pieces j >= b
// are all padding: these.
__device__ __forceinline__ void store_swizzle_padding(const GatherNormArgs& a, int scale_cols, int pad) {
  uint4* const sf_pieces = reinterpret_cast<uint4*>(a.a_sf);  // [tiles][32] pieces of the first band
  const int pieces = scale_cols / 4 * 32;
  for (int f = pad * blockDim.x + threadIdx.x; f < pieces; f += a.pad_ctas * blockDim.x)
    if ((f & 31) >= a.b) sf_pieces[f] = make_uint4(0, 0, 0, 0);
}

template <int FORMAT>
__global__ void gather_norm_kernel(const GatherNormArgs a) {
  SPARK_TRACE_CTA(kGatherNorm);
  __shared__ float warp_sums[norm::kMaxWarps];
  __shared__ int row_failed;
  const MailboxView& mb = a.mailbox;
  const mailbox::Layout layout = mailbox_dev::layout_of(mb);
  const int t = threadIdx.x, row = blockIdx.x;
  const int cols = layout.tp * layout.width;
  const int source = 16 * t / layout.width, col = 16 * t % layout.width;
  // A pad CTA (swizzled format, blockIdx.x >= b) stores the padding and
  // leaves (its exit lets the next grid launch as a trigger would): here,
  // before the wait, where pad_before_wait allows it, else right after the
  // wait below. Not on the row CTAs' path from their data's arrival: at
  // b = 1 one SM storing the whole tile band cost more than the rest of the
  // kernel's stores.
  const bool pad = FORMAT == kFormatNvfp4Swizzled && row >= a.b;
  if (pad && a.pad_before_wait) {
    store_swizzle_padding(a, cols / 16, row - a.b);
    return;
  }
  // Model parameters no grid writes: read before the wait.
  float w[16];
  nvfp4::bf16x8_to_float(ptx::ld_v4(a.weight + 16 * t), w);
  nvfp4::bf16x8_to_float(ptx::ld_v4(a.weight + 16 * t + 8), w + 8);
  if (t == 0) row_failed = 0;
  // Before the wait, so off the path from the data's arrival: row_failed's
  // initial value is seen by every thread that may set it.
  __syncthreads();

  // The next grid (the next layer's GEMM) may launch now and stream its
  // weights while this one waits (device.cuh, ordering 6).
  if (a.launch_next_early) ptx::griddep_launch_dependents();
  // ACTIVE comes from this call's publisher. The global scale is read after
  // the wait, as the stock quantize kernel reads it: a scale some earlier
  // kernel computes is then seen alike by both paths.
  ptx::griddep_wait();
  SPARK_TRACE_WAITED();
  const int scale_cols = cols / 16;  // a multiple of 32 (P % 512 == 0): no padding columns
  if (pad) {
    store_swizzle_padding(a, scale_cols, row - a.b);
    return;
  }
  const float global_scale = FORMAT == kFormatBf16 ? 0.0f : *a.global_scale;
  const uint4 state = mailbox_dev::read_state(mb.state);
  const uint32_t active = state.y;
  // A failed mailbox (STATUS set) gives nothing but poison from now on.
  bool failed = state.z != 0;
  SPARK_TRACE_MARK(0, active);  // ACTIVE has arrived
  if (t == 0 && row == 0 && !failed && mailbox_dev::check_published(mb, state))
    mailbox_dev::advance(mb.state, active, a.b);
  const int stage = mailbox::word_stage(active);
  uint16_t* const local = mb.local;

  uint4 v[2];
  mailbox_dev::take_vecs(local + layout.offset(stage, source, row, col), mb, mailbox_dev::expect(active, a.b), stage,
                         source, row, v, failed);
  SPARK_TRACE_MARK(1, v[1].w);  // this thread's data has arrived
  if (!a.launch_next_early) ptx::griddep_launch_dependents();
  // Read after inv_rms's __syncthreads.
  if (failed) row_failed = 1;

  float x[16], y[16];
  nvfp4::bf16x8_to_float(v[0], x);
  nvfp4::bf16x8_to_float(v[1], x + 8);
  const float inv = norm::inv_rms(x, cols, a.eps, warp_sums);
  uint4 normed[2];
  norm::normalize(x, w, inv, a.gain_center, y, normed);
  const bool poisoned = row_failed != 0;
  if constexpr (FORMAT == kFormatBf16) {
    if (poisoned) normed[0] = normed[1] = mailbox_dev::poison_vec();
    __nv_bfloat16* const out = a.normed + int64_t(row) * cols + 16 * t;
    ptx::st_v4(out, normed[0]);
    ptx::st_v4(out + 8, normed[1]);
    return;
  }
  uint32_t packed[2] = {0, 0};
  const uint32_t sf = poisoned ? kPoisonScale : nvfp4::quantize_block(y, global_scale, packed);
  *reinterpret_cast<uint2*>(a.a + int64_t(row) * (cols / 2) + 8 * t) = make_uint2(packed[0], packed[1]);
  if constexpr (FORMAT == kFormatNvfp4) {
    a.a_sf[int64_t(row) * scale_cols + t] = static_cast<uint8_t>(sf);
  } else {
    // Row i's piece of every tile whole (see the padding above): its 4 scale
    // bytes, gathered from the quad into one lane, then the zeros of rows
    // i + 32, + 64, + 96: one 16-byte store instead of one byte per scale.
    static_assert(nvfp4::kBlock == 16);
    const uint32_t b1 = __shfl_down_sync(0xffffffffu, sf, 1), b2 = __shfl_down_sync(0xffffffffu, sf, 2),
                   b3 = __shfl_down_sync(0xffffffffu, sf, 3);
    uint4* const sf_pieces = reinterpret_cast<uint4*>(a.a_sf);
    if ((t & 3) == 0)
      sf_pieces[(t / 4) * 32 + row] = make_uint4((sf & 0xffu) | (b1 & 0xffu) << 8 | (b2 & 0xffu) << 16 | (b3 & 0xffu) << 24, 0, 0,
                                                 0);
  }
}

}  // namespace spark_decode::kernels
