// The cuBLAS baseline of the unpooler and pooler GEMMs: out[m, n] =
// x[m, k] @ w[n, k]^T in BF16 with FP32 accumulation, through cuBLASLt, with
// the fastest of the heuristic's candidate algorithms for the shape (each
// timed the way the benchmark times everything).
#pragma once

#include <cublasLt.h>

#include <string>
#include <vector>

namespace spark_decode::bench {

class CublasGemm {
 public:
  CublasGemm(int m, int n, int k);
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // Enqueues the GEMM with the chosen algorithm (capturable).
  void run(const void* w, const void* x, void* out, cudaStream_t stream) const;
  // Times every candidate over `weights` (distinct copies, cold L2) and
  // keeps the fastest; returns its microseconds per call.
  double pick_fastest(const std::vector<const void*>& weights, const void* x, void* out, int repeats,
                      cudaStream_t stream);
  std::string algo_description() const { return description_; }
  int candidates() const { return static_cast<int>(algos_.size()); }

 private:
  int m_, n_, k_;
  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = size_t{32} << 20;
  std::vector<cublasLtMatmulHeuristicResult_t> algos_;
  int chosen_ = 0;
  std::string description_;
};

}  // namespace spark_decode::bench
