// The norm family: ExpertNorm, the stock NVFP4 quantize kernel and the
// Pooler's fused gather + norm (+ NVFP4) consumer's launch (its validation:
// pooler.cu).
// All three run the same device steps (kernels/norm/rms.cuh,
// kernels/nvfp4/nvfp4.cuh).
#include "cuda_utils.h"
#include "kernels/common/launch.cuh"
#include "kernels/consumer/gather_norm.cuh"
#include "kernels/norm/norm_kernels.cuh"
#include "launchers.h"
#include "spark_decode/error.h"
#include "spark_decode/expert_norm.h"
#include "spark_decode/mailbox.h"
#include "spark_decode/nvfp4.h"
#include "spark_decode/pooler.h"
#include "validate.h"

namespace spark_decode {

using detail::aligned;
using detail::disjoint;

namespace detail {

void launch_expert_norm(const void* x, const void* weight, void* y, int rows, int cols, float eps, float gain_center,
                        bool enable_pdl, cudaStream_t stream) {
  kernels::ExpertNormArgs args{static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(weight),
                               static_cast<__nv_bfloat16*>(y), cols, eps, gain_center};
  kernels::LaunchShape shape;
  shape.grid = dim3(rows);
  shape.block = dim3(kernels::norm::threads_for(cols));
  shape.enable_pdl = enable_pdl;
  kernels::launch(kernels::expert_norm_kernel, shape, stream, args);
}

template <int FORMAT>
void launch_gather_norm_format(const kernels::GatherNormArgs& args, int cols, bool enable_pdl, cudaStream_t stream) {
  kernels::LaunchShape shape;
  shape.grid = dim3(args.b + (FORMAT == kernels::kFormatNvfp4Swizzled ? args.pad_ctas : 0));
  shape.block = dim3(kernels::norm::threads_for(cols));
  shape.enable_pdl = enable_pdl;
  kernels::launch(kernels::gather_norm_kernel<FORMAT>, shape, stream, args);
}

void launch_gather_norm(const MailboxView& mb, OutputFormat format, const void* norm_weight, const float* global_scale,
                        float eps, float gain_center, void* normed, void* a, void* a_sf, int b, bool enable_pdl,
                        bool launch_next_early, bool pad_before_wait, cudaStream_t stream) {
  static_assert(int(OutputFormat::bf16) == kernels::kFormatBf16 && int(OutputFormat::nvfp4) == kernels::kFormatNvfp4 &&
                    int(OutputFormat::nvfp4_swizzled) == kernels::kFormatNvfp4Swizzled,
                "keep the kernel's format numbers in step with OutputFormat");
  kernels::GatherNormArgs args{};
  args.mailbox = mb;
  args.weight = static_cast<const __nv_bfloat16*>(norm_weight);
  args.global_scale = global_scale;
  args.normed = static_cast<__nv_bfloat16*>(normed);
  args.a = static_cast<uint8_t*>(a);
  args.a_sf = static_cast<uint8_t*>(a_sf);
  args.b = b;
  args.eps = eps;
  args.gain_center = gain_center;
  args.launch_next_early = launch_next_early ? 1 : 0;
  args.pad_before_wait = pad_before_wait ? 1 : 0;
  args.pad_ctas = kernels::kSwizzlePadCtas;
  const int cols = mb.tp * mb.width;
  switch (format) {
    case OutputFormat::bf16: launch_gather_norm_format<kernels::kFormatBf16>(args, cols, enable_pdl, stream); break;
    case OutputFormat::nvfp4: launch_gather_norm_format<kernels::kFormatNvfp4>(args, cols, enable_pdl, stream); break;
    case OutputFormat::nvfp4_swizzled:
      launch_gather_norm_format<kernels::kFormatNvfp4Swizzled>(args, cols, enable_pdl, stream);
      break;
  }
}

void load_norm_kernels() {
  cudaFuncAttributes attrs;
  CUDA_CHECK(cudaFuncGetAttributes(&attrs, kernels::expert_norm_kernel));
  CUDA_CHECK(cudaFuncGetAttributes(&attrs, kernels::nvfp4_quantize_kernel));
  CUDA_CHECK(cudaFuncGetAttributes(&attrs, kernels::gather_norm_kernel<kernels::kFormatBf16>));
  CUDA_CHECK(cudaFuncGetAttributes(&attrs, kernels::gather_norm_kernel<kernels::kFormatNvfp4>));
  CUDA_CHECK(cudaFuncGetAttributes(&attrs, kernels::gather_norm_kernel<kernels::kFormatNvfp4Swizzled>));
}

}  // namespace detail

std::optional<std::string> ExpertNorm::cols_unsupported(int cols) {
  const int threads = kernels::norm::threads_for(cols);
  if (cols <= 0 || cols % (kernels::norm::kColsPerThread * 32) != 0 || threads > 1024)
    return detail::concat("pre_expert_norm over ", cols, " columns: needs a multiple of ",
                          kernels::norm::kColsPerThread * 32, " in [512, 16384] (one thread per ",
                          kernels::norm::kColsPerThread, " columns, whole warps, at most 1024 threads)");
  return std::nullopt;
}

ExpertNorm::ExpertNorm(const TensorRef& weight, float eps, float gain_center, bool enable_pdl)
    : weight_(weight.data), cols_(0), device_(weight.device), eps_(eps), gain_center_(gain_center),
      enable_pdl_(enable_pdl) {
  SPARK_CHECK(weight.ndim == 1 && weight.dtype == DType::bf16 && weight.is_contiguous() &&
                  weight.is_aligned(16) && weight.data != nullptr,
              "pre_expert_norm weight ", weight.describe(), ": needs a contiguous 16-byte aligned BF16 [cols]");
  SPARK_CHECK(weight.device >= 0, "pre_expert_norm weight ", weight.describe(), ": needs device memory");
  cols_ = static_cast<int>(weight.shape[0]);
  if (auto reason = cols_unsupported(cols_)) throw InvalidArgument(*reason);
  SPARK_CHECK(eps >= 0.0f && eps == eps, "pre_expert_norm eps ", eps, " must be >= 0 (and not NaN)");
  detail::require_sm90(device_, "pre_expert_norm");
  detail::DeviceGuard guard(device_);
  detail::load_norm_kernels();  // now, not lazily under capture
}

void ExpertNorm::run(const void* x, void* y, int rows, cudaStream_t stream) const {
  SPARK_CHECK(rows >= 1 && rows <= 65535 * 1024, "pre_expert_norm: rows ", rows, " outside [1, ", 65535 * 1024, "]");
  SPARK_CHECK(aligned(x, 16) && aligned(y, 16),
              "pre_expert_norm: x and y must be non-null 16-byte aligned device pointers");
  const size_t bytes = size_t(rows) * cols_ * 2;
  SPARK_CHECK(disjoint(x, bytes, y, bytes), "pre_expert_norm: y may not overlap x");
  SPARK_CHECK(disjoint(y, bytes, weight_, size_t(cols_) * 2), "pre_expert_norm: y may not overlap the norm weight");
  detail::require_current_device(device_, "pre_expert_norm");
  detail::launch_expert_norm(x, weight_, y, rows, cols_, eps_, gain_center_, enable_pdl_, stream);
}

void ExpertNorm::run(const TensorRef& x, const TensorRef& y, cudaStream_t stream) const {
  for (const TensorRef* t : {&x, &y})
    SPARK_CHECK(t->ndim == 2 && t->shape[1] == cols_ && t->shape[0] >= 1 && t->dtype == DType::bf16 &&
                    t->is_contiguous() && t->is_aligned(16) && t->device == device_,
                "pre_expert_norm: ", t->describe(), " must be contiguous 16-byte aligned BF16 [rows, ", cols_,
                "] on cuda:", device_);
  SPARK_CHECK(x.shape[0] == y.shape[0], "pre_expert_norm: x ", x.describe(), " and y ", y.describe(),
              " differ in rows");
  run(x.data, y.data, static_cast<int>(x.shape[0]), stream);
}

void nvfp4_quantize(const void* y, const float* global_scale, void* a, void* a_sf, int rows, int cols,
                    cudaStream_t stream, bool enable_pdl, ScaleLayout layout) {
  SPARK_CHECK(rows >= 1 && rows <= 65535 && cols > 0 && cols % kNvfp4Block == 0, "nvfp4_quantize: [",
              rows, ", ", cols, "] needs 1 <= rows <= 65535 and cols % ", kNvfp4Block, " == 0");
  SPARK_CHECK(aligned(y, 16) && aligned(a, 16) && aligned(a_sf, 4) && aligned(global_scale, 4),
              "nvfp4_quantize: y and a must be 16-byte aligned, a_sf and global_scale 4-byte aligned, "
              "all non-null device pointers");
  const size_t y_bytes = size_t(rows) * cols * 2, a_bytes = y_bytes / 4;
  const size_t sf_bytes = size_t(nvfp4_scale_rows(rows, layout)) * nvfp4_scale_cols(cols, layout);
  SPARK_CHECK(disjoint(y, y_bytes, a, a_bytes) && disjoint(y, y_bytes, a_sf, sf_bytes) &&
                  disjoint(a, a_bytes, a_sf, sf_bytes),
              "nvfp4_quantize: y, a and a_sf may not overlap");
  SPARK_CHECK(disjoint(a, a_bytes, global_scale, 4) && disjoint(a_sf, sf_bytes, global_scale, 4),
              "nvfp4_quantize: a and a_sf may not overlap the global scale");
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  detail::require_sm90(device, "nvfp4_quantize");
  kernels::Nvfp4QuantizeArgs args{static_cast<const __nv_bfloat16*>(y), global_scale, static_cast<uint8_t*>(a),
                                  static_cast<uint8_t*>(a_sf), rows, cols, layout == ScaleLayout::swizzled};
  constexpr int kThreads = 128;
  kernels::LaunchShape shape;
  shape.grid = dim3((nvfp4_scale_cols(cols, layout) + kThreads - 1) / kThreads, nvfp4_scale_rows(rows, layout));
  shape.block = dim3(kThreads);
  shape.enable_pdl = enable_pdl;
  kernels::launch(kernels::nvfp4_quantize_kernel, shape, stream, args);
}

void nvfp4_quantize(const TensorRef& y, const TensorRef& global_scale, const TensorRef& a, const TensorRef& a_sf,
                    cudaStream_t stream, bool enable_pdl, ScaleLayout layout) {
  SPARK_CHECK(y.ndim == 2 && y.dtype == DType::bf16 && y.is_contiguous(), "nvfp4_quantize: y ", y.describe(),
              " must be contiguous BF16 [rows, cols]");
  const int64_t rows = y.shape[0], cols = y.shape[1];
  SPARK_CHECK(global_scale.numel() == 1 && global_scale.dtype == DType::f32, "nvfp4_quantize: global_scale ",
              global_scale.describe(), " must be one FP32 value");
  SPARK_CHECK(a.ndim == 2 && a.shape[0] == rows && a.shape[1] * 2 == cols && a.dtype == DType::u8 && a.is_contiguous(),
              "nvfp4_quantize: a ", a.describe(), " must be contiguous u8 [", rows, ", ", cols / 2, "]");
  const int64_t sf_rows = rows > 0 && rows <= 65535 ? nvfp4_scale_rows(int(rows), layout) : rows;
  const int64_t sf_cols = cols > 0 && cols % kNvfp4Block == 0 && cols <= (1 << 30)
                              ? nvfp4_scale_cols(int(cols), layout)
                              : cols / kNvfp4Block;
  SPARK_CHECK(a_sf.ndim == 2 && a_sf.shape[0] == sf_rows && a_sf.shape[1] == sf_cols &&
                  (a_sf.dtype == DType::u8 || a_sf.dtype == DType::e4m3) && a_sf.is_contiguous(),
              "nvfp4_quantize: a_sf ", a_sf.describe(), " must be contiguous u8/e4m3 [", sf_rows, ", ", sf_cols,
              "] (", scale_layout_name(layout), " scales)");
  for (const TensorRef* t : {&global_scale, &a, &a_sf})
    SPARK_CHECK(t->device == y.device && y.device >= 0, "nvfp4_quantize: ", t->describe(), " is not on y's device (",
                y.describe(), ")");
  detail::require_current_device(y.device, "nvfp4_quantize");
  nvfp4_quantize(y.data, static_cast<const float*>(global_scale.data), a.data, a_sf.data, static_cast<int>(rows),
                 static_cast<int>(cols), stream, enable_pdl, layout);
}

}  // namespace spark_decode
