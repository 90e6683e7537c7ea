// spark_decode/symmetric_memory.h: one device buffer per rank, every rank's
// buffer mapped into every rank's address space.
//
// Construction is collective over a Group: each rank cudaMalloc's `bytes` on
// its device, the ranks exchange (host, process, PCI bus id, CUDA IPC
// handle) over the group and map each other's buffers:
//   - ranks in the same process: peer access (cudaDeviceEnablePeerAccess)
//     and the peer's own pointer;
//   - ranks in different processes of one host: cudaIpcOpenMemHandle.
// Ranks on different hosts, or whose GPUs cannot reach each other
// peer-to-peer (cudaDeviceCanAccessPeer), get a RuntimeError naming the pair.
// All ranks pass the same `bytes` (else InvalidArgument). The buffers are
// 256-byte aligned (cudaMalloc) and NOT initialised: the owner fills them,
// then synchronises the group before any peer writes.
//
// Destruction closes every IPC mapping and frees the buffer; it is not
// collective and does not synchronise with peers, so every rank must have
// finished using the buffers (its kernels included) before any rank
// destroys its copy. Peer access, once enabled between two devices, is left
// enabled (it is per-context state others may rely on).
//
// Device pointers only: no kernel runs here, nothing here is capturable.
#pragma once

#include <cstddef>
#include <vector>

#include "spark_decode/group.h"

namespace spark_decode {

class SymmetricMemory {
 public:
  SymmetricMemory(Group& group, int device, size_t bytes);
  ~SymmetricMemory();
  SymmetricMemory(const SymmetricMemory&) = delete;
  SymmetricMemory& operator=(const SymmetricMemory&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }
  int device() const { return device_; }
  size_t bytes() const { return bytes_; }
  // This rank's buffer.
  void* local() const { return peers_[rank_]; }
  // Rank r's buffer as this rank's device addresses it (local() for r = rank()).
  void* peer(int r) const { return peers_.at(r); }
  const std::vector<void*>& peers() const { return peers_; }

 private:
  void release() noexcept;

  int rank_ = 0;
  int device_ = -1;
  size_t bytes_ = 0;
  std::vector<void*> peers_;
  std::vector<bool> ipc_opened_;
};

}  // namespace spark_decode
