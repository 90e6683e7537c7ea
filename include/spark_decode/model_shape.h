// spark_decode/model_shape.h: the Muse Spark shapes, named once.
//
// Nothing else in the library spells these numbers; tests also run small
// shapes through the same code.
#pragma once

namespace spark_decode {

struct ModelShape {
  int hidden = 8192;          // H
  int pooled = 4096;          // P = moe_hidden_size, the unpooler's K
  int layers = 62;
  int max_batch = 16;         // decode tokens per call (b, M)
  float norm_eps = 1e-5f;     // pre_expert_norm
  float gain_center = 1.0f;   // pre_expert_norm: weight + gain_center
  int nvfp4_block = 16;
};

inline constexpr ModelShape kMuseSpark{};

// The tensor-parallel degrees the model is served at.
inline constexpr int kTensorParallelSizes[] = {1, 2, 4, 8};

}  // namespace spark_decode
