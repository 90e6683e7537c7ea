#include "harness.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <exception>
#include <fstream>
#include <thread>

#include "kernels/common/launch.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/gemm/onchip_mma_config.h"
#include "spark_decode/error.h"
#include "spark_decode/group.h"
#include "spark_decode/trace.h"

namespace spark_decode::bench {
namespace {

// One 16-byte load per thread per iteration, grid-stride; the XOR keeps the
// loads live without a store per element.
__global__ void read_kernel(const uint4* __restrict__ p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // practically never; keeps acc alive
}

__global__ void fill_kernel(__nv_bfloat16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    // Two rounds of a 64-bit mix, then Box-Muller from two 24-bit uniforms.
    uint64_t z = seed + i * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u1 = ((z >> 40) + 1) * (1.0f / 16777217.0f);
    const float u2 = ((z >> 16) & 0xffffff) * (1.0f / 16777216.0f);
    p[i] = __float2bfloat16_rn(sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2) * scale);
  }
}

__global__ void empty_kernel() {}

// The copy engine's streaming read: CTA j streams its contiguous share of
// [p, p + bytes) into a ring of `stages` shared-memory buffers (cp.async.bulk);
// lane 0 of warp 0 issues, lane 0 of warp 1 takes each buffer as it lands and
// hands it back. Nothing computes: this is what a shared-memory-staged GEMM
// could stream at best. rows = 1: a buffer is one copy of `copy` bytes, the
// next `copy` bytes of the share. rows > 1: a buffer is `rows` copies, the
// same `copy`-byte column range of `rows` consecutive rows of `row_bytes`
// (what a GEMM stage of [rows][copy / 2] weights loads); a group of rows is
// read part by part.
constexpr int kBulkMaxStages = 32;
__global__ void __launch_bounds__(64) bulk_read_kernel(const char* p, int total, int per_cta, int copy, int stages,
                                                       int rows, int row_bytes, uint32_t* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t bars = ptx::smem_addr(smem);
  auto full = [&](int s) { return bars + 8u * s; };
  auto empty = [&](int s) { return bars + 8u * (kBulkMaxStages + s); };
  unsigned char* const ring = smem + 16 * kBulkMaxStages;
  const int first = blockIdx.x * per_cta;
  const int items = max(0, min(total - first, per_cta));
  const int buffer = rows * copy, parts = rows > 1 ? row_bytes / copy : 1;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      ptx::mbarrier_init(full(s), 1);
      ptx::mbarrier_init(empty(s), 1);
    }
    ptx::fence_mbarrier_init_cluster();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint64_t policy = ptx::l2_policy_evict_first();
    for (int i = 0; i < items; ++i) {
      const int s = i % stages;
      if (i >= stages) ptx::mbarrier_wait_parity(empty(s), ((i / stages) - 1) & 1);
      ptx::mbarrier_arrive_expect_tx(full(s), buffer);
      const uint32_t dst = ptx::smem_addr(ring + size_t(s) * buffer);
      // One thread issues every copy; the contiguous case stays one copy
      // per buffer with no further arithmetic (4 KiB buffers at one CTA per
      // SM are handshake-bound and vary between builds, docs/perf/pooler_gemm.md).
      if (rows == 1) {
        ptx::bulk_copy_g2s(dst, p + size_t(first + i) * copy, copy, full(s), policy);
      } else {
        const int item = first + i, group = item / parts, part = item % parts;
        const char* src = p + size_t(group) * rows * row_bytes + size_t(part) * copy;
        for (int r = 0; r < rows; ++r) ptx::bulk_copy_g2s(dst + r * copy, src + size_t(r) * row_bytes, copy, full(s), policy);
      }
    }
  } else if (threadIdx.x == 32) {
    uint32_t acc = 0;
    for (int i = 0; i < items; ++i) {
      const int s = i % stages;
      ptx::mbarrier_wait_parity(full(s), (i / stages) & 1);
      acc ^= *reinterpret_cast<const uint32_t*>(ring + size_t(s) * buffer);
      ptx::mbarrier_arrive(empty(s));
    }
    if (acc == 0x9e3779b9u) *sink = acc;  // practically never; keeps the reads
  }
}

