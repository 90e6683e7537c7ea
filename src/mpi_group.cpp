#include "spark_decode/mpi_group.h"

#include <climits>
#include <string>

#include "spark_decode/error.h"

namespace spark_decode {
namespace {

void mpi_check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw RuntimeError(detail::concat("MPI error in ", call, ": ", std::string(text, len)));
}

}  // namespace

MpiGroup::MpiGroup(MPI_Comm comm) : comm_(comm) {
  int initialized = 0;
  mpi_check(MPI_Initialized(&initialized), "MPI_Initialized");
  SPARK_CHECK_RUNTIME(initialized, "MpiGroup: MPI is not initialised (call MPI_Init first)");
  mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

std::vector<uint8_t> MpiGroup::all_gather(const void* data, size_t bytes) {
  SPARK_CHECK(data != nullptr || bytes == 0, "MpiGroup all_gather: null data");
  SPARK_CHECK(bytes <= size_t(INT_MAX), "MpiGroup all_gather: ", bytes, " bytes is too many");
  // Agree on the size first: MPI_Allgather with unequal counts is undefined.
  const unsigned long long mine = bytes;
  unsigned long long lo = 0, hi = 0;
  mpi_check(MPI_Allreduce(&mine, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm_), "MPI_Allreduce");
  mpi_check(MPI_Allreduce(&mine, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, comm_), "MPI_Allreduce");
  SPARK_CHECK(lo == hi, "MpiGroup all_gather: ranks passed between ", lo, " and ", hi,
              " bytes; every rank must pass the same count");
  std::vector<uint8_t> out(bytes * size_);
  if (bytes)
    mpi_check(MPI_Allgather(data, int(bytes), MPI_BYTE, out.data(), int(bytes), MPI_BYTE, comm_),
              "MPI_Allgather");
  return out;
}

void MpiGroup::barrier() { mpi_check(MPI_Barrier(comm_), "MPI_Barrier"); }

}  // namespace spark_decode
