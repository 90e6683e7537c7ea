// LamportMailbox: construction, validation and launches.
#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

#include "cuda_utils.h"
#include "enqueue_order.h"
#include "kernels/common/launch.cuh"
#include "kernels/mailbox/kernels.cuh"
#include "launchers.h"
#include "spark_decode/error.h"
#include "spark_decode/mailbox.h"
#include "validate.h"

namespace spark_decode {
namespace {

constexpr size_t kAlign = 256;

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

void check_threads(int threads, const char* what) {
  SPARK_CHECK(threads >= 32 && threads <= 1024 && threads % 32 == 0, what, ": threads ", threads,
              " must be a multiple of 32 in [32, 1024]");
}

}  // namespace

LamportMailbox::LamportMailbox(Group& group, int tp, int rank, int capacity, int width, int device,
                               Options options)
    : tp_(tp), rank_(rank), capacity_(capacity), width_(width), device_(device), group_(&group) {
  // This rank's arguments and GPU, agreed on before anything collective:
  // a rank that refuses alone must not leave its peers in the exchange.
  collective_step(group, "mailbox: construction", [&] {
    SPARK_CHECK(tp >= 1 && tp <= kMailboxMaxRanks, "mailbox: tp ", tp, " outside 1..", kMailboxMaxRanks);
    SPARK_CHECK(tp == group.size(), "mailbox: tp ", tp, " != group size ", group.size());
    SPARK_CHECK(rank == group.rank(), "mailbox: rank ", rank, " != group rank ", group.rank());
    SPARK_CHECK(capacity >= 1 && capacity <= mailbox::kMaxRows, "mailbox: capacity ", capacity,
                " outside 1..", mailbox::kMaxRows);
    SPARK_CHECK(width > 0 && width % mailbox::kVecElems == 0, "mailbox: width ", width,
                " must be a positive multiple of ", mailbox::kVecElems, " (16-byte rows)");
    SPARK_CHECK(options.spin_timeout_s > 0 && options.spin_timeout_s < 3600.0,
                "mailbox: spin timeout ", options.spin_timeout_s, " s outside (0, 3600)");
    detail::require_sm90(device, "the Lamport mailbox");
  });
  // Every rank must build the same layout: equal allocation sizes alone
  // would let capacity 16 x width 1024 pair with 32 x 512, and the rows
  // would land in the wrong places.
  struct Shape {
    int32_t capacity, width;
    uint64_t guard_bytes;
    char uuid[16];  // the rank's GPU, to find ranks that share one
  } mine{capacity, width, options.guard_bytes, {}};
  {
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    std::memcpy(mine.uuid, prop.uuid.bytes, sizeof mine.uuid);
  }
  const std::vector<uint8_t> shapes = group.all_gather(&mine, sizeof mine);
  bool any_shared = false;  // any two ranks on one GPU: the same answer on every rank
  for (int q = 0; q < tp; ++q) {
    Shape s;
    std::memcpy(&s, shapes.data() + q * sizeof s, sizeof s);
    SPARK_CHECK(s.capacity == capacity && s.width == width && s.guard_bytes == options.guard_bytes,
                "mailbox: rank ", q, " builds capacity ", s.capacity, ", width ", s.width, ", guard bytes ",
                s.guard_bytes, " where rank ", rank, " builds ", capacity, ", ", width, ", ",
                options.guard_bytes, "; every rank must build the same mailbox");
    if (q != rank && std::memcmp(s.uuid, mine.uuid, sizeof mine.uuid) == 0) shares_device_ = true;
    for (int p = 0; p < q; ++p)
      if (std::memcmp(s.uuid, shapes.data() + p * sizeof s + offsetof(Shape, uuid), sizeof s.uuid) == 0)
        any_shared = true;
  }
  if (any_shared)  // collective: every rank takes this branch
    enqueue_order_ = std::make_unique<detail::EnqueueOrder>(
        group, std::chrono::nanoseconds(static_cast<int64_t>(options.spin_timeout_s * 1e9)));
  view_.spin_timeout_ns = static_cast<uint64_t>(options.spin_timeout_s * 1e9);
  view_.trap_on_failure = options.on_failure == OnFailure::trap ? 1 : 0;
  view_.tp = tp;
  view_.rank = rank;
  view_.capacity = capacity;
  view_.width = width;
  detail::DeviceGuard guard(device);

  const mailbox::Layout layout{tp, capacity, width};
  const size_t data_bytes = size_t(layout.copy_elems()) * 2;
  const size_t claim_bytes = size_t(layout.claim_words()) * sizeof(uint32_t);  // right after the data
  const size_t data_offset = round_up(options.guard_bytes, kAlign);
  const size_t state_offset = data_offset + round_up(data_bytes + claim_bytes, kAlign);
  const size_t total = state_offset + kAlign + options.guard_bytes;

  memory_ = std::make_unique<SymmetricMemory>(group, device, total);  // collective; agrees on failure
  auto initialise = [&] {
    char* base = static_cast<char*>(memory_->local());
    CUDA_CHECK(cudaMemset(base, kMailboxGuardByte, total));
    const std::vector<uint16_t> sentinel(layout.copy_elems(), mailbox::kSentinel);
    CUDA_CHECK(cudaMemcpy(base + data_offset, sentinel.data(), data_bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(base + data_offset + data_bytes, 0xff, claim_bytes));  // kNoClaim
    static_assert(mailbox::kNoClaim == 0xffffffffu);
    // NEXT, ACTIVE, STATUS; the fourth word of the consumers' 16-byte load
    // of the state stays guard filler (read, never used).
    const uint32_t state[mailbox::kStateWords] = {0, mailbox::kNeverPublished, 0};
    CUDA_CHECK(cudaMemcpy(base + state_offset, state, sizeof state, cudaMemcpyHostToDevice));
    view_.state = reinterpret_cast<int32_t*>(base + state_offset);
    for (int q = 0; q < tp; ++q)
      view_.copies[q] = reinterpret_cast<uint16_t*>(static_cast<char*>(memory_->peer(q)) + data_offset);
    view_.local = view_.copies[rank];

    CUDA_CHECK(cudaHostAlloc(&record_host_, sizeof(uint32_t), cudaHostAllocMapped | cudaHostAllocPortable));
    *record_host_ = 0;
    CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&view_.timeout_record), record_host_, 0));

