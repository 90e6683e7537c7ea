// spark_decode/mailbox.h: the Lamport mailbox (docs/design.md, "The Lamport
// mailbox protocol").
//
// Every rank of a tensor-parallel group publishes a block of `width` BF16
// columns for b rows; every rank gathers all tp blocks into full rows,
// [b, tp * width], with no host round trip and no NCCL. Publishers write
// straight into every rank's copy with peer-to-peer stores over NVLink
// (peer-mapped memory: CUDA IPC across processes, peer access within one);
// the data is its own flag: BF16 -0.0 (bits 0x8000) means "not yet written",
// publishers store -0.0 as +0.0, and consumers spin until no lane of their
// rows holds the sentinel. No NVLink multicast.
//
// Memory per rank (SymmetricMemory over the group, allocated and filled at
// construction):
//   data   BF16 [3 stages][tp sources][capacity rows][width], 256-byte aligned,
//          then the claims uint32 [3 stages][tp sources][2] (each source's
//          call counter, rows and tag);
//   state  int32 [3]: NEXT (written by consumers) and ACTIVE (written by
//          publishers), call << 16 | rows, and STATUS. See
//          src/kernels/mailbox/protocol.h.
// Kernels take it as a MailboxView (view()).
// The stage advances on the device, once per call, so a captured CUDA graph
// replays correctly any number of times.
//
// Calls. One call = publish(b) then a consumer (gather(b), or a fused
// consumer of a later component) on every rank, in the same order on every
// rank, with the same b (1 <= b <= capacity) on every rank. Nothing else may
// run a publisher or consumer of this mailbox in between. Kernels that run
// between the publisher and the consumer on a stream, or between the
// consumer and the next publisher, must be ordinary stream-ordered kernels
// (or, with programmatic dependent launch, call griddepcontrol.wait before
// they end): the protocol's ordering rests on each mailbox kernel's
// griddepcontrol.wait seeing every earlier grid of the stream complete.
//
// Requirements (checked; InvalidArgument, nothing launched):
//   tp == group.size() in 1..8, rank == group.rank(), 1 <= capacity <= 65535,
//   width > 0 and width % 8 == 0, device of compute capability 9.0 or newer
//   (RuntimeError below), every pair of GPUs peer-to-peer capable
//   (RuntimeError naming the pair);
//   publish: src device pointer to b contiguous rows of `width` BF16,
//            16-byte aligned, on the mailbox's device;
//   gather:  out device pointer to b contiguous rows of tp * width BF16,
//            16-byte aligned, on the mailbox's device, not the mailbox;
//   1 <= b <= capacity; the mailbox's device current on the calling thread.
//
// What publish/gather may not do: allocate, synchronise, or prepare
// kernels. Both are CUDA-graph capturable (each enqueues one kernel).
//
// Failures: a consumer that waits longer than Options::spin_timeout_s for a
// slot (a peer missing, late, or calling in another order), that runs with
// no publish since the last consume (a skipped publish, a second gather),
// or whose peer claims other rows (another b), another tag (the Pooler: a
// rank calling another layer) or a failure of its own (its mailbox had
// failed, or it published the call twice), gives up. It records the kind, rank, stage,
// source and row (device STATUS word and a host-mapped word) and, per
// Options::on_failure:
//   poison (default): stops waiting, stores the poison into the outputs it
//     could not make (BF16 NaN 0xFFFF; NVFP4: every scale byte of the row
//     0x7F, an E4M3 NaN, over zero codes), and returns. Every consumer of
//     the mailbox then stops waiting too. The CUDA context stays usable: the
//     next host-side check (check(), synchronize(), barrier(), or the next
//     call of any entry point that uses the mailbox) throws RuntimeError
//     naming the failure, and the caller destroys the mailbox (and what
//     uses it) and builds new ones. The default because a trap takes down
//     every rank that shares the process and every later CUDA call in it.
//   trap: printf's the record and traps. The device's CUDA context is lost
//     for the rest of the process; synchronize() names the failure. For
//     debugging under a tool that stops at the trap.
// Either way a consumer never returns data of another call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "spark_decode/group.h"
#include "spark_decode/mailbox_view.h"
#include "spark_decode/symmetric_memory.h"
#include "spark_decode/types.h"

