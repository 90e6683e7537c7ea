// Host launcher of the ring MMA engine (src/kernels/gemm/ring_mma.cuh).
// Internal: PoolerGemm validates, this prepares and launches.
#pragma once

#include <cuda_runtime_api.h>

#include "spark_decode/mailbox_view.h"

namespace spark_decode::engines {

class RingMma {
 public:
  // An [n, k] BF16 weight with n % kRingRows == 0 and k % kRingKMultiple ==
  // 0 (the caller checked) on `device`, current. Prepares both token tiles:
  // their shared memory (RuntimeError where the device allows less) and the
  // grid, one CTA per SM walking the 32-row tiles.
  RingMma(const void* weight, int n, int k, int device, bool enable_pdl);

  // out[m, n] = x[m, k] @ W^T, and with `publish` the same rows into its
  // mailbox. No checks.
  void launch(const void* x, void* out, int m, const MailboxView* publish, cudaStream_t stream) const;

 private:
  const void* weight_;
  int n_, k_, grid_;
  bool enable_pdl_;
};

}  // namespace spark_decode::engines