// The on-chip engine's copies with nothing computed (enqueue_onchip_stream):
// the kernel's prologue and its stage waits, line for line, then exit.
__global__ void __launch_bounds__(kernels::onchip::kMaxThreads)
    onchip_stream_kernel(const __nv_bfloat16* w, int k, int kw, int stage_shift) {
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t bars = ptx::smem_addr(smem);
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int split = blockIdx.y, splits = gridDim.y, k_slice = k / splits;
  const int stages = warps >> stage_shift, width = kw << stage_shift;
  const int stage_size = kernels::onchip::stage_bytes(width);
  const uint32_t stage0 = ptx::smem_addr(smem + kernels::onchip::stages_offset(k, kw, 8));
  if (threadIdx.x == 0) {
    for (int q = 0; q < stages; ++q) ptx::mbarrier_init(bars + 8 * q, 1);
    ptx::fence_mbarrier_init_cluster();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint64_t policy = ptx::l2_policy_evict_first();
    const uint32_t bytes = kernels::onchip::row_bytes(width);
    const __nv_bfloat16* src = w + static_cast<size_t>(blockIdx.x) * 16 * k + split * k_slice;
    uint32_t dst = stage0;
    for (int q = 0; q < stages; ++q, src += width, dst += stage_size) {
      ptx::mbarrier_arrive_expect_tx(bars + 8 * q, 16 * bytes);
#pragma unroll
      for (int r = 0; r < 16; ++r)
        ptx::bulk_copy_g2s(dst + kernels::onchip::row_offset(width, r), src + static_cast<size_t>(r) * k, bytes,
                           bars + 8 * q, policy);
    }
  }
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  ptx::mbarrier_wait_parity(bars + 8 * (warp >> stage_shift), 0);
}

// The shard streamed with nothing computed, the best of the copy patterns
// measured on branch exp/stream-diag (enqueue_flat_stream): one CTA per SM,
// each requesting its whole contiguous chunk in kFlatPieces bulk copies
// before griddepcontrol.wait, so that all of it is in flight while the
// previous grid drains; warp w then waits for piece w and the CTA leaves.
constexpr int kFlatPieces = 8, kFlatThreads = 32 * kFlatPieces, kFlatHeader = 128;
__host__ __device__ int flat_piece_bytes(size_t bytes, int chunk, int cta, int q) {
  const size_t at = size_t(cta) * chunk + size_t(q) * (chunk / kFlatPieces);
  const size_t piece = chunk / kFlatPieces;
  return at >= bytes ? 0 : static_cast<int>(bytes - at < piece ? bytes - at : piece);
}
__global__ void __launch_bounds__(kFlatThreads) flat_stream_kernel(const char* p, size_t bytes, int chunk) {
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t bars = ptx::smem_addr(smem);
  if (threadIdx.x == 0) {
    for (int q = 0; q < kFlatPieces; ++q) ptx::mbarrier_init(bars + 8 * q, 1);
    ptx::fence_mbarrier_init_cluster();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint64_t policy = ptx::l2_policy_evict_first();
    for (int q = 0; q < kFlatPieces; ++q) {
      const int len = flat_piece_bytes(bytes, chunk, blockIdx.x, q);
      if (len == 0) continue;
      const int at = q * (chunk / kFlatPieces);
      ptx::mbarrier_arrive_expect_tx(bars + 8 * q, len);
      ptx::bulk_copy_g2s(ptx::smem_addr(smem + kFlatHeader) + at, p + size_t(blockIdx.x) * chunk + at, len,
                         bars + 8 * q, policy);
    }
  }
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int q = threadIdx.x >> 5;
  if (flat_piece_bytes(bytes, chunk, blockIdx.x, q) > 0) ptx::mbarrier_wait_parity(bars + 8 * q, 0);
}

// The stand-in predecessor (StandIn): wait, let the next grid launch, then
// one 16-byte coherent load per thread per iteration, grid-stride; the XOR
// keeps the loads live without a store per element.
__global__ void __launch_bounds__(512) standin_kernel(const uint4* __restrict__ p, size_t n, uint32_t* sink) {
  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // practically never; keeps acc alive
}

