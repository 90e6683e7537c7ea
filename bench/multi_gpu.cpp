#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "harness.h"
#include "spark_decode/error.h"
#include "spark_decode/group.h"

namespace spark_decode::bench {

// Replays `exec` `repeats` times on every rank at once (a group barrier
// before each replay keeps the ranks within a launch of each other) and
// returns rank 0's median microseconds per call.
double time_replays(Group& group, cudaGraphExec_t exec, cudaStream_t stream, int calls, int repeats) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> us;
  for (int r = 0; r < repeats + 3; ++r) {
    group.barrier();
    CUDA_CHECK(cudaEventRecord(a, stream));
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    CUDA_CHECK(cudaEventRecord(b, stream));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r >= 3) us.push_back(ms * 1e3 / calls);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

cudaGraphExec_t capture_graph(cudaStream_t stream, int calls, const std::function<void()>& one_call) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) one_call();
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_CHECK(cudaGraphDestroy(graph));
  return exec;
}

}  // namespace spark_decode::bench
