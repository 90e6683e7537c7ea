// The main() of the tests that run under mpirun: every rank runs every test
// with one seed (rank 0's, broadcast), and the process fails on every rank
// if any rank failed, so that mpirun's exit status does not depend on which
// rank it reports.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace spark_decode::testing {

// `draw_seed` runs on rank 0 only; the broadcast seed lands in `seed` before
// any test runs, and in SPARK_TEST_SEED, so that test_seed() (test_seed.h)
// derives the same seed of a tag on every rank: the bodies fill a rank's
// payload from it and check every peer's.
template <typename DrawSeed>
int mpi_gtest_main(int argc, char** argv, const char* what, DrawSeed draw_seed, uint64_t& seed) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  unsigned long long s = 0;
  if (rank == 0) {
    s = draw_seed();
    std::printf("[%s] seed %llu\n", what, s);
  }
  MPI_Bcast(&s, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  seed = s;
  setenv("SPARK_TEST_SEED", std::to_string(s).c_str(), /*overwrite=*/1);
  int failed = RUN_ALL_TESTS() != 0;
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  // A run in which every rank skipped every test (e.g. fewer than two GPUs)
  // must not read as a pass: ctest matches this line (SKIP_REGULAR_EXPRESSION)
  // and reports the test as skipped.
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  int skipped_all = unit.test_to_run_count() > 0 && unit.skipped_test_count() == unit.test_to_run_count();
  int every = 0;
  MPI_Allreduce(&skipped_all, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (every && !any && rank == 0) std::printf("[%s] every test skipped on every rank\n", what);
  MPI_Finalize();
  return any;
}

}  // namespace spark_decode::testing
