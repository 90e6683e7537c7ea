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
//      that the consumer spins on cannot be scheduled. So where ranks share
//      a GPU, consumers trigger only once their data has arrived, and the
//      mailbox's kernels launch without the attribute (mailbox.h,
//      shares_device).
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

// Publisher: ACTIVE = NEXT. Idempotent; one thread of the grid calls it
// (see publish_stage).
__device__ __forceinline__ void set_active(int32_t* state, uint32_t next_word) {
  ptx::st_relaxed_sys_u32(reinterpret_cast<uint32_t*>(state) + mailbox::kActiveWord, next_word);
}
// Consumer: the mailbox's failure status (0: healthy), read after the wait.
__device__ __forceinline__ uint32_t read_status(const int32_t* state) {
  return ptx::ld_relaxed_sys_u32(reinterpret_cast<const uint32_t*>(state) + mailbox::kStatusWord);
}
// NEXT, ACTIVE and STATUS in one load (x, y, z; each word single-copy
// atomic; the state is 16-byte aligned with a fourth, unused word), after
// the wait: a consumer's ACTIVE, STATUS and (its leader) NEXT, a
// publisher's NEXT and (its leader) ACTIVE and STATUS, at the cost of one
// L2 round trip. Every thread of a grid loads the same words with the same
// instruction: a leader that loaded apart from its warp (a divergent
// branch) would make that warp wait for two round trips in turn.
__device__ __forceinline__ uint4 read_state(const int32_t* state) { return ptx::ld_volatile_v4(state); }

// Consumer: NEXT = the following stage and this call's rows. Idempotent;
// one thread of the grid calls it.
__device__ __forceinline__ void advance(int32_t* state, uint32_t active_word, int rows) {
  ptx::st_relaxed_sys_u32(reinterpret_cast<uint32_t*>(state) + mailbox::kNextWord,
                          mailbox::advance_word(active_word, rows));
}

// ---- failures ------------------------------------------------------------------

// A consumer or publishing leader giving up (a spin timeout, a consume with
// no publish, a claim that differs, a second publish). The
// first to give up (a compare-and-swap on STATUS: one report, not one per
// thread) writes its record to host-mapped memory, from which the host names
// the failure even after a trap, and prints it; STATUS makes the other
// consumers stop waiting (wait_for_call). Then it traps
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

// ---- publishing ----------------------------------------------------------------

// Where a GEMM engine's epilogue publishes its output (docs/design.md,
// "Zero-copy publish and the ticket stage"). It stores exactly what the
// mailbox's publisher would: the same lanes (-0.0 as +0.0) into this rank's
// slot of every copy, at the stage NEXT names, ACTIVE = NEXT and the claim
// of `rows` rows and the view's tag; with a ticket, at the ticket's call and
// no stage word.
struct Publish {
  enum Mode : int { kNone = 0, kStageWord = 1, kTicket = 2 };
  int mode = kNone;
  int32_t* ticket = nullptr;  // kTicket: int32 [1], a call counter in its upper 16 bits
  int rows = 0;               // the rows this call publishes (the GEMM's m)
  MailboxView mailbox;

  static Publish none() { return Publish{}; }
  static Publish into(const MailboxView& mb, int32_t* ticket, int rows) {
    return Publish{ticket ? kTicket : kStageWord, ticket, rows, mb};
  }
};

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

// The leader's claim of its call into [stage][rank] of every copy (the
// claims follow the data: protocol.h). Peers first, as the data.
__device__ __forceinline__ void store_claims(const MailboxView& mb, int stage, uint32_t call, int rows) {
  const mailbox::Layout layout{mb.tp, mb.capacity, mb.width};
  const int64_t at = layout.claims_byte_offset() + 4 * int64_t(layout.claim_index(stage, mb.rank));
  const uint2 claim = make_uint2(mailbox::claim_rows_word(call, rows), mailbox::claim_tag_word(call, mb.tag));
  for_each_copy_peers_first(mb, [&](uint16_t* copy) { ptx::st_volatile_v2(reinterpret_cast<char*>(copy) + at, claim); });
}

