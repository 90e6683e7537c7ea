// spark_decode/trace.h: a per-CTA timeline of our kernels, for finding where
// time goes between kernels (the lent GPU machines have no nsys).
//
// Compiled in only when the library is built with -DSPARK_DECODE_TRACE=ON;
// otherwise compiled_in() is false, start() and stop() throw RuntimeError,
// and the kernels carry no trace code at all. When compiled in and started,
// thread 0 of every CTA of the traced kernels appends one Record (the
// %globaltimer nanoseconds at the CTA's entry, after its griddepcontrol.wait,
// at up to kMarks kernel-specific points and at its exit) to a device buffer.
// That costs one atomic and one 88-byte store per CTA: timings taken while
// tracing are not the benchmark's.
//
// start() and stop() act on the current device, allocate or free, and
// synchronise it: never under CUDA graph capture. A graph captured before
// start() records into the buffer start() set up (the kernels read its
// address when they run).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace spark_decode::trace {

// Which kernel wrote a record.
enum Kernel : uint16_t {
  kSplitKMma = 1,        // the split-K MMA engine (the unpooler, the pooler GEMM at tp >= 2)
  kSkinny = 2,           // the skinny GEMM engine
  kPublish = 3,          // LamportMailbox::publish
  kGather = 4,           // LamportMailbox::gather
  kGatherNorm = 5,       // the Pooler's fused gather + norm (+ NVFP4)
  kRingMma = 6,          // the ring MMA engine
  kOnchipMma = 7         // the on-chip MMA engine (marks: 0 warp 0's stage landed, 1 rank 0 has every
                         // partial, 2 thread 0's x fragments arrived, 3 thread 0's MMAs are done,
                         // 4 thread 0 has issued its copies (before the wait), 5 rank 0's thread 0
                         // has summed its elements (before the store's __syncthreads))
};
inline constexpr int kMarks = 6;
const char* kernel_name(uint16_t kernel);

struct Record {
  uint64_t grid;       // %gridid: which launch
  uint64_t start_ns;   // thread 0 at the CTA's entry (%globaltimer)
  uint64_t waited_ns;  // after its griddepcontrol.wait (0: the kernel has none)
  uint64_t mark_ns[kMarks];  // kernel-specific points (0: none; see the kernel)
  uint64_t end_ns;     // at its exit (before the record's own atomic)
  uint32_t block;      // linear CTA index
  uint16_t kernel;     // Kernel
  uint16_t sm;         // %smid
};

bool compiled_in();
// Records up to `capacity` CTAs (1 .. 2^28) on the current device from now
// on; InvalidArgument outside that range or when this device is already
// recording.
void start(size_t capacity);
// Stops recording on the current device and returns what was recorded, in
// the order the CTAs finished; InvalidArgument when it is not recording.
std::vector<Record> stop();

}  // namespace spark_decode::trace
