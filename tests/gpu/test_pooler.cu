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

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>

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

// L layers of one rank: this rank's rows of a [P, H] pooler weight, a norm
// weight and a global scale per layer, all functions of (seed, layer);
// format_of_layer(l) gives the layer's format, or nullopt for an edge layer
// (BF16, no global scale).
struct RandomLayers {
  DeviceBuffer w, nw, gs;
  std::vector<sd::PoolerLayer> layers;
  RandomLayers(int L, int tp, int rank, int pooled, int device, uint64_t seed,
               const std::function<std::optional<sd::OutputFormat>(int)>& format_of_layer)
      : w(size_t(L) * (pooled / tp) * sd::kMuseSpark.hidden * 2), nw(size_t(L) * pooled * 2), gs(size_t(L) * 4),
        layers(L) {
    const int H = sd::kMuseSpark.hidden, shard = pooled / tp;
    std::vector<float> scales(L);
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
      if (const auto f = format_of_layer(l)) {
        layers[l].global_scale = sd::TensorRef::contiguous(gs.as<float>() + l, sd::DType::f32, {1}, device);
        layers[l].format = *f;
      }
    }
    gs.upload(scales.data(), L * 4);
  }
};

// Every format in turn: normed BF16 rows (what Hopper's weight-only MoE
// kernels take), linear and swizzled scales.
sd::OutputFormat format_by_thirds(int l) {
  return l % 3 == 0 ? sd::OutputFormat::bf16 : l % 3 == 1 ? sd::OutputFormat::nvfp4 : sd::OutputFormat::nvfp4_swizzled;
}

