// Host helpers shared by every component (internal; not installed).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "spark_decode/error.h"

namespace spark_decode::detail {

// Makes `device` current for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) CUDA_CHECK(cudaSetDevice(device));
    changed_ = device != previous_;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// The same for code that may not throw (destructors, release paths): errors
// are dropped, since after a device trap (a mailbox spin timeout) every call
// fails with the sticky error, and the last error is cleared on the way out.
class QuietDeviceScope {
 public:
  explicit QuietDeviceScope(int device) noexcept {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    cudaSetDevice(device);
    device_ = device;
  }
  ~QuietDeviceScope() {
    (void)cudaGetLastError();
    if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
  }
  QuietDeviceScope(const QuietDeviceScope&) = delete;
  QuietDeviceScope& operator=(const QuietDeviceScope&) = delete;

 private:
  int previous_ = -1, device_ = -1;
};

// Throws RuntimeError unless `device` exists and has compute capability
// 9.0 or newer (clusters, distributed shared memory, griddepcontrol).
void require_sm90(int device, const char* what);

// Throws InvalidArgument unless the calling thread's current device is
// `device` (kernels launch on the current device).
void require_current_device(int device, const char* what);

// True while `stream` is being captured into a CUDA graph.
bool is_capturing(cudaStream_t stream);

}  // namespace spark_decode::detail
