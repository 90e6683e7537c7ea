// The device side of spark_decode/trace.h. With SPARK_DECODE_TRACE undefined
// the macros expand to nothing. Kernels put SPARK_TRACE_CTA(kernel) first,
// SPARK_TRACE_WAITED() right after their griddepcontrol.wait, and optionally
// SPARK_TRACE_MARK(i, value) where a loaded value has arrived.
#pragma once

#ifdef SPARK_DECODE_TRACE

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "spark_decode/trace.h"

namespace spark_decode::kernels::trace {

struct Sink {
  spark_decode::trace::Record* records;  // null: not recording
  unsigned* count;
  unsigned capacity;
};

// One per translation unit (the library is not built with relocatable
// device code), each pointed at the buffer by its own setter below.
static __device__ Sink g_sink;

__device__ __forceinline__ uint32_t smid() {
  uint32_t v;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
  return v;
}
__device__ __forceinline__ uint64_t gridid() {
  uint64_t v;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(v));
  return v;
}

// Thread 0's timestamps of one CTA; the record is written when it leaves
// scope, so every return path of the kernel records its exit.
class Cta {
 public:
  __device__ explicit Cta(uint16_t kernel) : kernel_(kernel) {
    if (threadIdx.x == 0) start_ = ptx::globaltimer_ns();
  }
  __device__ void waited() {
    if (threadIdx.x == 0) waited_ = ptx::globaltimer_ns();
  }
  // Mark i (0 .. kMarks - 1) once `dep` is available: the timer read takes it as an
  // operand, so it waits for the load that produces it.
  __device__ void mark(int i, uint32_t dep) {
    if (threadIdx.x != 0) return;
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer; // %1" : "=l"(t) : "r"(dep));
    mark_[i] = t;
  }
  __device__ ~Cta() {
    if (threadIdx.x != 0 || g_sink.records == nullptr) return;
    const uint64_t end = ptx::globaltimer_ns();  // before the atomic's round trip
    const unsigned i = atomicAdd(g_sink.count, 1u);
    if (i >= g_sink.capacity) return;
    spark_decode::trace::Record r;
    r.grid = gridid();
    r.start_ns = start_;
    r.waited_ns = waited_;
    for (int m = 0; m < spark_decode::trace::kMarks; ++m) r.mark_ns[m] = mark_[m];
    r.end_ns = end;
    r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r.kernel = kernel_;
    r.sm = static_cast<uint16_t>(smid());
    g_sink.records[i] = r;
  }

 private:
  uint64_t start_ = 0, waited_ = 0, mark_[spark_decode::trace::kMarks] = {};
  uint16_t kernel_;
};

// Host: points this translation unit's sink at `sink` on the current device.
static cudaError_t set_sink(const Sink& sink) { return cudaMemcpyToSymbol(g_sink, &sink, sizeof sink); }

}  // namespace spark_decode::kernels::trace

namespace spark_decode::trace::detail {
// src/trace.cu: every translation unit with traced kernels registers its
// setter at static initialisation.
using SinkSetter = cudaError_t (*)(const kernels::trace::Sink&);
bool register_sink_setter(SinkSetter setter);
namespace {
[[maybe_unused]] const bool registered_here = register_sink_setter(&kernels::trace::set_sink);
}
}  // namespace spark_decode::trace::detail

#define SPARK_TRACE_CTA(kernel) ::spark_decode::kernels::trace::Cta spark_trace_cta_(::spark_decode::trace::kernel)
#define SPARK_TRACE_WAITED() spark_trace_cta_.waited()
#define SPARK_TRACE_MARK(i, dep) spark_trace_cta_.mark(i, dep)

#else

#define SPARK_TRACE_CTA(kernel)
#define SPARK_TRACE_WAITED()
#define SPARK_TRACE_MARK(i, dep)

#endif
