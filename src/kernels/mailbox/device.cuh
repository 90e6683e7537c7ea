// The device-side steps of the Lamport mailbox, shared by every kernel that
// publishes into or consumes from one: the mailbox's own publish and gather
// kernels, the Pooler's fused gather + norm + NVFP4 consumer, and the GEMM
// engines' publishing epilogues. Each takes the mailbox as a MailboxView
// (spark_decode/mailbox_view.h). Stage and slot arithmetic comes from
// protocol.h; memory-ordering instructions from common/ptx.cuh.
//
// The orderings each step relies on:
//   1. Publisher after consumer on one rank (reading NEXT, and the previous
//      consumer's clear being performed before new stores land): the
//      publisher calls griddepcontrol.wait first, which returns only when
//      every earlier grid of the stream has completed and its memory is
//      visible. The clear stores are thereby performed (in this GPU's L2,
//      the point of coherence of its memory) before any store of the next
//      call is issued, and peers' stores of the call after that arrive
//      later still (protocol.h: they are caused by this publisher's data).
//   2. Consumer after publisher on one rank (reading ACTIVE): the same
//      kernel boundary via griddepcontrol.wait.
//   3. Publisher on rank q to consumer on rank r: no fence, no flag. The
//      data is the flag (Lamport): each 16-byte vector is polled until no
//      BF16 lane holds the sentinel, and every store and load is single-copy
//      atomic at its own size, and the sizes match: every poll is
//      ptx::ld_volatile_v4 (four 32-bit elements in the PTX memory model) and
//      every publishing store writes whole 32-bit words (st_volatile_v4, or
//      st_volatile_u32 for the pooler GEMM's column pairs), so the races
//      are between same-size accesses, which the model defines: a word is
//      either the sentinel pair, or its final value; each lane is checked
//      on its own, so vectors torn between words are harmless. The
//      consumer reads nothing else of the publisher's.
//   4. Polling loads are volatile (relaxed, system scope): they bypass L1
//      and go to L2 every time, where a peer's NVLink store lands. A weak
//      load could be served from a stale L1 line forever.
//   5. State words are read after griddepcontrol.wait and written with
//      relaxed system-scope stores: their readers run in later grids (1, 2).
//      One thread of a grid writes each (any number would write the same
//      value, but stores from every CTA to one word serialise in L2).
//   6. Consumers call griddepcontrol.launch_dependents before their wait, so
//      the next grid (typically the next layer's GEMM) launches as soon as
//      the consumer does and streams its weights into the slots the
//      previous GEMM frees (the Pooler's fused consumer, where measured
//      faster, only once its data has arrived: later is never less safe).
//      That grid may then run while the grid before the consumer still does, so everything in 1-5 rests on each kernel
//      touching the mailbox only after its own griddepcontrol.wait, which
//      returns after the grid before it completed, and that one only after
//      its own wait: completion is ordered along the stream even when
//      launches overlap. No publishing store precedes its kernel's wait.
//      This holds only if every kernel launched with programmatic dependent
//      launch between two of ours executes griddepcontrol.wait before it
//      completes (all of ours do; a caller's kernel in the chain must too).
//      And it assumes one GPU per rank: ranks sharing a GPU can fill its SMs
//      with early-launched CTAs parked in their wait while a peer's kernel
//      that the consumer spins on cannot be scheduled (tests that share a
//      GPU keep host barriers around such steps).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>

#include "kernels/common/ptx.cuh"
#include "kernels/mailbox/protocol.h"
#include "spark_decode/mailbox_view.h"

namespace spark_decode::kernels::mailbox_dev {

using spark_decode::mailbox::Layout;

__host__ __device__ __forceinline__ Layout layout_of(const MailboxView& mb) {
  return Layout{mb.tp, mb.capacity, mb.width};
}


// ---- stage words -------------------------------------------------------------

// Publisher: the stage this call writes (after griddepcontrol.wait).
__device__ __forceinline__ uint32_t read_next(const int32_t* state) {
  return ptx::ld_relaxed_sys_u32(reinterpret_cast<const uint32_t*>(state) + mailbox::kNextWord);
}
// Publisher: ACTIVE = NEXT. Idempotent; one thread of the grid calls it
// (see publish_stage).
__device__ __forceinline__ void set_active(int32_t* state, uint32_t next_word) {
  ptx::st_relaxed_sys_u32(reinterpret_cast<uint32_t*>(state) + mailbox::kActiveWord, next_word);
}
// Consumer: the stage this call reads and the rows of the call before
// (after griddepcontrol.wait).
__device__ __forceinline__ uint32_t read_active(const int32_t* state) {
  return ptx::ld_relaxed_sys_u32(reinterpret_cast<const uint32_t*>(state) + mailbox::kActiveWord);
}
// Consumer: the mailbox's failure status (0: healthy), read after the wait.
__device__ __forceinline__ uint32_t read_status(const int32_t* state) {
  return ptx::ld_relaxed_sys_u32(reinterpret_cast<const uint32_t*>(state) + mailbox::kStatusWord);
}

// Consumer: NEXT = the following stage and this call's rows. Idempotent;
// one thread of the grid calls it.
__device__ __forceinline__ void advance(int32_t* state, uint32_t active_word, int rows) {
  ptx::st_relaxed_sys_u32(reinterpret_cast<uint32_t*>(state) + mailbox::kNextWord,
                          mailbox::advance_word(mailbox::word_stage(active_word), rows));
}

// ---- publishing ----------------------------------------------------------------

// Where a GEMM engine's epilogue publishes its output (docs/design.md,
// "Zero-copy publish and the ticket stage"). It stores exactly what the
// mailbox's publisher would: the same lanes (-0.0 as +0.0) into this rank's
// slot of every copy, at the stage NEXT names, and ACTIVE = NEXT; with a
// ticket, at the ticket's stage and no stage word.
struct Publish {
  enum Mode : int { kNone = 0, kStageWord = 1, kTicket = 2 };
  int mode = kNone;
  int32_t* ticket = nullptr;  // kTicket: int32 [1], the stage in its upper 16 bits
  MailboxView mailbox;

