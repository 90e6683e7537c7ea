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
  // An [n, k] BF16 weight on `device`, current. tactic_of[m - 1]: the tactic
  // that serves m rows (each valid: onchip_unsupported(n, k, t) is nullopt,
  // the caller checked). A plan table's on-chip rows of one shape may differ
  // in S, copy stages, cluster policy and row tiles, never in the order of
  // the sum (kw, accs). Prepares the kernels that serve the batches `rows`
  // (RuntimeError where the device cannot run them: its shared-memory opt-in
  // below the CTA's, no cluster of S CTAs or no CTA fitting an SM).
  OnchipMma(const void* weight, int n, int k, int device, const std::array<OnchipTactic, kMaxBatch>& tactic_of,
            bool enable_pdl, const std::vector<int>& rows);

  // Whether the kernel that serves m rows is prepared; prepare(m) does it
  // (not under CUDA graph capture).
  bool prepared(int m) const;
  void prepare(int m);
  // Whether the kernel of token tile `tile` (8, 16) and `rows` row tiles
  // (1, 2) is prepared for some batch.
  bool prepared(int tile, int rows) const;

  // out[m, n] = x[m, k] @ W^T, and with `publish` the same rows into its
  // mailbox (with `ticket`, at the ticket's stage). No checks: m's kernel is
  // prepared, the pointers are valid, the device is current.
  void launch(const void* x, void* out, int m, const MailboxView* publish, int32_t* ticket,
              cudaStream_t stream) const;

  const OnchipTactic& tactic(int m) const { return launches_[of_[m - 1]].tactic; }

 private:
  // One tactic and its kernels: the compiled (token tile, row tiles) are
  // (8, 1), (16, 1), (16, 2); variant() numbers them, -1 for any other.
  struct Launch {
    OnchipTactic tactic;
    int stage_shift;  // log2 of the warps per copy stage
    std::array<bool, 3> prepared{};
  };
  static int variant(int tile, int rows) {
    if (rows != 1 && rows != 2) return -1;
    return tile == 8 ? (rows == 1 ? 0 : -1) : rows == 1 ? 1 : 2;
  }
  int variant_of(int m) const {
    const OnchipTactic& t = tactic(m);
    return variant(t.token_tile[m - 1], t.row_tiles[m - 1]);
  }

  const void* weight_;
  int n_, k_, device_;
  bool enable_pdl_;
  std::vector<Launch> launches_;     // the distinct tactics
  std::array<int, kMaxBatch> of_{};  // m's, an index into launches_
};

}  // namespace spark_decode::engines
