// spark_decode/group.h: the rendezvous a mailbox is built over.
//
// A Group is one rank's handle on a set of `size()` ranks: its rank, an
// all-gather of bytes and a barrier. Host-only, blocking, collective: every
// rank calls the same operations in the same order. It is used at
// construction and teardown of symmetric memory and mailboxes, never on the
// decode path (no CUDA work, no device memory).
//
// Implementations:
//   InProcessGroup  ranks are threads of one process (one thread per GPU);
//   MpiGroup        spark_decode/mpi_group.h, one process per rank (built
//                   when CMake finds MPI: SPARK_DECODE_HAS_MPI);
//   a torch.distributed one comes with the PyTorch binding.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <vector>

namespace spark_decode {

class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank passes `bytes` bytes (the same count on every rank, else
  // InvalidArgument on every rank that can tell); returns size() * bytes
  // bytes, rank i's at [i * bytes, (i + 1) * bytes).
  virtual std::vector<uint8_t> all_gather(const void* data, size_t bytes) = 0;
  // Returns once every rank has entered it.
  virtual void barrier() = 0;
};

// Makes one rank's failure in a collective step every rank's. Each rank
// passes what its own part of the step threw (nullptr if it succeeded);
// after one all-gather of a status byte, a rank that failed rethrows its
// own exception and every other rank throws RuntimeError naming `what` and
// the ranks that failed. Without it, a rank that throws alone (out of
// memory on its GPU, a peer it cannot map, an argument only it got wrong)
// leaves its peers blocked in the next collective until the transport's
// timeout, or forever. Collective: every rank calls it at the same point.
void all_ok_or_throw(Group& group, std::exception_ptr local, const char* what);
// One step of a collective construction: runs `step` on this rank, then
// all_ok_or_throw with what it threw.
template <typename Step>
void collective_step(Group& group, const char* what, Step&& step) {
  std::exception_ptr failed;
  try {
    step();
  } catch (...) {
    failed = std::current_exception();
  }
  all_ok_or_throw(group, failed, what);
}

// Ranks as threads of one process. Create one Shared for `size` ranks, hand
// it to every thread, and let thread r build InProcessGroup(shared, r).
// A rank that waits longer than `timeout` for the others throws
// RuntimeError (naming the ranks that did not arrive) instead of hanging;
// the group is then broken: every later call on any rank throws.
class InProcessGroup final : public Group {
 public:
  class Shared;
  static std::shared_ptr<Shared> make_shared(
      int size, std::chrono::milliseconds timeout = std::chrono::seconds(120));

  InProcessGroup(std::shared_ptr<Shared> shared, int rank);
  ~InProcessGroup() override;

  int rank() const override { return rank_; }
  int size() const override;
  std::vector<uint8_t> all_gather(const void* data, size_t bytes) override;
  void barrier() override;

 private:
  std::shared_ptr<Shared> shared_;
  int rank_;
};

}  // namespace spark_decode
