#include "reference/mailbox_model.h"

#include <thread>

namespace spark_decode::reference {

using mailbox::kActiveWord;
using mailbox::kNextWord;
using mailbox::kSentinel;

MailboxTimeout::MailboxTimeout(int rank_, int stage_, int source_, int row_,
                               std::chrono::nanoseconds timeout)
    : RuntimeError(detail::concat("mailbox spin timeout: rank ", rank_, " waited ",
                                  std::chrono::duration<double, std::milli>(timeout).count(),
                                  " ms for stage ", stage_, ", source ", source_, ", row ", row_,
                                  " (a peer is missing or late)")),
      rank(rank_),
      stage(stage_),
      source(source_),
      row(row_) {}

MailboxNoPublish::MailboxNoPublish(int rank_, int stage_)
    : RuntimeError(detail::concat("mailbox protocol error: rank ", rank_, " consumed stage ", stage_,
                                  " with no publish since the last consume")),
      rank(rank_),
      stage(stage_) {}

MailboxModel::MailboxModel(int tp, int capacity, int width) {
  SPARK_CHECK(tp >= 1 && tp <= mailbox::kMaxRanks, "mailbox model: tp ", tp, " outside 1..",
              mailbox::kMaxRanks);
  SPARK_CHECK(capacity >= 1 && capacity <= mailbox::kMaxRows, "mailbox model: capacity ",
              capacity, " outside 1..", mailbox::kMaxRows);
  SPARK_CHECK(width > 0 && width % mailbox::kVecElems == 0, "mailbox model: width ", width,
              " must be a positive multiple of ", mailbox::kVecElems);
  layout_ = mailbox::Layout{tp, capacity, width};
  const int64_t n = layout_.copy_elems();
  for (int r = 0; r < tp; ++r) {
    data_.emplace_back(new std::atomic<uint16_t>[n]);
    for (int64_t i = 0; i < n; ++i) data_.back()[i].store(kSentinel, std::memory_order_relaxed);
  }
  state_.reset(new std::atomic<uint32_t>[tp * mailbox::kStateWords]);
  for (int i = 0; i < tp * mailbox::kStateWords; ++i) state_[i].store(0, std::memory_order_relaxed);
  // Threads started after this constructor returns see the initial state
  // (thread creation synchronises).
}

void MailboxModel::check_call(int rank, int b) const {
  SPARK_CHECK(rank >= 0 && rank < layout_.tp, "mailbox model: rank ", rank, " outside [0, ",
              layout_.tp, ")");
  SPARK_CHECK(b >= 1 && b <= layout_.capacity, "mailbox model: b = ", b, " outside [1, ",
              layout_.capacity, "] (capacity)");
}

void MailboxModel::publish(int rank, const uint16_t* src, int b) {
  check_call(rank, b);
  const auto& L = layout_;
  // This rank's previous consumer wrote NEXT in this thread: program order.
  const uint32_t next = state_[rank * mailbox::kStateWords + kNextWord].load(std::memory_order_relaxed);
  const int stage = mailbox::word_stage(next);
  // Peers first, own copy last, as the kernel does.
  for (int i = 1; i <= L.tp; ++i) {
    const int q = (rank + i) % L.tp;
    std::atomic<uint16_t>* copy = data_[q].get();
    for (int row = 0; row < b; ++row)
      for (int col = 0; col < L.width; ++col)
        copy[L.offset(stage, rank, row, col)].store(
            mailbox::publish_bits(src[int64_t(row) * L.width + col]), std::memory_order_release);
  }
  state_[rank * mailbox::kStateWords + kActiveWord].store(next, std::memory_order_relaxed);
}

void MailboxModel::consume(int rank, uint16_t* out, int b, std::chrono::nanoseconds timeout) {
  check_call(rank, b);
  const auto& L = layout_;
  std::atomic<uint16_t>* copy = data_[rank].get();
  const uint32_t active =
      state_[rank * mailbox::kStateWords + kActiveWord].load(std::memory_order_relaxed);
  const int stage = mailbox::word_stage(active);
  // The device consumers' check (kernels/mailbox/device.cuh, check_published).
  if (state_[rank * mailbox::kStateWords + kNextWord].load(std::memory_order_relaxed) != active)
    throw MailboxNoPublish(rank, stage);
  const int64_t out_width = int64_t(L.tp) * L.width;
  const auto start = std::chrono::steady_clock::now();
  for (int q = 0; q < L.tp; ++q) {
    for (int row = 0; row < b; ++row) {
      for (int col = 0; col < L.width; ++col) {
        std::atomic<uint16_t>& cell = copy[L.offset(stage, q, row, col)];
        uint16_t v = cell.load(std::memory_order_acquire);
        for (unsigned spins = 1; v == kSentinel; ++spins) {
          // Yield: the model runs up to 8 ranks on 2 cores.
          std::this_thread::yield();
          if (spins % 64 == 0 && std::chrono::steady_clock::now() - start > timeout)
            throw MailboxTimeout(rank, stage, q, row, timeout);
          v = cell.load(std::memory_order_acquire);
        }
        // The reader clears what it read (protocol.h says why no peer
        // writes it before this rank's next call).
        cell.store(kSentinel, std::memory_order_relaxed);
        out[row * out_width + int64_t(q) * L.width + col] = v;
      }
    }
  }
  state_[rank * mailbox::kStateWords + kNextWord].store(mailbox::advance_word(stage, b),
                                                         std::memory_order_relaxed);
}

uint16_t MailboxModel::element(int rank, int stage, int source, int row, int col) const {
  return data_[rank][layout_.offset(stage, source, row, col)].load(std::memory_order_acquire);
}

uint16_t MailboxModel::element_at(int rank, int64_t index) const {
  SPARK_CHECK(rank >= 0 && rank < layout_.tp && index >= 0 &&
                  index < layout_.copy_elems(),
              "mailbox model: element ", index, " of rank ", rank, " is outside the copy");
  return data_[rank][index].load(std::memory_order_acquire);
}

uint32_t MailboxModel::state_word(int rank, int word) const {
  return state_[rank * mailbox::kStateWords + word].load(std::memory_order_acquire);
}

}  // namespace spark_decode::reference
