// The Pooler's host-side checks that run without a GPU: pooler_layer()'s
// reasons (the stock model's texts) and the pooler GEMM's launch-shape
// checks (its engines per (tp, b): tests/cpu/test_plan.cpp).
#include <gtest/gtest.h>

#include <string>

#include "spark_decode/error.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/pooler.h"
#include "spark_decode/pooler_gemm.h"

namespace sd = spark_decode;

namespace {

// Fake device addresses: pooler_layer() only looks at the descriptions.
char fake[64];

sd::StockMoeLayer good_layer(bool nvfp4) {
  const auto& m = sd::kMuseSpark;
  sd::StockMoeLayer moe;
  moe.pooler_weight = sd::TensorRef::contiguous(fake, sd::DType::bf16, {m.pooled, m.hidden}, 0);
  moe.pre_expert_norm.weight = sd::TensorRef::contiguous(fake, sd::DType::bf16, {m.pooled}, 0);
  moe.pre_expert_norm.variance_epsilon = 1e-6f;
  moe.pre_expert_norm.fused_gain_center = 0.5f;
  if (nvfp4) moe.nvfp4_input_global_scale = sd::TensorRef::contiguous(fake, sd::DType::f32, {1, 1}, 0);
  return moe;
}

std::string reason_of(const sd::StockMoeLayer& moe, int tp = 2, int rank = 1) {
  try {
    sd::pooler_layer(moe, tp, rank);
  } catch (const sd::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(PoolerLayer, TakesThisRanksRowsAndTheNormConstants) {
  const auto& m = sd::kMuseSpark;
  for (int tp : sd::kTensorParallelSizes)
    for (int rank = 0; rank < tp; ++rank) {
      const sd::PoolerLayer l = sd::pooler_layer(good_layer(true), tp, rank);
      EXPECT_EQ(l.weight.shape[0], m.pooled / tp);
      EXPECT_EQ(l.weight.shape[1], m.hidden);
      // Rows [rank P/tp, ...): the view starts rank * P/tp * H BF16 in.
      EXPECT_EQ(static_cast<char*>(l.weight.data) - fake, int64_t(rank) * (m.pooled / tp) * m.hidden * 2);
      EXPECT_EQ(l.eps, 1e-6f);
      EXPECT_EQ(l.gain_center, 0.5f);
      ASSERT_TRUE(l.global_scale.has_value());
      EXPECT_EQ(l.global_scale->ndim, 1);
      EXPECT_EQ(l.global_scale->shape[0], 1);
    }
  EXPECT_FALSE(sd::pooler_layer(good_layer(false), 2, 0).global_scale.has_value());
}

TEST(PoolerLayer, RefusesWithTheStockReasons) {
  const std::string weight_reason = "pooler weight must be [4096, 8192] BF16";
  const std::string norm_reason = "pre_expert_norm must apply a [P] BF16 weight after the norm";
  const std::string scale_reason = "the NVFP4 input global scale must be one FP32 value";
  auto expect = [](const sd::StockMoeLayer& moe, const std::string& want) {
    const std::string got = reason_of(moe);
    EXPECT_NE(got.find(want), std::string::npos) << "got: '" << got << "'";
  };
  {
    auto moe = good_layer(true);
    moe.pooler_weight.shape[0] = 2048;  // already sharded
    expect(moe, weight_reason);
    moe = good_layer(true);
    moe.pooler_weight.dtype = sd::DType::f32;
    expect(moe, weight_reason);
    moe = good_layer(true);
    moe.pooler_weight.ndim = 1;
    expect(moe, weight_reason);
  }
  {
    auto moe = good_layer(true);
    moe.pre_expert_norm.present = false;
    expect(moe, norm_reason);
    moe = good_layer(true);
    moe.pre_expert_norm.has_weight = false;
    expect(moe, norm_reason);
    moe = good_layer(true);
    moe.pre_expert_norm.variance_size_override = 1024;
    expect(moe, norm_reason);
    moe = good_layer(true);
    moe.pre_expert_norm.applies_weight_before_norm = true;
    expect(moe, norm_reason);
    moe = good_layer(true);
    moe.pre_expert_norm.weight.shape[0] = 8192;
    expect(moe, norm_reason);
    moe = good_layer(true);
    moe.pre_expert_norm.weight.dtype = sd::DType::f32;
    expect(moe, norm_reason);
  }
  {
    auto moe = good_layer(true);
    moe.nvfp4_input_global_scale->shape[1] = 2;
    expect(moe, scale_reason);
    moe = good_layer(true);
    moe.nvfp4_input_global_scale->dtype = sd::DType::bf16;
    expect(moe, scale_reason);
  }
  EXPECT_THROW(sd::pooler_layer(good_layer(true), 3, 0), sd::InvalidArgument);
  EXPECT_THROW(sd::pooler_layer(good_layer(true), 2, 2), sd::InvalidArgument);
  EXPECT_EQ(reason_of(good_layer(true)), "");
}

TEST(PoolerGemmShapes, ChecksDivisibilityAndCompiledShapes) {
  const sd::PoolerGemmShape s{512, 4, 2};
  EXPECT_FALSE(sd::pooler_gemm_unsupported(2048, 8192, 16, s));
  EXPECT_TRUE(sd::pooler_gemm_unsupported(2050, 8192, 1, s));   // N % 4
  EXPECT_TRUE(sd::pooler_gemm_unsupported(2048, 8000, 1, s));   // K % 8192
  EXPECT_TRUE(sd::pooler_gemm_unsupported(2048, 8192, 0, s));
  EXPECT_TRUE(sd::pooler_gemm_unsupported(2048, 8192, 17, s));
  const auto why = sd::pooler_gemm_unsupported(2048, 8192, 1, sd::PoolerGemmShape{128, 4, 4});
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("no compiled kernel"), std::string::npos) << *why;
}

TEST(PoolerGemmShapes, CandidatesNameEveryEngineAndShapeOnce) {
  const auto all = sd::pooler_gemm_candidates();
  ASSERT_EQ(all.size(), 3 + sd::pooler_gemm_shapes().size());
  EXPECT_EQ(all[0].engine, sd::GemmEngine::splitk_mma);
  EXPECT_EQ(all[1].engine, sd::GemmEngine::ring_mma);
  EXPECT_EQ(all[2].engine, sd::GemmEngine::onchip_mma);
  for (size_t i = 3; i < all.size(); ++i) {
    EXPECT_EQ(all[i].engine, sd::GemmEngine::skinny);
    EXPECT_EQ(all[i].shape, sd::pooler_gemm_shapes()[i - 3]);
  }
  // Names are distinct: benchmarks and results key on them.
  for (size_t i = 0; i < all.size(); ++i)
    for (size_t j = 0; j < i; ++j) EXPECT_NE(all[i].to_string(), all[j].to_string());
  // The skinny shape's own reasons; the MMA engine's are the Unpooler's, at construction.
  const auto skinny = all[3];
  EXPECT_EQ(sd::pooler_choice_unsupported(2049, 8192, 1, skinny), sd::pooler_gemm_unsupported(2049, 8192, 1, skinny.shape));
  EXPECT_TRUE(sd::pooler_choice_unsupported(2049, 8192, 1, skinny));  // N odd
  EXPECT_FALSE(sd::pooler_choice_unsupported(2049, 8192, 1, all.front()));
  EXPECT_STREQ(sd::engine_name(all[1].engine), "ring_mma");
}

TEST(PoolerGemmShapes, RingEngineGivesItsReasons) {
  const sd::PoolerGemmChoice ring{sd::GemmEngine::ring_mma, {}};
  for (int tp : sd::kTensorParallelSizes)
    for (int b = 1; b <= sd::kMaxBatch; ++b)
      EXPECT_FALSE(sd::pooler_choice_unsupported(sd::kMuseSpark.pooled / tp, sd::kMuseSpark.hidden, b, ring))
          << "tp " << tp << " b " << b;
  auto reason = [&](int n, int k, int m) {
    const auto why = sd::pooler_choice_unsupported(n, k, m, ring);
    return why ? *why : std::string("(none)");
  };
  EXPECT_NE(reason(2048 + 16, 8192, 1).find("N = 2064 is not a positive multiple of 32"), std::string::npos)
      << reason(2048 + 16, 8192, 1);
  EXPECT_NE(reason(2048, 8192 - 512, 1).find("K = 7680 is not a positive multiple of 1024"), std::string::npos)
      << reason(2048, 8192 - 512, 1);
  EXPECT_NE(reason(0, 8192, 1).find("N = 0"), std::string::npos);
  EXPECT_NE(reason(2048, 8192, 0).find("m = 0 outside [1, 16]"), std::string::npos) << reason(2048, 8192, 0);
  EXPECT_NE(reason(2048, 8192, 17).find("m = 17"), std::string::npos);
  EXPECT_EQ(sd::PoolerGemmChoice(ring).to_string(), "ring_mma");
}
