// The Pooler end to end: 62 layers (0 and 61 BF16 edge layers, the rest
// NVFP4), warm_up on every rank, then many steps in layer order with a random
// b from `batches` (the same on every rank), through Pooler::run (the path
// users take, with its per-(tp, b) publish route) and through project +
// publish + gather in turn, each as replays of a CUDA graph captured per b
// and eagerly. After every step each rank checks every layer's output
// (copied out inside the graph) against the stock path computed on the
// projected blocks of all ranks (stock gather = concatenation, ExpertNorm,
// nvfp4_quantize): NVFP4 layers bit for bit, edge layers except the sign of
// zero; every output a view of exactly b rows; one layer's projection per
// step against the FP64 GEMM reference; the mailbox's guard bytes intact.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "pooler_test_util.h"
#include "spark_decode/expert_norm.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/nvfp4.h"
#include "spark_decode/pooler.h"

namespace sd = spark_decode;
using namespace sd::testing;
using namespace sd::testing::pooler_tests;

namespace {

struct Shared {
  std::mutex mu;
  std::vector<std::vector<uint16_t>> shards;  // by rank: [layers][b][P/tp]
};

void pooler_steps(sd::Group& group, int device, int pooled, int steps, const std::vector<int>& batches,
                  std::optional<sd::PoolerGemmChoice> gemm, bool pdl, uint64_t seed, Shared& shared) {
  const int tp = group.size(), rank = group.rank(), H = sd::kMuseSpark.hidden, L = sd::kMuseSpark.layers;
  const int shard = pooled / tp, cap = sd::kMaxBatch;
  // Weights: W_full [P, H] per layer (this rank keeps its rows), norm
  // weights, global scales; all a function of (seed, layer).
  DeviceBuffer w(size_t(L) * shard * H * 2), nw(size_t(L) * pooled * 2), gs(size_t(L) * 4);
  std::vector<float> scales(L);
  std::vector<sd::PoolerLayer> layers(L);
  for (int l = 0; l < L; ++l) {
    const auto full = normal_bf16(size_t(pooled) * H, seed + 100 * l, 0.02f);
    CUDA_CHECK(cudaMemcpy(w.as<uint16_t>() + size_t(l) * shard * H, full.data() + size_t(rank) * shard * H,
                          size_t(shard) * H * 2, cudaMemcpyHostToDevice));
    const auto n = normal_bf16(pooled, seed + 100 * l + 1, 0.2f);
    CUDA_CHECK(cudaMemcpy(nw.as<uint16_t>() + size_t(l) * pooled, n.data(), pooled * 2, cudaMemcpyHostToDevice));
    scales[l] = std::ldexp(1.0f + 0.01f * l, (l % 9) - 2);
    layers[l].weight = sd::TensorRef::contiguous(w.as<uint16_t>() + size_t(l) * shard * H, sd::DType::bf16,
                                                 {shard, H}, device);
    layers[l].norm_weight = sd::TensorRef::contiguous(nw.as<uint16_t>() + size_t(l) * pooled, sd::DType::bf16,
                                                      {pooled}, device);
    layers[l].eps = l % 2 ? 1e-6f : 1e-5f;
    layers[l].gain_center = 1.0f;
    if (l != 0 && l != L - 1)
      layers[l].global_scale = sd::TensorRef::contiguous(gs.as<float>() + l, sd::DType::f32, {1}, device);
  }
  gs.upload(scales.data(), L * 4);
  sd::PoolerOptions options;
  options.gemm = gemm;
  options.mailbox_guard_bytes = 4096;
  sd::Pooler pooler(group, tp, rank, device, layers, batches, cap, pdl, options);
  TestStream stream;
  pooler.warm_up(stream);

  DeviceBuffer x(size_t(L) * cap * H * 2), rec_shard(size_t(L) * cap * shard * 2), rec_a(size_t(L) * cap * pooled / 2),
      rec_sf(size_t(L) * cap * pooled / 16), rec_n(size_t(L) * cap * pooled * 2);
  // One step over every layer: Pooler::run, or project + publish + gather.
  // With run(), the projection the stock path needs is taken by a second
  // project() after it (the GEMM is bitwise reproducible; project touches no
  // mailbox state), once the outputs have been copied out.
  auto one_step = [&](int b, bool use_run) {
    for (int l = 0; l < L; ++l) {
      const uint16_t* xl = x.as<uint16_t>() + size_t(l) * cap * H;
      sd::PoolerOutput out;
      if (!use_run) {
        const auto s = pooler.project(l, xl, b, stream);
        CUDA_CHECK(cudaMemcpyAsync(rec_shard.as<uint16_t>() + size_t(l) * cap * shard, s.data, size_t(b) * shard * 2,
                                   cudaMemcpyDeviceToDevice, stream));
        pooler.publish(b, stream);
        out = pooler.gather(l, b, stream);
      } else {
        out = pooler.run(l, xl, b, stream);
      }
      POOLER_REQUIRE(out.nvfp4 == (l != 0 && l != L - 1), "layer ", l, ": wrong output form");
      const sd::TensorRef& view = out.nvfp4 ? out.a : out.normed;
      POOLER_REQUIRE(view.ndim == 2 && view.shape[0] == b && (!out.nvfp4 || out.a_sf.shape[0] == b), "layer ", l,
                     ": the output view is not b = ", b, " rows");
      if (out.nvfp4) {
        CUDA_CHECK(cudaMemcpyAsync(rec_a.as<uint8_t>() + size_t(l) * cap * pooled / 2, out.a.data,
                                   size_t(b) * pooled / 2, cudaMemcpyDeviceToDevice, stream));
        CUDA_CHECK(cudaMemcpyAsync(rec_sf.as<uint8_t>() + size_t(l) * cap * pooled / 16, out.a_sf.data,
                                   size_t(b) * pooled / 16, cudaMemcpyDeviceToDevice, stream));
      } else {
        CUDA_CHECK(cudaMemcpyAsync(rec_n.as<uint16_t>() + size_t(l) * cap * pooled, out.normed.data,
                                   size_t(b) * pooled * 2, cudaMemcpyDeviceToDevice, stream));
      }
      if (use_run) {
        const auto s = pooler.project(l, xl, b, stream);
        CUDA_CHECK(cudaMemcpyAsync(rec_shard.as<uint16_t>() + size_t(l) * cap * shard, s.data, size_t(b) * shard * 2,
                                   cudaMemcpyDeviceToDevice, stream));
      }
    }
  };
  std::map<std::pair<int, bool>, cudaGraphExec_t> graphs;  // by (b, use_run)
  for (int b : batches)
    for (bool use_run : {false, true}) {
      cudaGraph_t graph;
      CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      one_step(b, use_run);
      CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
      CUDA_CHECK(cudaGraphInstantiate(&graphs[{b, use_run}], graph, 0));
      CUDA_CHECK(cudaGraphDestroy(graph));
    }
  // Stock path pieces.
  std::vector<std::unique_ptr<sd::ExpertNorm>> norms;
  for (int l = 0; l < L; ++l)
    norms.push_back(std::make_unique<sd::ExpertNorm>(layers[l].norm_weight, layers[l].eps, layers[l].gain_center));
  DeviceBuffer full(size_t(cap) * pooled * 2), normed(size_t(cap) * pooled * 2), sa(size_t(cap) * pooled / 2),
      ssf(size_t(cap) * pooled / 16);

  std::mt19937_64 bgen(seed + 5);  // the same b sequence on every rank
  for (int step = 0; step < steps; ++step) {
    const int b = batches[bgen() % batches.size()];
    const auto xs = normal_bf16(size_t(L) * cap * H, seed + 7 * step + 3);  // replicated tokens
    x.upload(xs.data(), xs.size() * 2);
    for (DeviceBuffer* r : {&rec_shard, &rec_a, &rec_sf, &rec_n}) CUDA_CHECK(cudaMemset(r->get(), 0xff, r->bytes()));
    CUDA_CHECK(cudaDeviceSynchronize());
    // Steps cycle through: graph of run, graph of the three calls, run
    // eagerly, the three calls eagerly.
    const bool use_run = step % 2 == 0, eager = step % 4 >= 2;
    if (eager)
      one_step(b, use_run);
    else
      CUDA_CHECK(cudaGraphLaunch(graphs[{b, use_run}], stream));
    pooler.mailbox().synchronize(stream);
    check_mailbox_guards(pooler.mailbox());

    const auto sh = download<uint16_t>(rec_shard.get(), size_t(L) * cap * shard);
    {
      std::lock_guard<std::mutex> lock(shared.mu);
      shared.shards[rank] = sh;
    }
    group.barrier();
    const auto ra = download<uint8_t>(rec_a.get(), rec_a.bytes()), rsf = download<uint8_t>(rec_sf.get(), rec_sf.bytes());
    const auto rn = download<uint16_t>(rec_n.get(), rec_n.bytes() / 2);
    for (int l = 0; l < L; ++l) {
      // The stock all-gather: every rank's projected rows side by side.
      std::vector<uint16_t> rows(size_t(b) * pooled);
      for (int q = 0; q < tp; ++q)
        for (int r = 0; r < b; ++r)
          std::memcpy(rows.data() + size_t(r) * pooled + size_t(q) * shard,
                      shared.shards[q].data() + (size_t(l) * cap + r) * shard, shard * 2);
      full.upload(rows.data(), rows.size() * 2);
      norms[l]->run(full.get(), normed.get(), b, stream);
      const bool nvfp4 = layers[l].global_scale.has_value();
      if (nvfp4) sd::nvfp4_quantize(normed.get(), gs.as<float>() + l, sa.get(), ssf.get(), b, pooled, stream);
      CUDA_CHECK(cudaStreamSynchronize(stream));
      if (nvfp4) {
        const auto a = download<uint8_t>(sa.get(), size_t(b) * pooled / 2);
        const auto s = download<uint8_t>(ssf.get(), size_t(b) * pooled / 16);
        for (size_t i = 0; i < a.size(); ++i)
          POOLER_REQUIRE(ra[size_t(l) * cap * pooled / 2 + i] == a[i], "step ", step, " b ", b, use_run ? " run" : "",
                         " layer ", l, " a byte ", i, " differs from stock");
        for (size_t i = 0; i < s.size(); ++i)
          POOLER_REQUIRE(rsf[size_t(l) * cap * pooled / 16 + i] == s[i], "step ", step, " b ", b,
                         use_run ? " run" : "", " layer ", l, " a_sf ", i, " differs from stock");
      } else {
        const auto n = download<uint16_t>(normed.get(), size_t(b) * pooled);
        for (size_t i = 0; i < n.size(); ++i) {
          const uint16_t got = rn[size_t(l) * cap * pooled + i];
          POOLER_REQUIRE(got == n[i] || ((got & 0x7fff) == 0 && (n[i] & 0x7fff) == 0), "step ", step, " b ", b,
                         use_run ? " run" : "", " edge layer ", l, " element ", i, ": 0x", std::hex, got,
                         " stock 0x", n[i]);
        }
      }
    }
    // One layer's projection per step against the FP64 reference.
    const int l = step % L;
    const auto wfull = normal_bf16(size_t(pooled) * H, seed + 100 * l, 0.02f);
    std::vector<uint16_t> got(sh.begin() + size_t(l) * cap * shard, sh.begin() + (size_t(l) * cap + b) * shard);
    const std::string bad = check_gemm(got, xs.data() + size_t(l) * cap * H, wfull.data() + size_t(rank) * shard * H,
                                       b, shard, H);
    POOLER_REQUIRE(bad.empty(), "step ", step, " layer ", l, " b ", b, " (", pooler.gemm_choice(l, b).to_string(),
                   "): ", bad);
    group.barrier();  // nobody overwrites shared.shards while a peer reads it
  }
  for (auto& [b, g] : graphs) CUDA_CHECK(cudaGraphExecDestroy(g));
  pooler.barrier();
}

void run(int tp, int devices, int pooled, int steps, std::vector<int> batches,
         std::optional<sd::PoolerGemmChoice> gemm = std::nullopt, bool pdl = true) {
  const uint64_t seed = test_seed("pooler");
  Shared shared;
  shared.shards.resize(tp);
  for (const auto& f : run_on_gpus(
           tp, [&](sd::Group& g, int d) { pooler_steps(g, d, pooled, steps, batches, gemm, pdl, seed, shared); }, devices))
    ADD_FAILURE() << f;
}

}  // namespace

