// spark_decode/error.h: the one error header of the library.
//
// Host code reports every failure by throwing; nothing returns error codes.
//   spark_decode::InvalidArgument  a caller's input the call cannot take
//                                  (shape, dtype, alignment, tactic, batch);
//                                  Python maps it to ValueError.
//   spark_decode::RuntimeError     the environment failed (a CUDA call, a
//                                  missing GPU feature, a peer that timed out);
//                                  Python maps it to RuntimeError.
// Checks run before anything is launched, so a call that throws
// InvalidArgument has launched nothing.
//
// Usable from plain C++ translation units (no CUDA headers needed) except
// CUDA_CHECK / SPARK_CHECK_LAUNCH, which need cuda_runtime_api.h.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace spark_decode {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InvalidArgument : public Error {
 public:
  using Error::Error;
};

class RuntimeError : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] inline void throw_cuda(const char* expr, int code, const char* name,
                                    const char* text, const char* file, int line) {
  throw RuntimeError(concat("CUDA error ", code, " (", name, ": ", text, ") in ", expr,
                            " at ", file, ":", line));
}

}  // namespace detail
}  // namespace spark_decode

// Throws InvalidArgument(reason...) unless cond holds.
#define SPARK_CHECK(cond, ...)                                                 \
  do {                                                                         \
    if (!(cond))                                                               \
      throw ::spark_decode::InvalidArgument(::spark_decode::detail::concat(__VA_ARGS__)); \
  } while (0)

// Throws RuntimeError(reason...) unless cond holds.
#define SPARK_CHECK_RUNTIME(cond, ...)                                         \
  do {                                                                         \
    if (!(cond))                                                               \
      throw ::spark_decode::RuntimeError(::spark_decode::detail::concat(__VA_ARGS__)); \
  } while (0)

// Every CUDA runtime call goes through CUDA_CHECK.
#define CUDA_CHECK(expr)                                                       \
  do {                                                                         \
    cudaError_t spark_err_ = (expr);                                           \
    if (spark_err_ != cudaSuccess)                                             \
      ::spark_decode::detail::throw_cuda(#expr, static_cast<int>(spark_err_),  \
                                         cudaGetErrorName(spark_err_),         \
                                         cudaGetErrorString(spark_err_),       \
                                         __FILE__, __LINE__);                  \
  } while (0)

// After every kernel launch: a bad configuration surfaces here, at the call
// that made it, not at the next synchronisation.
#define SPARK_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
