// The mailbox's own kernels: publish and the plain gather consumer.
#pragma once

#include <cuda_bf16.h>

#include "kernels/common/trace.cuh"
#include "kernels/mailbox/device.cuh"

namespace spark_decode::kernels {

struct MailboxPublishArgs {
  const __nv_bfloat16* src;  // [b, width], this rank's block
  MailboxView mailbox;
  int b;
};

// One thread per 16-byte vector of the b source rows; each stores its vector
// into all tp copies. Grid ceil(b * width / 8 / threads).
__global__ void mailbox_publish_kernel(const MailboxPublishArgs a) {
  SPARK_TRACE_CTA(kPublish);
  // The source rows come from the previous grid and NEXT from the previous
  // consumer: nothing may be read before this.
  ptx::griddep_wait();
  SPARK_TRACE_WAITED();
  ptx::griddep_launch_dependents();
  const MailboxView& mb = a.mailbox;
  // The leader (one thread of the grid) also sets ACTIVE and the claim.
  const int stage = mailbox_dev::stage_word_publish(mb, a.b, threadIdx.x == 0 && blockIdx.x == 0);

  const mailbox::Layout layout = mailbox_dev::layout_of(mb);
  const int vecs = layout.row_vecs();
  const int v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= a.b * vecs) return;
  const int row = v / vecs, col = (v % vecs) * mailbox::kVecElems;
  const uint4 data = mailbox_dev::publish_vec(ptx::ld_v4(a.src + int64_t(row) * layout.width + col));
  mailbox_dev::store_to_all<mailbox_dev::OwnCopy::local>(mb, layout.offset(stage, mb.rank, row, col),
                                                          data);
}

struct MailboxGatherArgs {
  __nv_bfloat16* out;  // [b, tp * width]
  MailboxView mailbox;
  int b;
  // Where the next grid may launch: at this grid's start (1), or once this
  // thread's data has arrived (0: where ranks share a GPU, so that no CTA
  // of a later kernel parks on an SM while this one waits for a peer).
  int launch_next_early;
};

// Grid (b, ceil(tp * width / 8 / threads)): CTA (i, j) thread t owns the 8
// columns [8f, 8f + 8) of output row i, f = j * threads + t, which come from
// source f / (width / 8). It takes them from the mailbox (poll, then clear)
// and stores them; if the mailbox failed, the poison (device.cuh).
__global__ void mailbox_gather_kernel(const MailboxGatherArgs a) {
  SPARK_TRACE_CTA(kGather);
  // The next grid may launch now (device.cuh, ordering 6); ACTIVE comes from
  // this call's publisher.
  if (a.launch_next_early) ptx::griddep_launch_dependents();
  ptx::griddep_wait();
  SPARK_TRACE_WAITED();
  const MailboxView& mb = a.mailbox;
  const uint4 state = mailbox_dev::read_state(mb.state);
  const uint32_t active = state.y;
  // A failed mailbox (STATUS set) gives nothing but poison from now on.
  bool failed = state.z != 0;
  SPARK_TRACE_MARK(0, active);  // ACTIVE has arrived
  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0 && !failed && mailbox_dev::check_published(mb, state))
    mailbox_dev::advance(mb.state, active, a.b);

  const mailbox::Layout layout = mailbox_dev::layout_of(mb);
  const int vecs = layout.row_vecs();
  const int row = blockIdx.x;
  const int fragment = blockIdx.y * blockDim.x + threadIdx.x;
  if (fragment >= layout.tp * vecs) return;
  const int source = fragment / vecs, col = (fragment % vecs) * mailbox::kVecElems;
  const int stage = mailbox::word_stage(active);
  uint4 v[1];
  mailbox_dev::take_vecs(mb.local + layout.offset(stage, source, row, col), mb, mailbox_dev::expect(active, a.b), stage,
                         source, row, v, failed);
  if (!a.launch_next_early) ptx::griddep_launch_dependents();
  ptx::st_v4(a.out + int64_t(row) * layout.tp * layout.width + int64_t(fragment) * mailbox::kVecElems, v[0]);
}

}  // namespace spark_decode::kernels