TEST(Pooler, SixtyTwoLayersSmallShapeOneGpu) {
  SKIP_WITHOUT_GPU(1);
  run(1, 1, 512, 24, {1, 3, 8, 16});
}

// Every kernel launched without programmatic dependent launch: the same
// stock results.
TEST(Pooler, SixtyTwoLayersPdlOffOneGpu) {
  SKIP_WITHOUT_GPU(1);
  run(1, 1, 512, 8, {1, 16}, std::nullopt, /*pdl=*/false);
}

// The ring engine, which the table takes at tp 1 for every b but only at the
// model's shape: forced here at the small one, both token tiles (8 and 16, x
// staged at 16), through run (its fused publish) and project + publish +
// gather, graphs and eager.
TEST(Pooler, SixtyTwoLayersRingEngineOneGpu) {
  SKIP_WITHOUT_GPU(1);
  sd::PoolerGemmChoice ring;
  ring.engine = sd::GemmEngine::ring_mma;
  run(1, 1, 512, 12, {1, 5, 9, 16}, ring);
}

TEST(Pooler, SixtyTwoLayersSmallShapeTwoGpus) {
  const std::string why = peer_gpus_unavailable_reason(2);
  if (!why.empty()) GTEST_SKIP() << why;
  run(2, 2, 512, 40, {1, 2, 5, 8, 13, 16});
}

