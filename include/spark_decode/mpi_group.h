// spark_decode/mpi_group.h: a Group over an MPI communicator, one process
// per rank. Built only when CMake finds MPI (target spark_decode_mpi, which
// defines SPARK_DECODE_HAS_MPI); include it only then.
//
// The caller initialises and finalises MPI; the communicator must outlive
// the group. Blocking and collective like every Group (group.h).
#pragma once

#include <mpi.h>

#include "spark_decode/group.h"

namespace spark_decode {

class MpiGroup final : public Group {
 public:
  explicit MpiGroup(MPI_Comm comm = MPI_COMM_WORLD);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<uint8_t> all_gather(const void* data, size_t bytes) override;
  void barrier() override;

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace spark_decode
