// `spark-decode bench consumer`: the Pooler's fused consumer (gather +
// pre_expert_norm, in each output format) against the mailbox's plain
// gather, at the widths of tp 1, 2, 4 and 8, on one GPU.
//
// NOTES: with one GPU the ranks of a tp share it, so their calls cannot
// overlap as on tp GPUs; what one GPU can time is the consumer over data
// already present. One thread enqueues every rank's calls on one stream,
// PDL off: per call, each rank's publish, then each rank's consumer. Every
// consumer then starts after every publish of its call has completed, and
// the difference between two consumers is the difference of their kernels
// alone, at that tp's mailbox layout (tp sources of width P / tp). The
// variants are timed in interleaved rounds (the same graphs, one variant
// after the other, round after round) and each figure is the median over
// rounds, so a slow phase of the machine falls on every variant alike.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benches.h"
#include "harness.h"
#include "spark_decode/error.h"
#include "spark_decode/group.h"
#include "spark_decode/mailbox.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/nvfp4.h"
#include "spark_decode/pooler.h"

namespace spark_decode::bench {
namespace {

// The consumers timed: the plain gather (BF16 rows, nothing computed) and
// the fused consumer in each output format.
struct Variant {
  std::string name;
  std::optional<OutputFormat> format;  // nullopt: the plain gather
};
const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {{"plain gather (BF16 rows)", std::nullopt},
                                         {"fused consumer, bf16", OutputFormat::bf16},
                                         {"fused consumer, nvfp4", OutputFormat::nvfp4},
                                         {"fused consumer, nvfp4_swizzled", OutputFormat::nvfp4_swizzled}};
  return v;
}

// One tp's figures on the current GPU: per b and variant, the median over
// rounds of the microseconds per call (every rank's publish and consumer),
// and of the per-round difference to nvfp4 and to the plain gather.
struct TpFigures {
  std::map<std::pair<int, int>, double> per_call, over_gather, over_nvfp4;  // (b, variant)
};

TpFigures time_tp(const ConsumerBenchOptions& o, int tp) {
  const int P = kMuseSpark.pooled, width = P / tp;
  std::vector<LamportMailbox*> mailboxes(tp);
  std::vector<std::unique_ptr<DeviceMemory>> sources(tp);
  TpFigures figures;
  run_ranks(
      tp,
      [&](Group& group, int rank) {
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        LamportMailbox mailbox(group, tp, rank, kMaxBatch, width, dev);
        mailboxes[rank] = &mailbox;
        sources[rank] = std::make_unique<DeviceMemory>(size_t{2} * kMaxBatch * width);
        fill_random_bf16(sources[rank]->get(), size_t{kMaxBatch} * width, 0x7100 + rank);
        CUDA_CHECK(cudaDeviceSynchronize());
        group.barrier();
        if (rank == 0) {
          Stream stream;
          DeviceMemory norm_weight(size_t{2} * P), scale(sizeof(float)), rows(size_t{2} * kMaxBatch * P),
              normed(size_t{2} * kMaxBatch * P), a(size_t{kMaxBatch} * P / 2),
              a_sf(size_t(nvfp4_scale_rows(kMaxBatch, ScaleLayout::swizzled)) * P / 16);
          fill_random_bf16(norm_weight.get(), P, 0x7200);
          const float gs = 2688.0f / 8.0f;
          CUDA_CHECK(cudaMemcpy(scale.get(), &gs, sizeof gs, cudaMemcpyHostToDevice));
          LamportMailbox::PublishOptions publish;
          LamportMailbox::GatherOptions gather;
          publish.enable_pdl = gather.enable_pdl = false;
          for (int b : o.bs) {
            auto one_call = [&](const Variant& v) {
              for (int r = 0; r < tp; ++r) mailboxes[r]->publish(sources[r]->get(), b, stream, publish);
              for (int r = 0; r < tp; ++r) {
                if (!v.format) {
                  mailboxes[r]->gather(rows.get(), b, stream, gather);
                  continue;
                }
                const PoolerOutput out = pooler_output_in(*v.format, b, P, normed.get(), a.get(), a_sf.get(), dev);
                gather_norm(*mailboxes[r], norm_weight.get(), scale.as<float>(), 1e-5f, 1.0f, out, b, stream,
                            /*enable_pdl=*/false, /*launch_next_early=*/false);
              }
            };
            std::vector<cudaGraphExec_t> graphs;
            for (const Variant& v : variants()) {
              one_call(v);  // eager once: every kernel prepared, nothing first under capture
              CUDA_CHECK(cudaStreamSynchronize(stream));
              graphs.push_back(capture_graph(stream, o.calls, [&] { one_call(v); }));
            }
            const int nv = static_cast<int>(graphs.size());
            std::vector<std::vector<double>> us(nv);
            for (int round = 0; round < o.rounds; ++round)
              for (int i = 0; i < nv; ++i) us[i].push_back(replay_us(graphs[i], stream, o.calls, o.repeats));
            for (const auto& m : mailboxes) m->check();
            for (cudaGraphExec_t g : graphs) CUDA_CHECK(cudaGraphExecDestroy(g));
            const int nvfp4 = 2;
            for (int i = 0; i < nv; ++i) {
              std::vector<double> d_gather, d_nvfp4;
              for (int round = 0; round < o.rounds; ++round) {
                d_gather.push_back((us[i][round] - us[0][round]) / tp);
                d_nvfp4.push_back((us[i][round] - us[nvfp4][round]) / tp);
              }
              figures.per_call[{b, i}] = median(us[i]);
              figures.over_gather[{b, i}] = median(d_gather);
              figures.over_nvfp4[{b, i}] = median(d_nvfp4);
            }
          }
        }
        group.barrier();
        mailbox.barrier();
      },
      /*devices=*/1);
  return figures;
}

}  // namespace

