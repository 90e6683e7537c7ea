#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include "benches.h"
#include "cublas_gemm.h"
#include "harness.h"
#include "spark_decode/bf16.h"
#include "spark_decode/error.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/pooler_gemm.h"
#include "spark_decode/unpooler.h"

namespace spark_decode::bench {
namespace {

// `copies` distinct [n, k] weights in one allocation, and an Unpooler per
// copy (they share the kernel; construction allocates nothing).
struct ColdWeights {
  int n, k, copies;
  DeviceMemory memory;
  ColdWeights(int n_, int k_)
      : n(n_), k(k_), copies(cold_copies(size_t{2} * n_ * k_)), memory(size_t{2} * n_ * k_ * copies) {
    fill_random_bf16(memory.get(), static_cast<size_t>(n) * k * copies, 0x5eed0000ull + n);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  const void* copy(int i) const { return memory.as<char>() + size_t{2} * n * k * i; }
  TensorRef ref(int i) const {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    return TensorRef::contiguous(copy(i), DType::bf16, {n, k}, dev);
  }
  std::vector<Unpooler> unpoolers(Unpooler::Options options) const {
    std::vector<Unpooler> u;
    u.reserve(copies);
    for (int i = 0; i < copies; ++i) u.emplace_back(ref(i), options);
    return u;
  }
};

// x [16, K] random and out [16, N]: every call's activations, sized for
// both the unpooler's shapes and the pooler's (tune --pooler-shapes).
struct Activations {
  static constexpr int kWidth = std::max(kMuseSpark.hidden, kMuseSpark.pooled);
  DeviceMemory x{size_t{2} * kMaxBatch * kWidth};
  DeviceMemory out{size_t{2} * kMaxBatch * kWidth};
  Activations() { fill_random_bf16(x.get(), size_t{kMaxBatch} * kWidth, 7); }
};
// The GEMM shape [n, k] at tp: the unpooler's (N = H / tp, K = P), or the
// pooler GEMM's (N = P / tp, K = H) that the Pooler's MMA engine serves.
struct GemmShape {
  int n, k;
};
GemmShape gemm_shape(int tp, bool pooler_shapes = false) {
  if (pooler_shapes) return {kMuseSpark.pooled / tp, kMuseSpark.hidden};
  return {kMuseSpark.hidden / tp, kMuseSpark.pooled};
}

bool wanted(const std::vector<int>& filter, int v) {
  return filter.empty() || std::find(filter.begin(), filter.end(), v) != filter.end();
}

}  // namespace

std::string bench_unpooler(const UnpoolerBenchOptions& o) {
  Report report = new_report();
  report.hbm_read_TBps = measure_hbm_read_TBps();
  std::printf("HBM read: %.2f TB/s\n", report.hbm_read_TBps);
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Activations io;
  DeviceMemory &x = io.x, &out = io.out;
  prepare_onchip_stream();
  // The routed experts' stand-in (mode after_stream), shared by every tp.
  std::unique_ptr<StandIn> standin;
  if (o.standin_mib > 0) standin = std::make_unique<StandIn>(size_t(o.standin_mib) << 20, o.standin_smem_kib * 1024);
  for (int tp : o.tps) {
    const GemmShape shape = gemm_shape(tp);
    const int n = shape.n, k = shape.k;
    ColdWeights weights(n, k);
    const double floor = floor_us(size_t{2} * n * k, report.hbm_read_TBps);
    std::vector<const void*> copies;
    for (int i = 0; i < weights.copies; ++i) copies.push_back(weights.copy(i));
    Unpooler::Options plain, pdl;
    plain.enable_pdl = false;
    pdl.enable_pdl = true;
    auto ours = weights.unpoolers(plain);
    auto ours_pdl = weights.unpoolers(pdl);
    std::printf("tp %d: N=%d K=%d, %d cold copies, tactic %s, floor %.2f us\n", tp, n, k, weights.copies,
                ours[0].tactic().to_string().c_str(), floor);
    const double empty_us =
        time_graph([&](cudaStream_t s, int) { enqueue_empty(s); }, weights.copies, o.repeats, stream);
    const double read_us = time_graph(
        [&](cudaStream_t s, int c) { enqueue_read(weights.copy(c), size_t{2} * n * k, s); }, weights.copies,
        o.repeats, stream);
    std::printf("  diagnostics: empty kernel %.2f us/call, streaming read of the same bytes %.2f us/call\n",
                empty_us, read_us);
    char diag[160];
    std::snprintf(diag, sizeof diag,
                  "tp %d diagnostics (same graph method): empty kernel %.2f us, plain streaming read of the "
                  "%.0f MB shard %.2f us",
                  tp, empty_us, 2.0 * n * k / 1e6, read_us);
    report.notes.push_back(diag);
    if (tp <= 2) {
      // What the copy engine streams into shared memory: the bound of an
      // engine that stages a shard through shared memory.
      prepare_bulk_read();
      std::string line = "tp " + std::to_string(tp) + " diagnostics: cp.async.bulk read (copy bytes x CTAs/SM):";
      for (int copy : {4096, 16384, 32768})
        for (int per_sm : {1, 2}) {
          const double us = time_graph(
              [&](cudaStream_t s, int c) { enqueue_bulk_read(weights.copy(c), size_t{2} * n * k, copy, per_sm, s); },
              weights.copies, o.repeats, stream);
          char buf[48];
          std::snprintf(buf, sizeof buf, " %dK x %d %.2f us", copy / 1024, per_sm, us);
          line += buf;
        }
      // A GEMM stage's pattern: 8 rows x 4 KiB pieces (the same columns of 8
      // consecutive rows), a group's parts one after another.
      const double strided = time_graph(
          [&](cudaStream_t s, int c) { enqueue_bulk_read(weights.copy(c), size_t{2} * n * k, 4096, 1, s, 8, 2 * k); },
          weights.copies, o.repeats, stream);
      char buf[64];
      std::snprintf(buf, sizeof buf, "; 8 rows x 4K pieces x 1 %.2f us", strided);
      line += buf;
      std::printf("  %s\n", line.c_str());
      report.notes.push_back(line);
    }
    // Each engine forced at every m beside the table's (which may mix them
    // by m): the split-K engine at the table's split-K tactic, the on-chip
    // engine at onchip_tactic; and the on-chip copies with nothing computed
    // (the bare stream it can at best reach), PDL off and in a PDL chain.
    const OnchipTactic onchip = onchip_tactic(PlanOp::unpooler, n, k);
    const bool onchip_runs = !onchip_unsupported(n, k, onchip);
    std::vector<Unpooler> on, on_pdl, sk, sk_pdl;
    const std::string onchip_name = "onchip_mma " + onchip.to_string();
    const std::string splitk_name = "splitk_mma " + ours[0].tactic().to_string();
    {
      Unpooler::Options a = plain, b = pdl;
      a.engine = b.engine = GemmEngine::splitk_mma;
      sk = weights.unpoolers(a);
      sk_pdl = weights.unpoolers(b);
    }
    if (onchip_runs) {
      Unpooler::Options a = plain, b = pdl;
      a.engine = b.engine = GemmEngine::onchip_mma;
      on = weights.unpoolers(a);
      on_pdl = weights.unpoolers(b);
      double stream_us[2];
      for (bool chain : {false, true})
        stream_us[chain] = time_graph(
            [&](cudaStream_t s, int c) {
              enqueue_onchip_stream(weights.copy(c), n, k, onchip.splits, onchip.kw, onchip.stage_warps_for(k), chain, s);
            },
            weights.copies, o.repeats, stream);
      char line[256];
      std::snprintf(line, sizeof line,
                    "tp %d diagnostics: %s, %d CTAs; its bulk copies with nothing computed %.2f us (PDL off), "
                    "%.2f us (PDL chain)",
                    tp, onchip_name.c_str(), n / kSplitKTileN * onchip.splits, stream_us[0], stream_us[1]);
      std::printf("  %s\n", line);
      report.notes.push_back(line);
    }
    // What a shared-memory-staged engine can at best reach at this shard.
    record_stream_bound(report, "unpooler", tp, n, k, [&](int c) { return weights.copy(c); }, weights.copies,
                        o.repeats, stream);
    // The stand-in alone, chained as in mode after_stream: what each pair's
    // time is over.
    double standin_us = 0;
    if (standin) {
      standin_us = standin->time_alone(weights.copies, o.repeats, stream);
      report.records.push_back({"unpooler", "standin", standin->describe(), "after_stream", tp, 0, n, k, standin_us, 0});
      std::printf("  stand-in: %s alone %.2f us/call (PDL chain)\n", standin->describe().c_str(), standin_us);
    }
    for (int m : o.ms) {
      CublasGemm blas(m, n, k);
      const double blas_us = blas.pick_fastest(copies, x.get(), out.get(), o.repeats, stream);
      auto time_ours = [&](std::vector<Unpooler>& u) {
        return time_graph([&](cudaStream_t s, int c) { u[c].run(x.get(), out.get(), m, s); }, weights.copies,
                          o.repeats, stream);
      };
      // Each call after the stand-in (both PDL): the time per pair less the
      // stand-in's own, i.e. what the call adds behind a realistic predecessor.
      auto after_standin = [&](std::vector<Unpooler>& u) {
        return standin->time_behind([&](cudaStream_t s, int c) { u[c].run(x.get(), out.get(), m, s); }, standin_us,
                                    weights.copies, o.repeats, stream);
      };
      const double g = time_ours(ours), c = time_ours(ours_pdl);
      // One replay of each mode's graph traced: the PDL chain, PDL off (no
      // next grid shares the SMs during a call's tail) and behind the
      // stand-in (where the weights still stream when the wait returns).
      if (!o.trace.empty()) {
        const auto trace_graph = [&](const char* mode, const std::function<void(int)>& call) {
          int i = 0;
          cudaGraphExec_t exec = capture_graph(stream, weights.copies, [&] { call(i++); });
          trace_replay(exec, stream,
                       o.trace + "_unpooler" + mode + "_tp" + std::to_string(tp) + "_m" + std::to_string(m) + ".csv");
          CUDA_CHECK(cudaGraphExecDestroy(exec));
        };
        trace_graph("", [&](int i) { ours_pdl[i].run(x.get(), out.get(), m, stream); });
        trace_graph("_graph", [&](int i) { ours[i].run(x.get(), out.get(), m, stream); });
        if (standin)
          trace_graph("_after", [&](int i) {
            standin->enqueue(stream, i);
            ours_pdl[i].run(x.get(), out.get(), m, stream);
          });
      }
      report.records.push_back({"unpooler", "spark", "", "graph", tp, m, n, k, g, floor});
      report.records.push_back({"unpooler", "spark", "", "pdl_chain", tp, m, n, k, c, floor});
      report.records.push_back({"unpooler", "cublas", "", "graph", tp, m, n, k, blas_us, floor});
      std::printf("  m=%2d  spark graph %6.2f us  pdl_chain %6.2f us  cublas %6.2f us (%s)  -> %.2fx, %.0f%% of floor\n",
                  m, g, c, blas_us, blas.algo_description().c_str(), blas_us / g, 100 * floor / g);
      // A forced engine, PDL off and in a chain.
      auto forced = [&](const char* label, const std::string& name, std::vector<Unpooler>& off,
                        std::vector<Unpooler>& chained) {
        const double fg = time_ours(off), fc = time_ours(chained);
        report.records.push_back({"unpooler", "spark", name, "graph", tp, m, n, k, fg, floor});
        report.records.push_back({"unpooler", "spark", name, "pdl_chain", tp, m, n, k, fc, floor});
        std::printf("        %s graph %6.2f us  pdl_chain %6.2f us  -> %.2fx cublas, %.0f%% of floor in the chain\n",
                    label, fg, fc, blas_us / fg, 100 * floor / fc);
      };
      forced("splitk", splitk_name, sk, sk_pdl);
      if (onchip_runs) forced("onchip", onchip_name, on, on_pdl);
      if (standin) {
        const double ta = after_standin(ours_pdl), sa = after_standin(sk_pdl);
        report.records.push_back({"unpooler", "spark", "", "after_stream", tp, m, n, k, ta, floor});
        report.records.push_back({"unpooler", "spark", splitk_name, "after_stream", tp, m, n, k, sa, floor});
        std::printf("        after the stand-in: table %6.2f us  splitk %6.2f us", ta, sa);
        if (onchip_runs) {
          const double oa = after_standin(on_pdl);
          report.records.push_back({"unpooler", "spark", onchip_name, "after_stream", tp, m, n, k, oa, floor});
          std::printf("  onchip %6.2f us", oa);
        }
        std::printf(" (per pair less the stand-in's %.2f)\n", standin_us);
      }
    }
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  report.notes.push_back("graph: CUDA graph of one call per cold weight copy, PDL off; pdl_chain: the same with "
                         "programmatic dependent launch on; cublas: the fastest cuBLASLt heuristic candidate, "
                         "timed the same way. variant empty: the plan table's engines (by m: "
                         "Unpooler::describe in the log); splitk_mma / onchip_mma: that engine forced at every m, "
                         "at its tactic for the shape (the same bits).");
  if (standin)
    report.notes.push_back("after_stream: each call preceded by " + standin->describe() +
                           ", both with PDL; us = the time per pair less the stand-in's alone (impl standin, m 0): "
                           "what the call adds behind a bandwidth-heavy predecessor.");
  report.notes.push_back(format_plan_table());
  return report.write(o.out_dir, "unpooler");
}

namespace {

// `tune unpooler --onchip`: every on-chip tactic of every tp's shape at the
// given m, one mode (o.pdl); records op unpooler, variant "onchip_mma " + the
// tactic (tools/rank_tune.py ranks two such files).
std::string tune_onchip(const UnpoolerBenchOptions& o) {
  Report report = new_report();
  report.hbm_read_TBps = measure_hbm_read_TBps();
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Activations io;
  DeviceMemory &x = io.x, &out = io.out;
  // Mode after_stream: each call behind the routed experts' stand-in (PDL
  // on), the pair's time less the stand-in's alone.
  std::unique_ptr<StandIn> standin;
  if (o.after_stream) standin = std::make_unique<StandIn>(size_t(o.standin_mib) << 20, o.standin_smem_kib * 1024);
  const char* mode = o.after_stream ? "after_stream" : o.pdl ? "pdl_chain" : "graph";
  for (int tp : o.tps) {
    const GemmShape shape = gemm_shape(tp, o.pooler_shapes);
    const int n = shape.n, k = shape.k;
    ColdWeights weights(n, k);
    const double floor = floor_us(size_t{2} * n * k, report.hbm_read_TBps);
    double standin_us = 0;
    if (standin) {
      standin_us = standin->time_alone(weights.copies, o.repeats, stream);
      report.records.push_back({"unpooler", "standin", standin->describe(), mode, tp, 0, n, k, standin_us, 0});
    }
    // The split-K engine at the table's tactic, timed the same way: what the
    // on-chip tactics are ranked against.
    std::vector<Unpooler> splitk;
    {
      Unpooler::Options opt;
      opt.enable_pdl = o.pdl || o.after_stream;
      opt.engine = GemmEngine::splitk_mma;
      opt.tactic = splitk_tactic(o.pooler_shapes ? PlanOp::pooler : PlanOp::unpooler, n, k);
      splitk = weights.unpoolers(opt);
    }
    auto time_calls = [&](std::vector<Unpooler>& u, int m) {
      const auto call = [&](cudaStream_t st, int c) { u[c].run(x.get(), out.get(), m, st); };
      return standin ? standin->time_behind(call, standin_us, weights.copies, o.repeats, stream)
                     : time_graph(call, weights.copies, o.repeats, stream);
    };
    {
      const std::string name = "splitk_mma " + splitk[0].tactic().to_string();
      std::string line;
      for (int m : o.ms) {
        const double us = time_calls(splitk, m);
        report.records.push_back({"unpooler", "spark", name, mode, tp, m, n, k, us, floor});
        char buf[32];
        std::snprintf(buf, sizeof buf, " m%d=%.2f", m, us);
        line += buf;
      }
      std::printf("  tp %d: %s%s (the split-K engine, for reference)\n", tp, name.c_str(), line.c_str());
    }
    std::multimap<double, std::string> ranking;
    for (int s : {1, 2, 4, 8})
      for (int kw : kOnchipKws)
        for (int accs = 1; accs <= kOnchipMaxAccs; ++accs)
          for (int g : {1, 2, 4, 8, 16})
            for (bool balance : {false, true})
              for (int rows : {1, 2}) {
                OnchipTactic t = onchip_tactic(o.pooler_shapes ? PlanOp::pooler : PlanOp::unpooler, n, k);
                t.splits = s;
                t.kw = kw;
                t.accs = accs;
                t.stage_warps = g;
                t.cluster_balance = balance;
                // Two row tiles where the token tile is 16 (the only m they serve).
                for (int m = 1; m <= kMaxBatch; ++m) t.row_tiles[m - 1] = t.token_tile[m - 1] == 16 ? rows : 1;
                if ((balance && s == 1) || onchip_unsupported(n, k, t) || !wanted(o.splits, s) ||
                    !wanted(o.kws, kw) || !wanted(o.accs, accs) || !wanted(o.stage_warps, g) ||
                    !wanted(o.onchip_rows, rows))
                  continue;
                Unpooler::Options opt;
                opt.enable_pdl = o.pdl || o.after_stream;
                opt.engine = GemmEngine::onchip_mma;
                opt.onchip = t;
                std::vector<Unpooler> u;
                try {
                  u = weights.unpoolers(opt);
                } catch (const RuntimeError& e) {  // the device cannot hold it (clusters, shared memory)
                  std::printf("  tp %d: %s cannot run: %s\n", tp, t.to_string().c_str(), e.what());
                  continue;
                }
                const std::string name = "onchip_mma " + t.to_string();
                std::string line;
                double sum = 0;
                for (int m : o.ms) {
                  const double us = time_calls(u, m);
                  report.records.push_back({"unpooler", "spark", name, mode, tp, m, n, k, us, floor});
                  sum += us;
                  char buf[32];
                  std::snprintf(buf, sizeof buf, " m%d=%.2f", m, us);
                  line += buf;
                }
                std::printf("  tp %d: %s%s\n", tp, name.c_str(), line.c_str());
                ranking.emplace(sum / o.ms.size(), name + line);
              }
    std::printf("tp %d (N=%d K=%d, floor %.2f us, %s): on-chip tactics by mean us over m\n", tp, n, k, floor, mode);
    int shown = 0;
    for (const auto& [mean, text] : ranking) {
      std::printf("  %6.2f  %s\n", mean, text.c_str());
      if (++shown == 8) break;
    }
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  if (standin)
    report.notes.push_back("after_stream: each call preceded by " + standin->describe() +
                           ", both with PDL; us = the time per pair less the stand-in's alone (impl standin, m 0).");
  return report.write(o.out_dir, std::string(o.pooler_shapes ? "onchip_tune_pooler_shapes" : "onchip_tune") +
                                     (o.after_stream ? "_after_stream" : o.pdl ? "_pdl" : ""));
}

}  // namespace

std::string tune_unpooler(const UnpoolerBenchOptions& o) {
  if (o.onchip) return tune_onchip(o);
  Report report = new_report();
  report.hbm_read_TBps = measure_hbm_read_TBps();
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Activations io;
  DeviceMemory &x = io.x, &out = io.out;
  for (int tp : o.tps) {
    const GemmShape shape = gemm_shape(tp, o.pooler_shapes);
    const int n = shape.n, k = shape.k;
    ColdWeights weights(n, k);
    const double floor = floor_us(size_t{2} * n * k, report.hbm_read_TBps);
    std::multimap<double, std::string> ranking;
    // Times tactic t with each compiled R > 1 row tiles per CTA at every m,
    // where it compiles: every R gives the same bits, so the table may pick
    // any per m; a tactic ranks by its mean over m of the best R.
    auto time_tactic = [&](const SplitKTactic& t) {
      std::vector<SplitKTactic> variants = {t};
      for (int rows : kSplitKRowTiles) {
        if (rows == 1) continue;
        SplitKTactic tr = t;
        tr.row_tiles.fill(rows);
        if (!launch_unsupported(n, k, tr)) variants.push_back(tr);
      }
      std::printf("  tp %d: %s (%zu row tilings) ...", tp, t.to_string().c_str(), variants.size());
      std::fflush(stdout);
      std::vector<double> best(o.ms.size(), 1e30);
      std::vector<int> best_rows(o.ms.size(), 1);
      for (const SplitKTactic& variant : variants) {
        Unpooler::Options opt;
        opt.enable_pdl = o.pdl;
        opt.tactic = variant;
        auto u = weights.unpoolers(opt);
        for (size_t i = 0; i < o.ms.size(); ++i) {
          const int m = o.ms[i];
          const double us = time_graph([&](cudaStream_t st, int c) { u[c].run(x.get(), out.get(), m, st); },
                                       weights.copies, o.repeats, stream);
          report.records.push_back(
              {"unpooler", "spark", variant.to_string(), o.pdl ? "pdl_chain" : "graph", tp, m, n, k, us, floor});
          if (us < best[i]) {
            best[i] = us;
            best_rows[i] = variant.row_tiles[m - 1];
          }
        }
      }
      double sum = 0;
      std::string line;
      for (size_t i = 0; i < o.ms.size(); ++i) {
        sum += best[i];
        char buf[64];
        std::snprintf(buf, sizeof buf, " m%d=%.2f%s", o.ms[i], best[i],
                      best_rows[i] > 1 ? ("(r" + std::to_string(best_rows[i]) + ")").c_str() : "");
        line += buf;
      }
      std::printf("%s\n", line.c_str());
      ranking.emplace(sum / o.ms.size(), t.to_string() + line);
    };
    for (int s : {1, 2, 4, 8})
      for (int kw : kSplitKKws)
        for (int accs : {1, 2, 4}) {
          if (launch_unsupported(n, k, s, kw, accs) || !wanted(o.splits, s) || !wanted(o.kws, kw) ||
              !wanted(o.accs, accs))
            continue;
          SplitKTactic t;
          t.splits = s;
          t.kw = kw;
          t.accs = accs;
          // Clustered tactics also under the load-balancing scheduling policy,
          // and the one compiled (kw, accs) also with fragment-order weight
          // loads: loads and scheduling only, the same bits, and which is
          // faster depends on the grid (docs/perf/unpooler.md).
          for (bool swizzle : {true, false}) {
            t.row_swizzle = swizzle;
            t.cluster_balance = false;
            if (launch_unsupported(n, k, t)) continue;
            time_tactic(t);
            if (s > 1) {
              t.cluster_balance = true;
              time_tactic(t);
            }
          }
        }
    std::printf("tp %d (N=%d, floor %.2f us, %s): tactics by mean us over m\n", tp, n, floor,
                o.pdl ? "pdl_chain" : "graph");
    int shown = 0;
    for (const auto& [mean, text] : ranking) {
      std::printf("  %6.2f  %s\n", mean, text.c_str());
      if (++shown == 8) break;
    }
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  return report.write(o.out_dir, std::string(o.pooler_shapes ? "unpooler_tune_pooler_shapes" : "unpooler_tune") +
                                     (o.pdl ? "_pdl" : ""));
}

void profile_unpooler(const UnpoolerBenchOptions& o) {
  Activations io;
  DeviceMemory &x = io.x, &out = io.out;
  for (int tp : o.tps) {
    const GemmShape shape = gemm_shape(tp);
    const int n = shape.n, k = shape.k;
    ColdWeights weights(n, k);
    Unpooler::Options opt;
    opt.enable_pdl = false;
    if (!o.splits.empty() && !o.kws.empty()) {
      SplitKTactic t = unpooler_tactic(n, k);
      t.splits = o.splits[0];
      t.kw = o.kws[0];
      if (!o.accs.empty()) t.accs = o.accs[0];
      opt.tactic = t;
    }
    auto u = weights.unpoolers(opt);
    for (int m : o.ms) {
      std::printf("profile tp %d m %d tactic %s\n", tp, m, u[0].tactic().to_string().c_str());
      for (int c = 0; c < 4; ++c) u[c].run(x.get(), out.get(), m, nullptr);
      CUDA_CHECK(cudaDeviceSynchronize());
    }
  }
}

}  // namespace spark_decode::bench