namespace spark_decode {
namespace detail {
class EnqueueOrder;
}

// Filler of the optional guard regions around a mailbox's allocation.
inline constexpr uint8_t kMailboxGuardByte = 0xa5;

class LamportMailbox {
 public:
  // What a consumer does when it gives up (see "Failures" above).
  enum class OnFailure { poison, trap };
  struct Options {
    // A consumer gives up after waiting this long for one slot; in (0, 3600)
    // seconds (InvalidArgument otherwise).
    double spin_timeout_s = 5.0;
    OnFailure on_failure = OnFailure::poison;
    // Bytes of kMailboxGuardByte before and after the data and state in the
    // allocation (for tests that check nothing writes outside the mailbox).
    size_t guard_bytes = 0;
  };
  struct PublishOptions {
    int threads = 128;            // threads per CTA, a multiple of 32 in [32, 1024]
    bool enable_pdl = true;       // programmatic dependent launch
  };
  struct GatherOptions {
    int threads = 128;  // threads per CTA, a multiple of 32 in [32, 1024]
    bool enable_pdl = true;
  };

  // Collective over `group`: every rank constructs its mailbox with the same
  // tp, capacity, width and options. Returns after every rank's copy is
  // initialised (a group barrier), so no peer can publish into a copy
  // before its owner has filled it with the sentinel. Fails on every rank
  // when any rank fails (its arguments, its allocation, a peer mapping, or
  // a capacity / width / guard_bytes that differs from another rank's): the
  // failing rank throws its own reason, the others RuntimeError naming it.
  // Allocates device memory (peer-mapped) and a pinned host word for
  // timeout reports, and synchronises the device: not under CUDA graph
  // capture.
  LamportMailbox(Group& group, int tp, int rank, int capacity, int width, int device,
                 Options options);
  LamportMailbox(Group& group, int tp, int rank, int capacity, int width, int device)
      : LamportMailbox(group, tp, rank, capacity, width, device, Options{}) {}
  // Not collective and not synchronising with peers: call barrier() on every
  // rank first, so that no peer still writes into this rank's copy.
  ~LamportMailbox();
  LamportMailbox(const LamportMailbox&) = delete;
  LamportMailbox& operator=(const LamportMailbox&) = delete;

  // Rows [0, b) of src [b, width] into this rank's slot of every rank's
  // copy, at the stage the device state names.
  void publish(const void* src, int b, cudaStream_t stream, const PublishOptions& options);
  void publish(const void* src, int b, cudaStream_t stream) {
    publish(src, b, stream, PublishOptions{});
  }
  void publish(const TensorRef& src, cudaStream_t stream, const PublishOptions& options);
  void publish(const TensorRef& src, cudaStream_t stream) {
    publish(src, stream, PublishOptions{});
  }

  // The plain gather consumer: out[i, q * width + j] = rank q's published
  // row i, column j, for i < b; then clears the previous call's stage and
  // advances. Grid (b, ceil(tp * width / 8 / threads)), one thread per 8
  // columns of one row.
  void gather(void* out, int b, cudaStream_t stream, const GatherOptions& options);
  void gather(void* out, int b, cudaStream_t stream) { gather(out, b, stream, GatherOptions{}); }
  void gather(const TensorRef& out, cudaStream_t stream, const GatherOptions& options);
  void gather(const TensorRef& out, cudaStream_t stream) { gather(out, stream, GatherOptions{}); }

