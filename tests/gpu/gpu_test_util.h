// Helpers of the GPU tests: skipping without a GPU, device buffers with
// guard regions, random BF16 inputs of several distributions.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/mailbox/protocol.h"
#include "spark_decode/error.h"
#include "spark_decode/group.h"
#include "spark_decode/mailbox.h"
#include "test_seed.h"

namespace spark_decode::testing {

// Where a mailbox's data and state words lie in its allocation (the rest is
// guard filler): byte offsets from memory().local().
struct MailboxRegions {
  size_t data_begin, data_end, state_begin, state_end;
};
inline MailboxRegions regions_of(const LamportMailbox& mb) {
  const char* base = static_cast<const char*>(mb.memory().local());
  const size_t data = reinterpret_cast<const char*>(mb.view().local) - base;
  const size_t state = reinterpret_cast<const char*>(mb.view().state) - base;
  // The data, then the claims: uint32 [3 stages][tp][2].
  return {data, data + size_t(3) * mb.tp() * mb.capacity() * mb.width() * 2 + size_t(3) * mb.tp() * 2 * 4, state,
          state + mailbox::kStateWords * sizeof(int32_t)};
}

// Why the GPU tests cannot run here ("" when they can): no device, or none
// of compute capability 9.0+.
std::string gpu_unavailable_reason(int min_devices = 1);

#define SKIP_WITHOUT_GPU(n)                                                          \
  do {                                                                               \
    const std::string why_ = ::spark_decode::testing::gpu_unavailable_reason(n);     \
    if (!why_.empty()) GTEST_SKIP() << why_;                                         \
  } while (0)

// One generator per process (ctest runs each test in its own), seeded from
// test_base_seed() (tests/test_seed.h: printed, SPARK_TEST_SEED replays).
// Tests that draw data seeds through test_seed() replay in any order too.
std::mt19937_64& rng();

enum class Dist { normal, scaled, outliers, specials };
const char* dist_name(Dist d);
inline constexpr Dist kAllDists[] = {Dist::normal, Dist::scaled, Dist::outliers, Dist::specials};

// BF16 bit patterns. `scale_log2` multiplies the normal draws by 2^scale_log2
// (for Dist::scaled). specials mixes -0.0, +0.0, subnormals and normals.
std::vector<uint16_t> random_bf16(size_t count, Dist dist, int scale_log2 = 0);
// The same from a caller's generator (one per thread: rng() is not shared
// safely between threads).
std::vector<uint16_t> random_bf16(size_t count, Dist dist, int scale_log2, std::mt19937_64& gen);

// Why GPUs 0..n-1 of this process cannot all reach each other peer to peer
// ("" when they can).
std::string peer_gpus_unavailable_reason(int n);

// Runs fn(group, device) on `tp` threads over one InProcessGroup, thread r on
// GPU r % devices (devices = 0: tp GPUs, one rank each; fewer GPUs than
// ranks shares them, which exercises tp 4 and 8 code paths on two GPUs);
// returns what each rank threw (empty: all passed).
std::vector<std::string> run_on_gpus(int tp, const std::function<void(Group&, int)>& fn, int devices = 0);

// Where ranks share a GPU, every rank must finish its set-up before any rank
// makes its first mailbox call: a stream created, a device allocation or
// free, or a graph instantiated while a peer's consumer already spins on
// this rank may wait for the device, which that consumer keeps busy until
// its spin timeout (docs/design.md, "The Lamport mailbox protocol",
// ordering 6). A barrier after set-up.
inline void set_up_done(Group& group) { group.barrier(); }

// Device memory with `guard_bytes` of a known pattern on either side; the
// caller checks the guards after the kernels ran.
class GuardedBuffer {
 public:
  static constexpr uint8_t kGuard = 0xA5;
  GuardedBuffer(size_t bytes, size_t guard_bytes = 4096);
  ~GuardedBuffer();
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;

  void* get() const { return static_cast<char*>(base_) + guard_; }
  size_t bytes() const { return bytes_; }
  void fill(uint8_t byte);  // the payload only; done when it returns
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  // Empty when both guards hold the pattern, else where they do not.
  std::string check_guards() const;

 private:
  void* base_ = nullptr;
  size_t bytes_, guard_;
};

// 0xFFFF (a NaN no kernel of ours produces from finite inputs) in every
// BF16 of the payload: an element still holding it was never written.
inline constexpr uint16_t kPoisonBf16 = 0xFFFF;
void poison_bf16(GuardedBuffer& buffer);

}  // namespace spark_decode::testing