  static Publish none() { return Publish{}; }
  static Publish into(const MailboxView& mb, int32_t* ticket = nullptr) {
    return Publish{ticket ? kTicket : kStageWord, ticket, mb};
  }
};

// The stage a publishing kernel writes; call after griddepcontrol.wait
// (ordering 1: the previous consumer's NEXT and clears are then visible).
// `write_active`: this thread also sets ACTIVE (its reader, the consumer,
// runs in a later grid). Let one thread of the grid write it: a store from
// every CTA to the one word, mixed with every CTA's load of NEXT beside it,
// serialises in its L2 slice (measured with the skinny GEMM's 1024 CTAs:
// docs/perf/mailbox.md). A ticket naming no stage traps: it would send the stores
// outside every copy's slots.
__device__ __forceinline__ uint32_t publish_stage(const Publish& p, bool write_active) {
  if (p.mode == Publish::kStageWord) {
    const uint32_t next = read_next(p.mailbox.state);
    if (write_active) set_active(p.mailbox.state, next);
    return mailbox::word_stage(next);
  }
  const uint32_t stage =
      mailbox::word_stage(ptx::ld_relaxed_sys_u32(reinterpret_cast<const uint32_t*>(p.ticket)));
  if (stage >= static_cast<uint32_t>(mailbox::kStages)) {
    printf("spark-decode: ticket stage %u is not a mailbox stage; trapping\n", stage);
    __trap();
  }
  return stage;
}

// A 16-byte vector as it is published: -0.0 lanes become +0.0.
__device__ __forceinline__ uint4 publish_vec(uint4 v) {
  v.x = mailbox::publish_pair(v.x);
  v.y = mailbox::publish_pair(v.y);
  v.z = mailbox::publish_pair(v.z);
  v.w = mailbox::publish_pair(v.w);
  return v;
}

// How a publisher addresses its own copy: selected from copies[] with
// constant indices (the GEMM epilogues: their code measured as it was
// written so), or through view.local (the publish kernel: with one store per
// thread the compiler turned the selection into a run-time index, which
// copies the parameter array to local memory).
enum class OwnCopy { select, local };

// store(copy) for every rank's copy, peers first (their latency overlaps the
// rest), own copy last. Constant indices only: a runtime index into the
// parameter array would copy it to local memory.
template <OwnCopy kOwn = OwnCopy::select, typename Store>
__device__ __forceinline__ void for_each_copy_peers_first(const MailboxView& mb, Store store) {
#pragma unroll
  for (int q = 0; q < kMailboxMaxRanks; ++q)
    if (q < mb.tp && q != mb.rank) store(mb.copies[q]);
  if constexpr (kOwn == OwnCopy::local) {
    store(mb.local);
  } else {
#pragma unroll
    for (int q = 0; q < kMailboxMaxRanks; ++q)
      if (q == mb.rank) store(mb.copies[q]);
  }
}

// Stores an already published vector at element offset `offset` of every
// rank's copy.
template <OwnCopy kOwn = OwnCopy::select>
__device__ __forceinline__ void store_to_all(const MailboxView& mb, int64_t offset, uint4 v) {
  for_each_copy_peers_first<kOwn>(mb, [&](uint16_t* copy) { ptx::st_volatile_v4(copy + offset, v); });
}

// Two published BF16 lanes (a packed pair, -0.0 as +0.0) at element offset
// `offset` (even) of every rank's copy, as one 32-bit word (ordering 3: the
// pollers load 32-bit elements).
__device__ __forceinline__ void store_pair_to_all(const MailboxView& mb, int64_t offset, uint32_t pair) {
  const uint32_t v = mailbox::publish_pair(pair);
  for_each_copy_peers_first(mb, [&](uint16_t* copy) { ptx::st_volatile_u32(copy + offset, v); });
}

// ---- consuming -------------------------------------------------------------------

// A consumer giving up (a spin timeout, a consume with no publish). The
// first to give up (a compare-and-swap on STATUS: one report, not one per
// thread) writes its record to host-mapped memory, from which the host names
// the failure even after a trap, and prints it; STATUS makes the other
// consumers stop waiting (spin_vec). Then it traps
// (MailboxView::trap_on_failure) or returns, and the caller poisons what it
// could not compute. Out of line, and given scalars rather than the view:
// taking the address of a kernel parameter would make the compiler copy the
// whole parameter block to local memory at every kernel's start.
__device__ __noinline__ inline void record_failure(int32_t* state, uint32_t* host_record, int trap, uint32_t record,
                                                   const char* what) {
  uint32_t* const status = reinterpret_cast<uint32_t*>(state) + mailbox::kStatusWord;
  if (ptx::cas_relaxed_sys_u32(status, 0u, record) == 0u) {
    if (host_record != nullptr) ptx::st_relaxed_sys_u32(host_record, record);
    ptx::fence_acq_rel_sys();  // the record reaches host memory before a trap
    printf("spark-decode mailbox: rank %d: %s (stage %d, source %d, row %d); %s\n", mailbox::record_rank(record),
           what, mailbox::record_stage(record), mailbox::record_source(record), mailbox::record_row(record),
           trap ? "trapping" : "outputs poisoned, the host's next check raises");
  }
  if (trap) __trap();
}
__device__ __forceinline__ void record_failure(const MailboxView& mb, uint32_t record, const char* what) {
  record_failure(mb.state, mb.timeout_record, mb.trap_on_failure, record, what);
}

// Consumer: ACTIVE must equal NEXT (the publisher of this call copied NEXT
// into ACTIVE; the consumer of the last call advanced NEXT past it). A
// consume with no publish since the last one (a skipped publish, a second
// gather) finds them apart: it fails (record_failure) instead of returning
// the previous call's rows. Returns whether the call may go on; one thread
// of the grid checks.
__device__ __forceinline__ bool check_published(const MailboxView& mb, uint32_t active) {
  if (read_next(mb.state) == active) return true;
  record_failure(mb, mailbox::make_record(mailbox::kNoPublish, mb.rank, mailbox::word_stage(active), 0, 0),
                 "consumed with no publish since the last consume (a skipped publish or a second gather)");
  return false;
}

__device__ __forceinline__ bool vec_has_sentinel(const uint4& v) {
  return mailbox::vec_has_sentinel(v.x, v.y, v.z, v.w);
}

// What a consumer gives for data it could not read: BF16 NaNs in every lane.
inline constexpr uint32_t kPoisonPair = 0xffffffffu;
__device__ __forceinline__ uint4 poison_vec() { return make_uint4(kPoisonPair, kPoisonPair, kPoisonPair, kPoisonPair); }

// Spins on the 16-byte vector at `ptr` (in this rank's own copy) until no
// BF16 lane holds the sentinel and returns it. Gives up when STATUS shows
// another consumer failed (read every kStatusPolls spins: one more L2 load
// per spin would slow the common wait) or after mb.spin_timeout_ns
// (record_failure): then sets `failed` and returns poison_vec().
inline constexpr unsigned kStatusPolls = 256;
__device__ __forceinline__ uint4 spin_vec(const uint16_t* ptr, const MailboxView& mb, int stage, int source,
                                          int row, bool& failed) {
  const uint64_t start = ptx::globaltimer_ns();
  for (unsigned spins = 1;; ++spins) {
    const uint4 v = ptx::ld_volatile_v4(ptr);
    if (!vec_has_sentinel(v)) return v;
    if (spins % kStatusPolls == 0 && read_status(mb.state) != 0) break;
    if (ptx::globaltimer_ns() - start > mb.spin_timeout_ns) {
      record_failure(mb, mailbox::make_timeout_record(mb.rank, stage, source, row),
                     "spin timeout: a slot was not published in time (a peer is missing, late or out of order)");
      break;
    }
  }
  failed = true;
  return poison_vec();
}

// Consumer: takes the N 16-byte vectors at `ptr` + 8i (this rank's own copy,
// one slot row): loads them all at once (their L2 round trips overlap),
// spins on any that still holds the sentinel (spin_vec), then restores the
// sentinel in every one it read (protocol.h: the reader clears what it
// read). The clears come after every load: a store into the sector a later
// load of the same thread reads would wait in front of that load.
template <int N>
__device__ __forceinline__ void take_vecs(uint16_t* ptr, const MailboxView& mb, int stage, int source, int row,
                                          uint4 (&v)[N], bool& failed) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = ptx::ld_volatile_v4(ptr + i * mailbox::kVecElems);
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (vec_has_sentinel(v[i])) v[i] = spin_vec(ptr + i * mailbox::kVecElems, mb, stage, source, row, failed);
  if (failed) return;
  const uint4 sentinel = make_uint4(mailbox::kSentinelPair, mailbox::kSentinelPair, mailbox::kSentinelPair,
                                    mailbox::kSentinelPair);
#pragma unroll
  for (int i = 0; i < N; ++i) ptx::st_v4(ptr + i * mailbox::kVecElems, sentinel);
}

}  // namespace spark_decode::kernels::mailbox_dev
