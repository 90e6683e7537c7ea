// spark_decode/reference.h: the CPU reference of every operation.
//
// What the GPU results are checked against, and what the tool runs where no
// GPU is. Host memory only; BF16 values are raw uint16_t bit patterns.
#pragma once

#include <cstdint>
#include <vector>

namespace spark_decode::reference {

// out[m, n] = bf16_rne(sum_k x[m, k] * w[n, k]), the sum in FP64 (exact
// enough that the only rounding that matters is the final one).
// Also returns, if asked, the FP64 sums and sum_k |x w| (for error bounds).
void gemm_bf16(const uint16_t* x, const uint16_t* w, uint16_t* out, int m, int n, int k,
               std::vector<double>* exact = nullptr, std::vector<double>* magnitude = nullptr);

}  // namespace spark_decode::reference