// An attribute of the current device (SM count, shared memory limit).
int device_attribute(cudaDeviceAttr attr) {
  int dev = 0, value = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, dev));
  return value;
}


}  // namespace

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

DeviceMemory::DeviceMemory(size_t bytes) { CUDA_CHECK(cudaMalloc(&p_, bytes)); }
DeviceMemory::~DeviceMemory() {
  if (p_) cudaFree(p_);
}

void fill_random_bf16(void* p, size_t count, uint64_t seed, cudaStream_t stream, float scale) {
  fill_kernel<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(p), count, seed, scale);
  SPARK_CHECK_LAUNCH();
}

void enqueue_empty(cudaStream_t stream) {
  empty_kernel<<<1, 32, 0, stream>>>();
  SPARK_CHECK_LAUNCH();
}

// Where read_kernel may write: a global, so that enqueueing allocates nothing
// (it is captured into graphs).
__device__ uint32_t g_read_sink;

void enqueue_read(const void* p, size_t bytes, cudaStream_t stream) {
  uint32_t* sink = nullptr;
  CUDA_CHECK(cudaGetSymbolAddress(reinterpret_cast<void**>(&sink), g_read_sink));
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  read_kernel<<<sms * 4, 512, 0, stream>>>(static_cast<const uint4*>(p), bytes / 16, sink);
  SPARK_CHECK_LAUNCH();
}

void prepare_bulk_read() {
  CUDA_CHECK(cudaFuncSetAttribute(bulk_read_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)));
}

void enqueue_bulk_read(const void* p, size_t bytes, int copy, int ctas_per_sm, cudaStream_t stream, int rows,
                       int row_bytes) {
  uint32_t* sink = nullptr;
  CUDA_CHECK(cudaGetSymbolAddress(reinterpret_cast<void**>(&sink), g_read_sink));
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  const int optin = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  // Per CTA: its share of the SM's shared memory, less the barriers and the
  // 1 KiB the runtime reserves per block.
  const int per_sm = optin / ctas_per_sm - 16 * kBulkMaxStages - 1024;
  const int buffer = rows * copy;
  const int stages = std::min(kBulkMaxStages, per_sm / buffer);
  SPARK_CHECK(stages >= 2 && copy % 16 == 0, "bulk read: ", stages, " stages of ", buffer, " bytes");
  SPARK_CHECK(bytes % buffer == 0 && (rows == 1 || (row_bytes % copy == 0 && bytes % (size_t(rows) * row_bytes) == 0)),
              "bulk read: ", bytes, " bytes in buffers of ", rows, " x ", copy);
  const int total = static_cast<int>(bytes / buffer), ctas = sms * ctas_per_sm;
  // Whole groups of rows per CTA (each read part by part).
  const int parts = rows > 1 ? row_bytes / copy : 1;
  const int per_cta = ((total / parts + ctas - 1) / ctas) * parts;
  const int smem = 16 * kBulkMaxStages + stages * buffer;
  bulk_read_kernel<<<(total + per_cta - 1) / per_cta, 64, smem, stream>>>(static_cast<const char*>(p), total,
                                                                          per_cta, copy, stages, rows, row_bytes, sink);
  SPARK_CHECK_LAUNCH();
}

void prepare_onchip_stream() {
  CUDA_CHECK(cudaFuncSetAttribute(onchip_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)));
}

void enqueue_onchip_stream(const void* w, int n, int k, int splits, int kw, int stage_warps, bool pdl,
                           cudaStream_t stream) {
  SPARK_CHECK(n % 16 == 0 && splits >= 1 && kw > 0 && k % (splits * kw) == 0 && stage_warps > 0 &&
                  (stage_warps & (stage_warps - 1)) == 0 && (k / (splits * kw)) % stage_warps == 0 &&
                  k / (splits * kw) <= kOnchipMaxWarps,
              "onchip stream: n=", n, " k=", k, " S=", splits, " kw=", kw, " stage_warps=", stage_warps);
  int shift = 0;
  while ((2 << shift) <= stage_warps) ++shift;
  kernels::LaunchShape shape;
  shape.grid = dim3(n / 16, splits);
  shape.block = dim3(32 * (k / (splits * kw)));
  shape.smem_bytes = kernels::onchip::smem_bytes(k, splits, kw, 8);
  shape.cluster_y = splits;
  shape.enable_pdl = pdl;
  kernels::launch(onchip_stream_kernel, shape, stream, static_cast<const __nv_bfloat16*>(w), k, kw, shift);
}

