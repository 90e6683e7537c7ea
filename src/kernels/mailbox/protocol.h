// The Lamport mailbox protocol: every stage, slot and word computation of it.
//
// Plain C++ compiled by nvcc for the device kernels (publish, gather, the
// fused consumers, the Unpooler's zero-copy epilogue) and by the host
// compiler for the CPU model (src/reference/mailbox_model.cpp), so that the
// model checks the very arithmetic the GPU runs. Nothing here touches memory.
//
// Memory of one rank (docs/design.md, "The Lamport mailbox protocol"):
//   data   BF16 [kStages][tp sources][capacity rows][width]   (raw uint16 bits)
//   claims uint32 [kStages][tp sources][kClaimWords], right after the data:
//          what the publisher of a slot's current call claims (its call
//          counter, its rows, its tag); written by that source's publisher,
//          read (never cleared) by this rank's consumers.
//   state  int32 [3] (read and written as uint32):
//     state[kNextWord]   NEXT   = (call << 16) | rows of the last call, where
//                        call counts this rank's consumes modulo kCallPeriod
//                        and call % kStages is the stage the next call uses.
//                        Written only by this rank's consumers, read by its
//                        publishers.
//     state[kActiveWord] ACTIVE = the NEXT word the last publish read (its
//                        call). Written only by this rank's publishers, read
//                        by its consumers (and by the publishers: a publish
//                        that finds ACTIVE == NEXT is the call's second).
//     state[kStatusWord] STATUS = 0 while the mailbox is healthy, else the
//                        failure record (below) of a consumer or publisher
//                        that gave up. Once it is set, this rank's consumers
//                        poison what they have not read and its publishers
//                        claim failure, so every peer fails at its next call.
//   Initially NEXT = STATUS = 0, ACTIVE = kNeverPublished, every claim word
//   kNoClaim, and every data element holds the sentinel.
//
// Call k (counter c) with b rows and tag g (b and g the same on every rank)
// on rank q:
//   publisher: after griddepcontrol.wait, read NEXT -> c, stage s = c % 3.
//     Store rows [0, b) of the source into slot [s][q] of EVERY rank's copy,
//     this rank's own included, BF16 -0.0 stored as +0.0 (publish_bits). One
//     thread of the grid (the leader) writes ACTIVE = NEXT and the claim
//     (c, b, g) into [s][q] of every copy; (c, kFailedRows, g) if STATUS is
//     set or ACTIVE already equals NEXT (a second publish of the call).
//   consumer: after griddepcontrol.wait, read ACTIVE -> c, s; with STATUS set
//     it poisons everything at once. One thread checks ACTIVE == NEXT (else
//     no publish ran since the last consume: a failure, kNoPublish) and
//     writes NEXT = advance_word(ACTIVE, b). Every thread spins on its
//     elements of its own copy's slots [s][*] rows [0, b) until no BF16 lane
//     holds the sentinel, and on the claim of each source it read until the
//     claim names call c; a claim of other rows or another tag, once the
//     thread's data has arrived, or of a failed peer, at once, is a failure
//     (kRowsDiffer, kTagDiffer, kPeerFailed). Then it
//     restores the sentinel in the data it read and produces the output.
//
// Why claims carry the counter and are never cleared: many consumer threads
// read each claim (every thread checks the claim of each source it takes
// data from, so that no output is made from a call it has not matched), so
// no one of them could clear it. A claim from an older call of the same
// stage names another counter (c - 3j is c modulo kCallPeriod only for j a
// multiple of 21845 calls), so it reads as "not yet written".
//
// Why a consumer may clear the data it just read:
//   every element of a stage is written once per call and read by one
//   consumer thread, which clears it after seeing it non-sentinel: the
//   peer's store is then coherence-before the clear. The next store into
//   that stage of rank r's copy comes from a publisher of call k+3 (stages
//   rotate mod 3), and even one of call k+2 could not overtake the clear: a
//   peer q's publisher k+2 runs after q's
//   consumer k+1, which needs r's publisher k+1, which runs after r's
//   consumer k has completed (stream order + griddepcontrol.wait): its
//   clears are performed before anything of call k+2 is stored.
//   So while r runs consumer k, peers may be writing stage s_{k+1} of its
//   copy but no other: two stages would do; the third is slack that costs
//   only memory. And a consume that runs with no publish since the last
//   one finds nothing but sentinels: it cannot return the last call's rows.
#pragma once

#include <cstdint>

#include "spark_decode/bf16.h"

#if defined(__CUDACC__)
#define SPARK_MAILBOX_HD __host__ __device__ __forceinline__
#else
#define SPARK_MAILBOX_HD inline
#endif

