#include "cublas_gemm.h"

#include <cuda_runtime_api.h>

#include <sstream>

#include "harness.h"
#include "spark_decode/error.h"

#define CUBLAS_CHECK(expr)                                                                   \
  do {                                                                                       \
    cublasStatus_t st_ = (expr);                                                             \
    SPARK_CHECK_RUNTIME(st_ == CUBLAS_STATUS_SUCCESS, "cuBLAS error ", static_cast<int>(st_), \
                        " in ", #expr);                                                      \
  } while (0)

namespace spark_decode::bench {

// Column-major view: C[n, m] = op(A) * B with A = w as col-major [k, n]
// (transposed), B = x as col-major [k, m], C = out as col-major [n, m]: the
// same bytes as the row-major out[m, n] = x @ w^T.
CublasGemm::CublasGemm(int m, int n, int k) : m_(m), n_(n), k_(k) {
  CUBLAS_CHECK(cublasLtCreate(&handle_));
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_, CUDA_R_16BF, k, n, k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b_, CUDA_R_16BF, k, m, k));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c_, CUDA_R_16BF, n, m, n));
  CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
  cublasLtMatmulPreference_t pref;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes_, sizeof workspace_bytes_));
  algos_.resize(16);
  int found = 0;
  CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, desc_, a_, b_, c_, c_, pref, 16, algos_.data(), &found));
  cublasLtMatmulPreferenceDestroy(pref);
  SPARK_CHECK_RUNTIME(found > 0, "cuBLASLt has no algorithm for ", m, "x", n, "x", k);
  algos_.resize(found);
}

CublasGemm::~CublasGemm() {
  cudaFree(workspace_);
  cublasLtMatrixLayoutDestroy(a_);
  cublasLtMatrixLayoutDestroy(b_);
  cublasLtMatrixLayoutDestroy(c_);
  cublasLtMatmulDescDestroy(desc_);
  cublasLtDestroy(handle_);
}

void CublasGemm::run(const void* w, const void* x, void* out, cudaStream_t stream) const {
  const float alpha = 1.0f, beta = 0.0f;
  CUBLAS_CHECK(cublasLtMatmul(handle_, desc_, &alpha, w, a_, x, b_, &beta, out, c_, out, c_,
                              &algos_[chosen_].algo, workspace_, workspace_bytes_, stream));
}

double CublasGemm::pick_fastest(const std::vector<const void*>& weights, const void* x, void* out,
                                int repeats, cudaStream_t stream) {
  double best = 1e30;
  int best_i = 0;
  for (int i = 0; i < static_cast<int>(algos_.size()); ++i) {
    chosen_ = i;
    double us;
    try {
      us = time_graph([&](cudaStream_t s, int c) { run(weights[c % weights.size()], x, out, s); },
                      static_cast<int>(weights.size()), repeats, stream);
    } catch (const RuntimeError&) {
      cudaGetLastError();
      continue;  // an algorithm that cannot be captured or launched here
    }
    if (us < best) {
      best = us;
      best_i = i;
    }
  }
  chosen_ = best_i;
  std::ostringstream os;
  os << "cuBLASLt heuristic candidate " << best_i << " of " << algos_.size();
  description_ = os.str();
  return best;
}

}  // namespace spark_decode::bench
