#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "benches.h"
#include "harness.h"
#include "nccl_check.h"
#include "peer_latency.h"
#include "spark_decode/error.h"
#include "spark_decode/group.h"
#include "spark_decode/mailbox.h"
#include "spark_decode/model_shape.h"


namespace spark_decode::bench {

std::string bench_gather(const GatherBenchOptions& o) {
  int devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  SPARK_CHECK_RUNTIME(devices >= o.tp, "bench gather at tp ", o.tp, " needs ", o.tp, " GPUs, found ", devices);
  std::vector<int> widths = o.widths;
  if (widths.empty()) widths = {kMuseSpark.pooled / o.tp, kMuseSpark.hidden / o.tp};

  Report report = new_report();
  report.hbm_read_TBps = measure_hbm_read_TBps();
  const double peer_us = o.tp >= 2 ? peer_store_latency_us(0, 1) : 0.0;
  std::printf("one-way peer store latency GPU0 -> GPU1: %.2f us\n", peer_us);

  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  std::mutex mutex;
  std::map<std::pair<int, int>, std::pair<double, double>> results;  // (width, b) -> (spark, nccl)
  run_ranks(o.tp, [&](Group& group, int rank) {
        cudaStream_t stream;
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        ncclComm_t comm;
        NCCL_CHECK(ncclCommInitRank(&comm, o.tp, id, rank));
        for (int width : widths) {
          LamportMailbox mailbox(group, o.tp, rank, kMaxBatch, width, rank);
          DeviceMemory src(size_t{2} * kMaxBatch * width);
          DeviceMemory out(size_t{2} * kMaxBatch * width * o.tp);
          fill_random_bf16(src.get(), size_t{kMaxBatch} * width, 11 + rank);
          mailbox.warm_up(stream);
          for (int b : o.bs) {
            cudaGraphExec_t ours = capture_graph(stream, o.calls, [&] {
              mailbox.publish(src.get(), b, stream);
              mailbox.gather(out.get(), b, stream);
            });
            const double spark_us = time_replays(group, ours, stream, o.calls, o.repeats);
            mailbox.synchronize(stream);
            CUDA_CHECK(cudaGraphExecDestroy(ours));
            // NCCL connects lazily on a communicator's first collective, which
            // cannot happen under capture: one eager call first.
            NCCL_CHECK(ncclAllGather(src.get(), out.get(), static_cast<size_t>(b) * width, ncclBfloat16, comm, stream));
            CUDA_CHECK(cudaStreamSynchronize(stream));
            group.barrier();
            cudaGraphExec_t theirs = capture_graph(stream, o.calls, [&] {
              NCCL_CHECK(ncclAllGather(src.get(), out.get(), static_cast<size_t>(b) * width, ncclBfloat16,
                                       comm, stream));
            });
            const double nccl_us = time_replays(group, theirs, stream, o.calls, o.repeats);
            CUDA_CHECK(cudaGraphExecDestroy(theirs));
            if (rank == 0) {
              std::lock_guard<std::mutex> lock(mutex);
              results[{width, b}] = {spark_us, nccl_us};
            }
          }
          mailbox.barrier();
        }
        NCCL_CHECK(ncclCommDestroy(comm));
        CUDA_CHECK(cudaStreamDestroy(stream));
  });

  for (const auto& [key, times] : results) {
    const auto [width, b] = key;
    report.records.push_back({"gather", "spark", "publish+gather", "graph", o.tp, b, width * o.tp, 0, times.first, 0});
    report.records.push_back({"gather", "nccl", "ncclAllGather", "graph", o.tp, b, width * o.tp, 0, times.second, 0});
    std::printf("  width %5d/rank b=%2d  spark publish+gather %5.2f us  ncclAllGather %5.2f us  -> %.2fx\n", width, b,
                times.first, times.second, times.second / times.first);
  }
  char note[200];
  std::snprintf(note, sizeof note,
                "one-way peer store latency GPU0 -> GPU1 (flag ping-pong, half the round trip): %.2f us; n is the "
                "gathered row width tp * width; %d calls per graph, PDL on for ours",
                peer_us, o.calls);
  report.notes.push_back(note);
  return report.write(o.out_dir, "gather_tp" + std::to_string(o.tp));
}

}  // namespace spark_decode::bench
