// A CPU model of the Lamport mailbox protocol (docs/design.md, "The Lamport mailbox protocol").
//
// Ranks are host threads; every rank's copy lives in host memory as one
// std::atomic<uint16_t> per BF16 element, its claims and its state words as
// std::atomic<uint32_t>. The model runs the exact stage, slot and word
// arithmetic of the device kernels (kernels/mailbox/protocol.h), so CI, which
// has no GPU, exercises the protocol itself: stage rotation, clearing, the
// one-call-ahead bound, variable rows per call, the claims (call counter,
// rows, tag), the failure status and the spin timeout.
//
// How it stands in for the GPU's orderings:
//   - a kernel boundary on one rank (publisher then consumer, consumer then
//     the next publisher) is program order within that rank's thread;
//   - a publisher's peer store is a release store, a consumer's poll an
//     acquire load. On the GPU the same role is played by the kernel boundary
//     that precedes every publisher (griddepcontrol.wait): everything the
//     previous consumer did, its clear included, is performed before the
//     publisher issues a store. Release/acquire is the C++ way to say that a
//     peer that saw our data also sees our earlier clears.
//
// Thread safety: publish/consume of one rank must be called from one thread
// at a time (that rank's); different ranks may run concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/mailbox/protocol.h"
#include "spark_decode/error.h"

namespace spark_decode::reference {

// A consumer that waited longer than its timeout for a slot: which one.
class MailboxTimeout : public RuntimeError {
 public:
  MailboxTimeout(int rank, int stage, int source, int row, std::chrono::nanoseconds timeout);
  int rank, stage, source, row;
};

// A consume with no publish since the last one (ACTIVE != NEXT).
class MailboxNoPublish : public RuntimeError {
 public:
  MailboxNoPublish(int rank, int stage);
  int rank, stage;
};

// A source's claim that differs from the consumer's call (another b,
// another tag, a failed peer), or a consume on a mailbox that has failed
// already: `record` is the failure record (protocol.h) the device would
// have written, `kind` its kind.
class MailboxFailed : public RuntimeError {
 public:
  MailboxFailed(uint32_t record, const std::string& what);
  uint32_t record, kind;
  int rank, stage, source, value;
};

class MailboxModel {
 public:
  // tp ranks in 1..8, capacity rows in 1..65535, width > 0 and a multiple of 8.
  MailboxModel(int tp, int capacity, int width);

  const mailbox::Layout& layout() const { return layout_; }

  // Rank `rank`'s publisher: rows [0, b) of src (raw BF16 bits, [b, width]
  // row-major) into slot [stage][rank] of every rank's copy, then its claim
  // (call, b, tag) into [stage][rank] of every copy: (call, kFailedRows,
  // tag) where this rank's mailbox has failed, or when the call was
  // published already (which fails this rank's mailbox: kDoublePublish).
  // 1 <= b <= capacity, else InvalidArgument and nothing is written.
  void publish(int rank, const uint16_t* src, int b, uint32_t tag = 0);

  // Rank `rank`'s consumer: waits for every source's claim of this call and
  // rows [0, b) in its own copy and writes them to out ([b, tp * width],
  // column block q from source q), clearing each element it read, then
  // advances. Throws MailboxTimeout (naming rank, stage, source, row) if a
  // slot stays empty for `timeout`, MailboxNoPublish if this rank published
  // nothing since its last consume, MailboxFailed if a source claims other
  // rows, another tag or a failure, or if this rank's mailbox has failed
  // already. Every throw but InvalidArgument fails the mailbox (STATUS),
  // as on the device: later calls of the rank fail too.
  void consume(int rank, uint16_t* out, int b, std::chrono::nanoseconds timeout, uint32_t tag = 0);

  // Rank `rank`'s copy, for checks. Reading a stage a peer may be writing
  // gives either the sentinel or the value being written.
  uint16_t element(int rank, int stage, int source, int row, int col) const;
  // The element at a flat index of rank's copy (3 tp capacity width of
  // them), for tests that compute the layout themselves.
  uint16_t element_at(int rank, int64_t index) const;
  uint32_t state_word(int rank, int word) const;
  uint32_t claim_word(int rank, int stage, int source, int word) const;

 private:
  void check_call(int rank, int b) const;
  std::atomic<uint32_t>& state(int rank, int word) const { return state_[rank * mailbox::kStateWords + word]; }
  [[noreturn]] void fail(int rank, uint32_t record, const std::string& what);

  mailbox::Layout layout_;
  std::vector<std::unique_ptr<std::atomic<uint16_t>[]>> data_;  // [tp] copies
  std::vector<std::unique_ptr<std::atomic<uint32_t>[]>> claims_;  // [tp] copies' claims
  std::unique_ptr<std::atomic<uint32_t>[]> state_;              // [tp][kStateWords]
};

}  // namespace spark_decode::reference
