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
  float norm_eps = 1e-5f;     // pre_expert_norm
  float gain_center = 1.0f;   // pre_expert_norm: weight + gain_center
};

inline constexpr ModelShape kMuseSpark{};

// The tensor-parallel degrees the model is served at.
inline constexpr int kTensorParallelSizes[] = {1, 2, 4, 8};

// The most decode tokens one call of the fast path takes (b, M): the
// GEMMs' largest token tile and the mailbox's default capacity.
inline constexpr int kMaxBatch = 16;

}  // namespace spark_decode