TEST(Pooler, SixtyTwoLayersMmaEngineTwoGpus) {
  const std::string why = peer_gpus_unavailable_reason(2);
  if (!why.empty()) GTEST_SKIP() << why;
  sd::PoolerGemmChoice mma;
  mma.engine = sd::GemmEngine::splitk_mma;
  run(2, 2, 512, 12, {4, 16}, mma);
}

TEST(Pooler, SixtyTwoLayersModelShapeTwoGpus) {
  const std::string why = peer_gpus_unavailable_reason(2);
  if (!why.empty()) GTEST_SKIP() << why;
  run(2, 2, sd::kMuseSpark.pooled, 8, {1, 4, 8, 16});
}

TEST(Pooler, RefusesBadConstruction) {
  SKIP_WITHOUT_GPU(1);
  for (const auto& f : run_on_gpus(1, [&](sd::Group& g, int d) {
         const int H = sd::kMuseSpark.hidden, P = 512;
         DeviceBuffer w(size_t(P) * H * 2), nw(P * 2), gs(4);
         sd::PoolerLayer l;
         l.weight = sd::TensorRef::contiguous(w.get(), sd::DType::bf16, {P, H}, d);
         l.norm_weight = sd::TensorRef::contiguous(nw.get(), sd::DType::bf16, {P}, d);
         EXPECT_THROW(sd::Pooler(g, 1, 0, d, {l}, {0}), sd::InvalidArgument);
         EXPECT_THROW(sd::Pooler(g, 1, 0, d, {l}, {17}), sd::InvalidArgument);
         EXPECT_THROW(sd::Pooler(g, 3, 0, d, {l}), sd::InvalidArgument);
         sd::PoolerLayer bad = l;
         bad.weight.shape[0] = P / 2;
         EXPECT_THROW(sd::Pooler(g, 1, 0, d, {bad}), sd::InvalidArgument);
         bad = l;
         bad.global_scale = sd::TensorRef::contiguous(gs.get(), sd::DType::bf16, {1}, d);
         EXPECT_THROW(sd::Pooler(g, 1, 0, d, {bad}), sd::InvalidArgument);
         sd::Pooler ok(g, 1, 0, d, {l}, {2});
         DeviceBuffer x(size_t(4) * H * 2);
         EXPECT_THROW(ok.run(0, x.get(), 3, nullptr), sd::InvalidArgument);  // b not in batches
         EXPECT_THROW(ok.run(1, x.get(), 2, nullptr), sd::InvalidArgument);  // no layer 1
         ok.barrier();
       }))
    ADD_FAILURE() << f;
}
