#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "benches.h"
#include "cublas_gemm.h"
#include "harness.h"
#include "nccl_check.h"
#include "spark_decode/error.h"
#include "spark_decode/group.h"
#include "spark_decode/mailbox.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/unpooler.h"


namespace spark_decode::bench {

std::string bench_unpooler_publish(const UnpoolerBenchOptions& o, int tp) {
  int devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  SPARK_CHECK_RUNTIME(devices >= tp, "bench unpooler --publish at tp ", tp, " needs ", tp, " GPUs, found ", devices);
  const int n = kMuseSpark.hidden / tp, k = kMuseSpark.pooled;
  Report report = new_report();
  report.hbm_read_TBps = measure_hbm_read_TBps();
  const double floor = floor_us(size_t{2} * n * k, report.hbm_read_TBps);

  ncclUniqueId id;
  NCCL_CHECK(ncclGetUniqueId(&id));
  std::mutex mutex;
  std::map<std::pair<int, std::string>, double> us;  // (m, variant) -> rank 0's time
  run_ranks(tp, [&](Group& group, int rank) {
        cudaStream_t stream;
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        ncclComm_t comm;
        NCCL_CHECK(ncclCommInitRank(&comm, tp, id, rank));
        const int copies = cold_copies(size_t{2} * n * k);
        DeviceMemory w(size_t{2} * n * k * copies), x(size_t{2} * kMaxBatch * k),
            out(size_t{2} * kMaxBatch * n), rows(size_t{2} * kMaxBatch * n * tp);
        fill_random_bf16(w.get(), static_cast<size_t>(n) * k * copies, 0x77 + rank);
        fill_random_bf16(x.get(), size_t{kMaxBatch} * k, 0x99);
        CUDA_CHECK(cudaDeviceSynchronize());
        // One mailbox for the exchanges, one that only the zero-copy GEMM
        // alone writes (it is never consumed).
        LamportMailbox mb(group, tp, rank, kMaxBatch, n, rank), lone(group, tp, rank, kMaxBatch, n, rank);
        mb.warm_up(stream);
        std::vector<Unpooler> zc, zc_lone, plain;
        std::vector<const void*> weights;
        for (int c = 0; c < copies; ++c) {
          const void* wc = w.as<char>() + size_t{2} * n * k * c;
          weights.push_back(wc);
          const auto ref = TensorRef::contiguous(wc, DType::bf16, {n, k}, rank);
          Unpooler::Options opt;
          opt.mailbox = &mb;
          zc.emplace_back(ref, opt);
          opt.mailbox = &lone;
          zc_lone.emplace_back(ref, opt);
          plain.emplace_back(ref);
        }
        for (int m : o.ms) {
          std::map<std::string, std::function<void(int)>> variants = {
              {"zerocopy", [&](int c) { zc[c].run(x.get(), out.get(), m, stream); mb.gather(rows.get(), m, stream); }},
              {"plain+publish",
               [&](int c) {
                 plain[c].run(x.get(), out.get(), m, stream);
                 mb.publish(out.get(), m, stream);
                 mb.gather(rows.get(), m, stream);
               }},
              {"gemm", [&](int c) { plain[c].run(x.get(), out.get(), m, stream); }},
              {"zerocopy_gemm", [&](int c) { zc_lone[c].run(x.get(), out.get(), m, stream); }},
          };
          for (auto& [name, call] : variants) {
            int c = 0;
            cudaGraphExec_t exec = capture_graph(stream, copies, [&] { call(c++ % copies); });
            const double t = time_replays(group, exec, stream, copies, o.repeats);
            mb.synchronize(stream);
            CUDA_CHECK(cudaGraphExecDestroy(exec));
            if (rank == 0) {
              std::lock_guard<std::mutex> lock(mutex);
              us[{m, name}] = t;
            }
          }
          // The stock exchange: cuBLAS, then ncclAllGather of the outputs.
          CublasGemm blas(m, n, k);
          blas.pick_fastest(weights, x.get(), out.get(), o.repeats, stream);
          NCCL_CHECK(ncclAllGather(out.get(), rows.get(), size_t(m) * n, ncclBfloat16, comm, stream));
          CUDA_CHECK(cudaStreamSynchronize(stream));
          group.barrier();
          int c = 0;
          cudaGraphExec_t exec = capture_graph(stream, copies, [&] {
            blas.run(weights[c++ % copies], x.get(), out.get(), stream);
            NCCL_CHECK(ncclAllGather(out.get(), rows.get(), size_t(m) * n, ncclBfloat16, comm, stream));
          });
          const double t = time_replays(group, exec, stream, copies, o.repeats);
          CUDA_CHECK(cudaGraphExecDestroy(exec));
          if (rank == 0) {
            std::lock_guard<std::mutex> lock(mutex);
            us[{m, "cublas+nccl"}] = t;
          }
        }
        mb.barrier();
        lone.barrier();
        NCCL_CHECK(ncclCommDestroy(comm));
        CUDA_CHECK(cudaStreamDestroy(stream));
  });

  for (int m : o.ms) {
    const double zc = us[{m, "zerocopy"}], pp = us[{m, "plain+publish"}], gemm = us[{m, "gemm"}],
                 zc_gemm = us[{m, "zerocopy_gemm"}], stock = us[{m, "cublas+nccl"}];
    for (auto [variant, t] : {std::pair{"zerocopy", zc}, std::pair{"plain+publish", pp}, std::pair{"gemm", gemm},
                              std::pair{"zerocopy_gemm", zc_gemm}})
      report.records.push_back({"unpooler_publish", "spark", variant, "graph", tp, m, n, k, t, floor});
    report.records.push_back({"unpooler_publish", "stock", "cublas+ncclAllGather", "graph", tp, m, n, k, stock, floor});
    std::printf("  m=%2d  zero-copy GEMM+gather %6.2f  plain GEMM+publish+gather %6.2f  cuBLAS+NCCL %6.2f us  "
                "(GEMM %6.2f, zero-copy GEMM alone %6.2f: +%.2f us)  -> %.2fx vs stock\n",
                m, zc, pp, stock, gemm, zc_gemm, zc_gemm - gemm, stock / zc);
  }
  report.notes.push_back("zerocopy: Unpooler with the mailbox (epilogue publishes) + gather; plain+publish: plain "
                         "Unpooler + LamportMailbox::publish + gather; gemm / zerocopy_gemm: the GEMMs alone (their "
                         "difference is what the zero-copy epilogue adds); stock: cuBLASLt (fastest candidate) + "
                         "ncclAllGather. CUDA graphs over cold weight copies, PDL on for ours, ranks replayed together.");
  report.notes.push_back(format_plan_table());
  return report.write(o.out_dir, "unpooler_publish_tp" + std::to_string(tp));
}

}  // namespace spark_decode::bench