    // Load the kernels now (lazy module loading would do it at the first
    // launch, possibly under capture or after a peer started spinning).
    cudaFuncAttributes attrs;
    CUDA_CHECK(cudaFuncGetAttributes(&attrs, kernels::mailbox_publish_kernel));
    CUDA_CHECK(cudaFuncGetAttributes(&attrs, kernels::mailbox_gather_kernel));
    CUDA_CHECK(cudaDeviceSynchronize());
  };
  try {
    // Also the barrier the protocol needs: no peer publishes into a copy
    // before its owner has filled it (an all-gather returns only once every
    // rank has entered it).
    collective_step(group, "mailbox: initialisation", initialise);
  } catch (...) {
    if (record_host_) cudaFreeHost(record_host_);
    record_host_ = nullptr;
    throw;
  }
}

LamportMailbox::~LamportMailbox() {
  if (record_host_) {
    detail::QuietDeviceScope scope(device_);
    cudaFreeHost(record_host_);
  }
  // memory_ frees the copies.
}

namespace detail {

void launch_mailbox_publish(const MailboxView& mb, const void* src, int b, int threads, bool enable_pdl,
                            cudaStream_t stream) {
  kernels::MailboxPublishArgs args{static_cast<const __nv_bfloat16*>(src), mb, b};
  const int vecs = b * (mb.width / mailbox::kVecElems);
  kernels::LaunchShape shape;
  shape.grid = dim3((vecs + threads - 1) / threads);
  shape.block = dim3(threads);
  shape.enable_pdl = enable_pdl;
  kernels::launch(kernels::mailbox_publish_kernel, shape, stream, args);
}

void launch_mailbox_gather(const MailboxView& mb, void* out, int b, int threads, bool enable_pdl,
                           bool launch_next_early, cudaStream_t stream) {
  kernels::MailboxGatherArgs args{static_cast<__nv_bfloat16*>(out), mb, b, launch_next_early ? 1 : 0};
  const int fragments = mb.tp * (mb.width / mailbox::kVecElems);
  kernels::LaunchShape shape;
  shape.grid = dim3(b, (fragments + threads - 1) / threads);
  shape.block = dim3(threads);
  shape.enable_pdl = enable_pdl;
  kernels::launch(kernels::mailbox_gather_kernel, shape, stream, args);
}

}  // namespace detail