void pooler_steps(sd::Group& group, int device, int pooled, int steps, const std::vector<int>& batches,
                  std::optional<sd::PoolerGemmChoice> gemm, bool pdl, uint64_t seed, Shared& shared) {
  const int tp = group.size(), rank = group.rank(), H = sd::kMuseSpark.hidden, L = sd::kMuseSpark.layers;
  const int shard = pooled / tp, cap = sd::kMaxBatch;
  // Layers 0 and L - 1 are the BF16 edge layers; the NVFP4 layers take
  // every format in turn.
  RandomLayers rl(L, tp, rank, pooled, device, seed, [&](int l) -> std::optional<sd::OutputFormat> {
    if (l == 0 || l == L - 1) return std::nullopt;
    return format_by_thirds(l);
  });
  const auto& layers = rl.layers;
  DeviceBuffer& gs = rl.gs;
  sd::PoolerOptions options;
  options.gemm = gemm;
  options.mailbox_guard_bytes = 4096;
  sd::Pooler pooler(group, tp, rank, device, layers, batches, cap, pdl, options);
  TestStream stream;
  pooler.warm_up(stream);

  // Every layer's record: a [cap, P/2], a_sf up to the swizzled layout's
  // [128, P/16], normed [cap, P].
  const size_t sf_slot = size_t(sd::nvfp4_scale_rows(cap, sd::ScaleLayout::swizzled)) * pooled / 16;
  DeviceBuffer x(size_t(L) * cap * H * 2), rec_shard(size_t(L) * cap * shard * 2), rec_a(size_t(L) * cap * pooled / 2),
      rec_sf(size_t(L) * sf_slot), rec_n(size_t(L) * cap * pooled * 2);
  auto record_of = [&](int l, int b, sd::OutputFormat format) {
    return sd::pooler_output_in(format, b, pooled, rec_n.as<uint16_t>() + size_t(l) * cap * pooled,
                                rec_a.as<uint8_t>() + size_t(l) * cap * pooled / 2,
                                rec_sf.as<uint8_t>() + size_t(l) * sf_slot, device);
  };
  // One step over every layer: Pooler::run into scratch (copied out), into
  // the caller's outputs (the records themselves), or project + publish +
  // gather. With run(), the projection the stock path needs is taken by a
  // second project() after it (the GEMM is bitwise reproducible; project
  // touches no mailbox state), once the outputs have been copied out.
  enum Mode { kSplit, kRun, kRunInto };
  auto one_step = [&](int b, int mode) {
    for (int l = 0; l < L; ++l) {
      const uint16_t* xl = x.as<uint16_t>() + size_t(l) * cap * H;
      const sd::PoolerOutput rec = record_of(l, b, pooler.format(l));
      if (mode == kRunInto) {
        pooler.run(l, sd::TensorRef::contiguous(xl, sd::DType::bf16, {b, H}, device), rec, stream);
      } else {
        sd::PoolerOutput out;
        if (mode == kSplit) {
          const auto s = pooler.project(l, xl, b, stream);
          CUDA_CHECK(cudaMemcpyAsync(rec_shard.as<uint16_t>() + size_t(l) * cap * shard, s.data,
                                     size_t(b) * shard * 2, cudaMemcpyDeviceToDevice, stream));
          pooler.publish(b, stream);
          out = pooler.gather(l, b, stream);
        } else {
          out = pooler.run(l, xl, b, stream);
        }
        POOLER_REQUIRE(out.format == sd::format_of(layers[l]), "layer ", l, ": wrong output format");
        const bool nvfp4 = out.format != sd::OutputFormat::bf16;
        const sd::TensorRef& view = nvfp4 ? out.a : out.normed;
        POOLER_REQUIRE(view.ndim == 2 && view.shape[0] == b && (!nvfp4 || out.a_sf.shape[0] == rec.a_sf.shape[0]),
                       "layer ", l, ": the output view is not b = ", b, " rows");
        if (nvfp4) {
          CUDA_CHECK(cudaMemcpyAsync(rec.a.data, out.a.data, size_t(b) * pooled / 2, cudaMemcpyDeviceToDevice, stream));
          CUDA_CHECK(cudaMemcpyAsync(rec.a_sf.data, out.a_sf.data, size_t(rec.a_sf.numel()), cudaMemcpyDeviceToDevice,
                                     stream));
        } else {
          CUDA_CHECK(cudaMemcpyAsync(rec.normed.data, out.normed.data, size_t(b) * pooled * 2,
                                     cudaMemcpyDeviceToDevice, stream));
        }
      }
      if (mode != kSplit) {
        const auto s = pooler.project(l, xl, b, stream);
        CUDA_CHECK(cudaMemcpyAsync(rec_shard.as<uint16_t>() + size_t(l) * cap * shard, s.data, size_t(b) * shard * 2,
                                   cudaMemcpyDeviceToDevice, stream));
      }
    }
  };
  std::map<std::pair<int, int>, cudaGraphExec_t> graphs;  // by (b, mode)
  for (int b : batches)
    for (int mode : {kSplit, kRun, kRunInto}) {
      cudaGraph_t graph;
      CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      one_step(b, mode);
      CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
      CUDA_CHECK(cudaGraphInstantiate(&graphs[{b, mode}], graph, 0));
      CUDA_CHECK(cudaGraphDestroy(graph));
    }
  // Stock path pieces.
  std::vector<std::unique_ptr<sd::ExpertNorm>> norms;
  for (int l = 0; l < L; ++l)
    norms.push_back(std::make_unique<sd::ExpertNorm>(layers[l].norm_weight, layers[l].eps, layers[l].gain_center));
  DeviceBuffer full(size_t(cap) * pooled * 2), normed(size_t(cap) * pooled * 2), sa(size_t(cap) * pooled / 2),
      ssf(sf_slot);

  set_up_done(group);
  std::mt19937_64 bgen(seed + 5);  // the same b sequence on every rank
  for (int step = 0; step < steps; ++step) {
    const int b = batches[bgen() % batches.size()];
    const auto xs = normal_bf16(size_t(L) * cap * H, seed + 7 * step + 3);  // replicated tokens
    x.upload(xs.data(), xs.size() * 2);
    // On this rank's stream: a device-wide synchronisation here would wait
    // for a peer sharing the GPU whose consumers wait for this rank's
    // publishes.
    for (DeviceBuffer* r : {&rec_shard, &rec_a, &rec_sf, &rec_n})
      CUDA_CHECK(cudaMemsetAsync(r->get(), 0xff, r->bytes(), stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    // Steps cycle through the three modes, each as a graph replay and
    // eagerly.
    const int mode = step % 3;
    const bool eager = step % 6 >= 3, use_run = mode != kSplit;
    if (eager)
      one_step(b, mode);
    else
      CUDA_CHECK(cudaGraphLaunch(graphs[{b, mode}], stream));
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
      const sd::OutputFormat format = sd::format_of(layers[l]);
      const bool nvfp4 = format != sd::OutputFormat::bf16;
      const sd::ScaleLayout sl =
          format == sd::OutputFormat::nvfp4_swizzled ? sd::ScaleLayout::swizzled : sd::ScaleLayout::linear;
      const size_t sf_bytes = size_t(sd::nvfp4_scale_rows(b, sl)) * sd::nvfp4_scale_cols(pooled, sl);
      if (nvfp4) {
        CUDA_CHECK(cudaMemsetAsync(ssf.get(), 0xcd, ssf.bytes(), stream));  // the stock kernel writes the padding
        sd::nvfp4_quantize(normed.get(), gs.as<float>() + l, sa.get(), ssf.get(), b, pooled, stream, true, sl);
      }
      CUDA_CHECK(cudaStreamSynchronize(stream));
      if (nvfp4) {
        const auto a = download<uint8_t>(sa.get(), size_t(b) * pooled / 2);
        const auto s = download<uint8_t>(ssf.get(), sf_bytes);
        for (size_t i = 0; i < a.size(); ++i)
          POOLER_REQUIRE(ra[size_t(l) * cap * pooled / 2 + i] == a[i], "step ", step, " b ", b, use_run ? " run" : "",
                         " layer ", l, " a byte ", i, " differs from stock");
        for (size_t i = 0; i < s.size(); ++i)
          POOLER_REQUIRE(rsf[size_t(l) * sf_slot + i] == s[i], "step ", step, " b ", b, use_run ? " run" : "",
                         " layer ", l, " (", sd::format_name(format), ") a_sf byte ", i, " differs from stock");
        if (sl == sd::ScaleLayout::swizzled)
          for (int r = b; r < sd::nvfp4_scale_rows(b, sl); ++r)
            for (int c = 0; c < pooled / 16; ++c)
              POOLER_REQUIRE(s[sd::nvfp4_scale_offset(r, c, pooled, sl)] == 0, "stock swizzled padding row ", r,
                             " column ", c, " not zero");
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

// Counts the 16-byte pieces of call i's output slot that differ from its
// expected image; the lowest failing call goes to first_bad.
__global__ void soak_compare_kernel(const uint8_t* got, const uint8_t* expected, const int* image_of_call, size_t slot,
                                    unsigned long long* bad, int* first_bad) {
  const uint4* o = reinterpret_cast<const uint4*>(got + blockIdx.x * slot);
  const uint4* e = reinterpret_cast<const uint4*>(expected + image_of_call[blockIdx.x] * slot);
  for (size_t i = threadIdx.x; i < slot / 16; i += blockDim.x) {
    const uint4 x = o[i], y = e[i];
    if (x.x != y.x || x.y != y.y || x.z != y.z || x.w != y.w) {
      atomicAdd(bad, 1ull);
      atomicMin(first_bad, int(blockIdx.x));
    }
  }
}

// The soak: `calls` Pooler::run calls at the model's shape with a random
// layer and b (the same sequence on every rank), eagerly, in chunks of
// kChunk calls between synchronisations (no barriers: the protocol alone
// keeps the ranks in step), each into its own output slot prefilled with
// 0xee. Every slot must equal, byte for byte, its (layer, b) image built on
// the host from the layer's output at b = capacity: its first b rows (batch
// invariance; pooler_steps checks outputs against the stock path), the
// swizzled scales' zero padding, and 0xee everywhere else. Prints the
// number of calls checked.
void pooler_soak(sd::Group& group, int device, int calls, uint64_t seed) {
  const int tp = group.size(), rank = group.rank(), H = sd::kMuseSpark.hidden, L = 6, pooled = sd::kMuseSpark.pooled;
  const int cap = sd::kMaxBatch, kChunk = 500;
  DeviceBuffer x(size_t(L) * cap * H * 2);
  for (int l = 0; l < L; ++l) {
    const auto xs = normal_bf16(size_t(cap) * H, seed + 100 * l + 2);
    CUDA_CHECK(cudaMemcpy(x.as<uint16_t>() + size_t(l) * cap * H, xs.data(), xs.size() * 2, cudaMemcpyHostToDevice));
  }
  RandomLayers rl(L, tp, rank, pooled, device, seed, [](int l) -> std::optional<sd::OutputFormat> {
    if (l % 3 == 0) return std::nullopt;
    return format_by_thirds(l);
  });
  const auto& layers = rl.layers;
  std::vector<int> batches(cap);
  for (int b = 1; b <= cap; ++b) batches[b - 1] = b;
  sd::Pooler pooler(group, tp, rank, device, layers, batches, cap, true, sd::PoolerOptions{});
  TestStream stream;
  pooler.warm_up(stream);
  // One slot per call: the largest output of any format at b = cap (the
  // scales after the codes).
  const size_t codes_bytes = size_t(cap) * pooled / 2;
  const size_t slot = std::max(size_t(cap) * pooled * 2,
                               codes_bytes + size_t(sd::nvfp4_scale_rows(cap, sd::ScaleLayout::swizzled)) * pooled / 16);
  DeviceBuffer out(size_t(kChunk) * slot);
  auto output_in = [&](uint8_t* base, int l, int b) {
    return sd::pooler_output_in(sd::format_of(layers[l]), b, pooled, base, base, base + codes_bytes, device);
  };
  auto x_of = [&](int l, int b) {
    return sd::TensorRef::contiguous(x.as<uint16_t>() + size_t(l) * cap * H, sd::DType::bf16, {b, H}, device);
  };
  set_up_done(group);
  // Every layer at b = cap, then the image of every (layer, b).
  CUDA_CHECK(cudaMemsetAsync(out.get(), 0xee, out.bytes(), stream));
  for (int l = 0; l < L; ++l) pooler.run(l, x_of(l, cap), output_in(out.as<uint8_t>() + l * slot, l, cap), stream);
  pooler.mailbox().synchronize(stream);
  const auto ref = download<uint8_t>(out.get(), size_t(L) * slot);
  std::vector<uint8_t> images(size_t(L) * cap * slot, 0xee);
  for (int l = 0; l < L; ++l)
    for (int b = 1; b <= cap; ++b) {
      uint8_t* img = images.data() + (size_t(l) * cap + b - 1) * slot;
      const uint8_t* r = ref.data() + size_t(l) * slot;
      const sd::OutputFormat f = sd::format_of(layers[l]);
      if (f == sd::OutputFormat::bf16) {
        std::memcpy(img, r, size_t(b) * pooled * 2);
        continue;
      }
      std::memcpy(img, r, size_t(b) * pooled / 2);
      const sd::ScaleLayout sl = f == sd::OutputFormat::nvfp4_swizzled ? sd::ScaleLayout::swizzled : sd::ScaleLayout::linear;
      for (int row = 0; row < sd::nvfp4_scale_rows(b, sl); ++row)
        for (int c = 0; c < pooled / 16; ++c) {
          const size_t at = codes_bytes + sd::nvfp4_scale_offset(row, c, pooled, sl);
          img[at] = row < b ? r[at] : 0;
        }
    }
  DeviceBuffer d_images(images.size()), which(size_t(kChunk) * 4), bad(8), first_bad(4);
  d_images.upload(images.data(), images.size());

  std::mt19937_64 g(seed + 17);  // the same sequence on every rank
  int64_t checked = 0;
  for (int done = 0; done < calls; done += kChunk) {
    const int n = std::min(kChunk, calls - done);
    std::vector<std::pair<int, int>> lb(n);
    std::vector<int> image_of_call(n);
    for (int i = 0; i < n; ++i) {
      lb[i] = {int(g() % L), 1 + int(g() % cap)};
      image_of_call[i] = lb[i].first * cap + lb[i].second - 1;
    }
    CUDA_CHECK(cudaMemsetAsync(out.get(), 0xee, out.bytes(), stream));
    for (int i = 0; i < n; ++i)
      pooler.run(lb[i].first, x_of(lb[i].first, lb[i].second),
                 output_in(out.as<uint8_t>() + i * slot, lb[i].first, lb[i].second), stream);
    pooler.mailbox().synchronize(stream);
    which.upload(image_of_call.data(), size_t(n) * 4);
    const unsigned long long zero = 0;
    const int none = n;
    bad.upload(&zero, 8);
    first_bad.upload(&none, 4);
    soak_compare_kernel<<<n, 256, 0, stream>>>(out.as<uint8_t>(), d_images.as<uint8_t>(), which.as<int>(), slot,
                                               bad.as<unsigned long long>(), first_bad.as<int>());
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const unsigned long long mismatches = download<unsigned long long>(bad.get(), 1)[0];
    const int first = download<int>(first_bad.get(), 1)[0];
    POOLER_REQUIRE(mismatches == 0, "soak call ", done + first, " (layer ", lb[first].first, ", b ", lb[first].second,
                   "): ", mismatches, " 16-byte pieces of this chunk differ from their images");
    checked += n;
  }
  if (rank == 0)
    std::printf("pooler soak: %lld calls at tp %d (random layer of %d, b in 1..%d) checked\n",
                static_cast<long long>(checked), tp, L, cap);
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

// Ranks sharing one GPU (how one-GPU machines, tests and `verify --tp N`
// exercise tp > 1), with programmatic dependent launch asked for: the
// mailbox finds the shared device and launches without it, so no rank's
// early-launched kernels can starve a peer's producer. tp 2, 4 and 8.
TEST(Pooler, RanksSharingOneGpuAtTp2Tp4Tp8) {
  SKIP_WITHOUT_GPU(1);
  for (int tp : {2, 4, 8}) run(tp, 1, 512, 9, {1, 5, 16});
}

// The model's shape at tp 2 on one GPU, every engine forced in turn.
TEST(Pooler, RanksSharingOneGpuModelShapeEveryEngine) {
  SKIP_WITHOUT_GPU(1);
  run(2, 1, sd::kMuseSpark.pooled, 6, {1, 9, 16});
  for (const auto& c : sd::pooler_gemm_candidates())
    if (!sd::pooler_choice_unsupported(sd::kMuseSpark.pooled / 2, sd::kMuseSpark.hidden, 1, c))
      run(2, 1, sd::kMuseSpark.pooled, 3, {1, 16}, c);
}

// 100,000 calls at tp 2 with the two ranks sharing the one GPU.
TEST(Pooler, SoakHundredThousandCallsTp2OnOneGpu) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("pooler soak");
  for (const auto& f : run_on_gpus(2, [&](sd::Group& g, int d) { pooler_soak(g, d, 100000, seed); }, 1))
    ADD_FAILURE() << f;
}

// A rank calling another layer (a caller's bug): the layer is the call's
// tag in the mailbox, so every rank fails at once by name, with its outputs
// poisoned, instead of norming a peer's projection of another layer. Tp 2
// and 4 as ranks sharing one GPU.
TEST(Pooler, RanksOnDifferentLayersFailByNameTp2Tp4OnOneGpu) {
  SKIP_WITHOUT_GPU(1);
  const uint64_t seed = test_seed("pooler ranks on different layers");
  for (const int tp : {2, 4}) {
    std::vector<std::string> errors(tp);
    for (const auto& f : run_on_gpus(
             tp,
             [&](sd::Group& g, int d) {
               const int rank = g.rank(), H = sd::kMuseSpark.hidden, pooled = 512, b = 4;
               RandomLayers rl(3, tp, rank, pooled, d, seed,
                               [](int) -> std::optional<sd::OutputFormat> { return sd::OutputFormat::bf16; });
               sd::PoolerOptions options;
               options.spin_timeout_s = 2.0;
               sd::Pooler pooler(g, tp, rank, d, rl.layers, {b}, b, true, options);
               TestStream stream;
               pooler.warm_up(stream);
               DeviceBuffer x(size_t(b) * H * 2), out(size_t(b) * pooled * 2);
               const auto xs = normal_bf16(size_t(b) * H, seed + 1);
               x.upload(xs.data(), xs.size() * 2);
               const auto x_ref = sd::TensorRef::contiguous(x.get(), sd::DType::bf16, {b, H}, d);
               const auto into = sd::pooler_output_in(sd::OutputFormat::bf16, b, pooled, out.get(), nullptr, nullptr, d);
               pooler.run(1, x_ref, into, stream);  // a good call first
               pooler.mailbox().synchronize(stream);
               g.barrier();
               CUDA_CHECK(cudaMemset(out.get(), 0x11, out.bytes()));
               const int mine = rank == tp - 1 ? 2 : 1;
               const auto start = std::chrono::steady_clock::now();
               try {
                 pooler.run(mine, x_ref, into, stream);
                 pooler.mailbox().synchronize(stream);
               } catch (const sd::RuntimeError& e) {
                 errors[rank] = e.what();
               }
               const double waited =
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
               // The warm-up's calls fix the stage: the text names rank, tag and "protocol error".
               const std::string want = rank == tp - 1 ? "with tag 1" : "with tag 2";
               if (errors[rank].find("protocol error on rank " + std::to_string(rank)) == std::string::npos)
                 throw std::runtime_error("rank " + std::to_string(rank) + ": '" + errors[rank] + "'");
               if (errors[rank].find(want) == std::string::npos)
                 throw std::runtime_error("rank " + std::to_string(rank) + ": '" + errors[rank] + "', want '" + want + "'");
               if (waited > 1.0) throw std::runtime_error("the error took " + std::to_string(waited) + " s");
               const auto got = download<uint16_t>(out.get(), size_t(b) * pooled);
               for (size_t i = 0; i < got.size(); ++i)
                 if (got[i] != 0xffff)
                   throw std::runtime_error("rank " + std::to_string(rank) + ": normed element " + std::to_string(i) +
                                            " is not the poison");
               g.barrier();
             },
             1))
      ADD_FAILURE() << "tp " << tp << ": " << f;
    for (int r = 0; r < tp; ++r) std::printf("tp %d, ranks on different layers, rank %d: %s\n", tp, r, errors[r].c_str());
  }
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

// Bad input to the formats and the caller-owned outputs: the reason, and
// nothing launched (the mailbox's stage words stay as they were).
TEST(Pooler, FormatAndOutputMisuseIsRefusedWithTheReason) {
  SKIP_WITHOUT_GPU(1);
  const int P = 512, H = 8192, b = 4;
  DeviceBuffer w(size_t(P) * H * 2), nw(P * 2), gs(4), x(size_t(16) * H * 2), a(16 * P / 2), sf(128 * P / 16),
      normed(size_t(16) * P * 2);
  CUDA_CHECK(cudaMemset(w.get(), 0, w.bytes()));
  CUDA_CHECK(cudaMemset(nw.get(), 0, nw.bytes()));
  CUDA_CHECK(cudaMemset(x.get(), 0, x.bytes()));
  const float one = 1.0f;
  gs.upload(&one, 4);
  auto layer = [&](std::optional<sd::OutputFormat> f, bool scale) {
    sd::PoolerLayer l;
    l.weight = sd::TensorRef::contiguous(w.get(), sd::DType::bf16, {P, H}, 0);
    l.norm_weight = sd::TensorRef::contiguous(nw.get(), sd::DType::bf16, {P}, 0);
    if (scale) l.global_scale = sd::TensorRef::contiguous(gs.get(), sd::DType::f32, {1}, 0);
    l.format = f;
    return l;
  };
  auto reason = [](auto fn) -> std::string {
    try {
      fn();
    } catch (const sd::InvalidArgument& e) {
      return e.what();
    }
    return "(accepted)";
  };
  auto group = sd::InProcessGroup::make_shared(1);
  sd::InProcessGroup g(group, 0);
  sd::PoolerConfig config;
  config.hidden = H;
  config.pooled = P;
  config.batches = {1, 4, 16};
  sd::Pooler pooler(g, config);
  EXPECT_NE(reason([&] { pooler.attach(0, layer(sd::OutputFormat::nvfp4, false)); })
                .find("has format nvfp4, which needs the NVFP4 input global scale"),
            std::string::npos);
  EXPECT_NE(reason([&] { pooler.attach(0, layer(sd::OutputFormat::nvfp4_swizzled, false)); }).find("global scale"),
            std::string::npos);
  EXPECT_EQ(reason([&] { pooler.attach(0, layer(sd::OutputFormat::bf16, false)); }), "(accepted)");
  EXPECT_EQ(reason([&] { pooler.attach(1, layer(sd::OutputFormat::nvfp4_swizzled, true)); }), "(accepted)");
  EXPECT_NE(reason([&] { pooler.run(2, x.get(), b, nullptr); }).find("layer 2 outside [0, 2)"), std::string::npos);
  const auto xv = sd::TensorRef::contiguous(x.get(), sd::DType::bf16, {b, H}, 0);
  sd::PoolerOutput o;
  o.format = sd::OutputFormat::nvfp4_swizzled;
  o.a = sd::TensorRef::contiguous(a.get(), sd::DType::u8, {b, P / 2}, 0);
  o.a_sf = sd::TensorRef::contiguous(sf.get(), sd::DType::e4m3, {b, P / 16}, 0);  // linear shape: wrong
  EXPECT_NE(reason([&] { pooler.run(1, xv, o, nullptr); }).find("output a_sf"), std::string::npos);
  o.a_sf = sd::TensorRef::contiguous(sf.get(), sd::DType::e4m3, {128, P / 16}, 0);
  EXPECT_NE(reason([&] { pooler.run(0, xv, o, nullptr); }).find("format nvfp4_swizzled for layer 0, whose format is bf16"),
            std::string::npos);
  sd::PoolerOutput alias = o;
  alias.a = sd::TensorRef::contiguous(w.get(), sd::DType::u8, {b, P / 2}, 0);  // the layer's weight
  EXPECT_NE(reason([&] { pooler.run(1, xv, alias, nullptr); }).find("output a overlaps the layer's weight"),
            std::string::npos);
  alias.a = sd::TensorRef::contiguous(sf.get(), sd::DType::u8, {b, P / 2}, 0);
  EXPECT_NE(reason([&] { pooler.run(1, xv, alias, nullptr); }).find("overlap"), std::string::npos);
  sd::PoolerOutput n;
  n.format = sd::OutputFormat::bf16;
  n.normed = sd::TensorRef::contiguous(normed.get(), sd::DType::bf16, {b + 1, P}, 0);
  EXPECT_NE(reason([&] { pooler.run(0, xv, n, nullptr); }).find("output normed"), std::string::npos);
  n.normed = sd::TensorRef::contiguous(x.get(), sd::DType::bf16, {b, P}, 0);  // x itself
  EXPECT_NE(reason([&] { pooler.run(0, xv, n, nullptr); }).find("output normed overlaps x"), std::string::npos);
  // Nothing ran: the stage words are still the initial ones.
  CUDA_CHECK(cudaDeviceSynchronize());
  int32_t state[2] = {-1, 0};
  CUDA_CHECK(cudaMemcpy(state, pooler.mailbox().view().state, 8, cudaMemcpyDeviceToHost));
  EXPECT_EQ(state[0], 0);
  EXPECT_EQ(uint32_t(state[1]), 0xffffffffu);  // ACTIVE: never published
  // And the good calls work.
  n.normed = sd::TensorRef::contiguous(normed.get(), sd::DType::bf16, {b, P}, 0);
  pooler.warm_up(nullptr);
  pooler.run(0, xv, n, nullptr);
  pooler.run(1, xv, o, nullptr);
  pooler.mailbox().synchronize(nullptr);
  pooler.barrier();
}
