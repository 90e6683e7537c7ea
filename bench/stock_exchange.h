// The stock path's exchange between tensor-parallel ranks: an all-gather of
// every rank's [b, width] block into the full rows [b, tp * width] (row i:
// rank 0's row i, then rank 1's, ...), what vLLM's tensor-parallel
// all-gather returns. The reference the mailbox and the step are checked
// against, and the exchange of the timed stock path.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

namespace spark_decode {
class Group;
}

namespace spark_decode::bench {

// NCCL_NVLS_ENABLE=0 in this process's environment (DEVELOPERS.md: never
// NVLink multicast), set before the first NCCL call; overrides another
// value, saying so on stderr. Called by every NCCL user here.
void disable_nvlink_multicast();

class StockExchange {
 public:
  enum class Kind {
    local,  // tp 1: nothing to exchange, the block is the row
    nccl,   // ncclAllGather + one 2-D copy per source into row order; one GPU per rank
            // (NCCL refuses two ranks on one GPU); capturable
    host,   // through the Group's all-gather on the host: any placement, the
            // stream synchronised on every call; not capturable
  };
  static const char* name(Kind kind);
  // The capturable kind for this placement: local at tp 1, nccl with one GPU
  // per rank, host where ranks share GPUs.
  static Kind for_placement(int tp, bool ranks_share_gpus);

  // Collective over `group` (NCCL: its communicator, set up with one eager
  // call so that nothing connects under capture). Rows of up to max_rows x
  // max_width per block.
  StockExchange(Group& group, Kind kind, int max_rows, int max_width, cudaStream_t stream);
  ~StockExchange();
  StockExchange(const StockExchange&) = delete;
  StockExchange& operator=(const StockExchange&) = delete;

  // The full rows of this call: `block` itself at tp 1, else `rows` (device,
  // [b, tp * width] BF16), filled on `stream`.
  const void* all_gather(const void* block, int b, int width, void* rows, cudaStream_t stream);

  Kind kind() const { return kind_; }
  bool capturable() const { return kind_ != Kind::host; }

 private:
  struct Nccl;
  Group& group_;
  Kind kind_;
  int tp_, max_rows_, max_width_;
  std::unique_ptr<Nccl> nccl_;
  std::vector<uint16_t> host_;
};

}  // namespace spark_decode::bench