// The stage a publishing kernel writes; call after griddepcontrol.wait
// (ordering 1: the previous consumer's NEXT and clears are then visible).
// `leader`: this thread also sets ACTIVE (its reader, the consumer, runs in
// a later grid) and stores the call's claim into every copy. Let one thread
// of the grid be the leader: a store from every CTA to the one word, mixed
// with every CTA's load of NEXT beside it, serialises in its L2 slice
// (measured with the skinny GEMM's 1024 CTAs: docs/perf/mailbox.md). The
// leader claims failure (kFailedRows) when this rank's mailbox has failed
// or the call was published already (ACTIVE == NEXT: a second publish,
// whose stores may have replaced rows a peer took): every peer then fails at
// this call instead of taking its rows. A ticket naming no call traps: it
// would send the stores outside every copy's slots.
// `state`: this thread's read_state.
__device__ __forceinline__ int lead_publish(const MailboxView& mb, uint4 state, int rows) {
  bool failed = state.z != 0;
  if (state.y == state.x) {
    record_failure(mb.state, mb.timeout_record, mb.trap_on_failure,
                   mailbox::make_record(mailbox::kDoublePublish, mb.rank, mailbox::word_stage(state.x), mb.rank, 0),
                   "published twice with no consume in between");
    failed = true;
  }
  set_active(mb.state, state.x);
  const int stage = mailbox::word_stage(state.x);
  store_claims(mb, stage, mailbox::word_call(state.x), failed ? mailbox::kFailedRows : rows);
  return stage;
}

// The stage a publisher of the stage word writes, every thread of the grid
// loading the state once (read_state); `leader` as in lead_publish.
__device__ __forceinline__ int stage_word_publish(const MailboxView& mb, int rows, bool leader) {
  const uint4 state = read_state(mb.state);
  return leader ? lead_publish(mb, state, rows) : mailbox::word_stage(state.x);
}

__device__ __forceinline__ int publish_stage(const Publish& p, bool leader) {
  const MailboxView& mb = p.mailbox;
  if (p.mode == Publish::kStageWord) return stage_word_publish(mb, p.rows, leader);
  // The leader's STATUS load is issued before the ticket is used, so the
  // two round trips overlap.
  const uint32_t ticket = ptx::ld_relaxed_sys_u32(reinterpret_cast<const uint32_t*>(p.ticket));
  const uint32_t status = leader ? read_status(mb.state) : 0u;
  const uint32_t call = mailbox::word_call(ticket);
  if (call >= mailbox::kCallPeriod) {
    printf("spark-decode: ticket call %u is not a mailbox call counter; trapping\n", call);
    __trap();
  }
  const int stage = int(call % mailbox::kStages);
  if (leader) store_claims(mb, stage, call, status != 0 ? mailbox::kFailedRows : p.rows);
  return stage;
}

// ---- consuming -------------------------------------------------------------------

