// Host launcher of the split-K MMA engine (src/kernels/gemm/splitk_mma.cuh):
// what the Unpooler and the pooler GEMM both run. Internal: the public
// classes validate, this prepares and launches.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <vector>

#include "spark_decode/mailbox_view.h"
#include "spark_decode/plan.h"

namespace spark_decode::engines {

class SplitKMma {
 public:
  // An [n, k] BF16 weight at `tactic` (launch_unsupported(n, k, tactic) is
  // nullopt: the caller checked), on `device`, current. Prepares the kernels
  // that serve the batches `rows` (RuntimeError where the device cannot run
  // them: its shared-memory opt-in below the tactic's, no cluster of S CTAs).
  SplitKMma(const void* weight, int n, int k, int device, const SplitKTactic& tactic, bool enable_pdl,
            const std::vector<int>& rows);

  // Whether the kernel of token tile `tile` (8, 16) with `row_tiles` (1, 2)
  // is prepared; prepare() does it (not under CUDA graph capture).
  bool prepared(int tile, int row_tiles) const { return prepared_[variant(tile, row_tiles)]; }
  void prepare(int tile, int row_tiles);

  // out[m, n] = x[m, k] @ W^T, and with `publish` the same rows into its
  // mailbox (with `ticket`, at the ticket's stage). No checks: m's kernel is
  // prepared, the pointers are valid, the device is current.
  void launch(const void* x, void* out, int m, const MailboxView* publish, int32_t* ticket,
              cudaStream_t stream) const;

  const SplitKTactic& tactic() const { return tactic_; }

 private:
  static int variant(int tile, int row_tiles) { return (tile == 8 ? 0 : 2) + row_tiles - 1; }

  const void* weight_;
  int n_, k_, device_;
  SplitKTactic tactic_;
  bool enable_pdl_;
  std::array<bool, 4> prepared_{};  // [tile 8, 16] x [row tiles 1, 2]
};

}  // namespace spark_decode::engines
