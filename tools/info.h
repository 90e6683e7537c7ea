// `spark-decode info`: the GPUs this process sees.
#pragma once

#include <string>

namespace spark_decode::tool {

// Number of visible CUDA devices (0 where there is no driver or GPU).
int gpu_count();
// GPUs, compute capability, SMs, L2, cluster support, peer-access matrix.
void print_info();
// The same as JSON text.
std::string info_json();

}  // namespace spark_decode::tool
