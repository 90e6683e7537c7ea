// spark-decode: device info, verification, the decode step and benchmarks
// of the library. Plain `spark-decode` is the main job: info, the plan table,
// verify, then the step, at the GPU count.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "bench_pooler.h"
#include "benches.h"
#include "git_commit.h"  // SPARK_DECODE_GIT_COMMIT
#include "info.h"
#include "spark_decode/error.h"
#include "spark_decode/plan.h"
#include "step.h"
#include "plot.h"
#include "stock_exchange.h"
#include "verify.h"

namespace sd = spark_decode;

namespace {

std::string version() {
  const char* commit = std::getenv("SPARK_DECODE_COMMIT");
  return std::string("spark-decode ") + SPARK_DECODE_VERSION + " (commit " +
         (commit && *commit ? commit : SPARK_DECODE_GIT_COMMIT) + ")";
}

// Progress of long work on stderr (stdout stays the result: a table, or
// JSON with --json), each line stamped with the seconds since the start.
struct Progress {
  std::string who;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  void operator()(const std::string& what) const {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "%s: [%6.1f s] %s\n", who.c_str(), s, what.c_str());
  }
};

// The largest of the model's tp (1, 2, 4, 8) that the visible GPUs hold.
int tp_of_gpus(int gpus) {
  int tp = 1;
  for (int t : sd::kTensorParallelSizes)
    if (t <= gpus) tp = t;
  return tp;
}

std::string tactics_json() {
  const sd::PlanTable& t = sd::plan_table();
  nlohmann::ordered_json j;
  j["machine"] = t.machine;
  j["rows"] = nlohmann::json::array();
  for (int i = 0; i < t.size; ++i) {
    const sd::PlanRow& r = t.rows[i];
    nlohmann::ordered_json o{{"op", sd::op_name(r.op)}, {"tp", r.tp}, {"b_first", r.b_first}, {"b_last", r.b_last},
                             {"engine", sd::engine_name(r.engine)}};
    if (r.engine == sd::GemmEngine::splitk_mma)
      o["splitk"] = {{"S", r.splits},         {"kw", r.kw},
                     {"accs", r.accs},         {"token_tile", r.token_tile},
                     {"row_tiles", r.row_tiles}, {"cluster_balance", r.cluster_balance},
                     {"row_swizzle", r.row_swizzle}};
    if (r.op == sd::PlanOp::pooler) {
      o["publish"] = r.publish == sd::PublishRoute::epilogue ? "epilogue" : "kernel";
      o["consumer_launch"] = r.consumer == sd::ConsumerLaunch::early ? "early" : "late";
    }
    o["measured"] = r.measured;
    j["rows"].push_back(o);
  }
  return j.dump(1);
}