// Chunk bytes per CTA of the flat stream: the shard over one CTA per SM, in
// 16-byte multiples per piece; 0 where that does not fit shared memory.
static int flat_stream_chunk(size_t bytes) {
  const size_t sms = device_attribute(cudaDevAttrMultiProcessorCount), quantum = 16 * kFlatPieces;
  const size_t chunk = ((bytes + sms - 1) / sms + quantum - 1) / quantum * quantum;
  const size_t room = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin) - kFlatHeader;
  return chunk <= room ? static_cast<int>(chunk) : 0;
}

bool flat_stream_fits(size_t bytes) { return bytes % 16 == 0 && flat_stream_chunk(bytes) > 0; }

void prepare_flat_stream() {
  CUDA_CHECK(cudaFuncSetAttribute(flat_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin)));
}

void enqueue_flat_stream(const void* p, size_t bytes, bool pdl, cudaStream_t stream) {
  const int chunk = flat_stream_chunk(bytes);
  SPARK_CHECK(bytes % 16 == 0 && chunk > 0, "flat stream: ", bytes, " bytes do not fit one CTA per SM");
  kernels::LaunchShape shape;
  shape.grid = dim3(static_cast<unsigned>((bytes + chunk - 1) / chunk));
  shape.block = dim3(kFlatThreads);
  shape.smem_bytes = kFlatHeader + chunk;
  shape.enable_pdl = pdl;
  kernels::launch(flat_stream_kernel, shape, stream, static_cast<const char*>(p), bytes, chunk);
}

void record_stream_bound(Report& report, const std::string& op, int tp, int n, int k,
                         const std::function<const void*(int)>& copy, int copies, int repeats, cudaStream_t stream) {
  const size_t bytes = size_t{2} * n * k;
  if (!flat_stream_fits(bytes)) return;
  prepare_flat_stream();
  const double floor = floor_us(bytes, report.hbm_read_TBps);
  const char* const variant = "bare bulk stream: one CTA per SM, whole chunk in flight before the wait, nothing computed";
  for (bool pdl : {false, true}) {
    const double us =
        time_graph([&](cudaStream_t s, int c) { enqueue_flat_stream(copy(c), bytes, pdl, s); }, copies, repeats, stream);
    report.records.push_back({op, "bound", variant, pdl ? "pdl_chain" : "graph", tp, 0, n, k, us, floor});
    std::printf("  bound (%s, %s): %.2f us, %.0f%% of floor\n", variant, pdl ? "PDL chain" : "PDL off", us,
                100 * floor / us);
  }
}

StandIn::StandIn(size_t bytes, int smem_bytes)
    : bytes_(bytes / 16 * 16), smem_bytes_(smem_bytes), memory_(bytes_ * kBuffers) {
  CUDA_CHECK(cudaMemset(memory_.get(), 1, bytes_ * kBuffers));
  if (smem_bytes_ > 0)
    CUDA_CHECK(cudaFuncSetAttribute(standin_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes_));
  CUDA_CHECK(cudaDeviceSynchronize());
}

void StandIn::enqueue(cudaStream_t stream, int i) const {
  uint32_t* sink = nullptr;
  CUDA_CHECK(cudaGetSymbolAddress(reinterpret_cast<void**>(&sink), g_read_sink));
  kernels::LaunchShape shape;
  shape.grid = dim3(device_attribute(cudaDevAttrMultiProcessorCount));
  shape.block = dim3(512);
  shape.smem_bytes = smem_bytes_;
  shape.enable_pdl = true;
  kernels::launch(standin_kernel, shape, stream,
                  reinterpret_cast<const uint4*>(memory_.as<char>() + bytes_ * (i % kBuffers)), bytes_ / 16, sink);
}

