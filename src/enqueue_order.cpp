// EnqueueOrder: the counters in POSIX shared memory and the consumer's wait.
#include "enqueue_order.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "spark_decode/error.h"
#include "spark_decode/mailbox_view.h"

namespace spark_decode::detail {

// Every rank maps the same pages, threads and processes alike, so the
// counters must be address-free: lock-free atomics are.
static_assert(std::atomic<uint64_t>::is_always_lock_free);

struct EnqueueOrder::Counters {
  struct alignas(64) Slot {  // one cache line per rank: only its rank writes it
    std::atomic<uint64_t> published;
  };
  Slot slot[kMailboxMaxRanks];
};

namespace {

using Name = std::array<char, 64>;

std::string errno_text() { return std::strerror(errno); }

void* map_shared(int fd, size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  SPARK_CHECK_RUNTIME(p != MAP_FAILED, "mailbox enqueue order: mmap of the shared counters failed: ", errno_text());
  return p;
}

}  // namespace

EnqueueOrder::EnqueueOrder(Group& group, std::chrono::nanoseconds timeout)
    : rank_(group.rank()), size_(group.size()), timeout_(timeout) {
  SPARK_CHECK(size_ >= 1 && size_ <= kMailboxMaxRanks, "mailbox enqueue order: ", size_, " ranks outside 1..",
              kMailboxMaxRanks);
  // Rank 0 creates the segment (zero-filled: every counter 0), every rank
  // maps it, and rank 0 unlinks the name once all have: the pages live while
  // any rank maps them, and nothing is left behind if a process dies.
  Name name{};
  collective_step(group, "mailbox enqueue order: creation", [&] {
    if (rank_ != 0) return;
    std::random_device rd;
    std::snprintf(name.data(), name.size(), "/spark-decode-order-%d-%08x%08x", int(getpid()), rd(), rd());
    const int fd = shm_open(name.data(), O_CREAT | O_EXCL | O_RDWR, 0600);
    SPARK_CHECK_RUNTIME(fd >= 0, "mailbox enqueue order: shm_open(", name.data(), ") failed: ", errno_text(),
                        " (ranks sharing a GPU order their launches through POSIX shared memory)");
    const bool sized = ftruncate(fd, sizeof(Counters)) == 0;
    const std::string why = sized ? "" : errno_text();
    if (sized) counters_ = static_cast<Counters*>(map_shared(fd, sizeof(Counters)));
    close(fd);
    if (!sized) shm_unlink(name.data());
    SPARK_CHECK_RUNTIME(sized, "mailbox enqueue order: ftruncate of ", name.data(), " failed: ", why);
  });
  const std::vector<uint8_t> names = group.all_gather(name.data(), name.size());
  std::memcpy(name.data(), names.data(), name.size());  // rank 0's
  try {
    collective_step(group, "mailbox enqueue order: mapping", [&] {
      if (rank_ == 0) return;
      const int fd = shm_open(name.data(), O_RDWR, 0600);
      SPARK_CHECK_RUNTIME(fd >= 0, "mailbox enqueue order: shm_open(", name.data(), ") failed: ", errno_text());
      try {
        counters_ = static_cast<Counters*>(map_shared(fd, sizeof(Counters)));
      } catch (...) {
        close(fd);
        throw;
      }
      close(fd);
    });
  } catch (...) {
    if (rank_ == 0) shm_unlink(name.data());
    if (counters_) munmap(counters_, sizeof(Counters));
    throw;
  }
  if (rank_ == 0) shm_unlink(name.data());
}

EnqueueOrder::~EnqueueOrder() {
  if (counters_) munmap(counters_, sizeof(Counters));
}

void EnqueueOrder::published() { counters_->slot[rank_].published.fetch_add(1, std::memory_order_release); }

uint64_t EnqueueOrder::published_by(int q) const {
  return counters_->slot[q].published.load(std::memory_order_acquire);
}

bool EnqueueOrder::before_consume(bool capturing) {
  const uint64_t call = ++consumed_;
  if (capturing || published_by(rank_) < call) return true;
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (int q = 0; q < size_; ++q) {
    // A peer normally enqueues within microseconds: yield first, then sleep
    // so that a late peer does not lose its core to this rank's spinning.
    for (int spins = 0; published_by(q) < call; ++spins) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      if (spins < 256)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  return true;
}

}  // namespace spark_decode::detail