std::string bench_consumer(const ConsumerBenchOptions& o) {
  Report report = new_report();
  report.hbm_read_TBps = measure_hbm_read_TBps();
  const int P = kMuseSpark.pooled;
  for (int tp : o.tps) {
    SPARK_CHECK(tp == 1 || tp == 2 || tp == 4 || tp == 8, "tp ", tp, " is not one of 1, 2, 4, 8");
    const TpFigures f = time_tp(o, tp);
    const int width = P / tp;
    for (int b : o.bs)
      for (int i = 0; i < static_cast<int>(variants().size()); ++i) {
        const std::string& name = variants()[i].name;
        report.records.push_back({"consumer", "spark", name, "graph", tp, b, P, width, f.per_call.at({b, i}), 0});
        if (i > 0)
          report.records.push_back(
              {"consumer", "spark", name + ", over the plain gather, per rank", "graph", tp, b, P, width,
               f.over_gather.at({b, i}), 0});
        if (i != 0 && i != 2)
          report.records.push_back(
              {"consumer", "spark", name + ", over nvfp4, per rank", "graph", tp, b, P, width, f.over_nvfp4.at({b, i}), 0});
        std::printf("consumer tp %d b=%2d: %-32s %7.2f us per call (all ranks)", tp, b, name.c_str(),
                    f.per_call.at({b, i}));
        if (i > 0) std::printf(", %+.2f us per rank over the plain gather", f.over_gather.at({b, i}));
        if (i != 0 && i != 2) std::printf(", %+.2f over nvfp4", f.over_nvfp4.at({b, i}));
        std::printf("\n");
      }
  }
  report.notes.push_back(
      "one GPU: the tp ranks' mailboxes (width P / tp each) on it; per call every rank's publish, then every rank's "
      "consumer, on one stream with PDL off, so each consumer runs over data already present. n = P, k = the width "
      "of a rank's block. us: the median over " +
      std::to_string(o.rounds) + " interleaved rounds (each the median of " + std::to_string(o.repeats) +
      " graph replays of " + std::to_string(o.calls) +
      " calls) of the time per call of all ranks' publishes and consumers; 'over the plain gather' and 'over nvfp4': "
      "the median of the per-round differences, divided by tp (one rank's consumer).");
  return report.write(o.out_dir, "consumer");
}

}  // namespace spark_decode::bench
