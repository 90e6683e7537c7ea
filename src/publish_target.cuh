// Host side of a kernel publishing into a LamportMailbox it does not own (the
// Unpooler's zero-copy epilogue, the pooler GEMM's): the device-side target
// built from the mailbox, in one place.
#pragma once

#include <cstdint>

#include "kernels/mailbox/mailbox_device.cuh"
#include "spark_decode/mailbox.h"

namespace spark_decode {

// Every copy as this device addresses it, this rank's slot, and the stage
// source: the mailbox's own stage state, or `ticket` (int32 [1], stage in its
// upper 16 bits) when given.
inline kernels::mailbox_dev::PublishTarget publish_target(const LamportMailbox& mb, int32_t* ticket = nullptr) {
  using Target = kernels::mailbox_dev::PublishTarget;
  Target p;
  p.mode = ticket ? Target::kTicket : Target::kStageWord;
  p.rank = mb.rank();
  p.layout = mailbox::Layout{mb.tp(), mb.capacity(), mb.width()};
  for (int q = 0; q < mb.tp(); ++q) p.copies[q] = static_cast<uint16_t*>(mb.copies()[q]);
  p.state = ticket ? ticket : mb.stage_state();
  return p;
}

}  // namespace spark_decode
