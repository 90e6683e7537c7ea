// The stand-ins of `spark-decode step` for the work a decode step does
// between its MoE boundaries (bench/step.h), and the replay check's kernel.
//
// experts   the routed experts: their [b, P] BF16 output from their input,
//           the dequantized input itself (NVFP4: code value times block scale
//           over the global scale; BF16: the normed value);
// residual  the rest of the layer: out[b, H] = h + update, the next layer's
//           pooler input.
// Both add +0.0f before rounding to BF16, which maps -0.0 to +0.0 (round to
// nearest), so the sign of a zero input never reaches their output: the one
// place the fast path's bits may differ from the stock path's
// (docs/design.md, "Exact semantics", Bit-exactness: publishers store -0.0
// as +0.0) cannot reach the final hidden rows.
//
// Their cost, per layer and rank at b rows: experts read b P / 2 + b P / 16
// bytes (NVFP4) or 2 b P (BF16) and write 2 b P; residual reads 4 b H and
// writes 2 b H. At b = 16 that is under 1 MiB, against the boundary's 128 / tp
// MiB of weights (64 / tp each GEMM): 0.7% of its bytes at tp 1, 5.7% at tp 8.
// They stand in for kernels that cost far more (the experts' weights); the
// step reports them apart (timed alone) so that the boundary's share is
// stated, not hidden.
//
// Launch: one kernel each, capturable, allocating nothing. With enable_pdl
// each waits (griddepcontrol.wait) before it reads anything, as every kernel
// between two of the mailbox's must (docs/design.md, "The Lamport mailbox
// protocol", ordering 6); launch_next_early lets the next kernel launch at
// its start instead of at its exit (what a model's own kernels, which know
// nothing of PDL, allow).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "spark_decode/pooler.h"

namespace spark_decode::bench::standins {

// The experts' input, as the Pooler's consumer (or the stock norm and
// quantize kernels) left it.
struct ExpertInput {
  OutputFormat format = OutputFormat::nvfp4;
  const void* normed = nullptr;        // bf16: [b, P]
  const void* a = nullptr;             // NVFP4: U8 [b, P / 2]
  const void* a_sf = nullptr;          // NVFP4: E4M3, pooler_output_spec's layout
  const float* global_scale = nullptr; // NVFP4: [1]
};

// m [b, P] BF16 from `in`. P % 512 == 0, P <= 16384 (one thread per NVFP4
// block); pointers 16-byte aligned device memory of the current device.
void experts(const ExpertInput& in, void* m, int b, int pooled, bool enable_pdl, bool launch_next_early,
             cudaStream_t stream);

// out [b, H] = bf16(h + update + 0.0f), FP32 sum; H % 8 == 0, pointers
// 16-byte aligned; out may not overlap either input.
void residual(const void* h, const void* update, void* out, int b, int hidden, bool enable_pdl,
              bool launch_next_early, cudaStream_t stream);

// counter += the number of BF16 elements of a[n] and b[n] whose bits differ
// (no PDL: the replay check runs between graph replays).
void count_mismatches(const void* a, const void* b, int64_t n, unsigned long long* counter, cudaStream_t stream);

// Loads the kernels above now: a lazily loaded kernel's first launch may wait
// for the whole device, which never goes idle while a rank sharing it spins
// on a peer (mailbox.h, shares_device).
void load();

}  // namespace spark_decode::bench::standins
