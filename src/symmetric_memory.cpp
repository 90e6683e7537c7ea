// SymmetricMemory: allocation, handle exchange and peer mapping.
#include "spark_decode/symmetric_memory.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <type_traits>

#include "cuda_utils.h"
#include "spark_decode/error.h"

namespace spark_decode {
namespace {

// What one rank tells the others. Fixed size, trivially copyable: it goes
// through Group::all_gather as bytes.
struct PeerRecord {
  char host[64];
  uint64_t pid;
  uint64_t process_nonce;  // pids repeat across containers on one host
  char bus_id[32];
  int32_t device;
  int32_t ipc_ok;
  uint64_t bytes;
  uint64_t ptr;  // meaningful to ranks of the same process only
  cudaIpcMemHandle_t handle;
};
static_assert(std::is_trivially_copyable_v<PeerRecord>);

uint64_t process_nonce() {
  static const uint64_t nonce = (uint64_t(std::random_device{}()) << 32) | std::random_device{}();
  return nonce;
}

std::string describe(int rank, const PeerRecord& r) {
  return detail::concat("rank ", rank, " (cuda:", r.device, ", PCI ", r.bus_id, ", host ", r.host,
                        ", pid ", r.pid, ")");
}

// Maps every peer's buffer into this rank's address space: peers[q], and
// whether it came through CUDA IPC (closed at release).
void map_peers(int rank, int device, const std::vector<PeerRecord>& records, const PeerRecord& mine,
               std::vector<void*>& peers, std::vector<bool>& ipc_opened) {
  for (int q = 0; q < static_cast<int>(records.size()); ++q) {
    if (q == rank) continue;
    const PeerRecord& r = records[q];
    SPARK_CHECK_RUNTIME(std::strncmp(r.host, mine.host, sizeof mine.host) == 0,
                        "symmetric memory: ", describe(q, r), " and ", describe(rank, mine),
                        " are on different hosts; peer-to-peer memory needs one host");
    const bool same_process = r.pid == mine.pid && r.process_nonce == mine.process_nonce;
    // The peer's GPU as this process numbers it, where it can see it.
    int peer_device = -1;
    if (same_process) {
      peer_device = r.device;
    } else if (cudaDeviceGetByPCIBusId(&peer_device, r.bus_id) != cudaSuccess) {
      (void)cudaGetLastError();
      peer_device = -1;
    }
    if (peer_device >= 0 && peer_device != device) {
      int can = 0;
      CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device, peer_device));
      SPARK_CHECK_RUNTIME(can, "symmetric memory: ", describe(rank, mine), " cannot access ",
                          describe(q, r), " peer-to-peer (cudaDeviceCanAccessPeer(", device,
                          ", ", peer_device, ") = 0)");
    }
    if (same_process) {
      if (peer_device != device) {
        const cudaError_t err = cudaDeviceEnablePeerAccess(peer_device, 0);
        if (err == cudaErrorPeerAccessAlreadyEnabled)
          (void)cudaGetLastError();
        else
          CUDA_CHECK(err);
      }
      peers[q] = reinterpret_cast<void*>(r.ptr);
    } else {
      SPARK_CHECK_RUNTIME(r.ipc_ok, "symmetric memory: ", describe(q, r),
                          " could not export a CUDA IPC handle for ", describe(rank, mine));
      void* mapped = nullptr;
      const cudaError_t err = cudaIpcOpenMemHandle(&mapped, r.handle, cudaIpcMemLazyEnablePeerAccess);
      if (err != cudaSuccess) (void)cudaGetLastError();
      SPARK_CHECK_RUNTIME(err == cudaSuccess, "symmetric memory: ", describe(rank, mine),
                          " cannot map the buffer of ", describe(q, r), " (cudaIpcOpenMemHandle: ",
                          cudaGetErrorName(err), ": ", cudaGetErrorString(err), ")");
      peers[q] = mapped;
      ipc_opened[q] = true;
    }
  }
}

}  // namespace

SymmetricMemory::SymmetricMemory(Group& group, int device, size_t bytes)
    : rank_(group.rank()), device_(device), bytes_(bytes) {
  const int n = group.size();
  peers_.assign(n, nullptr);
  ipc_opened_.assign(n, false);
  // Each step a rank can fail alone (its arguments, its allocation, its
  // mappings) is a collective_step: a rank that fails must not leave the
  // others waiting in the exchange or in the caller's next collective.
  PeerRecord mine{};
  auto allocate = [&] {
    SPARK_CHECK(bytes > 0, "symmetric memory: bytes must be positive");
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    SPARK_CHECK(device >= 0 && device < count, "symmetric memory: device ", device,
                " does not exist (", count, " visible)");
    detail::DeviceGuard guard(device);
    void* local = nullptr;
    CUDA_CHECK(cudaMalloc(&local, bytes));
    peers_[rank_] = local;
    gethostname(mine.host, sizeof mine.host - 1);
    mine.pid = static_cast<uint64_t>(getpid());
    mine.process_nonce = process_nonce();
    CUDA_CHECK(cudaDeviceGetPCIBusId(mine.bus_id, sizeof mine.bus_id, device));
    mine.device = device;
    mine.bytes = bytes;
    mine.ptr = reinterpret_cast<uint64_t>(local);
    // A device without IPC support is fine as long as no peer needs it.
    mine.ipc_ok = cudaIpcGetMemHandle(&mine.handle, local) == cudaSuccess;
    if (!mine.ipc_ok) (void)cudaGetLastError();
  };
  try {
    collective_step(group, "symmetric memory: allocation", allocate);
    detail::DeviceGuard guard(device);
    const std::vector<uint8_t> all = group.all_gather(&mine, sizeof mine);
    std::vector<PeerRecord> records(n);
    std::memcpy(records.data(), all.data(), sizeof(PeerRecord) * n);
    for (int q = 0; q < n; ++q)  // every rank sees the same records: all throw, or none
      SPARK_CHECK(records[q].bytes == bytes, "symmetric memory: rank ", q, " allocates ",
                  records[q].bytes, " bytes, rank ", rank_, " ", bytes,
                  "; every rank must pass the same size");
    collective_step(group, "symmetric memory: peer mapping",
                    [&] { map_peers(rank_, device_, records, mine, peers_, ipc_opened_); });
  } catch (...) {
    release();
    throw;
  }
}

SymmetricMemory::~SymmetricMemory() { release(); }

void SymmetricMemory::release() noexcept {
  if (peers_.empty()) return;
  {
    detail::QuietDeviceScope scope(device_);  // errors dropped (see QuietDeviceScope)
    for (size_t q = 0; q < peers_.size(); ++q)
      if (ipc_opened_[q] && peers_[q]) cudaIpcCloseMemHandle(peers_[q]);
    if (peers_[rank_]) cudaFree(peers_[rank_]);
  }
  peers_.clear();
  ipc_opened_.clear();
}

}  // namespace spark_decode
