// InProcessGroup: ranks as threads sharing one rendezvous object.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>

#include "spark_decode/error.h"
#include "spark_decode/group.h"

namespace spark_decode {

class InProcessGroup::Shared {
 public:
  Shared(int size, std::chrono::milliseconds timeout)
      : size_(size), timeout_(timeout), present_(size, false), slots_(size) {}

  int size() const { return size_; }

  // A generation-counted barrier with a timeout. A timeout breaks the group
  // for good: the ranks still waiting and every later call throw, so a
  // missing rank ends a test instead of hanging it.
  void arrive_and_wait(int rank, const char* what) {
    std::unique_lock<std::mutex> lock(mu_);
    throw_if_broken();
    const uint64_t gen = generation_;
    present_[rank] = true;
    if (++arrived_ == size_) {
      arrived_ = 0;
      std::fill(present_.begin(), present_.end(), false);
      ++generation_;
      cv_.notify_all();
      return;
    }
    const bool done = cv_.wait_for(lock, timeout_, [&] { return generation_ != gen || broken_; });
    if (!done) {
      std::string missing;
      for (int r = 0; r < size_; ++r)
        if (!present_[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      broken_ = true;
      reason_ = detail::concat("InProcessGroup ", what, ": rank ", rank, " waited ",
                               timeout_.count(), " ms; rank(s) ", missing, " never arrived");
      cv_.notify_all();
    }
    throw_if_broken();
  }

  void put(int rank, const void* data, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto* p = static_cast<const uint8_t*>(data);
    slots_[rank].assign(p, p + bytes);
  }

  // Everything gathered, or the sizes that disagree.
  bool collect(size_t bytes, std::vector<uint8_t>& out, std::string& mismatch) {
    std::lock_guard<std::mutex> lock(mu_);
    out.resize(bytes * size_);
    for (int r = 0; r < size_; ++r) {
      if (slots_[r].size() != bytes) {
        mismatch = detail::concat("InProcessGroup all_gather: rank ", r, " passed ",
                                  slots_[r].size(), " bytes, another ", bytes);
        return false;
      }
      if (bytes) std::memcpy(out.data() + r * bytes, slots_[r].data(), bytes);
    }
    return true;
  }

 private:
  void throw_if_broken() const {
    if (broken_) throw RuntimeError(reason_);
  }

  const int size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
  int arrived_ = 0;
  std::vector<bool> present_;
  bool broken_ = false;
  std::string reason_;
  std::vector<std::vector<uint8_t>> slots_;
};

std::shared_ptr<InProcessGroup::Shared> InProcessGroup::make_shared(
    int size, std::chrono::milliseconds timeout) {
  SPARK_CHECK(size >= 1, "InProcessGroup: size ", size, " must be at least 1");
  SPARK_CHECK(timeout.count() > 0, "InProcessGroup: timeout must be positive");
  return std::make_shared<Shared>(size, timeout);
}

InProcessGroup::InProcessGroup(std::shared_ptr<Shared> shared, int rank)
    : shared_(std::move(shared)), rank_(rank) {
  SPARK_CHECK(shared_ != nullptr, "InProcessGroup: no shared state (use make_shared)");
  SPARK_CHECK(rank >= 0 && rank < shared_->size(), "InProcessGroup: rank ", rank,
              " outside [0, ", shared_->size(), ")");
}

InProcessGroup::~InProcessGroup() = default;

int InProcessGroup::size() const { return shared_->size(); }

std::vector<uint8_t> InProcessGroup::all_gather(const void* data, size_t bytes) {
  SPARK_CHECK(data != nullptr || bytes == 0, "InProcessGroup all_gather: null data");
  shared_->put(rank_, data, bytes);
  shared_->arrive_and_wait(rank_, "all_gather");
  std::vector<uint8_t> out;
  std::string mismatch;
  const bool ok = shared_->collect(bytes, out, mismatch);
  // Nobody may overwrite its slot (next all_gather) before everyone has read.
  shared_->arrive_and_wait(rank_, "all_gather");
  if (!ok) throw InvalidArgument(mismatch);
  return out;
}

void InProcessGroup::barrier() { shared_->arrive_and_wait(rank_, "barrier"); }

void all_ok_or_throw(Group& group, std::exception_ptr local, const char* what) {
  const uint8_t ok = local ? 0 : 1;
  const std::vector<uint8_t> all = group.all_gather(&ok, 1);
  if (local) std::rethrow_exception(local);
  std::string failed;
  for (size_t q = 0; q < all.size(); ++q)
    if (!all[q]) failed += (failed.empty() ? "" : ", ") + std::to_string(q);
  SPARK_CHECK_RUNTIME(failed.empty(), what, ": rank(s) ", failed,
                      " failed (their own errors say why); no rank goes on");
}

}  // namespace spark_decode
