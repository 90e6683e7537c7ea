// Validation helpers of the host entry points (internal). Each throws
// InvalidArgument with the caller's reason, before anything is launched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "spark_decode/error.h"
#include "spark_decode/types.h"

namespace spark_decode::detail {

// Non-null and a multiple of `bytes`.
inline bool aligned(const void* p, size_t bytes) {
  return p != nullptr && reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// The byte ranges [a, a + a_bytes) and [b, b + b_bytes) do not overlap.
inline bool disjoint(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  return x + a_bytes <= y || y + b_bytes <= x;
}

// A contiguous, `align`-byte aligned [rows, cols] matrix of
// `dtype` on `device` (rows < 0: any number of rows).
inline bool is_matrix(const TensorRef& t, DType dtype, int64_t rows, int64_t cols, int device, int align = 16) {
  return t.ndim == 2 && (rows < 0 || t.shape[0] == rows) && t.shape[1] == cols && t.dtype == dtype &&
         t.is_contiguous() && t.is_aligned(align) && t.device == device;
}

template <typename... Reason>
void require_aligned(const void* p, size_t bytes, Reason&&... reason) {
  SPARK_CHECK(aligned(p, bytes), std::forward<Reason>(reason)...);
}

template <typename... Reason>
void require_disjoint(const void* a, size_t a_bytes, const void* b, size_t b_bytes, Reason&&... reason) {
  SPARK_CHECK(disjoint(a, a_bytes, b, b_bytes), std::forward<Reason>(reason)...);
}

template <typename... Reason>
void require_matrix(const TensorRef& t, DType dtype, int64_t rows, int64_t cols, int device, Reason&&... reason) {
  SPARK_CHECK(is_matrix(t, dtype, rows, cols, device), std::forward<Reason>(reason)...);
}

}  // namespace spark_decode::detail
