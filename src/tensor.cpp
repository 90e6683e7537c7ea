#include <sstream>

#include "spark_decode/error.h"
#include "spark_decode/types.h"

namespace spark_decode {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
    case DType::e4m3: return "e4m3";
  }
  return "?";
}

int dtype_size(DType dtype) {
  switch (dtype) {
    case DType::bf16: return 2;
    case DType::f32:
    case DType::i32: return 4;
    case DType::u8:
    case DType::e4m3: return 1;
  }
  return 0;
}

TensorRef TensorRef::contiguous(const void* data, DType dtype,
                                std::initializer_list<int64_t> shape, int device) {
  SPARK_CHECK(shape.size() <= kMaxDims, "at most ", kMaxDims, " dimensions");
  TensorRef t;
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.ndim = static_cast<int>(shape.size());
  t.device = device;
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t stride = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.stride[d] = stride;
    stride *= t.shape[d];
  }
  return t;
}

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool TensorRef::is_contiguous() const {
  int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string TensorRef::describe() const {
  std::ostringstream os;
  os << "[";
  for (int d = 0; d < ndim; ++d) os << (d ? ", " : "") << shape[d];
  os << "] " << dtype_name(dtype);
  if (device >= 0)
    os << " on cuda:" << device;
  else
    os << " on host";
  return os.str();
}

TensorRef TensorRef::narrow_rows(int64_t begin, int64_t count) const {
  SPARK_CHECK(ndim >= 1 && begin >= 0 && count >= 0 && begin + count <= shape[0],
              "rows [", begin, ", ", begin + count, ") outside ", describe());
  TensorRef t = *this;
  t.data = static_cast<char*>(data) + begin * stride[0] * dtype_size(dtype);
  t.shape[0] = count;
  return t;
}

}  // namespace spark_decode