double StandIn::time_alone(int calls, int repeats, cudaStream_t stream) const {
  return time_graph([&](cudaStream_t s, int c) { enqueue(s, c); }, calls, repeats, stream);
}

double StandIn::time_behind(const std::function<void(cudaStream_t, int)>& call, double alone_us, int calls,
                            int repeats, cudaStream_t stream) const {
  return time_graph(
             [&](cudaStream_t s, int c) {
               enqueue(s, c);
               call(s, c);
             },
             calls, repeats, stream) -
         alone_us;
}

std::string StandIn::describe() const {
  char buf[128];
  std::snprintf(buf, sizeof buf, "a %.0f MiB stream (1 CTA/SM x 512 threads, %d KiB of shared memory each)",
                bytes_ / 1048576.0, smem_bytes_ / 1024);
  return buf;
}

double measure_hbm_read_TBps(size_t bytes, int repeats) {
  DeviceMemory buf(bytes), sink(4);
  CUDA_CHECK(cudaMemset(buf.get(), 1, bytes));
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> tbps;
  for (int r = 0; r < repeats + 2; ++r) {
    CUDA_CHECK(cudaEventRecord(a));
    read_kernel<<<sms * 4, 512>>>(buf.as<uint4>(), bytes / 16, sink.as<uint32_t>());
    SPARK_CHECK_LAUNCH();
    CUDA_CHECK(cudaEventRecord(b));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r >= 2) tbps.push_back(bytes / (ms * 1e-3) / 1e12);
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  return median(tbps);
}

int cold_copies(size_t bytes_per_copy, int min_calls) {
  int dev = 0, l2 = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const size_t need = size_t{4} * static_cast<size_t>(l2) / std::max<size_t>(bytes_per_copy, 1) + 1;
  return std::max<int>(min_calls, static_cast<int>(need));
}

double replay_us(cudaGraphExec_t exec, cudaStream_t stream, int calls, int repeats,
                 const std::function<void()>& before_each) {
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> us;
  for (int r = 0; r < repeats + 3; ++r) {
    if (before_each) before_each();
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
  return median(us);
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

double time_graph(const std::function<void(cudaStream_t, int)>& enqueue, int calls, int repeats,
                  cudaStream_t stream) {
  int i = 0;
  cudaGraphExec_t exec = capture_graph(stream, calls, [&] { enqueue(stream, i++); });
  const double us = replay_us(exec, stream, calls, repeats);
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  return us;
}

double time_replays(Group& group, cudaGraphExec_t exec, cudaStream_t stream, int calls, int repeats) {
  return replay_us(exec, stream, calls, repeats, [&] { group.barrier(); });
}

void trace_replay(cudaGraphExec_t exec, cudaStream_t stream, const std::string& path,
                  const std::function<void()>& before) {
  trace::start(size_t{1} << 21);
  if (before) before();
  CUDA_CHECK(cudaGraphLaunch(exec, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  const auto records = trace::stop();
  std::ofstream csv(path);
  SPARK_CHECK_RUNTIME(csv.good(), "cannot write ", path);
  csv << "kernel,grid,block,sm,start_ns,waited_ns";
  for (int i = 0; i < trace::kMarks; ++i) csv << ",mark" << i << "_ns";
  csv << ",end_ns\n";
  for (const auto& r : records) {
    csv << trace::kernel_name(r.kernel) << ',' << r.grid << ',' << r.block << ',' << r.sm << ',' << r.start_ns << ','
        << r.waited_ns;
    for (uint64_t t : r.mark_ns) csv << ',' << t;
    csv << ',' << r.end_ns << '\n';
  }
  std::printf("  trace: %zu CTAs -> %s\n", records.size(), path.c_str());
}

void run_ranks(int tp, const std::function<void(Group&, int)>& fn, int devices) {
  if (devices <= 0) devices = tp;
  auto shared = InProcessGroup::make_shared(tp);
  std::vector<std::exception_ptr> errors(tp);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < tp; ++rank)
    threads.emplace_back([&, rank] {
      try {
        CUDA_CHECK(cudaSetDevice(rank % devices));
        InProcessGroup group(shared, rank);
        fn(group, rank);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace spark_decode::bench
