#include <cmath>

#include "spark_decode/bf16.h"
#include "spark_decode/reference.h"

namespace spark_decode::reference {

void expert_norm(const uint16_t* x, const uint16_t* w, uint16_t* y, int rows, int cols, float eps, float gain_center,
                 std::vector<double>* exact) {
  if (exact) exact->assign(static_cast<size_t>(rows) * cols, 0.0);
  for (int r = 0; r < rows; ++r) {
    const uint16_t* xr = x + static_cast<size_t>(r) * cols;
    double ss = 0.0;
    for (int c = 0; c < cols; ++c) {
      const double v = bf16_to_float(xr[c]);
      ss += v * v;
    }
    const double inv = 1.0 / std::sqrt(ss / cols + static_cast<double>(eps));
    for (int c = 0; c < cols; ++c) {
      const double v = bf16_to_float(xr[c]) * inv * (static_cast<double>(bf16_to_float(w[c])) + gain_center);
      const size_t o = static_cast<size_t>(r) * cols + c;
      // FP64 -> FP32 -> BF16: the FP32 step rounds too, which matters only
      // within 2^-24 of a BF16 tie; the tests' one-ulp bound covers it.
      y[o] = float_to_bf16_rne(static_cast<float>(v));
      if (exact) (*exact)[o] = v;
    }
  }
}

}  // namespace spark_decode::reference
