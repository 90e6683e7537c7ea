// spark_decode/expert_norm.h: pre_expert_norm, the standalone kernel
// (docs/design.md, "The Pooler"; the stock path's norm and the Pooler's BF16 edge layers).
//
//   y[r, :] = bf16_rn(x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * (w + gain_center))
//
// FP32 from the BF16 inputs, one rounding at the end. The mean(x^2)
// reduction order is defined once (src/kernels/norm/rms.cuh) and shared with
// the Pooler's fused consumer, so both give the same bits. rsqrt is the
// GPU's rsqrt.approx (about 2 ulp): the CPU reference
// (reference::expert_norm) agrees within one BF16 ulp, not bit for bit.
//
// Requirements (checked; InvalidArgument, nothing launched):
//   weight  BF16 [cols] contiguous, 16-byte aligned, device memory, with
//           cols % 512 == 0 and 512 <= cols <= 16384 (one thread per 16
//           columns, a whole number of warps, at most 1024 threads);
//   x, y    BF16 [rows, cols] contiguous, 16-byte aligned, on the weight's
//           device (current on the calling thread), 1 <= rows <= 65535 *
//           1024; y may not overlap x;
//   eps     >= 0 and not NaN; the device of compute capability 9.0+
//           (RuntimeError below).
// The weight is read before griddepcontrol.wait (programmatic dependent
// launch): no grid that may still be running when run() is enqueued may
// write it. x is read after.
// run() may not allocate or synchronise; it is CUDA-graph capturable
// (one kernel, grid (rows), cols / 16 threads).
#pragma once

#include <cuda_runtime_api.h>

#include <optional>
#include <string>

#include "spark_decode/types.h"

namespace spark_decode {

class ExpertNorm {
 public:
  // weight: a view (it must outlive the ExpertNorm).
  ExpertNorm(const TensorRef& weight, float eps, float gain_center, bool enable_pdl = true);

  // Why a row of `cols` columns has no launch shape, or nullopt.
  static std::optional<std::string> cols_unsupported(int cols);

  // y[rows, cols] = norm(x[rows, cols]); x, y device pointers.
  void run(const void* x, void* y, int rows, cudaStream_t stream) const;
  void run(const TensorRef& x, const TensorRef& y, cudaStream_t stream) const;

  int cols() const { return cols_; }
  int device() const { return device_; }
  float eps() const { return eps_; }
  float gain_center() const { return gain_center_; }
  const void* weight() const { return weight_; }

 private:
  const void* weight_;
  int cols_, device_;
  float eps_, gain_center_;
  bool enable_pdl_;
};

}  // namespace spark_decode
