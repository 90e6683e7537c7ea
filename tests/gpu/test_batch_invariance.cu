// Batch invariance at the model's shapes, every tp and every b, through the
// plan table's engines and the on-chip engine: row i of a batch of b has the
// bits of row i of the batch of 16 that shares its rows (docs/design.md,
// "The plan table": one reduction order per shape). Every output element is
// poisoned first and checked written; guard bytes around the outputs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/pooler_gemm.h"
#include "spark_decode/unpooler.h"

namespace sd = spark_decode;
using namespace sd::testing;

namespace {

// run(x, out, m) for m = 16, then every b: the first b rows of each must
// equal the m = 16 rows bit for bit. Returns the failures.
std::vector<std::string> check_every_b(const std::string& what, int n, int k,
                                       const std::function<void(const void*, void*, int)>& run) {
  std::vector<std::string> failures;
  const auto hx = random_bf16(size_t(sd::kMaxBatch) * k, Dist::outliers);
  GuardedBuffer x(hx.size() * 2), out(size_t(sd::kMaxBatch) * n * 2);
  x.upload(hx.data(), hx.size() * 2);
  auto result = [&](int m) {
    poison_bf16(out);
    run(x.get(), out.get(), m);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> h(size_t(m) * n);
    out.download(h.data(), h.size() * 2);
    if (!out.check_guards().empty()) failures.push_back(what + " m " + std::to_string(m) + ": " + out.check_guards());
    return h;
  };
  const auto full = result(sd::kMaxBatch);
  for (size_t i = 0; i < full.size(); ++i)
    if (full[i] == kPoisonBf16) {
      failures.push_back(what + " m 16: element " + std::to_string(i) + " not written");
      break;
    }
  for (int b = 1; b < sd::kMaxBatch; ++b) {
    const auto part = result(b);
    if (std::memcmp(part.data(), full.data(), part.size() * 2) != 0) {
      size_t i = 0;
      while (part[i] == full[i]) ++i;
      failures.push_back(what + " b " + std::to_string(b) + ": row " + std::to_string(i / n) + " col " +
                         std::to_string(i % n) + " differs from the same row in a batch of 16");
    }
  }
  return failures;
}

}  // namespace

TEST(BatchInvariance, UnpoolerAtEveryTpAndB) {
  SKIP_WITHOUT_GPU(1);
  for (int tp : sd::kTensorParallelSizes) {
    const int n = sd::kMuseSpark.hidden / tp, k = sd::kMuseSpark.pooled;
    const auto hw = random_bf16(size_t(n) * k, Dist::normal, -5);
    GuardedBuffer w(hw.size() * 2);
    w.upload(hw.data(), hw.size() * 2);
    sd::Unpooler u(sd::TensorRef::contiguous(w.get(), sd::DType::bf16, {n, k}, 0));
    for (const auto& f : check_every_b("unpooler tp " + std::to_string(tp) + " (" + u.describe() + ")", n, k,
                                       [&](const void* x, void* out, int m) { u.run(x, out, m, nullptr); }))
      ADD_FAILURE() << f;
  }
}

TEST(BatchInvariance, PoolerGemmAtEveryTpAndB) {
  SKIP_WITHOUT_GPU(1);
  for (int tp : sd::kTensorParallelSizes) {
    const int n = sd::kMuseSpark.pooled / tp, k = sd::kMuseSpark.hidden;
    const auto hw = random_bf16(size_t(n) * k, Dist::normal, -6);
    GuardedBuffer w(hw.size() * 2);
    w.upload(hw.data(), hw.size() * 2);
    sd::PoolerGemm g(sd::TensorRef::contiguous(w.get(), sd::DType::bf16, {n, k}, 0), tp);
    // The table's engines: one for every b of the shape, or the split-K and
    // on-chip engines (one order) at different b.
    std::string engines = g.choice(1).to_string();
    for (int b = 2; b <= sd::kMaxBatch; ++b) {
      const auto e = g.choice(b).engine, first = g.choice(1).engine;
      const auto family = [](sd::GemmEngine x) {
        return x == sd::GemmEngine::onchip_mma ? sd::GemmEngine::splitk_mma : x;
      };
      EXPECT_EQ(family(e), family(first)) << "tp " << tp << " b " << b;
      if (e != g.choice(b - 1).engine) engines += ", " + g.choice(b).to_string() + " from b " + std::to_string(b);
    }
    for (const auto& f : check_every_b("pooler GEMM tp " + std::to_string(tp) + " (" + engines + ")", n, k,
                                       [&](const void* x, void* out, int m) { g.run(x, out, m, nullptr); }))
      ADD_FAILURE() << f;
  }
}

// The on-chip engine forced at every tp and b of both ops:
// its own order, with m changing only which token columns are loaded.
TEST(BatchInvariance, OnchipEngineAtEveryTpAndB) {
  SKIP_WITHOUT_GPU(1);
  for (int tp : sd::kTensorParallelSizes) {
    for (bool unpooler : {true, false}) {
      const int n = (unpooler ? sd::kMuseSpark.hidden : sd::kMuseSpark.pooled) / tp;
      const int k = unpooler ? sd::kMuseSpark.pooled : sd::kMuseSpark.hidden;
      const auto hw = random_bf16(size_t(n) * k, Dist::normal, -6);
      GuardedBuffer w(hw.size() * 2);
      w.upload(hw.data(), hw.size() * 2);
      const auto weight = sd::TensorRef::contiguous(w.get(), sd::DType::bf16, {n, k}, 0);
      const std::string what = std::string(unpooler ? "onchip unpooler tp " : "onchip pooler GEMM tp ") +
                               std::to_string(tp);
      std::vector<std::string> failures;
      if (unpooler) {
        sd::Unpooler::Options o;
        o.engine = sd::GemmEngine::onchip_mma;
        sd::Unpooler u(weight, o);
        failures = check_every_b(what + " (" + u.describe() + ")", n, k,
                                 [&](const void* x, void* out, int m) { u.run(x, out, m, nullptr); });
      } else {
        sd::PoolerGemm::Options o;
        o.force = sd::PoolerGemmChoice{sd::GemmEngine::onchip_mma, {}};
        sd::PoolerGemm g(weight, tp, o);
        failures = check_every_b(what, n, k, [&](const void* x, void* out, int m) { g.run(x, out, m, nullptr); });
      }
      for (const auto& f : failures) ADD_FAILURE() << f;
    }
  }
}
