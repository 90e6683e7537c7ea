// spark_decode/types.h: the tensor description every host entry point takes.
//
// A TensorRef is a view (pointer, dtype, shape, strides in elements, device),
// never an owner: the library neither allocates nor frees through it. Entry
// points validate it (dtype, shape, contiguity, 16-byte alignment, device)
// before launching anything; see each class for what it requires.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace spark_decode {

enum class DType : int { bf16, f32, i32, u8, e4m3 };

const char* dtype_name(DType dtype);
int dtype_size(DType dtype);

struct TensorRef {
  static constexpr int kMaxDims = 4;

  void* data = nullptr;
  DType dtype = DType::bf16;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};  // in elements
  int device = -1;                         // CUDA ordinal; -1: host memory

  // A row-major contiguous view.
  static TensorRef contiguous(const void* data, DType dtype, std::initializer_list<int64_t> shape,
                              int device);

  int64_t numel() const;
  bool is_contiguous() const;
  bool is_aligned(int bytes) const { return reinterpret_cast<uintptr_t>(data) % bytes == 0; }
  // "[8192, 4096] bf16 on cuda:0", for error messages.
  std::string describe() const;
  // Rows [begin, begin + count) of dimension 0, as a view.
  TensorRef narrow_rows(int64_t begin, int64_t count) const;
};

}  // namespace spark_decode
