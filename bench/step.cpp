// `spark-decode step` (bench/step.h): one rank's setup, the three paths
// through the step, the checks and the timing; then the record.
#include "step.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cublas_gemm.h"
#include "harness.h"
#include "spark_decode/bf16.h"
#include "spark_decode/error.h"
#include "spark_decode/expert_norm.h"
#include "spark_decode/group.h"
#include "spark_decode/mailbox.h"
#include "spark_decode/nvfp4.h"
#include "spark_decode/pooler.h"
#include "spark_decode/unpooler.h"
#include "step_standins.h"
#include "stock_exchange.h"

namespace spark_decode::bench {
namespace {

constexpr int kCap = kMaxBatch;
constexpr float kEps = kMuseSpark.norm_eps, kGainCenter = kMuseSpark.gain_center;
// Weight scales: the pooler's rows near unit size, each layer's update
// (the unpooler's output) 2^-5 of the hidden rows', as in a residual stream
// where every layer adds a small part. The size of the update sets how far
// NVFP4's code flips carry a perturbation into later layers (see
// kStockUpdateBound).
constexpr float kPoolerWeightScale = 0x1p-6f;   // ~1 / sqrt(H)
constexpr float kUnpoolerWeightScale = 0x1p-11f;  // 2^-5 / sqrt(P)
constexpr float kNormWeightScale = 0.2f;

OutputFormat layer_format(const StepOptions& o, int l) {
  return l == 0 || l == o.layers - 1 ? OutputFormat::bf16 : o.format;
}
ScaleLayout layout_of(OutputFormat f) {
  return f == OutputFormat::nvfp4_swizzled ? ScaleLayout::swizzled : ScaleLayout::linear;
}

// One path's activations: the hidden rows (x_0 apart), the experts' input
// in every format, their output, the unpooler's rows, the gathered rows.
struct PathBuffers {
  int H, P, tp;
  DeviceMemory ping0, ping1, shard, rows, normed, a, a_sf, m, y, g;
  PathBuffers(int H_, int P_, int tp_)
      : H(H_), P(P_), tp(tp_),
        ping0(size_t(2) * kCap * H), ping1(size_t(2) * kCap * H), shard(size_t(2) * kCap * P / tp),
        rows(size_t(2) * kCap * P), normed(size_t(2) * kCap * P), a(size_t(kCap) * P / 2),
        a_sf(a_sf_bytes(P_)),
        m(size_t(2) * kCap * P), y(size_t(2) * kCap * H / tp), g(size_t(2) * kCap * H) {}
  void clear(cudaStream_t stream) const {
    const size_t hidden = size_t(2) * kCap * H, pooled = size_t(2) * kCap * P;
    const std::pair<const DeviceMemory*, size_t> all[] = {
        {&ping0, hidden}, {&ping1, hidden}, {&shard, pooled / tp}, {&rows, pooled}, {&normed, pooled},
        {&a, pooled / 4}, {&a_sf, a_sf_bytes()}, {&m, pooled}, {&y, hidden / tp}, {&g, hidden}};
    for (const auto& [d, bytes] : all) CUDA_CHECK(cudaMemsetAsync(d->get(), 0, bytes, stream));
  }
  static size_t a_sf_bytes(int P) {
    return size_t(nvfp4_scale_rows(kCap, ScaleLayout::swizzled)) * nvfp4_scale_cols(P, ScaleLayout::swizzled);
  }
  size_t a_sf_bytes() const { return a_sf_bytes(P); }
  void* out_of(int l) const { return l % 2 ? ping1.get() : ping0.get(); }
  const void* x_of(int l, const void* x0) const { return l == 0 ? x0 : out_of(l - 1); }
  // The consumer's outputs in `format` at b (the Pooler checks every shape).
  PoolerOutput outputs(OutputFormat format, int b, int device) const {
    return pooler_output_in(format, b, P, normed.get(), a.get(), a_sf.get(), device);
  }
  standins::ExpertInput expert_input(OutputFormat format, const float* global_scale) const {
    standins::ExpertInput in;
    in.format = format;
    in.normed = normed.get();
    in.a = a.get();
    in.a_sf = a_sf.get();
    in.global_scale = global_scale;
    return in;
  }
};

// What every rank contributes to the result (ranks are threads).
struct Shared {
  std::mutex mu;
  std::map<int, StepBatch> batches;
  std::string cublas_pooler, cublas_unpooler, exchange;
  bool shares = false;
};

// The worst row's |stock - fast|_2 / |fast - x0|_2 (kStockUpdateBound), and
// the bit-equal elements.
std::pair<double, int64_t> compare_with_stock(const std::vector<uint16_t>& fast, const std::vector<uint16_t>& stock,
                                              const std::vector<uint16_t>& x0, int b, int H) {
  double worst = 0;
  int64_t equal = 0;
  for (int r = 0; r < b; ++r) {
    double diff = 0, update = 0;
    for (int c = 0; c < H; ++c) {
      const size_t i = size_t(r) * H + c;
      equal += fast[i] == stock[i];
      const double f = bf16_to_float(fast[i]), s = bf16_to_float(stock[i]), x = bf16_to_float(x0[i]);
      diff += (s - f) * (s - f);
      update += (f - x) * (f - x);
    }
    const double ratio = std::sqrt(diff) / std::max(std::sqrt(update), 1e-30);
    worst = std::max(worst, std::isfinite(ratio) ? ratio : 1e30);
  }
  return {worst, equal};
}

void rank_main(Group& group, const StepOptions& o, Shared& shared) {
  const int tp = group.size(), rank = group.rank(), L = o.layers;
  const int H = kMuseSpark.hidden, P = kMuseSpark.pooled, sp = P / tp, sh = H / tp;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  auto say = [&](const std::string& what) {
    if (rank == 0 && o.progress) o.progress(what);
  };
  Stream stream;

  // ---- weights and input: every layer's own (cold in L2), the norm
  // weights, global scales and x_0 the same on every rank ----
  say("setting up " + std::to_string(L) + " layers of weights");
  DeviceMemory wpool(size_t(2) * L * sp * H), wunp(size_t(2) * L * sh * P), nw(size_t(2) * L * P),
      gs(sizeof(float) * L), x0(size_t(2) * kCap * H);
  fill_random_bf16(wpool.get(), size_t(L) * sp * H, o.seed * 131 + 2 * rank, stream, kPoolerWeightScale);
  fill_random_bf16(wunp.get(), size_t(L) * sh * P, o.seed * 131 + 2 * rank + 1, stream, kUnpoolerWeightScale);
  fill_random_bf16(nw.get(), size_t(L) * P, o.seed * 131 + 100, stream, kNormWeightScale);
  fill_random_bf16(x0.get(), size_t(kCap) * H, o.seed * 131 + 101, stream);
  // The normed values reach about 6 (about 5 standard deviations times the
  // norm weight's 1 + w): vLLM's global scale 448 * 6 / amax, varied a
  // little per layer.
  std::vector<float> scales(L);
  for (int l = 0; l < L; ++l) scales[l] = 448.0f * (1.0f + float(l % 7) / 16.0f);
  CUDA_CHECK(cudaMemcpyAsync(gs.get(), scales.data(), sizeof(float) * L, cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  auto pool_w = [&](int l) { return wpool.as<uint16_t>() + size_t(l) * sp * H; };
  auto unp_w = [&](int l) { return wunp.as<uint16_t>() + size_t(l) * sh * P; };
  auto scale_of = [&](int l) { return gs.as<float>() + l; };

  // ---- the fast path's objects ----
  PoolerConfig pc;
  pc.tp = tp;
  pc.rank = rank;
  pc.device = device;
  pc.hidden = H;
  pc.pooled = P;
  pc.batches = o.bs;
  pc.capacity = kCap;
  // Ranks sharing a GPU run each other's kernels in turn: a slot may wait
  // longer than one GPU per rank ever does.
  pc.options.spin_timeout_s = o.gpus > 0 && o.gpus < tp ? 60.0 : 5.0;
  Pooler pooler(group, pc);
  for (int l = 0; l < L; ++l) {
    PoolerLayer layer;
    layer.weight = TensorRef::contiguous(pool_w(l), DType::bf16, {sp, H}, device);
    layer.norm_weight = TensorRef::contiguous(nw.as<uint16_t>() + size_t(l) * P, DType::bf16, {P}, device);
    layer.eps = kEps;
    layer.gain_center = kGainCenter;
    const OutputFormat f = layer_format(o, l);
    if (f != OutputFormat::bf16) layer.global_scale = TensorRef::contiguous(scale_of(l), DType::f32, {1}, device);
    layer.format = f;
    pooler.attach(l, layer);
  }
  const bool shares = pooler.mailbox().shares_device();
  const bool pdl = !shares;  // the stand-ins between the mailbox's kernels: as theirs (mailbox.h)
  std::unique_ptr<LamportMailbox> hidden;
  if (tp > 1) {
    LamportMailbox::Options mo;
    mo.spin_timeout_s = pc.options.spin_timeout_s;
    hidden = std::make_unique<LamportMailbox>(group, tp, rank, kCap, sh, device, mo);
  }
  std::vector<Unpooler> plain, zero_copy;
  for (int l = 0; l < L; ++l) {
    const TensorRef w = TensorRef::contiguous(unp_w(l), DType::bf16, {sh, P}, device);
    plain.emplace_back(w);
    if (hidden) {
      Unpooler::Options uo;
      uo.mailbox = hidden.get();
      zero_copy.emplace_back(w, uo);
    }
  }
  // ---- the stock path's ----
  std::vector<ExpertNorm> norms;
  for (int l = 0; l < L; ++l)
    norms.emplace_back(TensorRef::contiguous(nw.as<uint16_t>() + size_t(l) * P, DType::bf16, {P}, device), kEps,
                       kGainCenter, /*enable_pdl=*/false);
  standins::load();
  const int widest = std::max(sp, sh);
  StockExchange reference_exchange(group, tp == 1 ? StockExchange::Kind::local : StockExchange::Kind::host, kCap,
                                   widest, stream);
  StockExchange stock_exchange(group, StockExchange::for_placement(tp, shares), kCap, widest, stream);
  const bool timed = !shares;
  std::map<int, std::unique_ptr<CublasGemm>> blas_pool, blas_unp;
  {
    DeviceMemory xs(size_t(2) * kCap * std::max(H, P)), outs(size_t(2) * kCap * std::max(H, P));
    CUDA_CHECK(cudaMemsetAsync(xs.get(), 0, size_t(2) * kCap * std::max(H, P), stream));
    std::vector<const void*> pool_ws, unp_ws;
    for (int l = 0; l < L; ++l) {
      pool_ws.push_back(pool_w(l));
      unp_ws.push_back(unp_w(l));
    }
    for (int b : o.bs) {
      say("choosing cuBLAS's algorithms, b = " + std::to_string(b));
      blas_pool[b] = std::make_unique<CublasGemm>(b, sp, H);
      blas_unp[b] = std::make_unique<CublasGemm>(b, sh, P);
      if (timed) {
        blas_pool[b]->pick_fastest(pool_ws, xs.get(), outs.get(), 5, stream);
        blas_unp[b]->pick_fastest(unp_ws, xs.get(), outs.get(), 5, stream);
      } else {  // loads the chosen kernel now, not while a peer on this GPU spins
        blas_pool[b]->run(pool_ws[0], xs.get(), outs.get(), stream);
        blas_unp[b]->run(unp_ws[0], xs.get(), outs.get(), stream);
      }
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(shared.mu);
      shared.cublas_pooler = blas_pool[o.bs.back()]->algo_description();
      shared.cublas_unpooler = blas_unp[o.bs.back()]->algo_description();
      shared.exchange = StockExchange::name(stock_exchange.kind());
      shared.shares = shares;
    }
  }
  PathBuffers fast(H, P, tp), ref(H, P, tp), stock(H, P, tp);
  for (PathBuffers* s : {&fast, &ref, &stock}) s->clear(stream);  // the stand-ins' warm run reads them
  // The stand-ins once each, before any rank spins (standins::load).
  standins::experts(fast.expert_input(OutputFormat::bf16, nullptr), fast.m.get(), 1, P, false, false, stream);
  standins::residual(x0.get(), fast.g.get(), fast.ping0.get(), 1, H, false, false, stream);
  pooler.warm_up(stream);
  if (hidden) hidden->warm_up(stream);
  DeviceMemory first(size_t(2) * kCap * H), counter(sizeof(unsigned long long));
  const auto x0_host = download<uint16_t>(x0.get(), size_t(kCap) * H, stream);
  group.barrier();

  // ---- the three paths, one layer each ----
  auto fast_layer = [&](int l, int b) {
    const OutputFormat f = layer_format(o, l);
    const void* x = fast.x_of(l, x0.get());
    pooler.run(l, TensorRef::contiguous(x, DType::bf16, {b, H}, device), fast.outputs(f, b, device), stream);
    standins::experts(fast.expert_input(f, scale_of(l)), fast.m.get(), b, P, pdl, o.standins_launch_early, stream);
    if (hidden) {
      zero_copy[l].run(fast.m.get(), fast.y.get(), b, stream);
      hidden->gather(fast.g.get(), b, stream);
    } else {
      plain[l].run(fast.m.get(), fast.g.get(), b, stream);  // tp 1: the unpooler's rows are the hidden rows
    }
    standins::residual(x, fast.g.get(), fast.out_of(l), b, H, pdl, o.standins_launch_early, stream);
  };
  auto reference_layer = [&](int l, int b) {
    const OutputFormat f = layer_format(o, l);
    const void* x = ref.x_of(l, x0.get());
    const TensorRef shard = pooler.project(l, x, b, stream);
    const void* rows = reference_exchange.all_gather(shard.data, b, sp, ref.rows.get(), stream);
    norms[l].run(rows, ref.normed.get(), b, stream);
    if (f != OutputFormat::bf16)
      nvfp4_quantize(ref.normed.get(), scale_of(l), ref.a.get(), ref.a_sf.get(), b, P, stream, false, layout_of(f));
    standins::experts(ref.expert_input(f, scale_of(l)), ref.m.get(), b, P, false, false, stream);
    plain[l].run(ref.m.get(), ref.y.get(), b, stream);
    const void* g = reference_exchange.all_gather(ref.y.get(), b, sh, ref.g.get(), stream);
    standins::residual(x, g, ref.out_of(l), b, H, false, false, stream);
  };
  auto stock_layer = [&](int l, int b) {
    const OutputFormat f = layer_format(o, l);
    const void* x = stock.x_of(l, x0.get());
    blas_pool[b]->run(pool_w(l), x, stock.shard.get(), stream);
    const void* rows = stock_exchange.all_gather(stock.shard.get(), b, sp, stock.rows.get(), stream);
    norms[l].run(rows, stock.normed.get(), b, stream);
    if (f != OutputFormat::bf16)
      nvfp4_quantize(stock.normed.get(), scale_of(l), stock.a.get(), stock.a_sf.get(), b, P, stream, false,
                     layout_of(f));
    standins::experts(stock.expert_input(f, scale_of(l)), stock.m.get(), b, P, false, false, stream);
    blas_unp[b]->run(unp_w(l), stock.m.get(), stock.y.get(), stream);
    const void* g = stock_exchange.all_gather(stock.y.get(), b, sh, stock.g.get(), stream);
    standins::residual(x, g, stock.out_of(l), b, H, false, false, stream);
  };
  // The stand-ins alone, as each path launches them.
  auto standins_layer = [&](PathBuffers& s, bool with_pdl, int l, int b) {
    const OutputFormat f = layer_format(o, l);
    const bool early = with_pdl && o.standins_launch_early;
    standins::experts(s.expert_input(f, scale_of(l)), s.m.get(), b, P, with_pdl, early, stream);
    standins::residual(s.x_of(l, x0.get()), s.g.get(), s.out_of(l), b, H, with_pdl, early, stream);
  };
  // One graph of the whole step, uploaded now: its first launch then
  // prepares nothing while a peer sharing the GPU may spin.
  auto whole_step = [&](auto&& layer, int b) {
    cudaGraphExec_t exec = capture_graph(stream, 1, [&] {
      for (int l = 0; l < L; ++l) layer(l, b);
    });
    CUDA_CHECK(cudaGraphUpload(exec, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return exec;
  };

  for (int b : o.bs) {
    const std::string at = "b = " + std::to_string(b);
    say(at + ": capturing the step's graphs");
    cudaGraphExec_t fast_graph = whole_step(fast_layer, b);
    cudaGraphExec_t stock_graph = stock_exchange.capturable() ? whole_step(stock_layer, b) : nullptr;
    cudaGraphExec_t fast_standins = whole_step([&](int l, int bb) { standins_layer(fast, pdl, l, bb); }, b);
    cudaGraphExec_t stock_standins = whole_step([&](int l, int bb) { standins_layer(stock, false, l, bb); }, b);
    const size_t n = size_t(b) * H;
    const void* fast_final = fast.out_of(L - 1);

    // The fast path's first replay, then the reference pass (eager).
    say(at + ": the fast path against the reference, bit for bit");
    group.barrier();
    CUDA_CHECK(cudaGraphLaunch(fast_graph, stream));
    pooler.mailbox().synchronize(stream);
    CUDA_CHECK(cudaMemcpyAsync(first.get(), fast_final, n * 2, cudaMemcpyDeviceToDevice, stream));
    group.barrier();
    for (int l = 0; l < L; ++l) reference_layer(l, b);
    const auto fast_rows = download<uint16_t>(fast_final, n, stream);
    const auto ref_rows = download<uint16_t>(ref.out_of(L - 1), n, stream);
    int64_t ref_mismatches = 0;
    for (size_t i = 0; i < n; ++i) ref_mismatches += fast_rows[i] != ref_rows[i];

    // The stock path: its graph, or eagerly where its exchange cannot be captured.
    say(at + ": the stock path (cuBLAS) against the fast path, within the bound");
    group.barrier();
    if (stock_graph) {
      CUDA_CHECK(cudaGraphLaunch(stock_graph, stream));
    } else {
      for (int l = 0; l < L; ++l) stock_layer(l, b);
    }
    const auto stock_rows = download<uint16_t>(stock.out_of(L - 1), n, stream);
    const auto [stock_ratio, stock_equal] = compare_with_stock(fast_rows, stock_rows, x0_host, b, H);

    // Replays against the first, counted on the device (no host round trip
    // per replay).
    say(at + ": " + std::to_string(o.checked_replays) + " replays of the fast path against its first");
    CUDA_CHECK(cudaMemsetAsync(counter.get(), 0, sizeof(unsigned long long), stream));
    for (int i = 0; i < o.checked_replays; ++i) {
      group.barrier();  // ranks within a replay of each other: no slot waits past its timeout
      CUDA_CHECK(cudaGraphLaunch(fast_graph, stream));
      standins::count_mismatches(fast_final, first.get(), int64_t(n), counter.as<unsigned long long>(), stream);
    }
    pooler.mailbox().synchronize(stream);
    const auto replay_mismatches = download<unsigned long long>(counter.get(), 1, stream)[0];

    StepBatch r;
    r.b = b;
    r.elements = int64_t(n);
    r.reference_mismatches = ref_mismatches;
    r.replays = o.checked_replays;
    r.replay_mismatches = int64_t(replay_mismatches);
    r.stock_update_ratio = stock_ratio;
    r.stock_equal_elements = stock_equal;
    r.stock_checked = true;
    if (timed) {
      say(at + ": timing (" + std::to_string(o.repeats) + " replays of each graph)");
      r.fast_us = time_replays(group, fast_graph, stream, 1, o.repeats);
      pooler.mailbox().synchronize(stream);
      r.stock_us = time_replays(group, stock_graph, stream, 1, o.repeats);
      r.fast_standins_us = time_replays(group, fast_standins, stream, 1, o.repeats);
      r.stock_standins_us = time_replays(group, stock_standins, stream, 1, o.repeats);
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (cudaGraphExec_t g : {fast_graph, stock_graph, fast_standins, stock_standins})
      if (g) CUDA_CHECK(cudaGraphExecDestroy(g));
    {
      // Every rank checks its own copy of the (replicated) hidden rows; the
      // times are rank 0's.
      std::lock_guard<std::mutex> lock(shared.mu);
      auto [it, fresh] = shared.batches.try_emplace(b, r);
      StepBatch& s = it->second;
      if (!fresh) {
        s.elements += r.elements;
        s.reference_mismatches += r.reference_mismatches;
        s.replay_mismatches += r.replay_mismatches;
        s.stock_equal_elements += r.stock_equal_elements;
        s.stock_update_ratio = std::max(s.stock_update_ratio, r.stock_update_ratio);
      }
      if (rank == 0) {
        s.fast_us = r.fast_us;
        s.stock_us = r.stock_us;
        s.fast_standins_us = r.fast_standins_us;
        s.stock_standins_us = r.stock_standins_us;
      }
    }
    group.barrier();
  }
  pooler.barrier();
  if (hidden) hidden->barrier();
}

}  // namespace

namespace {

// What a batch's times give (0 where not timed).
struct Derived {
  double fast_boundary = 0, stock_boundary = 0;  // microseconds per layer
  double boundary_speedup = 0, step_speedup = 0;
  double saving_us_per_token = 0;  // the step's saving over its b tokens
};

Derived derive(const StepBatch& r, int layers) {
  Derived d;
  if (r.fast_us <= 0 || r.stock_us <= 0) return d;
  d.fast_boundary = (r.fast_us - r.fast_standins_us) / layers;
  d.stock_boundary = (r.stock_us - r.stock_standins_us) / layers;
  d.boundary_speedup = d.fast_boundary > 0 ? d.stock_boundary / d.fast_boundary : 0;
  d.step_speedup = r.stock_us / r.fast_us;
  d.saving_us_per_token = (r.stock_us - r.fast_us) / r.b;
  return d;
}

double round3(double x) { return std::round(x * 1000) / 1000; }

std::string method_fast(const StepResult& r) {
  return std::string("Pooler.run into caller-owned outputs (BF16 edge layers 0 and ") + std::to_string(r.layers - 1) +
         ", " + format_name(r.format) + " in between), the experts' stand-in, " +
         (r.tp > 1 ? "the Unpooler publishing from its epilogue into the hidden rows' mailbox, the mailbox's gather"
                   : "the Unpooler writing the hidden rows (tp 1: no exchange, as in the stock path)") +
         ", the residual stand-in; PDL " + (r.ranks_share_gpus ? "off (ranks share GPUs)" : "on") +
         "; one CUDA graph of the whole step";
}

const char* const kMethodReference =
    "the stock structure on our GEMM engines: Pooler.project (no mailbox), an all-gather on the host, ExpertNorm, "
    "nvfp4_quantize, the plain Unpooler (no mailbox), an all-gather on the host, the same stand-ins; eager. Only the "
    "publish route, the mailbox and the fused consumer differ from the fast path, which the semantics make exact "
    "(docs/design.md, \"Exact semantics\") except the sign of zero, which the stand-ins drop (they add +0.0): the "
    "fast path's final hidden rows must equal it bit for bit, on its first replay and on every checked replay";

std::string method_stock(const StepResult& r) {
  return "cuBLAS (the fastest cuBLASLt candidate per shape), " + r.stock_exchange +
         ", ExpertNorm, nvfp4_quantize, the same stand-ins; PDL off; " +
         (r.timed ? "one CUDA graph of the whole step" : "eager (its exchange cannot be captured here)") +
         ". Its GEMMs sum in cuBLAS's order: its final rows are checked within the bound, not bit for bit";
}

std::string bound_text() {
  char s[400];
  std::snprintf(s, sizeof s,
                "per row, |stock - fast|_2 <= %.2f |fast - x_0|_2 (the rows' update over the step): NVFP4's code "
                "flips, which a last-bit GEMM difference causes now and then, feed every later layer; a wrong or "
                "missing operation in every layer moves the update by about its own size",
                kStockUpdateBound);
  return s;
}

const char* const kMethodTiming =
    "CUDA events over graph replays (median), 62 layers of distinct weights (cold L2); the stand-ins timed alone in "
    "a graph of the same launches; boundary per layer = (step - stand-ins) / layers; saving per token = (stock step - "
    "fast step) / b, per million tokens the same figure in seconds (per tensor-parallel group; times tp for "
    "GPU-seconds); times of rank 0";

}  // namespace

bool StepResult::ok() const {
  if (batches.empty()) return false;
  for (const auto& b : batches)
    if (!b.ok()) return false;
  return true;
}

StepResult run_step(const StepOptions& options) {
  StepOptions o = options;
  SPARK_CHECK(std::find(std::begin(kTensorParallelSizes), std::end(kTensorParallelSizes), o.tp) !=
                  std::end(kTensorParallelSizes),
              "tp ", o.tp, " is not one of 1, 2, 4, 8");
  std::sort(o.bs.begin(), o.bs.end());
  o.bs.erase(std::unique(o.bs.begin(), o.bs.end()), o.bs.end());
  SPARK_CHECK(!o.bs.empty() && o.bs.front() >= 1 && o.bs.back() <= kMaxBatch, "b must lie in [1, ", kMaxBatch, "]");
  SPARK_CHECK(o.layers >= 2, "layers ", o.layers, ": the step needs its two edge layers");
  SPARK_CHECK(o.repeats >= 1 && o.checked_replays >= 0, "repeats must be >= 1 and replays >= 0");
  int visible = 0;
  SPARK_CHECK_RUNTIME(cudaGetDeviceCount(&visible) == cudaSuccess && visible > 0, "no GPU is visible");
  if (o.gpus <= 0) o.gpus = std::min(o.tp, visible);
  SPARK_CHECK(o.gpus <= o.tp, "gpus ", o.gpus, " above tp ", o.tp, " (a rank runs on one GPU)");
  SPARK_CHECK_RUNTIME(o.gpus <= visible, "the step at ", o.gpus, " GPUs, but ", visible, " are visible");
  CUDA_CHECK(cudaSetDevice(0));
  const Report meta = new_report();
  Shared shared;
  run_ranks(o.tp, [&](Group& group, int) { rank_main(group, o, shared); }, o.gpus);

  StepResult r;
  r.gpu = meta.gpu;
  r.date = meta.date;
  r.commit = meta.commit;
  r.tp = o.tp;
  r.gpus = o.gpus;
  r.layers = o.layers;
  r.ranks_share_gpus = shared.shares;
  r.timed = !shared.shares;
  r.format = o.format;
  r.standins_launch_early = o.standins_launch_early;
  r.stock_exchange = shared.exchange;
  r.cublas_pooler = shared.cublas_pooler;
  r.cublas_unpooler = shared.cublas_unpooler;
  r.seed = o.seed;
  for (auto& [b, batch] : shared.batches) r.batches.push_back(batch);
  if (!r.timed)
    r.notes.push_back("ranks share GPUs (" + std::to_string(o.tp) + " ranks on " + std::to_string(o.gpus) +
                      "): correctness only, nothing timed");
  return r;
}

std::string step_json(const StepResult& r) {
  nlohmann::ordered_json j;
  j["tool"] = "spark-decode step";
  j["gpu"] = r.gpu;
  j["date"] = r.date;
  j["commit"] = r.commit;
  j["tp"] = r.tp;
  j["gpus"] = r.gpus;
  j["ranks_share_gpus"] = r.ranks_share_gpus;
  j["timed"] = r.timed;
  j["layers"] = r.layers;
  j["formats"] = {{"edge layers", "bf16"}, {"other layers", format_name(r.format)}};
  j["standins_launch_next"] = r.standins_launch_early ? "early (at their start)" : "late (at their exit)";
  j["seed"] = r.seed;
  j["method"] = {{"fast", method_fast(r)},
                 {"reference", kMethodReference},
                 {"stock", method_stock(r)},
                 {"stock_bound", bound_text()},
                 {"timing", kMethodTiming},
                 {"stand-ins", "bench/step_standins.h: experts = the dequantized input, residual = x + rows; under "
                               "1 MiB of traffic per layer at b = 16, 0.7% of the boundary's bytes at tp 1"},
                 {"cublas", {{"pooler", r.cublas_pooler}, {"unpooler", r.cublas_unpooler}}}};
  j["batches"] = nlohmann::json::array();
  j["records"] = nlohmann::json::array();
  for (const StepBatch& b : r.batches) {
    const Derived d = derive(b, r.layers);
    nlohmann::ordered_json o;
    o["b"] = b.b;
    if (r.timed) {
      o["fast_step_us"] = round3(b.fast_us);
      o["stock_step_us"] = round3(b.stock_us);
      o["fast_standins_us"] = round3(b.fast_standins_us);
      o["stock_standins_us"] = round3(b.stock_standins_us);
      o["fast_boundary_us_per_layer"] = round3(d.fast_boundary);
      o["stock_boundary_us_per_layer"] = round3(d.stock_boundary);
      o["boundary_speedup"] = round3(d.boundary_speedup);
      o["step_speedup"] = round3(d.step_speedup);
      o["saving_us_per_token"] = round3(d.saving_us_per_token);
      o["saving_s_per_million_tokens"] = round3(d.saving_us_per_token);
      o["saving_gpu_s_per_million_tokens"] = round3(d.saving_us_per_token * r.tp);
    }
    o["checks"] = {{"elements", b.elements},
                   {"reference_mismatches", b.reference_mismatches},
                   {"replays", b.replays},
                   {"replay_mismatches", b.replay_mismatches},
                   {"bit_exact", b.bit_exact()},
                   {"stock_update_ratio", b.stock_update_ratio},
                   {"stock_bound", kStockUpdateBound},
                   {"stock_equal_fraction", b.elements ? double(b.stock_equal_elements) / b.elements : 0.0},
                   {"stock_within_bound", b.stock_ok()}};
    j["batches"].push_back(o);
    if (!r.timed) continue;
    // The benchmark records' schema (docs/design.md, "Benchmark records").
    auto record = [&](const char* op, const char* impl, const char* variant, const char* mode, double us) {
      j["records"].push_back({{"op", op}, {"impl", impl}, {"variant", variant}, {"tp", r.tp}, {"m", b.b},
                              {"n", kMuseSpark.hidden}, {"k", kMuseSpark.pooled}, {"mode", mode},
                              {"us", round3(us)}, {"floor_us", 0}});
    };
    const char* ours = r.ranks_share_gpus ? "graph" : "pdl_chain";
    record("step", "spark", "whole step", ours, b.fast_us);
    record("step", "stock", "whole step", "graph", b.stock_us);
    record("step", "spark", "stand-ins alone", ours, b.fast_standins_us);
    record("step", "stock", "stand-ins alone", "graph", b.stock_standins_us);
    record("step_boundary", "spark", "per layer", ours, d.fast_boundary);
    record("step_boundary", "stock", "per layer", "graph", d.stock_boundary);
  }
  j["notes"] = r.notes;
  j["pass"] = r.ok();
  return j.dump(1);
}

namespace {

std::string table(const StepResult& r, bool markdown) {
  std::ostringstream os;
  char line[512];
  if (markdown) {
    os << "| b | step us (ours / stock) | stand-ins us (ours / stock) | boundary us per layer (ours / stock) | "
          "boundaries x | saving us per token | s per 1M tokens | bit for bit vs reference | replays identical | "
          "stock within bound (ratio) |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  } else {
    os << "     b  step us ours / stock   boundary us/layer ours / stock   boundaries   saving us/token   checks\n";
  }
  for (const StepBatch& b : r.batches) {
    const Derived d = derive(b, r.layers);
    const std::string checks = std::string(b.bit_exact() ? "bit-exact" : "DIFFERS") + ", " +
                               std::to_string(b.replays) + " replays " +
                               (b.replay_mismatches == 0 ? "identical" : "DIFFER") + ", stock " +
                               (b.stock_ok() ? "within" : "OUTSIDE") + " bound";
    if (markdown) {
      if (r.timed)
        std::snprintf(line, sizeof line,
                      "| %d | %.1f / %.1f | %.1f / %.1f | %.2f / %.2f | %.2fx | %.2f | %.2f | %s (%lld of %lld "
                      "differ) | %s | %s (%.4f) |\n",
                      b.b, b.fast_us, b.stock_us, b.fast_standins_us, b.stock_standins_us, d.fast_boundary,
                      d.stock_boundary, d.boundary_speedup, d.saving_us_per_token, d.saving_us_per_token,
                      b.bit_exact() ? "yes" : "NO", (long long)b.reference_mismatches, (long long)b.elements,
                      b.replay_mismatches == 0 ? "yes" : "NO", b.stock_ok() ? "yes" : "NO", b.stock_update_ratio);
      else
        std::snprintf(line, sizeof line, "| %d | - | - | - | - | - | - | %s (%lld of %lld differ) | %s | %s (%.4f) |\n",
                      b.b, b.bit_exact() ? "yes" : "NO", (long long)b.reference_mismatches, (long long)b.elements,
                      b.replay_mismatches == 0 ? "yes" : "NO", b.stock_ok() ? "yes" : "NO", b.stock_update_ratio);
    } else if (r.timed) {
      std::snprintf(line, sizeof line, "  %4d  %8.1f / %8.1f      %8.2f / %8.2f            %5.2fx       %8.2f       %s\n",
                    b.b, b.fast_us, b.stock_us, d.fast_boundary, d.stock_boundary, d.boundary_speedup,
                    d.saving_us_per_token, checks.c_str());
    } else {
      std::snprintf(line, sizeof line, "  %4d  %-64s %s\n", b.b, "(not timed)", checks.c_str());
    }
    os << line;
  }
  return os.str();
}

}  // namespace

std::string step_summary(const StepResult& r) {
  std::ostringstream os;
  os << "step: " << r.layers << " layers, tp " << r.tp << " on " << r.gpus << " GPU" << (r.gpus > 1 ? "s" : "")
     << (r.ranks_share_gpus ? " (ranks share GPUs: correctness only, nothing timed)" : "") << ", " << r.gpu
     << ", commit " << r.commit << "\n";
  os << table(r, false);
  os << "  fast: " << method_fast(r) << ".\n  reference: " << kMethodReference << ".\n  stock: " << method_stock(r)
     << ".\n  stock bound: " << bound_text() << ".\n";
  if (r.timed) os << "  timing: " << kMethodTiming << ".\n";
  os << "  step: " << (r.ok() ? "PASS" : "FAIL") << "\n";
  return os.str();
}

std::string write_step(const StepResult& r, const std::string& dir) {
  const std::string stem = dir + "/step_tp" + std::to_string(r.tp);
  std::ofstream(stem + ".json") << step_json(r) << "\n";
  std::ostringstream md;
  md << "# step on " << r.gpu << ", " << r.date << ", commit " << r.commit << "\n\n"
     << "The MoE boundaries of a whole decode step (" << r.layers << " layers) at tp " << r.tp << " on " << r.gpus
     << " GPU" << (r.gpus > 1 ? "s" : "") << (r.ranks_share_gpus ? " (ranks share GPUs: correctness only)" : "")
     << ": ours against the stock path, in the same run.\n\n"
     << table(r, true) << "\n"
     << "- fast: " << method_fast(r) << ".\n- reference: " << kMethodReference << ".\n- stock: " << method_stock(r)
     << ".\n- stock bound: " << bound_text() << ".\n- timing: " << kMethodTiming << ".\n";
  for (const auto& n : r.notes) md << "- " << n << "\n";
  std::ofstream(stem + ".md") << md.str();
  return stem + ".json";
}

}  // namespace spark_decode::bench
