#include "spark_decode/bf16.h"
#include "spark_decode/reference.h"

#include <cmath>

namespace spark_decode::reference {

void gemm_bf16(const uint16_t* x, const uint16_t* w, uint16_t* out, int m, int n, int k,
               std::vector<double>* exact, std::vector<double>* magnitude) {
  std::vector<double> xd(static_cast<size_t>(k));
  if (exact) exact->assign(static_cast<size_t>(m) * n, 0.0);
  if (magnitude) magnitude->assign(static_cast<size_t>(m) * n, 0.0);
  for (int i = 0; i < m; ++i) {
    for (int kk = 0; kk < k; ++kk) xd[kk] = bf16_to_float(x[static_cast<size_t>(i) * k + kk]);
    for (int j = 0; j < n; ++j) {
      const uint16_t* wr = w + static_cast<size_t>(j) * k;
      double s = 0.0, a = 0.0;
      for (int kk = 0; kk < k; ++kk) {
        const double p = xd[kk] * static_cast<double>(bf16_to_float(wr[kk]));
        s += p;
        a += std::fabs(p);
      }
      const size_t o = static_cast<size_t>(i) * n + j;
      // FP64 -> FP32 rounds once more than the GPU's FP32 sum does; the
      // tests' bound covers both roundings.
      out[o] = float_to_bf16_rne(static_cast<float>(s));
      if (exact) (*exact)[o] = s;
      if (magnitude) (*magnitude)[o] = a;
    }
  }
}

}  // namespace spark_decode::reference