  // cudaStreamSynchronize(stream), then check().
  void synchronize(cudaStream_t stream) const;
  // The same for an error a caller got from its own synchronisation.
  void raise_if_failed(cudaError_t err) const;
  // RuntimeError naming the failure if a consumer of this rank has given up
  // (no CUDA call: a read of the host-mapped record, so cheap enough for
  // every entry point, which each calls it first). A consumer still running
  // may record a failure later: check after synchronising for a final word.
  void check() const;
  // The failure this rank's consumers recorded, if any.
  std::optional<std::string> timeout_report() const;

  // Collective, not capturable: waits for every rank, runs one publish +
  // gather of `capacity` rows of zeros on `stream` so that first-launch
  // costs are paid here, synchronises, and waits for every rank again.
  // Allocates (and frees) scratch: call it before capture.
  void warm_up(cudaStream_t stream);
  // Collective: synchronises this rank's device, then the group.
  void barrier();

  int tp() const { return tp_; }
  int rank() const { return rank_; }
  int capacity() const { return capacity_; }
  int width() const { return width_; }
  int device() const { return device_; }
  // What a kernel that publishes into or consumes from this mailbox takes:
  // every rank's copy as this device maps it, the stage state, the layout,
  // the spin limit. A plain struct, passed by value.
  const MailboxView& view() const { return view_; }
  // The whole allocation, guards included (view().copies[rank()] and
  // view().state lie in it).
  const SymmetricMemory& memory() const { return *memory_; }
  // Whether another rank of the group runs on this rank's GPU (found at
  // construction from the GPUs' UUIDs). Then every kernel that publishes into
  // or consumes from this mailbox (its own, the zero-copy Unpooler's, the
  // Pooler's) launches without programmatic dependent launch: CTAs of a
  // rank's next kernel, launched early and parked in griddepcontrol.wait,
  // could fill the SMs a peer's producer needs while this rank's consumer
  // spins on it (docs/design.md, "The Lamport mailbox protocol", ordering 6).
  // The bits are the same; only the overlap between kernels is lost. And
  // its consumers let the next grid launch only once their data has
  // arrived, so that a caller's kernel launched with programmatic dependent
  // launch after a consumer cannot park on the SMs either. The caller's
  // side of the same rule: while a peer on the same GPU may be
  // waiting for this rank's next publish, this rank may not wait for the
  // whole device (cudaDeviceSynchronize, a synchronous copy on a blocking
  // stream, a first launch of a lazily loaded kernel): synchronise its own
  // stream instead. The library loads every kernel it launches at
  // construction.
  bool shares_device() const { return shares_device_; }

  // Where any two ranks of the group share a GPU, the host order of launches
  // that keeps the GPU's hardware queues moving (docs/design.md, "Ranks
  // sharing a GPU"): every rank's publisher of a call is enqueued before any
  // rank's consumer of it. A component that launches a publisher into this
  // mailbox calls publish_enqueued() right after the launch, one that
  // launches a consumer calls before_consume(stream) right before it, which
  // waits (on the host, at most Options::spin_timeout_s) for every peer's
  // publisher of the call. No-ops where every rank has its own GPU. The
  // mailbox's publish and gather, the Pooler and the zero-copy Unpooler do
  // this; a caller's own kernel on the view() must too. Under CUDA graph
  // capture nothing waits: the host cannot order a graph's replays (the
  // design's note on CUDA_DEVICE_MAX_CONNECTIONS says what to do).
  void publish_enqueued();
  void before_consume(cudaStream_t stream);
  // Whether the launches are ordered so (any two ranks share a GPU).
  bool orders_enqueues() const { return enqueue_order_ != nullptr; }

 private:
  int tp_, rank_, capacity_, width_, device_;
  Group* group_;
  std::unique_ptr<SymmetricMemory> memory_;
  MailboxView view_;
  bool shares_device_ = false;
  std::unique_ptr<detail::EnqueueOrder> enqueue_order_;
  uint32_t* record_host_ = nullptr;
};

}  // namespace spark_decode
