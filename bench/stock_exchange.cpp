#include "stock_exchange.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "nccl_check.h"
#include "spark_decode/error.h"
#include "spark_decode/group.h"

namespace spark_decode::bench {

void disable_nvlink_multicast() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* now = std::getenv("NCCL_NVLS_ENABLE");
    if (now && std::string(now) != "0")
      std::fprintf(stderr, "spark-decode: NCCL_NVLS_ENABLE=%s overridden to 0 (no NVLink multicast)\n", now);
    setenv("NCCL_NVLS_ENABLE", "0", 1);
  });
}

const char* StockExchange::name(Kind kind) {
  switch (kind) {
    case Kind::local: return "none (tp 1)";
    case Kind::nccl: return "ncclAllGather";
    case Kind::host: return "all-gather on the host";
  }
  return "?";
}

StockExchange::Kind StockExchange::for_placement(int tp, bool ranks_share_gpus) {
  if (tp == 1) return Kind::local;
  return ranks_share_gpus ? Kind::host : Kind::nccl;
}

struct StockExchange::Nccl {
  ncclComm_t comm = nullptr;
  void* gathered = nullptr;  // [tp][max_rows][max_width] BF16: what ncclAllGather writes
  ~Nccl() {
    if (comm) ncclCommDestroy(comm);
    if (gathered) cudaFree(gathered);
  }
};

StockExchange::StockExchange(Group& group, Kind kind, int max_rows, int max_width, cudaStream_t stream)
    : group_(group), kind_(kind), tp_(group.size()), max_rows_(max_rows), max_width_(max_width) {
  SPARK_CHECK(kind != Kind::local || tp_ == 1, "stock exchange: kind local needs tp 1, got ", tp_);
  if (kind_ == Kind::host) host_.resize(size_t(max_rows) * max_width);
  if (kind_ != Kind::nccl) return;
  disable_nvlink_multicast();
  ncclUniqueId id{};
  if (group.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  const std::vector<uint8_t> ids = group.all_gather(&id, sizeof id);
  std::memcpy(&id, ids.data(), sizeof id);  // rank 0's
  nccl_ = std::make_unique<Nccl>();
  CUDA_CHECK(cudaMalloc(&nccl_->gathered, size_t(2) * tp_ * max_rows * max_width));
  NCCL_CHECK(ncclCommInitRank(&nccl_->comm, tp_, id, group.rank()));
  // NCCL connects on a communicator's first collective, which may not happen
  // under capture (in place: this rank's block is its part of the result).
  const size_t count = size_t(max_rows) * max_width;
  NCCL_CHECK(ncclAllGather(static_cast<char*>(nccl_->gathered) + 2 * count * group.rank(), nccl_->gathered, count,
                           ncclBfloat16, nccl_->comm, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

StockExchange::~StockExchange() = default;

const void* StockExchange::all_gather(const void* block, int b, int width, void* rows, cudaStream_t stream) {
  SPARK_CHECK(b >= 1 && b <= max_rows_ && width >= 1 && width <= max_width_, "stock exchange: [", b, ", ", width,
              "] outside [", max_rows_, ", ", max_width_, "]");
  if (kind_ == Kind::local) return block;
  const size_t row_bytes = size_t(2) * width, block_bytes = row_bytes * b;
  if (kind_ == Kind::nccl) {
    NCCL_CHECK(ncclAllGather(block, nccl_->gathered, size_t(b) * width, ncclBfloat16, nccl_->comm, stream));
    // [tp][b][width] -> [b][tp * width]: one strided copy per source.
    for (int q = 0; q < tp_; ++q)
      CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(rows) + q * row_bytes, row_bytes * tp_,
                                   static_cast<const char*>(nccl_->gathered) + q * block_bytes, row_bytes, row_bytes,
                                   b, cudaMemcpyDeviceToDevice, stream));
    return rows;
  }
  // Host: this rank's block down, every rank's across, the rows up; each
  // copy on this rank's stream, which is synchronised (never the device: a
  // rank sharing it may be busy).
  CUDA_CHECK(cudaMemcpyAsync(host_.data(), block, block_bytes, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<uint8_t> all = group_.all_gather(host_.data(), block_bytes);
  std::vector<uint8_t> full(block_bytes * tp_);
  for (int q = 0; q < tp_; ++q)
    for (int r = 0; r < b; ++r)
      std::memcpy(full.data() + (size_t(r) * tp_ + q) * row_bytes, all.data() + q * block_bytes + r * row_bytes,
                  row_bytes);
  CUDA_CHECK(cudaMemcpyAsync(rows, full.data(), full.size(), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));  // `full` is freed on return
  return rows;
}

}  // namespace spark_decode::bench
