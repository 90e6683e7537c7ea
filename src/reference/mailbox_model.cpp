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

MailboxFailed::MailboxFailed(uint32_t record_, const std::string& what)
    : RuntimeError(what),
      record(record_),
      kind(mailbox::record_kind(record_)),
      rank(mailbox::record_rank(record_)),
      stage(mailbox::record_stage(record_)),
      source(mailbox::record_source(record_)),
      value(mailbox::record_row(record_)) {}

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
  for (int r = 0; r < tp; ++r) {
    claims_.emplace_back(new std::atomic<uint32_t>[layout_.claim_words()]);
    for (int i = 0; i < layout_.claim_words(); ++i) claims_.back()[i].store(mailbox::kNoClaim, std::memory_order_relaxed);
  }
  state_.reset(new std::atomic<uint32_t>[tp * mailbox::kStateWords]);
  for (int r = 0; r < tp; ++r) {
    state(r, kNextWord).store(0, std::memory_order_relaxed);
    state(r, kActiveWord).store(mailbox::kNeverPublished, std::memory_order_relaxed);
    state(r, mailbox::kStatusWord).store(0, std::memory_order_relaxed);
  }
  // Threads started after this constructor returns see the initial state
  // (thread creation synchronises).
}

void MailboxModel::check_call(int rank, int b) const {
  SPARK_CHECK(rank >= 0 && rank < layout_.tp, "mailbox model: rank ", rank, " outside [0, ",
              layout_.tp, ")");
  SPARK_CHECK(b >= 1 && b <= layout_.capacity, "mailbox model: b = ", b, " outside [1, ",
              layout_.capacity, "] (capacity)");
}

void MailboxModel::fail(int rank, uint32_t record, const std::string& what) {
  // The first failure of the rank is its STATUS (the device's compare-and-swap).
  uint32_t expected = 0;
  state(rank, mailbox::kStatusWord).compare_exchange_strong(expected, record, std::memory_order_relaxed);
  throw MailboxFailed(record, what);
}

void MailboxModel::publish(int rank, const uint16_t* src, int b, uint32_t tag) {
  check_call(rank, b);
  const auto& L = layout_;
  // This rank's previous consumer wrote NEXT in this thread: program order.
  const uint32_t next = state(rank, kNextWord).load(std::memory_order_relaxed);
  const uint32_t call = mailbox::word_call(next);
  const int stage = mailbox::word_stage(next);
  bool failed = state(rank, mailbox::kStatusWord).load(std::memory_order_relaxed) != 0;
  if (state(rank, kActiveWord).load(std::memory_order_relaxed) == next) {  // the device leader's check
    uint32_t expected = 0;
    state(rank, mailbox::kStatusWord)
        .compare_exchange_strong(expected, mailbox::make_record(mailbox::kDoublePublish, rank, stage, rank, 0),
                                 std::memory_order_relaxed);
    failed = true;
  }
  // Peers first, own copy last, as the kernel does.
  for (int i = 1; i <= L.tp; ++i) {
    const int q = (rank + i) % L.tp;
    std::atomic<uint16_t>* copy = data_[q].get();
    for (int row = 0; row < b; ++row)
      for (int col = 0; col < L.width; ++col)
        copy[L.offset(stage, rank, row, col)].store(
            mailbox::publish_bits(src[int64_t(row) * L.width + col]), std::memory_order_release);
  }
  // The claims after the data here; on the device the leader's claim and
  // the other threads' data race, which the consumer's wait for both covers.
  for (int i = 1; i <= L.tp; ++i) {
    std::atomic<uint32_t>* claim = claims_[(rank + i) % L.tp].get() + L.claim_index(stage, rank);
    claim[0].store(mailbox::claim_rows_word(call, failed ? mailbox::kFailedRows : b), std::memory_order_release);
    claim[1].store(mailbox::claim_tag_word(call, tag), std::memory_order_release);
  }
  state(rank, kActiveWord).store(next, std::memory_order_relaxed);
}

