// The Lamport mailbox across processes: `mpirun -np 2`, buffers mapped with
// CUDA IPC. Rank r runs on GPU r where there are as many GPUs as ranks (they
// must reach each other peer-to-peer), and on GPU r % count where there are
// fewer: ranks that are processes sharing a GPU, as on a one-GPU machine (the
// host order of launches then goes through POSIX shared memory between the
// processes). Every rank runs the same tests; the process fails if any rank
// failed. Skips (on every rank alike) without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "../cpu/mpi_gtest_main.h"
#include "mailbox_test_bodies.h"
#include "spark_decode/mpi_group.h"
#include "unpooler_publish_bodies.h"

namespace sd = spark_decode;
using namespace sd::testing;
using namespace sd::testing::mailbox_tests;

namespace {

uint64_t g_seed = 0;  // the same on every rank (rank 0's, broadcast)

int mpi_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

int gpu_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

// Why the bodies cannot run here ("" where they can): a GPU at least, and
// every GPU the ranks use reaching the others peer-to-peer. With `own_gpus`,
// every rank must have a GPU of its own.
std::string mpi_gpu_reason(bool own_gpus) {
  const int size = mpi_size();
  if (size < 2) return "needs at least 2 MPI ranks (mpirun -np 2)";
  return peer_gpus_unavailable_reason(own_gpus ? size : std::max(1, std::min(size, gpu_count())));
}

// Runs a body on this rank, on GPU rank % count; a rank's failure is
// reported by that rank.
template <typename Fn>
void run_body(Fn fn, bool own_gpus = false) {
  const std::string why = mpi_gpu_reason(own_gpus);
  if (!why.empty()) GTEST_SKIP() << why;
  sd::MpiGroup group;
  const int device = group.rank() % gpu_count();
  CUDA_CHECK(cudaSetDevice(device));
  if (group.rank() == 0 && gpu_count() < group.size())
    std::printf("%d ranks as processes sharing %d GPU(s)\n", group.size(), gpu_count());
  try {
    fn(group, device);
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
}

TEST(MailboxMpi, PayloadsArriveBitForBit) {
  run_body([](sd::Group& g, int device) {
    for (int width : {2048, 4096, 8, 24}) payloads_arrive_bit_for_bit(g, device, width, g_seed + width);
  });
}

TEST(MailboxMpi, TenThousandCallsWithRandomRows) {
  run_body([](sd::Group& g, int device) { many_calls_random_rows(g, device, 512, 10000, g_seed); });
}

TEST(MailboxMpi, GraphOf16CallsReplayed1000Times) {
  run_body([](sd::Group& g, int device) { graph_replays(g, device, 512, 16, 1000, g_seed); });
}

// The zero-copy Unpooler across processes (CUDA IPC), at this tp's shard.
TEST(UnpoolerPublishMpi, ZeroCopyEqualsPlainRunPlusPublish) {
  run_body([](sd::Group& g, int) {
    publish_tests::zero_copy_equals_publish(g, sd::kMuseSpark.hidden / g.size(), sd::kMuseSpark.pooled, g_seed);
  });
}

TEST(UnpoolerPublishMpi, TenThousandConsecutiveBoundaries) {
  run_body([](sd::Group& g, int) {
    publish_tests::consecutive_boundaries(g, sd::kMuseSpark.hidden / g.size(), sd::kMuseSpark.pooled, 10000, 500,
                                          g_seed);
  });
}

TEST(UnpoolerPublishMpi, GraphReplayEqualsEager) {
  run_body([](sd::Group& g, int) {
    publish_tests::graph_replay_equals_eager(g, sd::kMuseSpark.hidden / g.size(), sd::kMuseSpark.pooled, 200, g_seed);
  });
}

// Rank 1 skips call 4; rank 0's consumer must give the spin timeout error
// (rank, stage, source, row) within the timeout, not hang, poison what it
// could not read and leave the process able to go on.
TEST(MailboxMpiTimeout, SkippedCallIsSurvived) {
  run_body([](sd::Group& g, int device) {
    const double timeout_s = 0.5;
    const TimeoutOutcome o = skipped_call_times_out(g, device, timeout_s, sd::LamportMailbox::OnFailure::poison);
    if (g.rank() == 0) expect_timeout_outcome(o, timeout_s);
    failure_is_survived(g, device, 2.0);
  });
}

// Last suite of the file (gtest runs suites in order of appearance): the
// trap poisons rank 0's CUDA context for the rest of the process. Only where
// every rank has its own GPU: a peer's context on rank 0's GPU is not part
// of what the trap's report is tested for.
TEST(ZzMailboxMpiTimeout, SkippedCallTrapsWithTheReport) {
  run_body(
      [](sd::Group& g, int device) {
        const double timeout_s = 0.5;
        const TimeoutOutcome o = skipped_call_times_out(g, device, timeout_s, sd::LamportMailbox::OnFailure::trap);
        if (g.rank() == 0) expect_timeout_outcome(o, timeout_s);
      },
      /*own_gpus=*/true);
}

}  // namespace

int main(int argc, char** argv) {
  return sd::testing::mpi_gtest_main(argc, argv, "mailbox mpi", [] { return sd::testing::test_base_seed(); }, g_seed);
}
