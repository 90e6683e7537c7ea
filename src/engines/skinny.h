// Host launcher of the skinny GEMM engine (src/kernels/gemm/skinny.cuh).
// Internal: PoolerGemm and skinny_gemm() validate, this launches.
#pragma once

#include <cuda_runtime_api.h>

#include "spark_decode/mailbox_view.h"
#include "spark_decode/plan.h"

namespace spark_decode::engines {

// Loads the kernel serving m rows at `shape` (never lazily under capture).
void prepare_skinny(const PoolerGemmShape& shape, int m);
// out[m, n] = x[m, k] @ W^T at `shape` (a compiled one), and with `publish`
// the same rows into its mailbox. No checks.
void launch_skinny(const PoolerGemmShape& shape, const void* w, const void* x, void* out, int n, int k, int m,
                   bool enable_pdl, const MailboxView* publish, cudaStream_t stream);

}  // namespace spark_decode::engines
