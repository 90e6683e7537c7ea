// Hardware limits the kernels are compiled against and the host checks
// against. Plain C++: host validation runs on machines without a GPU.
#pragma once

namespace spark_decode::kernels {

// The opt-in shared memory per block of sm_90 and sm_100 (227 KiB); the
// device's own limit is checked again at construction.
inline constexpr int kMaxSmemPerBlock = 227 * 1024;

}  // namespace spark_decode::kernels
