#include "gpu_test_util.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <mutex>
#include <sstream>
#include <thread>

#include "spark_decode/bf16.h"

namespace spark_decode::testing {
namespace {
// Before the first CUDA call (static initialisation): ranks sharing one GPU
// replay CUDA graphs, which the host cannot order in the GPU's hardware
// queues; the most queues makes two ranks' streams least likely to share
// one (docs/design.md, "Ranks sharing a GPU"). Eager calls need no such
// help: the ctest entry shared_gpu_one_hardware_queue runs them with one.
[[maybe_unused]] const bool kMostHardwareQueues = setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0) == 0;
}  // namespace

std::string gpu_unavailable_reason(int min_devices) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess)
    return std::string("no CUDA device: ") + cudaGetErrorString(err);
  if (count < min_devices)
    return "needs " + std::to_string(min_devices) + " GPUs, found " + std::to_string(count);
  for (int d = 0; d < min_devices; ++d) {
    int major = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d));
    if (major < 9) return "GPU " + std::to_string(d) + " is below compute capability 9.0";
  }
  return "";
}

std::mt19937_64& rng() {
  static std::mt19937_64 gen(test_base_seed());
  return gen;
}

const char* dist_name(Dist d) {
  switch (d) {
    case Dist::normal: return "normal";
    case Dist::scaled: return "scaled";
    case Dist::outliers: return "outliers";
    case Dist::specials: return "specials";
  }
  return "?";
}

std::vector<uint16_t> random_bf16(size_t count, Dist dist, int scale_log2) {
  return random_bf16(count, dist, scale_log2, rng());
}

std::string peer_gpus_unavailable_reason(int n) {
  std::string why = gpu_unavailable_reason(n);
  if (!why.empty()) return why;
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      int can = 1;
      if (a != b) CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
      if (!can) return "GPUs " + std::to_string(a) + " and " + std::to_string(b) + " cannot access each other peer-to-peer";
    }
  return "";
}

std::vector<std::string> run_on_gpus(int tp, const std::function<void(Group&, int)>& fn, int devices) {
  if (devices <= 0) devices = tp;
  auto shared = InProcessGroup::make_shared(tp, std::chrono::seconds(60));
  std::mutex mu;
  std::vector<std::string> failures;
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r)
    threads.emplace_back([&, r] {
      try {
        CUDA_CHECK(cudaSetDevice(r % devices));
        InProcessGroup group(shared, r);
        fn(group, r % devices);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  for (auto& t : threads) t.join();
  return failures;
}

std::vector<uint16_t> random_bf16(size_t count, Dist dist, int scale_log2, std::mt19937_64& g) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::uniform_int_distribution<int> mantissa(1, 127);
  std::vector<uint16_t> out(count);
  const float scale = std::ldexp(1.0f, scale_log2);
  for (auto& v : out) {
    float f = normal(g);
    switch (dist) {
      case Dist::normal: break;
      case Dist::scaled: f *= scale; break;
      case Dist::outliers:
        if (unit(g) < 0.01f) f *= 256.0f;
        break;
      case Dist::specials: {
        const float u = unit(g);
        if (u < 0.05f) {
          v = kBf16NegativeZero;
          continue;
        }
        if (u < 0.08f) {
          v = 0;
          continue;
        }
        if (u < 0.12f) {  // a subnormal of either sign
          v = static_cast<uint16_t>(mantissa(g) | (unit(g) < 0.5f ? 0x8000 : 0));
          continue;
        }
        break;
      }
    }
    v = float_to_bf16_rne(f);
  }
  return out;
}

GuardedBuffer::GuardedBuffer(size_t bytes, size_t guard_bytes) : bytes_(bytes), guard_(guard_bytes) {
  CUDA_CHECK(cudaMalloc(&base_, bytes_ + 2 * guard_));
  CUDA_CHECK(cudaMemset(base_, kGuard, bytes_ + 2 * guard_));
}

GuardedBuffer::~GuardedBuffer() { cudaFree(base_); }

// Synchronous with the host: cudaMemset runs on the legacy stream, which does
// not order against the tests' non-blocking streams, so without the wait a
// kernel launched next on such a stream could run before the poison lands.
void GuardedBuffer::fill(uint8_t byte) {
  CUDA_CHECK(cudaMemset(get(), byte, bytes_));
  CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

void GuardedBuffer::upload(const void* host, size_t bytes) {
  SPARK_CHECK(bytes <= bytes_, "upload of ", bytes, " bytes into ", bytes_);
  CUDA_CHECK(cudaMemcpy(get(), host, bytes, cudaMemcpyHostToDevice));
  // A pageable copy may return before its DMA lands; the next kernel runs on
  // a non-blocking stream that does not order against it.
  CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

void GuardedBuffer::download(void* host, size_t bytes) const {
  SPARK_CHECK(bytes <= bytes_, "download of ", bytes, " bytes from ", bytes_);
  CUDA_CHECK(cudaMemcpy(host, get(), bytes, cudaMemcpyDeviceToHost));
}

std::string GuardedBuffer::check_guards() const {
  std::vector<uint8_t> lo(guard_), hi(guard_);
  CUDA_CHECK(cudaMemcpy(lo.data(), base_, guard_, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaMemcpy(hi.data(), static_cast<char*>(base_) + guard_ + bytes_, guard_,
                        cudaMemcpyDeviceToHost));
  std::ostringstream os;
  for (size_t i = 0; i < guard_; ++i) {
    if (lo[i] != kGuard) {
      os << "guard byte " << i << " before the buffer changed to " << int(lo[i]) << "; ";
      break;
    }
  }
  for (size_t i = 0; i < guard_; ++i) {
    if (hi[i] != kGuard) {
      os << "guard byte " << i << " after the buffer changed to " << int(hi[i]) << "; ";
      break;
    }
  }
  return os.str();
}

void poison_bf16(GuardedBuffer& buffer) { buffer.fill(0xFF); }

}  // namespace spark_decode::testing