namespace spark_decode::mailbox {

inline constexpr int kStages = 3;
inline constexpr int kMaxRanks = 8;  // tp in {1, 2, 4, 8}
inline constexpr int kMaxRows = 0xffff;  // rows must fit the word's low 16 bits
// BF16 -0.0: "not yet written". Tested on raw bits only: a float compare
// would also take +0.0, and flush-to-zero turns negative subnormals into -0.0.
inline constexpr uint16_t kSentinel = kBf16NegativeZero;
inline constexpr uint32_t kSentinelPair = 0x80008000u;
inline constexpr int kNextWord = 0;
inline constexpr int kActiveWord = 1;
inline constexpr int kStatusWord = 2;
inline constexpr int kStateWords = 3;
// One 16-byte vector: the unit every kernel moves, polls and clears.
inline constexpr int kVecElems = 8;
// Words per claim (call << 16 | rows, call << 16 | tag: below).
inline constexpr int kClaimWords = 2;

// The per-rank data layout. width % kVecElems == 0 (checked on the host).
struct Layout {
  int tp = 1;
  int capacity = 16;
  int width = 0;

  SPARK_MAILBOX_HD int64_t slot_elems() const { return int64_t(capacity) * width; }
  SPARK_MAILBOX_HD int64_t stage_elems() const { return int64_t(tp) * slot_elems(); }
  // Elements of one rank's whole copy: [kStages][tp][capacity][width].
  SPARK_MAILBOX_HD int64_t copy_elems() const { return int64_t(kStages) * stage_elems(); }
  // Element offset of (stage, source, row, col) within one rank's copy.
  SPARK_MAILBOX_HD int64_t offset(int stage, int source, int row, int col) const {
    return (int64_t(stage) * tp + source) * slot_elems() + int64_t(row) * width + col;
  }
  // The claims of one copy, uint32 [kStages][tp][kClaimWords], start right
  // after its data (16-byte aligned: width % 8 == 0).
  SPARK_MAILBOX_HD int claim_words() const { return kStages * tp * kClaimWords; }
  SPARK_MAILBOX_HD int64_t claims_byte_offset() const { return copy_elems() * 2; }
  SPARK_MAILBOX_HD int claim_index(int stage, int source) const { return (stage * tp + source) * kClaimWords; }
  // 16-byte vectors per row of one source; a gather row has tp times as many.
  SPARK_MAILBOX_HD int row_vecs() const { return width / kVecElems; }
};

// ---- stage words -----------------------------------------------------------

// The call counter's period: a multiple of kStages (3 x 21845), so that the
// stage stays call % kStages across the wrap, and below 2^16.
inline constexpr uint32_t kCallPeriod = 65535;
// ACTIVE before the first publish: its call (65535) is never a counter, so
// a consume before any publish fails as one with no publish.
inline constexpr uint32_t kNeverPublished = 0xffffffffu;

SPARK_MAILBOX_HD uint32_t make_word(uint32_t call, int rows) {
  return (call << 16) | (uint32_t(rows) & 0xffffu);
}
SPARK_MAILBOX_HD uint32_t word_call(uint32_t word) { return word >> 16; }
SPARK_MAILBOX_HD int word_stage(uint32_t word) { return int(word_call(word) % kStages); }
SPARK_MAILBOX_HD int word_rows(uint32_t word) { return int(word & 0xffffu); }

SPARK_MAILBOX_HD uint32_t next_call(uint32_t call) { return (call + 1) % kCallPeriod; }

// The NEXT word a consumer of the call `active` names, with `rows` rows,
// leaves.
SPARK_MAILBOX_HD uint32_t advance_word(uint32_t active, int rows) {
  return make_word(next_call(word_call(active)), rows);
}

// ---- claims ------------------------------------------------------------------
// Two words per (stage, source), each single-copy atomic on its own and
// each naming the call, so that a consumer never pairs halves of two calls:
// [0] = call << 16 | rows, [1] = call << 16 | tag (the caller's 16-bit tag:
// the Pooler's layer, 0 where the caller gives none).
inline constexpr uint32_t kNoClaim = 0xffffffffu;  // initial: call 65535 is never current
inline constexpr int kFailedRows = 0;  // the rows a publisher on a failed mailbox claims
inline constexpr uint32_t kMaxTag = 0xffffu;

SPARK_MAILBOX_HD uint32_t claim_rows_word(uint32_t call, int rows) { return make_word(call, rows); }
SPARK_MAILBOX_HD uint32_t claim_tag_word(uint32_t call, uint32_t tag) { return (call << 16) | (tag & kMaxTag); }

enum ClaimCheck : int {
  kClaimPending = 0,   // not this call's yet: keep waiting
  kClaimMatches = 1,   // this call's, with this consumer's rows and tag
  kClaimRowsDiffer = 2,
  kClaimTagDiffer = 3,
  kClaimPeerFailed = 4,  // the publisher's mailbox had failed, or it published the call twice
};
SPARK_MAILBOX_HD int check_claim(uint32_t rows_word, uint32_t tag_word, uint32_t call, int rows, uint32_t tag) {
  if (word_call(rows_word) != call || word_call(tag_word) != call) return kClaimPending;
  if (word_rows(rows_word) == kFailedRows) return kClaimPeerFailed;
  if (word_rows(rows_word) != rows) return kClaimRowsDiffer;
  if ((tag_word & kMaxTag) != (tag & kMaxTag)) return kClaimTagDiffer;
  return kClaimMatches;
}

// ---- payload bits ------------------------------------------------------------

// What a publisher stores for a BF16 value: -0.0 becomes +0.0 so that no
// published value reads as the sentinel; every other bit pattern (NaN, Inf,
// subnormals of either sign) is stored unchanged.
SPARK_MAILBOX_HD uint16_t publish_bits(uint16_t bits) {
  return bits == kSentinel ? uint16_t(0) : bits;
}
// The same on two packed BF16 lanes.
SPARK_MAILBOX_HD uint32_t publish_pair(uint32_t pair) {
  const uint32_t lo = (pair & 0xffffu) == kSentinel ? 0u : (pair & 0xffffu);
  const uint32_t hi = (pair >> 16) == kSentinel ? 0u : (pair & 0xffff0000u);
  return hi | lo;
}
// True if either BF16 lane of a packed pair still holds the sentinel.
SPARK_MAILBOX_HD bool pair_has_sentinel(uint32_t pair) {
  return (pair & 0xffffu) == kSentinel || (pair >> 16) == kSentinel;
}
// The same over the four words of a 16-byte vector.
SPARK_MAILBOX_HD bool vec_has_sentinel(uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  return pair_has_sentinel(a) || pair_has_sentinel(b) || pair_has_sentinel(c) ||
         pair_has_sentinel(d);
}

// ---- the failure record -------------------------------------------------------
// A consumer that gives up stores one 32-bit word into host-mapped memory
// and into STATUS, so the host can name the slot (even after a trap has
// poisoned the CUDA context) and the other consumers stop waiting. One word, so that the host never reads a mix
// of two threads' reports: bit 31 valid, bits 28..30 the kind, 24..27 rank,
// 20..21 stage, 16..19 source, 0..15 row.
enum RecordKind : uint32_t {
  kTimeout = 0,    // a slot was not published within the spin timeout
  kNoPublish = 1,  // ACTIVE != NEXT: this call's publisher did not run (a
                   // consume without a publish since the last consume)
  kRowsDiffer = 2,  // the source claimed other rows for the call (row = its rows)
  kTagDiffer = 3,   // the source claimed another tag, e.g. another layer (row = its tag)
  kPeerFailed = 4,  // the source's mailbox had failed (or it published twice)
  kDoublePublish = 5,  // a publish found ACTIVE == NEXT: the call was published already
};
// What a failure record's row field carries for a failed claim check: the
// source's rows (kRowsDiffer), its tag (kTagDiffer), else 0.
SPARK_MAILBOX_HD int claim_detail(int check, uint32_t rows_word, uint32_t tag_word) {
  return check == kClaimRowsDiffer ? word_rows(rows_word) : check == kClaimTagDiffer ? int(tag_word & kMaxTag) : 0;
}
// The record kind of a failed claim check.
SPARK_MAILBOX_HD uint32_t claim_record_kind(int check) {
  return check == kClaimRowsDiffer ? kRowsDiffer : check == kClaimTagDiffer ? kTagDiffer : kPeerFailed;
}
SPARK_MAILBOX_HD uint32_t make_record(uint32_t kind, int rank, int stage, int source, int row) {
  return 0x80000000u | ((kind & 0x7u) << 28) | (uint32_t(rank & 0xf) << 24) | (uint32_t(stage & 0x3) << 20) |
         (uint32_t(source & 0xf) << 16) | (uint32_t(row) & 0xffffu);
}
SPARK_MAILBOX_HD uint32_t make_timeout_record(int rank, int stage, int source, int row) {
  return make_record(kTimeout, rank, stage, source, row);
}
SPARK_MAILBOX_HD bool record_valid(uint32_t r) { return (r >> 31) != 0; }
SPARK_MAILBOX_HD uint32_t record_kind(uint32_t r) { return (r >> 28) & 0x7u; }
SPARK_MAILBOX_HD int record_rank(uint32_t r) { return int((r >> 24) & 0xf); }
SPARK_MAILBOX_HD int record_stage(uint32_t r) { return int((r >> 20) & 0x3); }
SPARK_MAILBOX_HD int record_source(uint32_t r) { return int((r >> 16) & 0xf); }
SPARK_MAILBOX_HD int record_row(uint32_t r) { return int(r & 0xffffu); }

}  // namespace spark_decode::mailbox