// Consumer: ACTIVE must equal NEXT (the publisher of this call copied NEXT
// into ACTIVE; the consumer of the last call advanced NEXT past it). A
// consume with no publish since the last one (a skipped publish, a second
// gather) finds them apart: it fails (record_failure) instead of returning
// the previous call's rows. Returns whether the call may go on; one thread
// of the grid, the one that then advances NEXT, checks, from its own
// read_state (no other thread of the grid writes NEXT before its check).
__device__ __forceinline__ bool check_published(const MailboxView& mb, uint4 state) {
  const uint32_t active = state.y;
  if (state.x == active) return true;
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

// What a consumer thread expects of the call it takes: the call ACTIVE
// names and its own rows (the tag is the view's).
struct Expect {
  uint32_t call;
  int rows;
};
__device__ __forceinline__ Expect expect(uint32_t active, int rows) { return Expect{mailbox::word_call(active), rows}; }

// The claim of (stage, source) in this rank's own copy.
__device__ __forceinline__ const uint32_t* claim_of(const MailboxView& mb, int stage, int source) {
  const Layout layout = layout_of(mb);
  return reinterpret_cast<const uint32_t*>(reinterpret_cast<const char*>(mb.local) + layout.claims_byte_offset()) +
         layout.claim_index(stage, source);
}

__device__ __forceinline__ const char* claim_failure_text(int check) {
  return check == mailbox::kClaimRowsDiffer ? "a peer published this call with other rows (b differs across ranks)"
         : check == mailbox::kClaimTagDiffer
             ? "a peer published this call with another tag (another layer: the ranks' calls differ)"
             : "a peer's mailbox had failed, or it published this call twice";
}

// The wait of take_vecs once its first loads found a vector still holding
// the sentinel or the claim not yet this call's: reloads what is missing
// (the vectors and the claim together, so that the claim, stored before the
// data, is seen in the round trip that brings the data) until everything
// is there. Gives up when the claim differs from what this consumer expects
// (record_failure), when STATUS shows another thread of the mailbox gave up
// (read every kStatusPolls spins: one more L2 load per spin would slow the
// common wait), or after mb.spin_timeout_ns (record_failure): then sets
// `failed`.
//
// A claim of other rows or another tag counts only once this thread's data
// has arrived. A consume with no publish since the last one expects the
// last call (ACTIVE has not moved) and finds that call's claims beside data
// its consumer already cleared: its claims may name other rows than this
// consume's b, yet the failure is the missing publish, which the grid's
// leader names (check_published) and every waiting thread then sees in
// STATUS. Where a peer really claimed other rows or another tag, its data
// does arrive (row 0 at least of every source), so the thread that takes it
// names the difference. A failed peer's claim needs no data: it counts at
// once.
inline constexpr unsigned kStatusPolls = 256;
template <int N>
__device__ __forceinline__ void wait_for_call(const uint16_t* ptr, const uint32_t* claim_ptr, const MailboxView& mb,
                                           Expect e, int stage, int source, int row, uint4 (&v)[N], uint2 claim,
                                           bool& failed) {
  const uint64_t start = ptx::globaltimer_ns();
  for (unsigned spins = 1;; ++spins) {
    int check = mailbox::check_claim(claim.x, claim.y, e.call, e.rows, mb.tag);
    bool missing = false;
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (vec_has_sentinel(v[i])) {
        v[i] = ptx::ld_volatile_v4(ptr + i * mailbox::kVecElems);
        missing |= vec_has_sentinel(v[i]);
      }
    if (check == mailbox::kClaimPending) {
      claim = ptx::ld_volatile_v2(claim_ptr);
      check = mailbox::check_claim(claim.x, claim.y, e.call, e.rows, mb.tag);
    }
    if (!missing && check == mailbox::kClaimMatches) return;
    if (check == mailbox::kClaimPeerFailed || (!missing && check != mailbox::kClaimPending)) {
      const int theirs = mailbox::claim_detail(check, claim.x, claim.y);
      record_failure(mb, mailbox::make_record(mailbox::claim_record_kind(check), mb.rank, stage, source, theirs),
                     claim_failure_text(check));
      break;
    }
    if (spins % kStatusPolls == 0 && read_status(mb.state) != 0) break;
    if (ptx::globaltimer_ns() - start > mb.spin_timeout_ns) {
      record_failure(mb, mailbox::make_timeout_record(mb.rank, stage, source, row),
                     "spin timeout: a slot was not published in time (a peer is missing, late or out of order)");
      break;
    }
  }
  failed = true;
}

// Consumer: takes the N 16-byte vectors at `ptr` + 8i (this rank's own copy,
// one slot row of `source`) of the call `e`: loads them and the source's
// claim all at once (their L2 round trips overlap), waits for what is
// missing (wait_for_call), then restores the sentinel in every vector it
// read (protocol.h: the reader clears what it read). The clears come after
// every load: a store into the sector a later load of the same thread reads
// would wait in front of that load. Nothing is taken once `failed` is set
// (on entry: STATUS was set when the consumer started); then every vector
// is poison_vec(), as it is when the wait gives up.
template <int N>
__device__ __forceinline__ void take_vecs(uint16_t* ptr, const MailboxView& mb, Expect e, int stage, int source,
                                          int row, uint4 (&v)[N], bool& failed) {
  if (!failed) {
    const uint32_t* const claim_ptr = claim_of(mb, stage, source);
    const uint2 claim = ptx::ld_volatile_v2(claim_ptr);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = ptx::ld_volatile_v4(ptr + i * mailbox::kVecElems);
    bool missing = false;
#pragma unroll
    for (int i = 0; i < N; ++i) missing |= vec_has_sentinel(v[i]);
    if (missing || mailbox::check_claim(claim.x, claim.y, e.call, e.rows, mb.tag) != mailbox::kClaimMatches)
      wait_for_call(ptr, claim_ptr, mb, e, stage, source, row, v, claim, failed);
  }
  if (failed) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = poison_vec();
    return;
  }
  const uint4 sentinel = make_uint4(mailbox::kSentinelPair, mailbox::kSentinelPair, mailbox::kSentinelPair,
                                    mailbox::kSentinelPair);
#pragma unroll
  for (int i = 0; i < N; ++i) ptx::st_v4(ptr + i * mailbox::kVecElems, sentinel);
}

}  // namespace spark_decode::kernels::mailbox_dev