void LamportMailbox::publish(const void* src, int b, cudaStream_t stream, const PublishOptions& options) {
  check();
  SPARK_CHECK(b >= 1 && b <= capacity_, "mailbox publish: b = ", b, " outside [1, ", capacity_,
              "] (the mailbox capacity)");
  detail::require_aligned(src, 16, "mailbox publish: src must be a non-null 16-byte aligned device pointer");
  detail::require_disjoint(src, size_t(b) * width_ * 2, memory_->local(), memory_->bytes(),
                           "mailbox publish: src may not overlap the mailbox");
  check_threads(options.threads, "mailbox publish");
  detail::require_current_device(device_, "the mailbox");
  detail::launch_mailbox_publish(view_, src, b, options.threads, options.enable_pdl && !shares_device_, stream);
  publish_enqueued();
}

void LamportMailbox::publish(const TensorRef& src, cudaStream_t stream,
                             const PublishOptions& options) {
  const int b = src.ndim == 2 ? static_cast<int>(src.shape[0]) : 0;
  SPARK_CHECK(src.ndim == 2 && src.shape[1] == width_ && src.dtype == DType::bf16 &&
                  src.is_contiguous() && src.is_aligned(16),
              "mailbox publish: src ", src.describe(), " must be contiguous 16-byte aligned BF16 [b, ",
              width_, "]");
  SPARK_CHECK(src.device == device_, "mailbox publish: src ", src.describe(), " is not on cuda:",
              device_);
  publish(src.data, b, stream, options);
}

void LamportMailbox::gather(void* out, int b, cudaStream_t stream, const GatherOptions& options) {
  check();
  SPARK_CHECK(b >= 1 && b <= capacity_, "mailbox gather: b = ", b, " outside [1, ", capacity_,
              "] (the mailbox capacity)");
  detail::require_aligned(out, 16, "mailbox gather: out must be a non-null 16-byte aligned device pointer");
  check_threads(options.threads, "mailbox gather");
  detail::require_disjoint(out, size_t(b) * tp_ * width_ * 2, memory_->local(), memory_->bytes(),
                           "mailbox gather: out may not overlap the mailbox");
  detail::require_current_device(device_, "the mailbox");
  before_consume(stream);
  detail::launch_mailbox_gather(view_, out, b, options.threads, options.enable_pdl && !shares_device_,
                                /*launch_next_early=*/!shares_device_, stream);
}

void LamportMailbox::gather(const TensorRef& out, cudaStream_t stream,
                            const GatherOptions& options) {
  const int b = out.ndim == 2 ? static_cast<int>(out.shape[0]) : 0;
  SPARK_CHECK(out.ndim == 2 && out.shape[1] == int64_t(tp_) * width_ && out.dtype == DType::bf16 &&
                  out.is_contiguous() && out.is_aligned(16),
              "mailbox gather: out ", out.describe(), " must be contiguous 16-byte aligned BF16 [b, ",
              int64_t(tp_) * width_, "]");
  SPARK_CHECK(out.device == device_, "mailbox gather: out ", out.describe(), " is not on cuda:",
              device_);
  gather(out.data, b, stream, options);
}

void LamportMailbox::publish_enqueued() {
  if (enqueue_order_) enqueue_order_->published();
}

