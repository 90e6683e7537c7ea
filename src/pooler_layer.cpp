// pooler_layer(): a stock MoE layer checked against what the fused path
// assumes. Plain C++ (tested on machines without a GPU).
#include "spark_decode/error.h"
#include "spark_decode/pooler.h"

namespace spark_decode {

PoolerLayer pooler_layer(const StockMoeLayer& moe, int tp, int rank, const ModelShape& shape) {
  const TensorRef& w = moe.pooler_weight;
  if (w.ndim != 2 || w.shape[0] != shape.pooled || w.shape[1] != shape.hidden || w.dtype != DType::bf16)
    throw InvalidArgument(detail::concat("pooler weight must be [", shape.pooled, ", ", shape.hidden,
                                         "] BF16 (got ", w.describe(), ")"));
  const auto& norm = moe.pre_expert_norm;
  if (!norm.present || !norm.has_weight || norm.variance_size_override.has_value() ||
      norm.applies_weight_before_norm || norm.weight.ndim != 1 || norm.weight.shape[0] != shape.pooled ||
      norm.weight.dtype != DType::bf16)
    throw InvalidArgument("pre_expert_norm must apply a [P] BF16 weight after the norm");
  SPARK_CHECK(tp >= 1 && shape.pooled % tp == 0, "pooler: P = ", shape.pooled, " does not split into tp = ", tp,
              " blocks");
  SPARK_CHECK(rank >= 0 && rank < tp, "pooler: rank ", rank, " outside [0, ", tp, ")");
  std::optional<TensorRef> global_scale = moe.nvfp4_input_global_scale;
  if (global_scale) {
    if (global_scale->numel() != 1 || global_scale->dtype != DType::f32)
      throw InvalidArgument("the NVFP4 input global scale must be one FP32 value");
    // reshape(1)
    TensorRef one = *global_scale;
    one.ndim = 1;
    one.shape = {1, 0, 0, 0};
    one.stride = {1, 0, 0, 0};
    global_scale = one;
  }
  const int64_t shard = shape.pooled / tp;
  PoolerLayer layer;
  layer.weight = w.narrow_rows(rank * shard, shard);
  layer.norm_weight = norm.weight;
  layer.eps = norm.variance_epsilon;
  layer.gain_center = norm.fused_gain_center;
  layer.global_scale = global_scale;
  return layer;
}

}  // namespace spark_decode