// verify: the report (table or JSON) on stdout; 0 when every check passed.
int run_verify(sd::tool::VerifyOptions o, bool json, nlohmann::ordered_json* into = nullptr) {
  if (o.seed == 0) o.seed = (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  const sd::tool::VerifyReport report = sd::tool::verify(o);
  if (into)
    (*into)["verify"] = nlohmann::json::parse(sd::tool::verify_json(report));
  else if (json)
    std::printf("%s\n", sd::tool::verify_json(report).c_str());
  if (!json) std::printf("%s", sd::tool::format_verify(report).c_str());
  return report.ok() ? 0 : 1;
}

// step: the summary (or JSON), the record and its plot under out_dir; 0
// when every check passed.
int run_step(sd::bench::StepOptions o, const std::string& out_dir, bool json, const Progress& progress,
             nlohmann::ordered_json* into = nullptr) {
  o.progress = progress;
  const sd::bench::StepResult r = sd::bench::run_step(o);
  std::filesystem::create_directories(out_dir);
  const std::string path = sd::bench::write_step(r, out_dir);
  const std::string plot = r.timed ? sd::tool::plot_step(path, progress) : "; no plot: nothing was timed";
  if (into) {
    (*into)["step"] = nlohmann::json::parse(sd::bench::step_json(r));
  } else if (json) {
    std::printf("%s\n", sd::bench::step_json(r).c_str());
  }
  if (!json) {
    std::printf("%s", sd::bench::step_summary(r).c_str());
    std::printf("  wrote %s (and .md)%s\n", path.c_str(), plot.c_str());
  }
  return r.ok() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  sd::bench::disable_nvlink_multicast();  // before anything could start NCCL
  // Before the first CUDA call: `verify --tp N` and `step --tp N` on fewer
  // GPUs run ranks sharing one, whose replayed graphs the host cannot order
  // in the GPU's hardware queues; the most queues makes two ranks' streams
  // least likely to share one (docs/design.md, "Ranks sharing a GPU").
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  CLI::App app{"spark-decode: tensor-parallel decode kernels at the MoE boundaries of Muse Spark.\n"
               "Without a subcommand: the main job (info, the plan table, verify, then step at the GPU count)."};
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", version());
  app.require_subcommand(0, 1);
  bool json = false;
  const std::string json_help = "machine-readable output: JSON on stdout (progress on stderr)";
  std::string out_dir = "spark-decode-out";  // under the current directory, not the source tree
  const std::string out_help = "directory of the JSON, markdown and plot";

  // ---- the main job's own options ----
  sd::bench::StepOptions main_step;
  app.add_flag("--json", json, json_help);
  app.add_option("--b", main_step.bs, "the step's batch sizes")->delimiter(',');
  app.add_option("--out", out_dir, out_help);

  auto* info = app.add_subcommand("info", "GPUs, compute capability, SMs, L2, clusters, peer access");
  info->add_flag("--json", json, json_help);
  auto* tactics = app.add_subcommand("tactics", "print the plan table (engine and parameters per op, tp and b)");
  tactics->add_flag("--json", json, json_help);

  // ---- verify ----
  sd::tool::VerifyOptions vo;
  auto* verify = app.add_subcommand("verify", "every operation against the stock path on this machine (exit 1 on a mismatch)");
  verify->footer(
      "On the GPUs, at the model's shapes: the unpooler and pooler GEMMs against the FP64 CPU reference (the GEMM "
      "bound); the mailbox's publish + gather and the zero-copy unpooler publish against an all-gather (bit for "
      "bit); the Pooler in each output format (bf16, nvfp4, nvfp4_swizzled), through Pooler.run and project + "
      "publish + gather, against all-gather + ExpertNorm + nvfp4_quantize (bit for bit; the BF16 rows but for the "
      "sign of zero); ExpertNorm (one BF16 ulp) and nvfp4_quantize (equal but at rounding boundaries) against the "
      "CPU reference. --tp above the GPU count runs the ranks as threads sharing the GPUs: correctness only. "
      "Without a GPU: the CPU reference and the CPU model of the mailbox protocol on a small shape, and it says "
      "that no GPU ran.");
  verify->add_option("--tp", vo.tp, "tensor-parallel ranks (0: the GPU count; without a GPU: 2)");
  verify->add_option("--gpus", vo.gpus,
                     "GPUs the ranks are spread over (0: one per rank, up to the GPU count); fewer GPUs than ranks "
                     "share them: correctness only");
  verify->add_option("--seed", vo.seed, "random seed (0: fresh, printed)");
  verify->add_flag("--cpu", vo.cpu, "the CPU model even where a GPU is");
  verify->add_flag("--json", json, json_help);
  // The test hook (tests/CMakeLists.txt): a verify that cannot fail proves nothing.
  verify->add_flag("--corrupt-reference", vo.corrupt_reference, "change one stock value before comparing")->group("");

  // ---- step ----
  sd::bench::StepOptions so;
  so.tp = 0;
  std::string format = "nvfp4", standins = "late";
  auto* step = app.add_subcommand("step", "the MoE boundaries of a whole decode step (62 layers): ours vs the stock "
                                          "path, timed and checked");
  step->footer(
      "Per layer, as a server runs them: ours = Pooler.run (BF16 edge layers 0 and 61, --format in between), the "
      "experts' stand-in, the Unpooler publishing from its epilogue into the next boundary's mailbox, the gather of "
      "the hidden rows, the residual stand-in; one CUDA graph of the whole step with PDL, replayed. Stock = cuBLAS, "
      "ncclAllGather, ExpertNorm, nvfp4_quantize, the same stand-ins; one CUDA graph, in the same run. Checks: our "
      "final hidden rows equal, bit for bit, a reference pass of the stock structure on our GEMM engines "
      "(Pooler.project and the plain Unpooler, an all-gather, ExpertNorm, nvfp4_quantize, the same stand-ins: only "
      "the publish route, the mailbox and the fused consumer differ, which the semantics make exact but for the "
      "sign of zero, which the stand-ins drop), on the first replay and on every checked replay; the cuBLAS path, "
      "whose GEMMs sum in another order, agrees within a stated bound (per row, |stock - ours|_2 <= 0.25 |ours - "
      "x_0|_2: NVFP4 code flips compound over the layers). Prints the step time of both, the boundary time per "
      "layer ((step - stand-ins alone) / 62), the saving per token and per million tokens; writes step_tp<tp>.json "
      "and .md, and .png where Python has matplotlib, under --out. --gpus below --tp: ranks share GPUs, "
      "correctness only.");
  step->add_option("--tp", so.tp, "tensor-parallel ranks (0: the GPU count)");
  step->add_option("--gpus", so.gpus, "GPUs the ranks are spread over (0: one per rank); fewer GPUs than ranks: "
                                      "correctness only, nothing timed");
  step->add_option("--b", so.bs, "batch sizes (decode tokens per step)")->delimiter(',');
  step->add_option("--format", format, "the expert input of layers 1..60 (0 and 61 are bf16)")
      ->check(CLI::IsMember({"nvfp4", "nvfp4_swizzled", "bf16"}));
  step->add_option("--repeats", so.repeats, "timed replays of each graph (median)");
  step->add_option("--replays", so.checked_replays, "replays of our graph compared with its first, bit for bit");
  step->add_option("--standins-launch", standins,
                   "where the stand-ins let the next kernel launch: late (at their exit, as a model's own kernels "
                   "do) or early (at their start)")
      ->check(CLI::IsMember({"late", "early"}));
  step->add_option("--seed", so.seed, "random seed of the weights and input");
  step->add_option("--out", out_dir, out_help);
  step->add_flag("--json", json, json_help);

  // ---- bench, tune, profile ----
  sd::bench::UnpoolerBenchOptions opts;
  opts.out_dir = out_dir;
  auto* bench = app.add_subcommand("bench", "benchmarks against the stock path (docs/design.md, \"Benchmark records\")");
  bench->require_subcommand(1);
  auto* bench_unpooler = bench->add_subcommand("unpooler", "the unpooler GEMM against cuBLAS, tp 1, 2, 4, 8");
  bool publish = false;
  int publish_tp = 2;
  bench_unpooler->add_flag("--publish", publish,
                           "zero-copy publish + gather against plain + publish and cuBLAS + NCCL (--publish-tp GPUs)");
  bench_unpooler->add_option("--publish-tp", publish_tp, "GPUs for --publish");
  bench_unpooler->add_option("--trace", opts.trace,
                             "path prefix of per-CTA timelines, PDL chain, PDL off and behind the stand-in, at every m (a -DSPARK_DECODE_TRACE=ON build)");
  bench_unpooler->add_option("--standin-mib", opts.standin_mib,
                             "MiB the routed-expert stand-in streams before each call (mode after_stream; 0: off)");
  bench_unpooler->add_option("--standin-smem-kib", opts.standin_smem_kib,
                             "shared memory the stand-in holds per SM (KiB)");
  sd::bench::GatherBenchOptions gather_opts;
  gather_opts.out_dir = opts.out_dir;
  auto* bench_gather = bench->add_subcommand("gather", "mailbox publish + gather against ncclAllGather (tp GPUs)");
  bench_gather->add_option("--tp", gather_opts.tp, "ranks (one GPU each, this process)");
  bench_gather->add_option("--b", gather_opts.bs, "rows per call")->delimiter(',');
  bench_gather->add_option("--width", gather_opts.widths, "per-rank widths (default P/tp, H/tp)")->delimiter(',');
  bench_gather->add_option("--repeats", gather_opts.repeats, "graph replays per figure (median)");
  bench_gather->add_option("--out", gather_opts.out_dir, out_help);
  sd::bench::ConsumerBenchOptions consumer_opts;
  consumer_opts.out_dir = opts.out_dir;
  auto* bench_consumer = bench->add_subcommand(
      "consumer", "the Pooler's fused consumer in each format against the plain gather, tp 1-8 widths (one GPU)");
  bench_consumer->add_option("--tp", consumer_opts.tps, "mailbox layouts: tp ranks sharing the GPU")->delimiter(',');
  bench_consumer->add_option("--b", consumer_opts.bs, "rows per call")->delimiter(',');
  bench_consumer->add_option("--rounds", consumer_opts.rounds, "interleaved rounds of the variants (median)");
  bench_consumer->add_option("--repeats", consumer_opts.repeats, "graph replays per round (median)");
  bench_consumer->add_option("--out", consumer_opts.out_dir, out_help);
  auto* tune = app.add_subcommand("tune", "time every valid tactic (to choose the tactic table)");
  tune->require_subcommand(1);
  auto* tune_unpooler = tune->add_subcommand("unpooler", "every unpooler tactic at the model's shapes");
  sd::bench::PoolerBenchOptions pooler_opts;
  pooler_opts.out_dir = opts.out_dir;
  auto* bench_pooler = bench->add_subcommand("pooler", "Pooler.run vs stock (tp GPUs) and the pooler GEMM vs cuBLAS");
  auto* tune_pooler = tune->add_subcommand("pooler", "the pooler GEMM: every engine and shape vs cuBLAS (one GPU)");
  for (CLI::App* c : {bench_pooler, tune_pooler}) {
    c->add_option("--tp", pooler_opts.tps, "tp of Pooler.run vs stock")->delimiter(',');
    c->add_option("--gemm-tp", pooler_opts.gemm_tps, "tp of the GEMM sweep")->delimiter(',');
    c->add_option("--b", pooler_opts.bs, "batch sizes")->delimiter(',');
    c->add_option("--engines", pooler_opts.engines, "GEMM sweep: engines by name prefix (table, splitk, ring, onchip, skinny)")
        ->delimiter(',');
    c->add_option("--run-engines", pooler_opts.run_engines,
                  "Pooler.run also on each of these engines (name prefix), besides the table's choice")
        ->delimiter(',');
    c->add_option("--repeats", pooler_opts.repeats, "graph replays per figure (median)");
    c->add_option("--out", pooler_opts.out_dir, out_help);
    c->add_option("--trace", pooler_opts.trace, "path prefix of per-CTA timelines (a -DSPARK_DECODE_TRACE=ON build)");
    c->add_option("--standin-mib", pooler_opts.standin_mib,
                  "MiB the routed-expert stand-in streams before each GEMM call (mode after_stream; 0: off)");
    c->add_option("--standin-smem-kib", pooler_opts.standin_smem_kib, "shared memory the stand-in holds per SM (KiB)");
  }
  auto* profile = app.add_subcommand("profile", "a few eager calls of one kernel, to run under ncu");
  profile->require_subcommand(1);
  auto* profile_unpooler = profile->add_subcommand("unpooler", "the unpooler at one tactic");
  tune_unpooler->add_flag("--pooler-shapes", opts.pooler_shapes,
                          "the pooler GEMM's shapes (N = P/tp, K = H) that the MMA engine serves");
  tune_unpooler->add_flag("--pdl", opts.pdl, "time each tactic in a PDL chain (mode pdl_chain), not with PDL off");
  tune_unpooler->add_flag("--onchip", opts.onchip, "the on-chip engine's tactics instead of the split-K engine's");
  tune_unpooler->add_flag("--after-stream", opts.after_stream,
                          "--onchip: time each tactic behind the routed experts' stand-in (mode after_stream)");
  tune_unpooler->add_option("--stage-warps", opts.stage_warps, "--onchip: only these warps per copy stage")
      ->delimiter(',');
  tune_unpooler->add_option("--rows", opts.onchip_rows, "--onchip: only these row tiles (1, 2) at token tile 16")
      ->delimiter(',');
  for (CLI::App* c : {tune_unpooler, profile_unpooler}) {
    c->add_option("--splits", opts.splits, "only these S")->delimiter(',');
    c->add_option("--kw", opts.kws, "only these kw")->delimiter(',');
    c->add_option("--accs", opts.accs, "only these accs")->delimiter(',');
  }
  for (CLI::App* c : {bench_unpooler, tune_unpooler, profile_unpooler}) {
    c->add_option("--tp", opts.tps, "tensor-parallel sizes")->delimiter(',');
    c->add_option("--m", opts.ms, "batch sizes")->delimiter(',');
    c->add_option("--repeats", opts.repeats, "graph replays per figure (median)");
    c->add_option("--out", opts.out_dir, out_help);
  }
  for (CLI::App* c : {bench_unpooler, bench_gather, bench_consumer, bench_pooler, tune_unpooler, tune_pooler})
    c->add_flag("--json", json, "print the paths written as JSON");
  CLI11_PARSE(app, argc, argv);

  // One error prefix per subcommand: "spark-decode step: ...".
  std::string who = "spark-decode";
  for (CLI::App* c = &app; !c->get_subcommands().empty();) {
    c = c->get_subcommands().front();
    who += " " + c->get_name();
  }
  const Progress progress{who};
  // Benchmarks: where they wrote, said plainly or as JSON.
  auto wrote = [&](const std::string& path) {
    const std::string md = path.substr(0, path.size() - 5) + ".md";
    if (json)
      std::printf("%s\n", nlohmann::ordered_json{{"json", path}, {"markdown", md}}.dump().c_str());
    else
      std::printf("wrote %s (and .md)\n", path.c_str());
    return 0;
  };
  auto require_gpu = [&]() {
    if (sd::tool::gpu_count() > 0) return 0;
    std::fprintf(stderr, "%s: no GPU is visible on this machine; nothing was run or measured.\n", who.c_str());
    return 2;
  };

  try {
    if (*info) {
      if (json)
        std::printf("%s\n", sd::tool::info_json().c_str());
      else
        sd::tool::print_info();
      return 0;
    }
    if (*tactics) {
      if (json) {
        std::printf("%s\n", tactics_json().c_str());
        return 0;
      }
      std::printf("%s", sd::format_plan_table().c_str());
      // The on-chip engine's tactic at each model shape and b: the table's
      // where it names the engine, else what Unpooler::Options::engine and
      // PoolerGemm::Options::force run.
      std::printf("on-chip engine (onchip_mma), its tactic per model shape and b:\n");
      for (sd::PlanOp op : {sd::PlanOp::unpooler, sd::PlanOp::pooler})
        for (int tp : sd::kTensorParallelSizes) {
          const bool un = op == sd::PlanOp::unpooler;
          const int n = (un ? sd::kMuseSpark.hidden : sd::kMuseSpark.pooled) / tp;
          const int k = un ? sd::kMuseSpark.pooled : sd::kMuseSpark.hidden;
          for (int b = 1; b <= sd::kMaxBatch;) {
            const auto t = sd::onchip_tactic(op, n, k, b);
            int last = b;
            while (last < sd::kMaxBatch && sd::onchip_tactic(op, n, k, last + 1) == t &&
                   t.row_tiles[last] == t.row_tiles[b - 1])
              ++last;
            auto resolved = t;
            resolved.stage_warps = t.stage_warps_for(k);
            std::printf("  %s tp %d [%d, %d] b %d..%d -> %s, %d CTAs\n", sd::op_name(op), tp, n, k, b, last,
                        resolved.to_string().c_str(), n / sd::kSplitKTileN * t.splits / t.row_tiles[b - 1]);
            b = last + 1;
          }
        }
      return 0;
    }
    if (*verify) {
      vo.progress = progress;
      return run_verify(vo, json);
    }
    if (*step) {
      if (int rc = require_gpu()) return rc;
      so.format = format == "nvfp4" ? sd::OutputFormat::nvfp4
                  : format == "bf16" ? sd::OutputFormat::bf16
                                     : sd::OutputFormat::nvfp4_swizzled;
      so.standins_launch_early = standins == "early";
      if (so.tp <= 0) so.tp = tp_of_gpus(sd::tool::gpu_count());
      return run_step(so, out_dir, json, progress);
    }
    if (*bench_unpooler || *tune_unpooler) {
      if (int rc = require_gpu()) return rc;
      std::filesystem::create_directories(opts.out_dir);
      if (*bench_unpooler && publish) {
        if (opts.ms == std::vector<int>{1, 2, 4, 8, 16}) opts.ms = {1, 4, 8, 16};
        return wrote(sd::bench::bench_unpooler_publish(opts, publish_tp));
      }
      return wrote(*bench_unpooler ? sd::bench::bench_unpooler(opts) : sd::bench::tune_unpooler(opts));
    }
    if (*bench_pooler || *tune_pooler) {
      if (int rc = require_gpu()) return rc;
      pooler_opts.gemm_only = static_cast<bool>(*tune_pooler);
      std::filesystem::create_directories(pooler_opts.out_dir);
      return wrote(sd::bench::bench_pooler(pooler_opts));
    }
    if (*bench_gather) {
      if (int rc = require_gpu()) return rc;
      std::filesystem::create_directories(gather_opts.out_dir);
      return wrote(sd::bench::bench_gather(gather_opts));
    }
    if (*bench_consumer) {
      if (int rc = require_gpu()) return rc;
      std::filesystem::create_directories(consumer_opts.out_dir);
      return wrote(sd::bench::bench_consumer(consumer_opts));
    }
    if (*profile_unpooler) {
      if (int rc = require_gpu()) return rc;
      sd::bench::profile_unpooler(opts);
      return 0;
    }

    // ---- the main job: what is here, does it compute the right thing, and
    // how much faster is the decode step ----
    const int gpus = sd::tool::gpu_count();
    nlohmann::ordered_json all;
    all["tool"] = version();
    if (json) {
      all["info"] = nlohmann::json::parse(sd::tool::info_json());
    } else {
      sd::tool::print_info();
      std::printf("%s\n", sd::format_plan_table().c_str());
    }
    sd::tool::VerifyOptions main_verify;
    main_verify.progress = progress;
    int rc = run_verify(main_verify, json, json ? &all : nullptr);
    if (gpus == 0) {
      const char* why = "no GPU ran: the step's kernels need one; nothing was timed";
      if (json) {
        all["step"] = nullptr;
        all["step_skipped"] = why;
      } else {
        std::printf("step: %s.\n", why);
      }
    } else {
      main_step.tp = tp_of_gpus(gpus);
      std::printf("%s", json ? "" : "\n");
      rc |= run_step(main_step, out_dir, json, progress, json ? &all : nullptr);
    }
    if (json) {
      all["pass"] = rc == 0;
      std::printf("%s\n", all.dump(1).c_str());
    }
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
    return 1;
  }
}
