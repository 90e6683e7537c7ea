#include "bench_pooler.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>

#include "cublas_gemm.h"
#include "harness.h"
#include "nccl_check.h"
#include "spark_decode/error.h"
#include "spark_decode/expert_norm.h"
#include "spark_decode/group.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/nvfp4.h"
#include "spark_decode/pooler.h"
#include "spark_decode/pooler_gemm.h"


namespace spark_decode::bench {
namespace {

// Pooler.run with the table's engines and the fused consumer's trigger forced
// (records "run (PDL; <this>)", which tools/rank_pooler.py reads).
const char* const kEarly = "the consumer launching the next kernel at its start";
const char* const kLate = "the consumer launching the next kernel once its data arrived";
// Interleaved rounds of Pooler.run's variants (median).
constexpr int kRounds = 5;


// Whether an engine's name starts with one of the prefixes (none: all).
bool selected(const std::vector<std::string>& prefixes, const std::string& name) {
  if (prefixes.empty()) return true;
  for (const auto& prefix : prefixes)
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

// The GEMM sweep on the current GPU: records op pooler_gemm.
void gemm_sweep(const PoolerBenchOptions& o, Report& report, cudaStream_t stream) {
  const int k = kMuseSpark.hidden;
  prepare_onchip_stream();
  // The routed experts' stand-in (mode after_stream), shared by every tp.
  std::unique_ptr<StandIn> standin;
  if (o.standin_mib > 0) standin = std::make_unique<StandIn>(size_t(o.standin_mib) << 20, o.standin_smem_kib * 1024);
  DeviceMemory x(size_t{2} * kMaxBatch * k), out(size_t{2} * kMaxBatch * kMuseSpark.pooled);
  fill_random_bf16(x.get(), size_t{kMaxBatch} * k, 7);
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  for (int tp : o.gemm_tps) {
    const int n = kMuseSpark.pooled / tp;
    const size_t bytes = size_t{2} * n * k;
    const int copies = cold_copies(bytes);
    DeviceMemory w(bytes * copies);
    fill_random_bf16(w.get(), size_t(n) * k * copies, 0x900d + tp);
    CUDA_CHECK(cudaDeviceSynchronize());
    auto copy = [&](int i) { return static_cast<const void*>(w.as<char>() + bytes * i); };
    std::vector<const void*> ptrs;
    for (int i = 0; i < copies; ++i) ptrs.push_back(copy(i));
    const double floor = floor_us(bytes, report.hbm_read_TBps);
    std::printf("pooler GEMM tp %d: N=%d K=%d, %d cold copies, floor %.2f us\n", tp, n, k, copies, floor);
    std::vector<std::pair<std::string, std::optional<PoolerGemmChoice>>> engines = {{"table", std::nullopt}};
    for (const auto& c : pooler_gemm_candidates()) engines.push_back({c.to_string(), c});
    std::erase_if(engines, [&](const auto& e) { return !selected(o.engines, e.first); });
    // The on-chip engine's copies with nothing computed: the bare stream it
    // can at best reach at this shape.
    const OnchipTactic onchip = onchip_tactic(PlanOp::pooler, n, k);
    if (!onchip_unsupported(n, k, onchip) && selected(o.engines, "onchip_mma")) {
      double stream_us[2];
      for (bool chain : {false, true})
        stream_us[chain] = time_graph(
            [&](cudaStream_t s, int c) {
              enqueue_onchip_stream(copy(c), n, k, onchip.splits, onchip.kw, onchip.stage_warps_for(k), chain, s);
            },
            copies, o.repeats, stream);
      char line[256];
      std::snprintf(line, sizeof line,
                    "pooler GEMM tp %d diagnostics: onchip_mma %s, %d CTAs; its bulk copies with nothing computed "
                    "%.2f us (PDL off), %.2f us (PDL chain)",
                    tp, onchip.to_string().c_str(), n / kSplitKTileN * onchip.splits, stream_us[0], stream_us[1]);
      std::printf("  %s\n", line);
      report.notes.push_back(line);
    }
    // What a shared-memory-staged engine can at best reach at this shard.
    record_stream_bound(report, "pooler_gemm", tp, n, k, copy, copies, o.repeats, stream);
    // The stand-in alone (mode after_stream), chained as the pairs are.
    double standin_us = 0;
    if (standin) {
      standin_us = standin->time_alone(copies, o.repeats, stream);
      report.records.push_back({"pooler_gemm", "standin", standin->describe(), "after_stream", tp, 0, n, k, standin_us, 0});
      std::printf("  stand-in: %s alone %.2f us/call (PDL chain)\n", standin->describe().c_str(), standin_us);
    }
    for (int b : o.bs) {
      CublasGemm blas(b, n, k);
      const double blas_us = blas.pick_fastest(ptrs, x.get(), out.get(), o.repeats, stream);
      report.records.push_back({"pooler_gemm", "cublas", "", "graph", tp, b, n, k, blas_us, floor});
      std::printf("  b=%2d  cublas %6.2f us (%s)\n", b, blas_us, blas.algo_description().c_str());
      for (const auto& [name, force] : engines) {
        for (bool pdl : {false, true}) {
          PoolerGemm::Options go;
          go.enable_pdl = pdl;
          go.batches = {b};
          go.force = force;
          std::vector<PoolerGemm> gemms;
          try {
            for (int i = 0; i < copies; ++i)
              gemms.emplace_back(TensorRef::contiguous(copy(i), DType::bf16, {n, k}, dev), tp, go);
          } catch (const InvalidArgument& e) {
            std::printf("        %-52s cannot run: %s\n", name.c_str(), e.what());
            break;
          }
          const double us = time_graph([&](cudaStream_t s, int c) { gemms[c].run(x.get(), out.get(), b, s); },
                                       copies, o.repeats, stream);
          const std::string variant = (name == "table" ? "table=" + gemms[0].choice(b).to_string() : name);
          report.records.push_back(
              {"pooler_gemm", "spark", variant, pdl ? "pdl_chain" : "graph", tp, b, n, k, us, floor});
          std::printf("        %-52s %-9s %6.2f us  %.2fx cublas, %3.0f%% of floor\n", variant.c_str(),
                      pdl ? "pdl_chain" : "graph", us, blas_us / us, 100 * floor / us);
          // The table's, the split-K and the on-chip engines behind the
          // stand-in: the time per pair less the stand-in's alone.
          if (pdl && standin &&
              (name == "table" || (force && (force->engine == GemmEngine::onchip_mma ||
                                             force->engine == GemmEngine::splitk_mma)))) {
            const double after = standin->time_behind(
                [&](cudaStream_t s, int c) { gemms[c].run(x.get(), out.get(), b, s); }, standin_us, copies, o.repeats,
                stream);
            report.records.push_back({"pooler_gemm", "spark", variant, "after_stream", tp, b, n, k, after, floor});
            std::printf("        %-52s %-9s %6.2f us  (per pair less the stand-in's %.2f)\n", variant.c_str(),
                        "after the stand-in", after, standin_us);
          }
        }
      }
    }
  }
}

// Pooler.run against the stock path at tp (tp GPUs, a thread each): op pooler.
void pooler_vs_stock(const PoolerBenchOptions& o, int tp, Report& report) {
  const int H = kMuseSpark.hidden, P = kMuseSpark.pooled, shard = P / tp, L = kMuseSpark.layers;
  int devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  SPARK_CHECK_RUNTIME(devices >= tp, "bench pooler at tp ", tp, " needs ", tp, " GPUs, found ", devices);
  ncclUniqueId id;
  if (tp > 1) NCCL_CHECK(ncclGetUniqueId(&id));
  std::mutex mu;
  std::map<int, std::tuple<double, double, double>> results;  // b -> (run, stock, project+publish+gather)
  // (b, what was forced: "engine <name>" or a trigger) -> Pooler.run
  std::map<std::pair<int, std::string>, double> forced_results;
  run_ranks(tp, [&](Group& group, int rank) {
        cudaStream_t stream;
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        // 62 layers of distinct weights (62 x P/tp x H BF16: far more than
        // 4x the L2): every call's weights are cold.
        DeviceMemory w(size_t{2} * L * shard * H), nw(size_t{2} * P), gs(sizeof(float) * L);
        fill_random_bf16(w.get(), size_t(L) * shard * H, 0x1000 + rank);
        fill_random_bf16(nw.get(), P, 0x2000);
        std::vector<float> scales(L, 2688.0f / 8.0f);
        CUDA_CHECK(cudaMemcpy(gs.get(), scales.data(), sizeof(float) * L, cudaMemcpyHostToDevice));
        std::vector<PoolerLayer> layers(L);
        for (int l = 0; l < L; ++l) {
          layers[l].weight = TensorRef::contiguous(w.as<char>() + size_t{2} * l * shard * H, DType::bf16, {shard, H}, rank);
          layers[l].norm_weight = TensorRef::contiguous(nw.get(), DType::bf16, {P}, rank);
          if (l != 0 && l != L - 1) layers[l].global_scale = TensorRef::contiguous(gs.as<float>() + l, DType::f32, {1}, rank);
        }
        Pooler pooler(group, tp, rank, rank, layers, o.bs, kMaxBatch, true);
        pooler.warm_up(stream);
        // The same Pooler with every layer's GEMM forced onto one engine
        // (--run-engines): what the table's choice gives the whole boundary,
        // not just the GEMM. Validation is the same on every rank, so a rank
        // skips an engine exactly when all do.
        std::vector<std::pair<std::string, std::unique_ptr<Pooler>>> forced;  // (what was forced, Pooler)
        for (const auto& c : pooler_gemm_candidates()) {
          if (o.run_engines.empty() || !selected(o.run_engines, c.to_string())) continue;
          PoolerOptions po;
          po.gemm = c;
          try {
            forced.emplace_back("engine " + c.to_string(), std::make_unique<Pooler>(group, tp, rank, rank, layers,
                                                                                    o.bs, kMaxBatch, true, po));
          } catch (const InvalidArgument& e) {
            if (rank == 0) std::printf("pooler tp %d: Pooler.run on %s cannot run: %s\n", tp, c.to_string().c_str(), e.what());
            continue;
          }
          forced.back().second->warm_up(stream);
        }
        // Every NVFP4 layer in the other output formats (the main Pooler's is
        // nvfp4, linear scales): what each consumer costs.
        for (OutputFormat f : {OutputFormat::bf16, OutputFormat::nvfp4_swizzled}) {
          std::vector<PoolerLayer> formatted = layers;
          for (int l = 1; l < L - 1; ++l) formatted[l].format = f;
          forced.emplace_back(std::string("format ") + format_name(f),
                              std::make_unique<Pooler>(group, tp, rank, rank, formatted, o.bs, kMaxBatch, true));
          forced.back().second->warm_up(stream);
        }
        // The table's engines with the fused consumer's launch point forced
        // each way (the plan's consumer launch): where the next GEMM may launch.
        for (bool early : {true, false}) {
          PoolerOptions po;
          po.consumer_launches_early = early;
          forced.emplace_back(early ? kEarly : kLate, std::make_unique<Pooler>(group, tp, rank, rank, layers, o.bs,
                                                                            kMaxBatch, true, po));
          forced.back().second->warm_up(stream);
        }
        DeviceMemory x(size_t{2} * kMaxBatch * H);
        fill_random_bf16(x.get(), size_t{kMaxBatch} * H, 0x3000);
        // Stock: cuBLAS, ncclAllGather, a [tp][b][shard] -> [b][P] copy, norm, quantize.
        ExpertNorm norm(layers[1].norm_weight, 1e-5f, 1.0f, /*enable_pdl=*/false);
        DeviceMemory part(size_t{2} * kMaxBatch * shard), gathered(size_t{2} * kMaxBatch * P),
            rows(size_t{2} * kMaxBatch * P), normed(size_t{2} * kMaxBatch * P),
            a(size_t(kMaxBatch) * P / 2), sf(size_t(kMaxBatch) * P / 16);
        ncclComm_t comm = nullptr;
        if (tp > 1) NCCL_CHECK(ncclCommInitRank(&comm, tp, id, rank));
        for (int b : o.bs) {
          CublasGemm blas(b, shard, H);
          std::vector<const void*> ptrs;
          for (int l = 1; l < L - 1; ++l) ptrs.push_back(layers[l].weight.data);
          blas.pick_fastest(ptrs, x.get(), part.get(), 5, stream);
          auto stock_call = [&](int l) {
            blas.run(layers[l].weight.data, x.get(), part.get(), stream);
            const void* src = part.get();
            if (tp > 1) {
              NCCL_CHECK(ncclAllGather(part.get(), gathered.get(), size_t(b) * shard, ncclBfloat16, comm, stream));
              CUDA_CHECK(cudaMemcpy2DAsync(rows.get(), size_t{2} * P, gathered.get(), size_t{2} * shard,
                                           size_t{2} * shard, size_t(b) * 1, cudaMemcpyDeviceToDevice, stream));
              for (int q = 1; q < tp; ++q)
                CUDA_CHECK(cudaMemcpy2DAsync(rows.as<char>() + size_t{2} * q * shard, size_t{2} * P,
                                             gathered.as<char>() + size_t{2} * q * b * shard, size_t{2} * shard,
                                             size_t{2} * shard, b, cudaMemcpyDeviceToDevice, stream));
              src = rows.get();
            }
            norm.run(src, normed.get(), b, stream);
            nvfp4_quantize(normed.get(), gs.as<float>() + l, a.get(), sf.get(), b, P, stream, false);
          };
          // NCCL connects on a communicator's first collective: not under capture.
          stock_call(1);
          CUDA_CHECK(cudaStreamSynchronize(stream));
          group.barrier();
          int layer = 0;
          cudaGraphExec_t stock = capture_graph(stream, L - 2, [&] { stock_call(1 + layer++ % (L - 2)); });
          const double stock_us = time_replays(group, stock, stream, L - 2, o.repeats);
          CUDA_CHECK(cudaGraphExecDestroy(stock));
          // Ours and every forced variant, timed in interleaved rounds (each
          // graph once per round, the median over rounds): variants a few
          // tenths of a microsecond apart are otherwise confounded with the
          // machine's drift over the minutes between their turns.
          std::vector<Pooler*> poolers = {&pooler};
          for (auto& f : forced) poolers.push_back(f.second.get());
          std::vector<cudaGraphExec_t> graphs;
          for (Pooler* p : poolers) {
            layer = 0;
            graphs.push_back(capture_graph(stream, L - 2, [&] { p->run(1 + layer++ % (L - 2), x.get(), b, stream); }));
          }
          std::vector<std::vector<double>> rounds(graphs.size());
          for (int round = 0; round < kRounds; ++round)
            for (size_t i = 0; i < graphs.size(); ++i)
              rounds[i].push_back(time_replays(group, graphs[i], stream, L - 2, o.repeats));
          const bool tracing = !o.trace.empty() && b == o.bs.front();
          const std::string trace_path = o.trace + "_tp" + std::to_string(tp) + "_b" + std::to_string(b) + "_rank" +
                                         std::to_string(rank);
          if (tracing) trace_replay(graphs[0], stream, trace_path + "_run.csv", [&] { group.barrier(); });
          for (size_t i = 0; i < graphs.size(); ++i) {
            poolers[i]->mailbox().synchronize(stream);
            CUDA_CHECK(cudaGraphExecDestroy(graphs[i]));
          }
          const double spark_us = median(rounds[0]);
          if (rank == 0) {
            std::lock_guard<std::mutex> lock(mu);
            for (size_t i = 1; i < graphs.size(); ++i) forced_results[{b, forced[i - 1].first}] = median(rounds[i]);
          }
          // The same calls as three kernels (the publish kernel between GEMM
          // and gather): what run() did before the GEMM's epilogue published.
          layer = 0;
          cudaGraphExec_t split = capture_graph(stream, L - 2, [&] {
            const int l = 1 + layer++ % (L - 2);
            pooler.project(l, x.get(), b, stream);
            pooler.publish(b, stream);
            pooler.gather(l, b, stream);
          });
          const double split_us = time_replays(group, split, stream, L - 2, o.repeats);
          if (tracing) trace_replay(split, stream, trace_path + "_split.csv", [&] { group.barrier(); });
          pooler.mailbox().synchronize(stream);
          CUDA_CHECK(cudaGraphExecDestroy(split));
          if (rank == 0) {
            std::lock_guard<std::mutex> lock(mu);
            results[b] = {spark_us, stock_us, split_us};
          }
        }
        for (auto& f : forced) f.second->barrier();
        pooler.barrier();
        if (comm) NCCL_CHECK(ncclCommDestroy(comm));
        CUDA_CHECK(cudaStreamDestroy(stream));
  });
  const double floor = floor_us(size_t{2} * shard * H, report.hbm_read_TBps);
  for (const auto& [b, t] : results) {
    const auto [run_us, stock_us, split_us] = t;
    report.records.push_back({"pooler", "spark", "run (PDL; publish route of the table)", "graph", tp, b, P, H, run_us, floor});
    report.records.push_back({"pooler", "spark", "project+publish+gather (PDL)", "graph", tp, b, P, H, split_us, floor});
    report.records.push_back({"pooler", "stock", "cublas+ncclAllGather+norm+quantize", "graph", tp, b, P, H, stock_us, floor});
    std::printf("pooler tp %d b=%2d: Pooler.run %6.2f us (project+publish+gather %6.2f), stock %6.2f us -> %.2fx "
                "(floor %.2f us)\n",
                tp, b, run_us, split_us, stock_us, stock_us / run_us, floor);
  }
  for (const auto& [key, us] : forced_results) {
    const auto& [b, name] = key;
    report.records.push_back({"pooler", "spark", "run (PDL; " + name + ")", "graph", tp, b, P, H, us, floor});
    std::printf("pooler tp %d b=%2d: Pooler.run, %-47s %6.2f us\n", tp, b, name.c_str(), us);
  }
}

}  // namespace

std::string bench_pooler(const PoolerBenchOptions& o) {
  Report report = new_report();
  report.hbm_read_TBps = measure_hbm_read_TBps();
  std::printf("HBM read: %.2f TB/s\n", report.hbm_read_TBps);
  CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  gemm_sweep(o, report, stream);
  CUDA_CHECK(cudaStreamDestroy(stream));
  if (!o.gemm_only) {
    int devices = 0;
    CUDA_CHECK(cudaGetDeviceCount(&devices));
    for (int tp : o.tps) {
      if (tp > devices) {
        // Say so, in the log and in the record, instead of failing the whole
        // run (the GEMM sweep above is still worth keeping).
        char note[128];
        std::snprintf(note, sizeof note, "pooler at tp %d not measured: it needs %d GPUs, this machine has %d", tp,
                      tp, devices);
        std::printf("%s\n", note);
        report.notes.push_back(note);
        continue;
      }
      pooler_vs_stock(o, tp, report);
    }
  }
  report.notes.push_back(
      "pooler_gemm: one call per cold weight copy in a CUDA graph; variant names the engine (table= the tactic "
      "table's choice); graph = PDL off, pdl_chain = PDL on; cublas = the fastest cuBLASLt candidate; "
      "after_stream = each call (PDL) after a stand-in for the routed experts (PDL; impl standin, m 0: alone), "
      "us = the time per pair less the stand-in's alone.");
  report.notes.push_back(
      "pooler: one graph of the 60 NVFP4 layers in order (distinct weights), per-call time; spark run = Pooler.run "
      "(the GEMM publishing from its epilogue or followed by the publish kernel, as the plan table "
      "says, then the fused gather/norm/NVFP4; PDL on); spark "
      "project+publish+gather = the same work as three kernels; stock = cuBLAS + ncclAllGather + [tp][b][P/tp] -> "
      "[b][P] copies + ExpertNorm + nvfp4_quantize (PDL off; no NCCL at tp 1). n = P, k = H; floor = this rank's "
      "weight bytes over the measured HBM read bandwidth.");
  report.notes.push_back(format_plan_table());
  return report.write(o.out_dir, o.gemm_only ? "pooler_tune" : "pooler");
}

}  // namespace spark_decode::bench
