// spark-decode: device info, verification and benchmarks of the library.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>

#include "bench_pooler.h"
#include "benches.h"
#include "info.h"
#include "spark_decode/error.h"
#include "spark_decode/plan.h"
#include "spark_decode/unpooler.h"

namespace sd = spark_decode;

namespace {

int require_gpu(const char* what) {
  if (sd::tool::gpu_count() == 0) {
    std::fprintf(stderr, "spark-decode %s: no GPU is visible on this machine; nothing was measured.\n", what);
    return 2;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"spark-decode: tensor-parallel decode kernels at the MoE boundaries of Muse Spark"};
  app.require_subcommand(0, 1);

  auto* info = app.add_subcommand("info", "GPUs, compute capability, SMs, L2, clusters, peer access");
  auto* tactics = app.add_subcommand("tactics", "print the plan table (engine and parameters per op, tp and b)");

  sd::bench::UnpoolerBenchOptions opts;
  opts.out_dir = "spark-decode-out";  // under the current directory, not the source tree
  auto* bench = app.add_subcommand("bench", "benchmarks against the stock path (docs/design.md, \"Benchmark records\")");
  bench->require_subcommand(1);
  auto* bench_unpooler = bench->add_subcommand("unpooler", "the unpooler GEMM against cuBLAS, tp 1, 2, 4, 8");
  bool publish = false;
  int publish_tp = 2;
  bench_unpooler->add_flag("--publish", publish,
                           "zero-copy publish + gather against plain + publish and cuBLAS + NCCL (--publish-tp GPUs)");
  bench_unpooler->add_option("--publish-tp", publish_tp, "GPUs for --publish");
  bench_unpooler->add_option("--trace", opts.trace, "path prefix of per-CTA timelines (a -DSPARK_DECODE_TRACE=ON build)");
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
  bench_gather->add_option("--out", gather_opts.out_dir, "directory of the JSON and markdown");
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
    c->add_option("--out", pooler_opts.out_dir, "directory of the JSON and markdown");
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
  tune_unpooler->add_option("--stage-warps", opts.stage_warps, "--onchip: only these warps per copy stage")
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
    c->add_option("--out", opts.out_dir, "directory of the JSON and markdown");
  }
  CLI11_PARSE(app, argc, argv);

  try {
    if (*info) {
      sd::tool::print_info();
      return 0;
    }
    if (*tactics) {
      std::printf("%s", sd::format_plan_table().c_str());
      // The on-chip engine's tactic at each model shape (not in the table:
      // what Unpooler::Options::engine and PoolerGemm::Options::force run).
      std::printf("on-chip engine (onchip_mma, forced), its tactic per model shape:\n");
      for (sd::PlanOp op : {sd::PlanOp::unpooler, sd::PlanOp::pooler})
        for (int tp : sd::kTensorParallelSizes) {
          const bool un = op == sd::PlanOp::unpooler;
          const int n = (un ? sd::kMuseSpark.hidden : sd::kMuseSpark.pooled) / tp;
          const int k = un ? sd::kMuseSpark.pooled : sd::kMuseSpark.hidden;
          const auto t = sd::onchip_tactic(op, n, k);
          std::printf("  %s tp %d [%d, %d] -> %s stage_warps=%d, %d CTAs\n", sd::op_name(op), tp, n, k,
                      t.to_string().c_str(), t.stage_warps_for(k), n / sd::kSplitKTileN * t.splits);
        }
      return 0;
    }
    if (*bench_unpooler || *tune_unpooler) {
      if (int rc = require_gpu("bench")) return rc;
      std::filesystem::create_directories(opts.out_dir);
      if (*bench_unpooler && publish) {
        if (opts.ms == std::vector<int>{1, 2, 4, 8, 16}) opts.ms = {1, 4, 8, 16};
        std::printf("wrote %s (and .md)\n", sd::bench::bench_unpooler_publish(opts, publish_tp).c_str());
        return 0;
      }
      const std::string path = *bench_unpooler ? sd::bench::bench_unpooler(opts) : sd::bench::tune_unpooler(opts);
      std::printf("wrote %s (and .md)\n", path.c_str());
      return 0;
    }
    if (*bench_pooler || *tune_pooler) {
      if (int rc = require_gpu("bench")) return rc;
      pooler_opts.gemm_only = static_cast<bool>(*tune_pooler);
      std::filesystem::create_directories(pooler_opts.out_dir);
      std::printf("wrote %s (and .md)\n", sd::bench::bench_pooler(pooler_opts).c_str());
      return 0;
    }
    if (*bench_gather) {
      if (int rc = require_gpu("bench")) return rc;
      std::filesystem::create_directories(gather_opts.out_dir);
      std::printf("wrote %s (and .md)\n", sd::bench::bench_gather(gather_opts).c_str());
      return 0;
    }
    if (*profile_unpooler) {
      if (int rc = require_gpu("profile")) return rc;
      sd::bench::profile_unpooler(opts);
      return 0;
    }
    // The main job: what is here, and does it compute the right thing.
    sd::tool::print_info();
    std::printf("%s", sd::format_plan_table().c_str());
    if (sd::tool::gpu_count() == 0) {
      std::printf("No GPU on this machine: the kernels cannot run here. Running the CPU reference instead.\n");
      sd::tool::run_cpu_reference_demo();
      return 0;
    }
    return sd::tool::verify_unpooler_gpu() ? 0 : 1;
  } catch (const sd::Error& e) {
    std::fprintf(stderr, "spark-decode: %s\n", e.what());
    return 1;
  }
}
