#include "cuda_utils.h"

namespace spark_decode::detail {

void require_sm90(int device, const char* what) {
  // An ordinal that cannot name a device is the caller's error, GPU or not.
  SPARK_CHECK(device >= 0, what, ": device ", device, " is not a CUDA device ordinal (>= 0)");
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  SPARK_CHECK_RUNTIME(err == cudaSuccess && count > 0, what, " needs a CUDA GPU, and none is visible (",
                      cudaGetErrorString(err), ")");
  SPARK_CHECK(device >= 0 && device < count, what, ": device ", device, " does not exist (",
              count, " visible)");
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  SPARK_CHECK_RUNTIME(major >= 9, what, " needs compute capability 9.0 or newer; device ", device,
                      " has ", major, ".", minor);
}

void require_current_device(int device, const char* what) {
  int current = -1;
  CUDA_CHECK(cudaGetDevice(&current));
  SPARK_CHECK(current == device, what, " was built on cuda:", device,
              " but the current device is cuda:", current);
}

bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace spark_decode::detail
