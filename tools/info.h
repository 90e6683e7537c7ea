// `spark-decode info` and the self-check the bare `spark-decode` runs.
#pragma once

namespace spark_decode::tool {

// Number of visible CUDA devices (0 where there is no driver or GPU).
int gpu_count();
// GPUs, compute capability, SMs, L2, cluster support, peer-access matrix.
void print_info();
// The Unpooler at small and model shapes against the FP64 CPU reference;
// returns false if any element is out of bounds.
bool verify_unpooler_gpu();
// No GPU: the CPU reference on a small shape, said plainly.
void run_cpu_reference_demo();

}  // namespace spark_decode::tool
