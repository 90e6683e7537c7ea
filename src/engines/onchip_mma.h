// Host launcher of the on-chip MMA engine (src/kernels/gemm/onchip_mma.cuh):
// what the Unpooler and the pooler GEMM run where their option or plan row
// names onchip_mma. Internal: the public classes validate, this prepares and
// launches.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <vector>

#include "spark_decode/mailbox_view.h"
#include "spark_decode/plan.h"

namespace spark_decode::engines {

class OnchipMma {
 public:
  // An [n, k] BF16 weight at `tactic` (onchip_unsupported(n, k, tactic) is
  // nullopt: the caller checked), on `device`, current. Prepares the kernels
  // that serve the batches `rows` (RuntimeError where the device cannot run
  // them: its shared-memory opt-in below the CTA's, no cluster of S CTAs or
  // no CTA fitting an SM).
  OnchipMma(const void* weight, int n, int k, int device, const OnchipTactic& tactic, bool enable_pdl,
            const std::vector<int>& rows);

  // Whether the kernel of token tile `tile` (8, 16) and `rows` row tiles
  // (1, 2) is prepared; prepare() does it (not under CUDA graph capture).
  bool prepared(int tile, int rows) const {
    const int v = variant(tile, rows);
    return v >= 0 && prepared_[v];
  }
  void prepare(int tile, int rows);

  // out[m, n] = x[m, k] @ W^T, and with `publish` the same rows into its
  // mailbox (with `ticket`, at the ticket's stage). No checks: m's kernel is
  // prepared, the pointers are valid, the device is current.
  void launch(const void* x, void* out, int m, const MailboxView* publish, int32_t* ticket,
              cudaStream_t stream) const;

  const OnchipTactic& tactic() const { return tactic_; }
  // CTAs of (token tile, row tiles) the device runs at once (clusters x S),
  // found at prepare(): below the grid, the grid runs in more than one wave
  // and its later CTAs stream nothing before the wait. 0 before prepare().
  int resident_ctas(int tile, int rows) const {
    const int v = variant(tile, rows);
    return v >= 0 ? resident_[v] : 0;
  }

 private:
  const void* weight_;
  int n_, k_, device_;
  OnchipTactic tactic_;
  int stage_shift_;  // log2 of the warps per copy stage
  bool enable_pdl_;
  // The compiled (token tile, row tiles): (8, 1), (16, 1), (16, 2); -1 for
  // any other.
  static int variant(int tile, int rows) {
    if (rows != 1 && rows != 2) return -1;
    return tile == 8 ? (rows == 1 ? 0 : -1) : rows == 1 ? 1 : 2;
  }
  std::array<bool, 3> prepared_{};
  std::array<int, 3> resident_{};
};

}  // namespace spark_decode::engines