void LamportMailbox::before_consume(cudaStream_t stream) {
  if (enqueue_order_) enqueue_order_->before_consume(detail::is_capturing(stream));
}

std::optional<std::string> LamportMailbox::timeout_report() const {
  const uint32_t r = *static_cast<volatile uint32_t*>(record_host_);
  if (!mailbox::record_valid(r)) return std::nullopt;
  const int rank = mailbox::record_rank(r), stage = mailbox::record_stage(r), source = mailbox::record_source(r),
            row = mailbox::record_row(r);
  const auto on = [&](const char* what) { return detail::concat("mailbox ", what, " on rank ", rank, " (cuda:", device_, ")"); };
  switch (mailbox::record_kind(r)) {
    case mailbox::kNoPublish:
      return detail::concat(on("protocol error"), ": a consumer of stage ", stage,
                            " ran with no publish since the last consume (a skipped publish or a second gather)");
    case mailbox::kDoublePublish:
      return detail::concat(on("protocol error"), ": stage ", stage,
                            " was published twice with no consume in between (its peers fail this call too)");
    case mailbox::kRowsDiffer:
      return detail::concat(on("protocol error"), ": rank ", source, " published stage ", stage, " with b = ", row,
                            " where this rank consumed another b (every rank must call with the same b)");
    case mailbox::kTagDiffer:
      return detail::concat(on("protocol error"), ": rank ", source, " published stage ", stage, " with tag ", row,
                            " (the Pooler's layer) where this rank consumed another (every rank must call the same "
                            "layer in the same order)");
    case mailbox::kPeerFailed:
      return detail::concat(on("failure"), ": rank ", source, "'s mailbox had failed (or it published stage ", stage,
                            " twice): its report names the cause");
    default:
      return detail::concat(on("spin timeout"), ": stage ", stage, ", source ", source, ", row ", row,
                            " was not published within ", view_.spin_timeout_ns / 1e9,
                            " s (a peer is missing, late, or ran its calls in another order)");
  }
}

void LamportMailbox::raise_if_failed(cudaError_t err) const {
  if (err == cudaSuccess) return check();
  if (auto report = timeout_report())
    throw RuntimeError(detail::concat(
        *report, "; the consumer trapped, which poisons this device's CUDA context for the rest "
                 "of the process (", cudaGetErrorName(err), ")"));
  CUDA_CHECK(err);
}

void LamportMailbox::check() const {
  if (auto report = timeout_report())
    throw RuntimeError(detail::concat(*report,
                                      "; the consumers stopped waiting and poisoned their outputs: destroy this "
                                      "mailbox (and what uses it) and build new ones"));
}

void LamportMailbox::synchronize(cudaStream_t stream) const {
  detail::DeviceGuard guard(device_);
  raise_if_failed(cudaStreamSynchronize(stream));
}

void LamportMailbox::warm_up(cudaStream_t stream) {
  SPARK_CHECK(!detail::is_capturing(stream), "mailbox warm_up cannot run under CUDA graph capture");
  detail::DeviceGuard guard(device_);
  // Nobody starts spinning while a peer may still be setting up.
  group_->barrier();
  void* src = nullptr;
  void* out = nullptr;
  CUDA_CHECK(cudaMalloc(&src, size_t(capacity_) * width_ * 2));
  try {
    CUDA_CHECK(cudaMalloc(&out, size_t(capacity_) * tp_ * width_ * 2));
    CUDA_CHECK(cudaMemsetAsync(src, 0, size_t(capacity_) * width_ * 2, stream));
    publish(src, capacity_, stream);
    gather(out, capacity_, stream);
    synchronize(stream);
  } catch (...) {
    cudaFree(src);
    if (out) cudaFree(out);
    throw;
  }
  CUDA_CHECK(cudaFree(src));
  CUDA_CHECK(cudaFree(out));
  group_->barrier();
}

void LamportMailbox::barrier() {
  {
    detail::DeviceGuard guard(device_);
    raise_if_failed(cudaDeviceSynchronize());
  }
  group_->barrier();
}

}  // namespace spark_decode
