// spark_decode/trace.h: the host side (the buffers, and the registry of the
// translation units' sinks).
#include "spark_decode/trace.h"

#include <map>
#include <mutex>

#include "cuda_utils.h"
#include "kernels/common/trace.cuh"
#include "spark_decode/error.h"

namespace spark_decode::trace {

const char* kernel_name(uint16_t kernel) {
  switch (kernel) {
    case kSplitKMma: return "splitk_mma";
    case kSkinny: return "skinny";
    case kPublish: return "publish";
    case kGather: return "gather";
    case kGatherNorm: return "gather_norm";
    case kRingMma: return "ring_mma";
    case kOnchipMma: return "onchip_mma";
    default: return "unknown";
  }
}

#ifdef SPARK_DECODE_TRACE

namespace detail {
namespace {
std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}
std::vector<SinkSetter>& setters() {
  static std::vector<SinkSetter> s;
  return s;
}
}  // namespace
bool register_sink_setter(SinkSetter setter) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  setters().push_back(setter);
  return true;
}
}  // namespace detail

namespace {
struct Buffers {
  Record* records = nullptr;
  unsigned* count = nullptr;
  unsigned capacity = 0;
};
std::mutex g_mu;
std::map<int, Buffers> g_buffers;  // by device

void set_all(const kernels::trace::Sink& sink) {
  std::lock_guard<std::mutex> lock(detail::registry_mutex());
  for (auto set : detail::setters()) CUDA_CHECK(set(sink));
}
}  // namespace

bool compiled_in() { return true; }

void start(size_t capacity) {
  SPARK_CHECK(capacity >= 1 && capacity <= (1u << 28), "trace capacity ", capacity, " outside [1, 2^28]");
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mu);
  SPARK_CHECK(g_buffers.count(device) == 0, "trace already started on cuda:", device);
  Buffers b;
  b.capacity = static_cast<unsigned>(capacity);
  CUDA_CHECK(cudaMalloc(&b.records, sizeof(Record) * capacity));
  CUDA_CHECK(cudaMalloc(&b.count, sizeof(unsigned)));
  CUDA_CHECK(cudaMemset(b.count, 0, sizeof(unsigned)));
  set_all({b.records, b.count, b.capacity});
  CUDA_CHECK(cudaDeviceSynchronize());
  g_buffers[device] = b;
}

std::vector<Record> stop() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_buffers.find(device);
  SPARK_CHECK(it != g_buffers.end(), "trace not started on cuda:", device);
  const Buffers b = it->second;
  g_buffers.erase(it);
  CUDA_CHECK(cudaDeviceSynchronize());
  set_all({nullptr, nullptr, 0});
  unsigned count = 0;
  CUDA_CHECK(cudaMemcpy(&count, b.count, sizeof count, cudaMemcpyDeviceToHost));
  std::vector<Record> out(std::min(count, b.capacity));
  if (!out.empty()) CUDA_CHECK(cudaMemcpy(out.data(), b.records, sizeof(Record) * out.size(), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(b.records));
  CUDA_CHECK(cudaFree(b.count));
  return out;
}

#else

bool compiled_in() { return false; }
void start(size_t) {
  throw RuntimeError("tracing is not compiled in: configure with -DSPARK_DECODE_TRACE=ON");
}
std::vector<Record> stop() {
  throw RuntimeError("tracing is not compiled in: configure with -DSPARK_DECODE_TRACE=ON");
}

#endif

}  // namespace spark_decode::trace
