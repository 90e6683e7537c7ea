// `spark-decode verify` on the GPUs (tools/verify.h): the checks of one
// rank, every rank a thread.
//
// Ranks may share a GPU. Then no rank may wait for the whole device while a
// peer's consumer may be waiting for this rank's next publish
// (mailbox.h, shares_device): everything is allocated and every kernel
// loaded before the mailbox checks start (a barrier between), and during
// them every copy and wait is on this rank's own stream.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "harness.h"
#include "reference/mailbox_payload.h"
#include "spark_decode/bf16.h"
#include "spark_decode/error.h"
#include "spark_decode/expert_norm.h"
#include "spark_decode/group.h"
#include "spark_decode/mailbox.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/nvfp4.h"
#include "spark_decode/pooler.h"
#include "spark_decode/reference.h"
#include "spark_decode/unpooler.h"
#include "stock_exchange.h"
#include "verify.h"

namespace spark_decode::tool {

using reference::arrived_bits;
using reference::payload_bits;

namespace {

using bench::DeviceMemory;
using bench::Stream;
using bench::download;

constexpr int kBatches[] = {1, 7, 16};
constexpr int kCap = kMaxBatch;
constexpr int kNormRows = 64;
constexpr float kEps = kMuseSpark.norm_eps, kGainCenter = kMuseSpark.gain_center;
// The formats of the verify Pooler's three layers (one weight shared).
constexpr OutputFormat kFormats[] = {OutputFormat::bf16, OutputFormat::nvfp4, OutputFormat::nvfp4_swizzled};

const char* const kUnpoolerGemm = "unpooler GEMM";
const char* const kPoolerGemm = "pooler GEMM";
const char* const kMailbox = "mailbox publish + gather";
const char* const kZeroCopy = "zero-copy unpooler publish + gather";
const char* const kExpertNorm = "ExpertNorm";
const char* const kQuantLinear = "nvfp4_quantize, linear scales";
const char* const kQuantSwizzled = "nvfp4_quantize, swizzled scales";
std::string pooler_check(OutputFormat f) { return std::string("Pooler, ") + format_name(f); }

template <typename T>
void up(void* p, const std::vector<T>& host, cudaStream_t stream) {
  CUDA_CHECK(cudaMemcpyAsync(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));  // `host` may go away
}
void poison(const DeviceMemory& d, size_t bytes, cudaStream_t stream, int byte = 0xff) {
  CUDA_CHECK(cudaMemsetAsync(d.get(), byte, bytes, stream));
}

std::string dims(int64_t a, int64_t b) { return detail::concat("[", a, ", ", b, "]"); }

// The table's rows in order, before any rank adds to them.
void register_checks(Tally& tally, int tp) {
  const int H = kMuseSpark.hidden, P = kMuseSpark.pooled;
  tally.declare(kUnpoolerGemm, "[b, " + std::to_string(P) + "] x " + dims(H / tp, P) + "^T", "FP64 CPU reference",
                Rule::gemm_bound);
  tally.declare(kPoolerGemm, "[b, " + std::to_string(H) + "] x " + dims(P / tp, H) + "^T", "FP64 CPU reference",
                Rule::gemm_bound);
  tally.declare(kMailbox, "[b, " + std::to_string(P / tp) + " | " + std::to_string(H / tp) + "] per rank",
                "every rank's block, concatenated", Rule::bits,
                "payloads with -0.0, NaNs, infinities, subnormals; 6 calls per width (every stage)");
  tally.declare(kZeroCopy, "[b, " + std::to_string(H / tp) + "] per rank", "plain Unpooler + all-gather (host)",
                Rule::bits);
  for (OutputFormat f : kFormats)
    tally.declare(pooler_check(f), "[b, " + std::to_string(H) + "] -> [b, " + std::to_string(P) + "]",
                  "all-gather + ExpertNorm" + std::string(f == OutputFormat::bf16 ? "" : " + nvfp4_quantize"),
                  f == OutputFormat::bf16 ? Rule::bits_but_zero : Rule::bits,
                  "Pooler.run and project + publish + gather, into caller-owned outputs");
  tally.declare(kExpertNorm, dims(kNormRows, P), "FP64 CPU reference", Rule::one_ulp);
  tally.declare(kQuantLinear, dims(kNormRows, P), "CPU reference", Rule::nvfp4_boundary, "5 global scales");
  tally.declare(kQuantSwizzled, dims(kNormRows, P), "CPU reference", Rule::nvfp4_boundary, "5 global scales");
}

struct Rank {
  Group& group;
  const VerifyOptions& o;
  Tally& tally;
  uint64_t seed;
  int tp, rank, device;
  Stream stream;
  void say(const std::string& what) const {
    if (rank == 0 && o.progress) o.progress(what);
  }
};

void check_unpooler_gemm(Rank& r, Unpooler& u, const std::vector<uint16_t>& w, const std::vector<uint16_t>& x,
                         const DeviceMemory& dx) {
  const int n = u.n(), k = u.k();
  std::vector<double> exact, mag;
  reference_gemm(x.data(), w.data(), kCap, n, k, exact, mag);
  DeviceMemory out(size_t(2) * kCap * n);
  Check c = part(kUnpoolerGemm, 0, 0);
  for (int m : kBatches) {
    poison(out, size_t(2) * kCap * n, r.stream);
    u.run(dx.get(), out.get(), m, r.stream);
    const auto got = download<uint16_t>(out.get(), size_t(m) * n, r.stream);
    // A row does not depend on the others: the first m rows of the m = 16 reference.
    c.mismatches += count_gemm_violations(got.data(), exact, mag, m, n, k);
    c.elements += int64_t(m) * n;
  }
  r.tally.add(c);
}

void check_pooler_gemm(Rank& r, Pooler& pooler, const std::vector<uint16_t>& w, const std::vector<uint16_t>& x,
                       const DeviceMemory& dx) {
  const int n = pooler.shard_width(), k = pooler.hidden();
  std::vector<double> exact, mag;
  reference_gemm(x.data(), w.data(), kCap, n, k, exact, mag);
  Check c = part(kPoolerGemm, 0, 0);
  for (int b : kBatches) {
    const TensorRef shard = pooler.project(0, dx.get(), b, r.stream);
    const auto got = download<uint16_t>(shard.data, size_t(b) * n, r.stream);
    c.mismatches += count_gemm_violations(got.data(), exact, mag, b, n, k);
    c.elements += int64_t(b) * n;
  }
  r.tally.add(c);
}

void check_expert_norm(Rank& r, const ExpertNorm& norm, const std::vector<uint16_t>& w) {
  const int P = norm.cols();
  const auto x = varied_rows(kNormRows, P, r.seed + 17 * r.rank + 3);
  DeviceMemory dx(x.size() * 2), dy(x.size() * 2);
  up(dx.get(), x, r.stream);
  poison(dy, x.size() * 2, r.stream);
  norm.run(dx.get(), dy.get(), kNormRows, r.stream);
  const auto got = download<uint16_t>(dy.get(), x.size(), r.stream);
  std::vector<uint16_t> ref(x.size());
  std::vector<double> exact;
  reference::expert_norm(x.data(), w.data(), ref.data(), kNormRows, P, norm.eps(), norm.gain_center(), &exact);
  r.tally.add(part(kExpertNorm, int64_t(x.size()), count_ulp_violations(got.data(), exact.data(), x.size())));
}

void check_quantize(Rank& r, int P) {
  const auto y = varied_rows(kNormRows, P, r.seed + 17 * r.rank + 5);
  DeviceMemory dy(y.size() * 2), gs(4), a(y.size() / 2),
      sf(size_t(nvfp4_scale_rows(kNormRows, ScaleLayout::swizzled)) * nvfp4_scale_cols(P, ScaleLayout::swizzled));
  up(dy.get(), y, r.stream);
  // gs in FP32's normal range (rcp.approx.ftz flushes subnormals; no model
  // uses one): 1, typical (448 * 6 / amax), and far from 1 both ways.
  for (float g : {1.0f, 2688.0f / 7.3f, 0.0371f, 0x1p-20f, 0x1p24f}) {
    up(gs.get(), std::vector<float>{g}, r.stream);
    for (ScaleLayout layout : {ScaleLayout::linear, ScaleLayout::swizzled}) {
      const size_t sf_bytes = size_t(nvfp4_scale_rows(kNormRows, layout)) * nvfp4_scale_cols(P, layout);
      poison(a, y.size() / 2, r.stream);
      poison(sf, sf_bytes, r.stream, 0xcd);  // the swizzled layout's padding must come back zero
      nvfp4_quantize(dy.get(), gs.as<float>(), a.get(), sf.get(), kNormRows, P, r.stream, true, layout);
      const auto ga = download<uint8_t>(a.get(), y.size() / 2, r.stream);
      const auto gsf = download<uint8_t>(sf.get(), sf_bytes, r.stream);
      const Nvfp4Comparison cmp =
          compare_nvfp4_with_reference(y.data(), kNormRows, P, g, ga.data(), gsf.data(), layout);
      Check c = part(layout == ScaleLayout::linear ? kQuantLinear : kQuantSwizzled, cmp.elements, cmp.violations);
      c.tolerated = cmp.boundary;
      c.tolerated_limit = cmp.elements / 10000;
      r.tally.add(c);
    }
  }
}

// The mailbox checks' buffers, allocated before any of them starts: a free
// (which may wait for the whole device) between two checks could wait for a
// peer's consumer that waits for this rank's next publish.
struct MailboxBuffers {
  DeviceMemory src, out, yz, yp, g, rows;
  MailboxBuffers(int H, int P, int tp)
      : src(size_t(2) * kCap * std::max(H, P) / tp), out(size_t(2) * kCap * std::max(H, P)),
        yz(size_t(2) * kCap * H / tp), yp(size_t(2) * kCap * H / tp), g(size_t(2) * kCap * H),
        rows(size_t(2) * kCap * P) {}
};

// publish + gather at one width, 6 calls (every stage twice, b = 1, 7, 16).
void check_mailbox(Rank& r, LamportMailbox& mb, const MailboxBuffers& bufs, int64_t& call) {
  const int w = mb.width(), tp = r.tp;
  const DeviceMemory &src = bufs.src, &out = bufs.out;
  Check c = part(kMailbox, 0, 0);
  for (int round = 0; round < 2; ++round)
    for (int b : kBatches) {
      std::vector<uint16_t> block(size_t(b) * w);
      for (int i = 0; i < b; ++i)
        for (int j = 0; j < w; ++j) block[size_t(i) * w + j] = payload_bits(r.seed, call, r.rank, i, j);
      up(src.get(), block, r.stream);
      poison(out, size_t(2) * kCap * w * tp, r.stream);
      mb.publish(src.get(), b, r.stream);
      mb.gather(out.get(), b, r.stream);
      mb.synchronize(r.stream);
      const auto got = download<uint16_t>(out.get(), size_t(b) * w * tp, r.stream);
      // Every rank's block is the same pure function of (call, rank): the
      // all-gather computed here, not asked of the code under test.
      std::vector<uint16_t> want(got.size());
      for (int i = 0; i < b; ++i)
        for (int q = 0; q < tp; ++q)
          for (int j = 0; j < w; ++j)
            want[(size_t(i) * tp + q) * w + j] = arrived_bits(payload_bits(r.seed, call, q, i, j));
      c.mismatches += count_bf16_mismatches(got.data(), want.data(), got.size());
      c.elements += int64_t(got.size());
      ++call;
    }
  r.tally.add(c);
}

void check_zero_copy(Rank& r, Unpooler& zero_copy, Unpooler& plain, LamportMailbox& mb, const MailboxBuffers& bufs,
                     const DeviceMemory& m_in) {
  const int n = plain.n(), tp = r.tp;
  const DeviceMemory &yz = bufs.yz, &yp = bufs.yp, &g = bufs.g;
  Check c = part(kZeroCopy, 0, 0);
  for (int b : kBatches) {
    for (const DeviceMemory* d : {&yz, &yp}) poison(*d, size_t(2) * kCap * n, r.stream);
    poison(g, size_t(2) * kCap * n * tp, r.stream);
    zero_copy.run(m_in.get(), yz.get(), b, r.stream);
    mb.gather(g.get(), b, r.stream);
    plain.run(m_in.get(), yp.get(), b, r.stream);
    mb.synchronize(r.stream);
    const auto z = download<uint16_t>(yz.get(), size_t(b) * n, r.stream), p = download<uint16_t>(yp.get(), z.size(), r.stream);
    const auto got = download<uint16_t>(g.get(), size_t(b) * n * tp, r.stream);
    // The all-gather of the plain rows (-0.0 arrives as +0.0).
    const std::vector<uint8_t> all = r.group.all_gather(p.data(), p.size() * 2);
    const auto* bits = reinterpret_cast<const uint16_t*>(all.data());
    std::vector<uint16_t> want(got.size());
    for (int q = 0; q < tp; ++q)
      for (int i = 0; i < b; ++i)
        for (int j = 0; j < n; ++j)
          want[(size_t(i) * tp + q) * n + j] = arrived_bits(bits[(size_t(q) * b + i) * n + j]);
    c.mismatches += count_bf16_mismatches(z.data(), p.data(), z.size()) +
                    count_bf16_mismatches(got.data(), want.data(), got.size());
    c.elements += int64_t(z.size() + got.size());
  }
  r.tally.add(c);
}

// The consumer's outputs in caller-owned buffers.
struct Outputs {
  int P;
  DeviceMemory normed, a, a_sf;
  explicit Outputs(int P_)
      : P(P_), normed(size_t(2) * kCap * P), a(size_t(kCap) * P / 2),
        a_sf(size_t(nvfp4_scale_rows(kCap, ScaleLayout::swizzled)) * nvfp4_scale_cols(P, ScaleLayout::swizzled)) {}
  PoolerOutput view(OutputFormat f, int b, int device) const {
    return pooler_output_in(f, b, P, normed.get(), a.get(), a_sf.get(), device);
  }
  void poison_all(cudaStream_t s) const {
    poison(normed, size_t(2) * kCap * P, s);
    poison(a, size_t(kCap) * P / 2, s);
    poison(a_sf, size_t(nvfp4_scale_rows(kCap, ScaleLayout::swizzled)) * nvfp4_scale_cols(P, ScaleLayout::swizzled), s,
           0xcd);
  }
  // What format f at b wrote: normed rows, or a then a_sf.
  std::vector<uint8_t> download(OutputFormat f, int b, cudaStream_t s) const {
    if (f == OutputFormat::bf16) return bench::download<uint8_t>(normed.get(), size_t(2) * b * P, s);
    const ScaleLayout layout = f == OutputFormat::nvfp4 ? ScaleLayout::linear : ScaleLayout::swizzled;
    std::vector<uint8_t> v = bench::download<uint8_t>(a.get(), size_t(b) * P / 2, s);
    const auto sf = bench::download<uint8_t>(a_sf.get(), size_t(nvfp4_scale_rows(b, layout)) * nvfp4_scale_cols(P, layout), s);
    v.insert(v.end(), sf.begin(), sf.end());
    return v;
  }
};

void check_pooler(Rank& r, Pooler& pooler, const std::vector<ExpertNorm>& norms, const float* scales, bool pdl,
                  bench::StockExchange& exchange, const MailboxBuffers& bufs, const Outputs& ours, const Outputs& stock,
                  const DeviceMemory& dx) {
  const int P = pooler.pooled(), H = pooler.hidden(), sp = pooler.shard_width();
  const DeviceMemory& rows = bufs.rows;
  bool corrupted = false;
  for (int b : kBatches)
    for (int l = 0; l < 3; ++l) {
      const OutputFormat f = kFormats[l];
      // The stock path on this call's projected blocks (project touches no
      // mailbox state, and the GEMM is reproducible).
      const TensorRef shard = pooler.project(l, dx.get(), b, r.stream);
      const void* full = exchange.all_gather(shard.data, b, sp, rows.get(), r.stream);
      stock.poison_all(r.stream);
      norms[l].run(full, stock.normed.get(), b, r.stream);
      if (f != OutputFormat::bf16)
        nvfp4_quantize(stock.normed.get(), scales + l, stock.a.get(), stock.a_sf.get(), b, P, r.stream, pdl,
                       f == OutputFormat::nvfp4 ? ScaleLayout::linear : ScaleLayout::swizzled);
      std::vector<uint8_t> want = stock.download(f, b, r.stream);
      if (r.o.corrupt_reference && r.rank == 0 && f == OutputFormat::nvfp4 && !corrupted) {
        want[0] ^= 0x01;  // the test hook: one code of the stock result changed
        corrupted = true;
      }
      for (int form = 0; form < 2; ++form) {
        ours.poison_all(r.stream);
        const PoolerOutput out = ours.view(f, b, r.device);
        const TensorRef x = TensorRef::contiguous(dx.get(), DType::bf16, {b, H}, r.device);
        if (form == 0) {
          pooler.run(l, x, out, r.stream);
        } else {
          pooler.project(l, x, r.stream);
          pooler.publish(b, r.stream);
          pooler.gather(l, b, out, r.stream);
        }
        pooler.mailbox().synchronize(r.stream);
        const std::vector<uint8_t> got = ours.download(f, b, r.stream);
        const int64_t bad =
            f == OutputFormat::bf16
                ? count_bf16_mismatches(reinterpret_cast<const uint16_t*>(got.data()),
                                        reinterpret_cast<const uint16_t*>(want.data()), got.size() / 2, true)
                : count_byte_mismatches(got.data(), want.data(), got.size());
        r.tally.add(part(pooler_check(f), f == OutputFormat::bf16 ? int64_t(got.size() / 2) : int64_t(got.size()),
                         bad));
      }
    }
}

void rank_main(Group& group, const VerifyOptions& o, uint64_t seed, Tally& tally, bool& shares) {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  Rank r{group, o, tally, seed, group.size(), group.rank(), device, {}};
  const int tp = r.tp, H = kMuseSpark.hidden, P = kMuseSpark.pooled, sp = P / tp, sh = H / tp;
  const double spin_timeout = o.gpus < tp ? 60.0 : 5.0;  // ranks sharing a GPU take turns on it

  // ---- setup: data, objects, every kernel loaded ----
  r.say("setting up (tp " + std::to_string(tp) + ", model shapes)");
  const auto x = normal_bf16(size_t(kCap) * H, seed + 1);      // replicated tokens
  const auto m_in = normal_bf16(size_t(kCap) * P, seed + 2);   // the experts' output, replicated
  const auto nw = normal_bf16(P, seed + 3, 0.2f);              // the norm weight, replicated
  DeviceMemory dx(x.size() * 2), dm(m_in.size() * 2), dnw(nw.size() * 2), dunp(size_t(2) * sh * P),
      dpool(size_t(2) * sp * H), scales(3 * sizeof(float));
  up(dx.get(), x, r.stream);
  up(dm.get(), m_in, r.stream);
  up(dnw.get(), nw, r.stream);
  up(scales.get(), std::vector<float>{1.0f, 448.0f, 560.0f}, r.stream);
  bench::fill_random_bf16(dunp.get(), size_t(sh) * P, seed * 31 + 2 * r.rank, r.stream, 1.0f / 64);
  bench::fill_random_bf16(dpool.get(), size_t(sp) * H, seed * 31 + 2 * r.rank + 1, r.stream, 1.0f / 64);
  const auto unp_w = download<uint16_t>(dunp.get(), size_t(sh) * P, r.stream);
  const auto pool_w = download<uint16_t>(dpool.get(), size_t(sp) * H, r.stream);

  PoolerConfig pc;
  pc.tp = tp;
  pc.rank = r.rank;
  pc.device = device;
  pc.hidden = H;
  pc.pooled = P;
  pc.batches = {std::begin(kBatches), std::end(kBatches)};
  pc.options.spin_timeout_s = spin_timeout;
  Pooler pooler(group, pc);
  // The stock kernels as the mailbox's own where ranks share a GPU: without
  // PDL (mailbox.h, shares_device).
  const bool pdl = !pooler.mailbox().shares_device();
  const TensorRef nw_view = TensorRef::contiguous(dnw.get(), DType::bf16, {P}, device);
  std::vector<ExpertNorm> norms;
  for (int l = 0; l < 3; ++l) {
    PoolerLayer layer;
    layer.weight = TensorRef::contiguous(dpool.get(), DType::bf16, {sp, H}, device);
    layer.norm_weight = nw_view;
    layer.eps = kEps;
    layer.gain_center = kGainCenter;
    layer.format = kFormats[l];
    if (kFormats[l] != OutputFormat::bf16)
      layer.global_scale = TensorRef::contiguous(scales.as<float>() + l, DType::f32, {1}, device);
    pooler.attach(l, layer);
    norms.emplace_back(nw_view, kEps, kGainCenter, pdl);
  }
  LamportMailbox::Options mo;
  mo.spin_timeout_s = spin_timeout;
  LamportMailbox mb_pooled(group, tp, r.rank, kCap, sp, device, mo), mb_hidden(group, tp, r.rank, kCap, sh, device, mo);
  const TensorRef unp_view = TensorRef::contiguous(dunp.get(), DType::bf16, {sh, P}, device);
  Unpooler plain(unp_view);
  Unpooler::Options zo;
  zo.mailbox = &mb_hidden;
  Unpooler zero_copy(unp_view, zo);
  bench::StockExchange exchange(group, tp == 1 ? bench::StockExchange::Kind::local : bench::StockExchange::Kind::host,
                                kCap, sp, r.stream);
  MailboxBuffers bufs(H, P, tp);
  Outputs ours(P), stock(P);
  pooler.warm_up(r.stream);
  mb_pooled.warm_up(r.stream);
  mb_hidden.warm_up(r.stream);
  if (r.rank == 0) shares = !pdl;

  // ---- one rank at a time on its own data: no mailbox ----
  r.say("the GEMMs against the FP64 CPU reference");
  check_unpooler_gemm(r, plain, unp_w, m_in, dm);
  check_pooler_gemm(r, pooler, pool_w, x, dx);
  r.say("ExpertNorm and nvfp4_quantize against the CPU reference");
  check_expert_norm(r, norms[0], nw);
  check_quantize(r, P);
  CUDA_CHECK(cudaStreamSynchronize(r.stream));
  group.barrier();

  // ---- the mailbox's calls, every rank in the same order ----
  int64_t call = 0;
  r.say("mailbox publish + gather (pooled width)");
  check_mailbox(r, mb_pooled, bufs, call);
  r.say("mailbox publish + gather (hidden width)");
  check_mailbox(r, mb_hidden, bufs, call);
  r.say("zero-copy Unpooler publish + gather");
  check_zero_copy(r, zero_copy, plain, mb_hidden, bufs, dm);
  r.say("Pooler.run and project + publish + gather in every format");
  check_pooler(r, pooler, norms, scales.as<float>(), pdl, exchange, bufs, ours, stock, dx);
  CUDA_CHECK(cudaStreamSynchronize(r.stream));
  group.barrier();
  pooler.barrier();
  mb_pooled.barrier();
  mb_hidden.barrier();
}

}  // namespace

VerifyReport verify_gpu(const VerifyOptions& options) {
  VerifyOptions o = options;
  int visible = 0;
  CUDA_CHECK(cudaGetDeviceCount(&visible));
  if (o.tp <= 0)
    for (int tp : kTensorParallelSizes)
      if (tp <= visible) o.tp = tp;
  SPARK_CHECK(std::find(std::begin(kTensorParallelSizes), std::end(kTensorParallelSizes), o.tp) !=
                  std::end(kTensorParallelSizes),
              "tp ", o.tp, " is not one of 1, 2, 4, 8");
  if (o.gpus <= 0) o.gpus = std::min(o.tp, visible);
  SPARK_CHECK(o.gpus <= o.tp, "gpus ", o.gpus, " above tp ", o.tp, " (a rank runs on one GPU)");
  SPARK_CHECK_RUNTIME(o.gpus <= visible, "verify on ", o.gpus, " GPUs, but ", visible, " are visible");
  VerifyReport report;
  report.gpu_ran = true;
  report.tp = o.tp;
  report.gpus = o.gpus;
  report.seed = o.seed;
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  report.device = prop.name;
  Tally tally;
  register_checks(tally, o.tp);
  bool shares = false;
  bench::run_ranks(o.tp, [&](Group& group, int) { rank_main(group, o, o.seed, tally, shares); }, o.gpus);
  report.ranks_share_gpus = shares;
  report.checks = tally.checks();
  report.notes.push_back("b = 1, 7, 16 on every rank; every output poisoned before its kernel and every element "
                         "compared");
  if (shares)
    report.notes.push_back(std::to_string(o.tp) + " ranks on " + std::to_string(o.gpus) +
                           " GPU(s): the multi-rank code paths are checked, nothing is timed");
  return report;
}

}  // namespace spark_decode::tool
