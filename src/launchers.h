// The unchecked launches behind the public entry points (internal). Each
// public call validates its arguments and then calls one of these; the
// Pooler validates a call once and calls them directly, so that nothing is
// checked twice on its hot path. The caller guarantees what the public
// call's header requires (shapes, alignment, device, b within capacity).
#pragma once

#include <cuda_runtime_api.h>

#include "spark_decode/mailbox_view.h"
#include "spark_decode/pooler.h"

namespace spark_decode::detail {

// The mailbox's publish kernel: rows [0, b) of src [b, width] into this
// rank's slot of every copy.
void launch_mailbox_publish(const MailboxView& mb, const void* src, int b, int threads, bool enable_pdl,
                            cudaStream_t stream);
// The plain gather consumer: out [b, tp * width].
// launch_next_early: whether it lets the next grid launch at its start or
// only once its data has arrived (where ranks share a GPU: LamportMailbox::
// shares_device).
void launch_mailbox_gather(const MailboxView& mb, void* out, int b, int threads, bool enable_pdl,
                           bool launch_next_early, cudaStream_t stream);
// The fused gather + pre_expert_norm consumer in `format` (P = tp * width):
// normed [b, P] for bf16; a [b, P/2] and a_sf (pooler_output_spec) for the
// NVFP4 formats, whose global scale it reads.
void launch_gather_norm(const MailboxView& mb, OutputFormat format, const void* norm_weight, const float* global_scale,
                        float eps, float gain_center, void* normed, void* a, void* a_sf, int b, bool enable_pdl,
                        bool launch_next_early, bool pad_before_wait, cudaStream_t stream);
// Loads the norm kernels (ExpertNorm's, the stock quantizer's, the fused
// consumer's) now: lazy loading would do it at the first launch, possibly
// under capture, and loading a module may wait for the device to go idle,
// which never happens while a consumer of ranks sharing the GPU spins on a
// peer that is itself waiting for that load.
void load_norm_kernels();
// pre_expert_norm over rows [rows, cols].
void launch_expert_norm(const void* x, const void* weight, void* y, int rows, int cols, float eps, float gain_center,
                        bool enable_pdl, cudaStream_t stream);

}  // namespace spark_decode::detail
