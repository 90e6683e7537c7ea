// The Lamport mailbox across processes: `mpirun -np 2`, rank r on GPU r,
// buffers mapped with CUDA IPC. Every rank runs the same tests; the process
// fails if any rank failed. Skips (on every rank alike) without two GPUs
// that reach each other peer-to-peer.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

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

std::string mpi_gpu_reason() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) return "needs at least 2 MPI ranks (mpirun -np 2)";
  std::string why = gpu_unavailable_reason(size);
  if (!why.empty()) return why;
  for (int a = 0; a < size; ++a)
    for (int b = 0; b < size; ++b) {
      int can = 1;
      if (a != b) CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can) return "GPUs " + std::to_string(a) + " and " + std::to_string(b) + " cannot access each other peer-to-peer";
    }
  return "";
}

// Runs a body on this rank; a rank's failure is reported by that rank.
template <typename Fn>
void run_body(Fn fn) {
  const std::string why = mpi_gpu_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  sd::MpiGroup group;
  CUDA_CHECK(cudaSetDevice(group.rank()));
  try {
    fn(group, group.rank());
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
// trap poisons rank 0's CUDA context for the rest of the process.
TEST(ZzMailboxMpiTimeout, SkippedCallTrapsWithTheReport) {
  run_body([](sd::Group& g, int device) {
    const double timeout_s = 0.5;
    const TimeoutOutcome o = skipped_call_times_out(g, device, timeout_s, sd::LamportMailbox::OnFailure::trap);
    if (g.rank() == 0) expect_timeout_outcome(o, timeout_s);
  });
}

}  // namespace

int main(int argc, char** argv) {
  return sd::testing::mpi_gtest_main(argc, argv, "mailbox mpi", [] { return sd::testing::test_base_seed(); }, g_seed);
}
