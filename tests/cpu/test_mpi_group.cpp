// MpiGroup across processes: run with `mpirun -np 2` (ctest: mpi_group).
// Every rank runs the same tests; the process fails if any rank failed.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <random>
#include <vector>

#include "reference/mailbox_payload.h"
#include "mpi_gtest_main.h"
#include "test_seed.h"
#include "spark_decode/error.h"
#include "spark_decode/mpi_group.h"

namespace sd = spark_decode;
using sd::reference::splitmix64;

namespace {

uint64_t g_seed = 0;

std::vector<uint8_t> piece(int rank, int round, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i)
    v[i] = uint8_t(splitmix64(g_seed ^ (uint64_t(rank) << 48) ^ (uint64_t(round) << 24) ^ i));
  return v;
}

TEST(MpiGroup, AllGatherOfRandomBytesOverManyRounds) {
  sd::MpiGroup group;
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_EQ(group.rank(), rank);
  ASSERT_EQ(group.size(), size);
  for (int round = 0; round < 300; ++round) {
    const size_t bytes = splitmix64(g_seed + round) % 5000;  // same on every rank, 0 included
    const auto all = group.all_gather(piece(rank, round, bytes).data(), bytes);
    ASSERT_EQ(all.size(), bytes * size);
    for (int q = 0; q < size; ++q)
      ASSERT_TRUE(std::equal(all.begin() + q * bytes, all.begin() + (q + 1) * bytes,
                             piece(q, round, bytes).begin()))
          << "round " << round << " piece of rank " << q;
  }
}

TEST(MpiGroup, BarrierWaitsForEveryRank) {
  sd::MpiGroup group;
  // Rank 0 arrives late; nobody may leave the barrier before that.
  const double start = MPI_Wtime();
  if (group.rank() == 0) {
    while (MPI_Wtime() - start < 0.2) {
    }
  }
  double t0 = group.rank() == 0 ? MPI_Wtime() : 0.0;
  group.barrier();
  const double left = MPI_Wtime();
  MPI_Bcast(&t0, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  // MPI_Wtime is not globally synchronised across hosts, but these ranks
  // share one host clock (MPI_WTIME_IS_GLOBAL aside), so a rank leaving
  // before rank 0 entered shows as left < t0.
  EXPECT_GE(left, t0 - 1e-3);
}

TEST(MpiGroup, UnequalSizesAreRefusedOnEveryRank) {
  sd::MpiGroup group;
  std::vector<uint8_t> data(16 + group.rank());
  EXPECT_THROW(group.all_gather(data.data(), data.size()), sd::InvalidArgument);
  group.barrier();
}

}  // namespace

int main(int argc, char** argv) {
  return sd::testing::mpi_gtest_main(
      argc, argv, "mpi group",
      [] { return sd::testing::test_base_seed(); }, g_seed);
}
