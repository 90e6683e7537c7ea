// spark_decode/mailbox_view.h: what a kernel needs of a Lamport mailbox.
//
// A plain struct (pointers and sizes, no CUDA headers), returned by
// LamportMailbox::view() and passed by value to every kernel that publishes
// into the mailbox or consumes from it: the mailbox's own publish and gather,
// the unpooler's zero-copy epilogue, the pooler GEMM's fused publish and the
// fused gather + norm + NVFP4 consumer. The protocol these pointers serve is
// in docs/design.md, "The Lamport mailbox protocol".
#pragma once

#include <cstdint>

namespace spark_decode {

inline constexpr int kMailboxMaxRanks = 8;

struct MailboxView {
  // Every rank's copy, data BF16 bits [3 stages][tp sources][capacity rows]
  // [width], as this rank's device addresses it; copies[rank] is its own.
  uint16_t* copies[kMailboxMaxRanks] = {};
  // copies[rank], the copy this rank's consumers poll and clear. Apart, so
  // that no kernel indexes copies by a run-time value: that would make the
  // compiler copy the parameter array into local memory.
  uint16_t* local = nullptr;
  int32_t* state = nullptr;           // this rank's stage state, int32 [3]: NEXT, ACTIVE, STATUS
  uint32_t* timeout_record = nullptr;  // host-mapped word a timing-out consumer reports into
  uint64_t spin_timeout_ns = 0;        // a consumer gives up on a slot after this long
  int tp = 0, rank = 0, capacity = 0, width = 0;
  // The call's tag (16 bits; docs/design.md, "The Lamport mailbox
  // protocol"): what a publisher claims with its rows and what a consumer
  // requires of every source's claim. The Pooler sets it to the layer per
  // call (on a copy of the view), so ranks calling different layers fail
  // instead of mixing them; 0 where the caller gives none.
  uint32_t tag = 0;
  // What a consumer does when it gives up (a spin timeout, a consume with no
  // publish): 0 records the failure (host word and STATUS), poisons the
  // outputs it could not make and returns; 1 records it and traps.
  int trap_on_failure = 0;
};

}  // namespace spark_decode