void MailboxModel::consume(int rank, uint16_t* out, int b, std::chrono::nanoseconds timeout, uint32_t tag) {
  check_call(rank, b);
  const auto& L = layout_;
  std::atomic<uint16_t>* copy = data_[rank].get();
  const uint32_t active = state(rank, kActiveWord).load(std::memory_order_relaxed);
  const int stage = mailbox::word_stage(active);
  const uint32_t status = state(rank, mailbox::kStatusWord).load(std::memory_order_relaxed);
  if (status != 0)  // the device consumers poison everything at once
    throw MailboxFailed(status, detail::concat("mailbox model: rank ", rank, "'s mailbox has failed already"));
  // The device consumers' check (kernels/mailbox/device.cuh, check_published).
  if (state(rank, kNextWord).load(std::memory_order_relaxed) != active) {
    uint32_t expected = 0;
    state(rank, mailbox::kStatusWord)
        .compare_exchange_strong(expected, mailbox::make_record(mailbox::kNoPublish, rank, stage, 0, 0),
                                 std::memory_order_relaxed);
    throw MailboxNoPublish(rank, stage);
  }
  const auto start = std::chrono::steady_clock::now();
  auto spin = [&](unsigned spins, int source, int row) {
    // Yield: the model runs up to 8 ranks on 2 cores.
    std::this_thread::yield();
    if (spins % 64 == 0 && std::chrono::steady_clock::now() - start > timeout) {
      uint32_t expected = 0;
      state(rank, mailbox::kStatusWord)
          .compare_exchange_strong(expected, mailbox::make_timeout_record(rank, stage, source, row),
                                   std::memory_order_relaxed);
      throw MailboxTimeout(rank, stage, source, row, timeout);
    }
  };
  const uint32_t call = mailbox::word_call(active);
  for (int q = 0; q < L.tp; ++q) {
    const std::atomic<uint32_t>* claim = claims_[rank].get() + L.claim_index(stage, q);
    for (unsigned spins = 1;; ++spins) {
      const uint32_t rows_word = claim[0].load(std::memory_order_acquire);
      const uint32_t tag_word = claim[1].load(std::memory_order_acquire);
      const int check = mailbox::check_claim(rows_word, tag_word, call, b, tag);
      if (check == mailbox::kClaimMatches) break;
      // As on the device (wait_for_call), a claim of other rows or another
      // tag counts once the source's data (row 0) has arrived: a consume
      // with no publish must be named as such, not by the last call's claim.
      const bool arrived = copy[L.offset(stage, q, 0, 0)].load(std::memory_order_acquire) != kSentinel;
      if (check == mailbox::kClaimPeerFailed || (check != mailbox::kClaimPending && arrived)) {
        const int theirs = mailbox::claim_detail(check, rows_word, tag_word);
        fail(rank, mailbox::make_record(mailbox::claim_record_kind(check), rank, stage, q, theirs),
             detail::concat("mailbox model: rank ", rank, ": source ", q, " claims ",
                            check == mailbox::kClaimRowsDiffer   ? "b = "
                            : check == mailbox::kClaimTagDiffer ? "tag "
                                                                : "a failure",
                            check == mailbox::kClaimPeerFailed ? std::string() : std::to_string(theirs),
                            " for stage ", stage, " where this rank consumes b = ", b, ", tag ", tag));
      }
      spin(spins, q, 0);
    }
  }
  const int64_t out_width = int64_t(L.tp) * L.width;
  for (int q = 0; q < L.tp; ++q) {
    for (int row = 0; row < b; ++row) {
      for (int col = 0; col < L.width; ++col) {
        std::atomic<uint16_t>& cell = copy[L.offset(stage, q, row, col)];
        uint16_t v = cell.load(std::memory_order_acquire);
        for (unsigned spins = 1; v == kSentinel; ++spins) {
          spin(spins, q, row);
          v = cell.load(std::memory_order_acquire);
        }
        // The reader clears what it read (protocol.h says why no peer
        // writes it before this rank's next call).
        cell.store(kSentinel, std::memory_order_relaxed);
        out[row * out_width + int64_t(q) * L.width + col] = v;
      }
    }
  }
  state(rank, kNextWord).store(mailbox::advance_word(active, b), std::memory_order_relaxed);
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
  return state(rank, word).load(std::memory_order_acquire);
}

uint32_t MailboxModel::claim_word(int rank, int stage, int source, int word) const {
  return claims_[rank][layout_.claim_index(stage, source) + word].load(std::memory_order_acquire);
}

}  // namespace spark_decode::reference
