// spark_decode/reference.h: the CPU reference of the GEMMs and of
// pre_expert_norm.
//
// What the GPU results are checked against, and what the tool runs where no
// GPU is. Host memory only; BF16 values are raw uint16_t bit patterns. The
// NVFP4 quantizer's reference lives in nvfp4.h (reference::), the mailbox
// protocol's CPU model in src/reference/mailbox_model.h.
#pragma once

#include <cstdint>
#include <vector>

namespace spark_decode::reference {

// out[m, n] = bf16_rne(sum_k x[m, k] * w[n, k]), the sum in FP64 (exact
// enough that the only rounding that matters is the final one).
// Also returns, if asked, the FP64 sums and sum_k |x w| (for error bounds).
void gemm_bf16(const uint16_t* x, const uint16_t* w, uint16_t* out, int m, int n, int k,
               std::vector<double>* exact = nullptr, std::vector<double>* magnitude = nullptr);

// pre_expert_norm / ExpertNorm (docs/design.md, "Exact semantics"): y[r, c] = bf16_rne(x[r, c] *
// rsqrt(mean_c(x[r, :]^2) + eps) * (w[c] + gain_center)), all in FP64 from
// the BF16 inputs (the GPU works in FP32 with rsqrt.approx: its results are
// within one BF16 ulp of these, not bit-equal). x, y [rows, cols], w [cols].
// Also returns, if asked, the FP64 values before rounding.
void expert_norm(const uint16_t* x, const uint16_t* w, uint16_t* y, int rows, int cols, float eps, float gain_center,
                 std::vector<double>* exact = nullptr);

}  // namespace spark_decode::reference
