// `spark-decode verify` without a GPU: the CPU reference against independent
// computations, and the CPU model of the mailbox protocol (ranks as threads,
// the arithmetic the kernels run: src/reference/mailbox_model.h) carrying
// both boundaries on a small shape, against the stock path computed whole.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <random>
#include <thread>

#include "reference/mailbox_model.h"
#include "reference/mailbox_payload.h"
#include "spark_decode/bf16.h"
#include "spark_decode/error.h"
#include "spark_decode/model_shape.h"
#include "spark_decode/nvfp4.h"
#include "spark_decode/pooler.h"
#include "spark_decode/reference.h"
#include "verify.h"

namespace spark_decode::tool {

using reference::arrived_bits;
using reference::payload_bits;

namespace {

// The small shape: every tp of 1..8 splits it into 16-column NVFP4 blocks
// (P / 8 = 16) and 16-byte mailbox rows.
constexpr int kH = 256, kP = 128, kCap = kMaxBatch, kRows = 32;
constexpr int kBatches[] = {1, 7, 16};
constexpr float kEps = kMuseSpark.norm_eps, kGainCenter = kMuseSpark.gain_center, kScale = 448.0f;
constexpr OutputFormat kFormats[] = {OutputFormat::bf16, OutputFormat::nvfp4, OutputFormat::nvfp4_swizzled};
const std::chrono::seconds kTimeout(20);

const char* const kGemm = "GEMM reference";
const char* const kNorm = "ExpertNorm reference";
const char* const kNvfp4 = "NVFP4 reference";
const char* const kModel = "mailbox protocol (CPU model)";
const char* const kUnpooler = "unpooler boundary (CPU model)";
std::string pooler_check(OutputFormat f) { return std::string("pooler boundary, ") + format_name(f) + " (CPU model)"; }

ScaleLayout layout_of(OutputFormat f) {
  return f == OutputFormat::nvfp4_swizzled ? ScaleLayout::swizzled : ScaleLayout::linear;
}

// ---- independent computations of the reference's semantics ----

// The E4M3 byte nearest to v >= 0 by search over every finite value, ties
// to the even code; above 448 the largest (satfinite).
uint8_t nearest_e4m3(float v) {
  int best = 0;
  double best_d = 1e300;
  for (int c = 0; c <= 0x7e; ++c) {
    const double d = std::fabs(double(e4m3_to_float(uint8_t(c))) - v);
    if (d < best_d || (d == best_d && c % 2 == 0)) best = c, best_d = d;
  }
  return uint8_t(best);
}

// The E2M1 code nearest to p by search, ties to the even code, saturating,
// the sign kept (also of values that round to zero).
uint8_t nearest_e2m1(float p) {
  static const double kValues[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double a = std::fabs(double(p));
  int best = 0;
  double best_d = 1e300;
  for (int c = 0; c < 8; ++c) {
    const double d = std::fabs(kValues[c] - a);
    if (d < best_d || (d == best_d && c % 2 == 0)) best = c, best_d = d;
  }
  return uint8_t(best | (std::signbit(p) ? 8 : 0));
}

// docs/design.md's swizzled offset, written out again.
int64_t swizzled_at(int r, int c, int scale_cols) {
  const int padded = (scale_cols + 3) / 4 * 4;
  return (int64_t(r / 128) * (padded / 4) + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
}

void check_gemm(Tally& tally, uint64_t seed) {
  int64_t elements = 0, bad = 0;
  for (auto [n, k] : {std::pair{kH, kP}, std::pair{kP, kH}}) {
    const auto x = normal_bf16(size_t(kCap) * k, seed + n), w = normal_bf16(size_t(n) * k, seed + n + 1);
    std::vector<uint16_t> out(size_t(kCap) * n);
    reference::gemm_bf16(x.data(), w.data(), out.data(), kCap, n, k);
    std::vector<double> exact(out.size()), mag(out.size());
    for (int i = 0; i < kCap; ++i)
      for (int j = 0; j < n; ++j) {
        long double s = 0, a = 0;
        for (int kk = k - 1; kk >= 0; --kk) {  // another order, wider sums
          const long double p = (long double)bf16_to_float(x[size_t(i) * k + kk]) * bf16_to_float(w[size_t(j) * k + kk]);
          s += p;
          a += std::fabs(p);
        }
        exact[size_t(i) * n + j] = double(s);
        mag[size_t(i) * n + j] = double(a);
      }
    bad += count_gemm_violations(out.data(), exact, mag, kCap, n, k);
    elements += int64_t(out.size());
  }
  tally.add(part(kGemm, elements, bad));
}

void check_norm(Tally& tally, uint64_t seed) {
  const auto x = varied_rows(kRows, kP, seed), w = normal_bf16(kP, seed + 1, 0.2f);
  std::vector<uint16_t> y(x.size());
  reference::expert_norm(x.data(), w.data(), y.data(), kRows, kP, kEps, kGainCenter);
  std::vector<double> exact(x.size());
  for (int r = 0; r < kRows; ++r) {
    long double ss = 0;
    for (int c = 0; c < kP; ++c) {
      const long double v = bf16_to_float(x[size_t(r) * kP + c]);
      ss += v * v;
    }
    const long double inv = 1.0L / std::sqrt(ss / kP + (long double)kEps);
    for (int c = 0; c < kP; ++c)
      exact[size_t(r) * kP + c] =
          double((long double)bf16_to_float(x[size_t(r) * kP + c]) * inv * ((long double)bf16_to_float(w[c]) + kGainCenter));
  }
  tally.add(part(kNorm, int64_t(y.size()), count_ulp_violations(y.data(), exact.data(), y.size())));
}

void check_nvfp4(Tally& tally, uint64_t seed) {
  const auto y = varied_rows(kRows, kP, seed);
  const int scale_cols = kP / kNvfp4Block;
  int64_t elements = 0, bad = 0;
  for (float gs : {1.0f, 2688.0f / 7.3f, 0.0371f, 0x1p-20f, 0x1p24f})
    for (ScaleLayout layout : {ScaleLayout::linear, ScaleLayout::swizzled}) {
      const size_t sf_bytes = size_t(nvfp4_scale_rows(kRows, layout)) * nvfp4_scale_cols(kP, layout);
      std::vector<uint8_t> a(size_t(kRows) * kP / 2), sf(sf_bytes, 0xcd), wa(a.size()), wsf(sf_bytes, 0);
      reference::nvfp4_quantize(y.data(), kRows, kP, gs, a.data(), sf.data(), layout);
      for (int r = 0; r < kRows; ++r)
        for (int blk = 0; blk < scale_cols; ++blk) {
          float v[kNvfp4Block], vmax = 0;
          for (int i = 0; i < kNvfp4Block; ++i) {
            v[i] = bf16_to_float(y[size_t(r) * kP + blk * kNvfp4Block + i]);
            vmax = std::fmax(vmax, std::fabs(v[i]));
          }
          const uint8_t s = nearest_e4m3(gs * (vmax * (1.0f / 6.0f)));
          const float sff = e4m3_to_float(s);
          const float os = sff == 0.0f ? 0.0f : 1.0f / (sff * (1.0f / gs));
          wsf[layout == ScaleLayout::linear ? int64_t(r) * scale_cols + blk : swizzled_at(r, blk, scale_cols)] = s;
          for (int j = 0; j < kNvfp4Block / 2; ++j)
            wa[size_t(r) * kP / 2 + blk * 8 + j] =
                uint8_t(nearest_e2m1(v[2 * j] * os) | nearest_e2m1(v[2 * j + 1] * os) << 4);
        }
      bad += count_byte_mismatches(a.data(), wa.data(), a.size()) + count_byte_mismatches(sf.data(), wsf.data(), sf_bytes);
      elements += int64_t(a.size() + sf_bytes);
    }
  tally.add(part(kNvfp4, elements, bad));
}

// The multi-rank checks of one rank (a thread): every model call in the same
// order on every rank.
struct Models {
  reference::MailboxModel protocol_p, protocol_h, pooled, hidden;
  Models(int tp)
      : protocol_p(tp, kCap, kP / tp), protocol_h(tp, kCap, kH / tp), pooled(tp, kCap, kP / tp), hidden(tp, kCap, kH / tp) {}
};

struct Inputs {
  std::vector<uint16_t> x, m, w_pool, w_unp, norm_w;  // x [cap, H], m [cap, P], W [P, H] and [H, P], [P]
};

void check_protocol(Tally& tally, reference::MailboxModel& model, int tp, int rank, uint64_t seed, int64_t& call) {
  const int w = model.layout().width;
  std::vector<int> rows;
  std::mt19937_64 g(seed);  // the same sequence on every rank
  for (int i = 0; i < 3; ++i) rows.insert(rows.end(), std::begin(kBatches), std::end(kBatches));
  for (int i = 0; i < 30; ++i) rows.push_back(std::uniform_int_distribution<int>(1, kCap)(g));
  int64_t elements = 0, bad = 0;
  std::vector<uint16_t> src(size_t(kCap) * w), out(size_t(kCap) * w * tp), want(out.size());
  for (int b : rows) {
    for (int i = 0; i < b; ++i)
      for (int j = 0; j < w; ++j) src[size_t(i) * w + j] = payload_bits(seed, call, rank, i, j);
    model.publish(rank, src.data(), b);
    model.consume(rank, out.data(), b, kTimeout);
    for (int i = 0; i < b; ++i)
      for (int q = 0; q < tp; ++q)
        for (int j = 0; j < w; ++j) want[(size_t(i) * tp + q) * w + j] = arrived_bits(payload_bits(seed, call, q, i, j));
    bad += count_bf16_mismatches(out.data(), want.data(), size_t(b) * w * tp);
    elements += int64_t(b) * w * tp;
    ++call;
  }
  tally.add(part(kModel, elements, bad));
}

void check_unpooler_boundary(Tally& tally, reference::MailboxModel& model, const Inputs& in, int tp, int rank) {
  const int sh = kH / tp;
  int64_t elements = 0, bad = 0;
  std::vector<uint16_t> whole(size_t(kCap) * kH), y(size_t(kCap) * sh), rows(size_t(kCap) * kH);
  reference::gemm_bf16(in.m.data(), in.w_unp.data(), whole.data(), kCap, kH, kP);  // the stock path: one GEMM
  for (uint16_t& v : whole) v = arrived_bits(v);
  for (int b : kBatches) {
    reference::gemm_bf16(in.m.data(), in.w_unp.data() + size_t(rank) * sh * kP, y.data(), b, sh, kP);
    model.publish(rank, y.data(), b);
    model.consume(rank, rows.data(), b, kTimeout);
    bad += count_bf16_mismatches(rows.data(), whole.data(), size_t(b) * kH);
    elements += int64_t(b) * kH;
  }
  tally.add(part(kUnpooler, elements, bad));
}

// The expert input of rows [b, P] in format f: normed BF16 rows, or a then
// a_sf bytes.
std::vector<uint8_t> expert_input(const std::vector<uint16_t>& rows, const std::vector<uint16_t>& norm_w, int b,
                                  OutputFormat f) {
  std::vector<uint16_t> normed(size_t(b) * kP);
  reference::expert_norm(rows.data(), norm_w.data(), normed.data(), b, kP, kEps, kGainCenter);
  if (f == OutputFormat::bf16) {
    std::vector<uint8_t> bytes(normed.size() * 2);
    std::memcpy(bytes.data(), normed.data(), bytes.size());
    return bytes;
  }
  const ScaleLayout layout = layout_of(f);
  std::vector<uint8_t> out(size_t(b) * kP / 2 + size_t(nvfp4_scale_rows(b, layout)) * nvfp4_scale_cols(kP, layout));
  reference::nvfp4_quantize(normed.data(), b, kP, kScale, out.data(), out.data() + size_t(b) * kP / 2, layout);
  return out;
}

void check_pooler_boundary(Tally& tally, reference::MailboxModel& model, const Inputs& in, int tp, int rank,
                           bool corrupt) {
  const int sp = kP / tp;
  std::vector<uint16_t> whole(size_t(kCap) * kP), shard(size_t(kCap) * sp), rows(size_t(kCap) * kP);
  reference::gemm_bf16(in.x.data(), in.w_pool.data(), whole.data(), kCap, kP, kH);  // the stock path's GEMM, whole
  bool corrupted = false;
  for (int b : kBatches)
    for (OutputFormat f : kFormats) {
      reference::gemm_bf16(in.x.data(), in.w_pool.data() + size_t(rank) * sp * kH, shard.data(), b, sp, kH);
      model.publish(rank, shard.data(), b);
      model.consume(rank, rows.data(), b, kTimeout);
      const std::vector<uint8_t> got = expert_input(rows, in.norm_w, b, f);
      std::vector<uint8_t> want = expert_input(whole, in.norm_w, b, f);
      if (corrupt && rank == 0 && f == OutputFormat::nvfp4 && !corrupted) {
        want[0] ^= 0x01;  // the test hook: one code of the stock result changed
        corrupted = true;
      }
      const int64_t bad = f == OutputFormat::bf16
                              ? count_bf16_mismatches(reinterpret_cast<const uint16_t*>(got.data()),
                                                      reinterpret_cast<const uint16_t*>(want.data()), got.size() / 2,
                                                      true)
                              : count_byte_mismatches(got.data(), want.data(), got.size());
      tally.add(part(pooler_check(f), int64_t(f == OutputFormat::bf16 ? got.size() / 2 : got.size()), bad));
    }
}

void register_checks(Tally& tally, int tp) {
  const std::string P = std::to_string(kP), H = std::to_string(kH);
  tally.declare(kGemm, "m = 16, N x K = " + H + " x " + P + ", " + P + " x " + H, "long-double sums, reverse order",
                Rule::gemm_bound);
  const std::string rows = detail::concat("[", kRows, ", ", kP, "]");
  tally.declare(kNorm, rows, "long-double norm", Rule::one_ulp);
  tally.declare(kNvfp4, rows, "nearest-value search, both layouts", Rule::bits,
                "every E4M3 and E2M1 value searched; 5 global scales");
  tally.declare(kModel, "[b, " + std::to_string(kP / tp) + " | " + std::to_string(kH / tp) + "] per rank",
                "every rank's block, concatenated", Rule::bits,
                "payloads with -0.0, NaNs, infinities, subnormals; 39 calls");
  tally.declare(kUnpooler, "[b, " + P + "] -> [b, " + std::to_string(kH / tp) + "] per rank", "the whole GEMM",
                Rule::bits);
  for (OutputFormat f : kFormats)
    tally.declare(pooler_check(f), "[b, " + H + "] -> [b, " + P + "]",
                  std::string("the whole GEMM + norm") + (f == OutputFormat::bf16 ? "" : " + NVFP4"),
                  f == OutputFormat::bf16 ? Rule::bits_but_zero : Rule::bits);
}

}  // namespace

VerifyReport verify_cpu(const VerifyOptions& options) {
  const int tp = options.tp > 0 ? options.tp : 2;
  SPARK_CHECK(std::find(std::begin(kTensorParallelSizes), std::end(kTensorParallelSizes), tp) !=
                  std::end(kTensorParallelSizes),
              "tp ", tp, " is not one of 1, 2, 4, 8");
  const uint64_t seed = options.seed;
  VerifyReport report;
  report.tp = tp;
  report.seed = seed;
  report.device = "The CPU reference and the CPU model of the mailbox protocol (ranks as threads, the kernels' "
                  "stage and slot arithmetic), tp " + std::to_string(tp) + ", on a small shape (H = " +
                  std::to_string(kH) + ", P = " + std::to_string(kP) + "); nothing was timed";
  Tally tally;
  register_checks(tally, tp);
  if (options.progress) options.progress("the CPU reference against independent computations");
  check_gemm(tally, seed + 1);
  check_norm(tally, seed + 2);
  check_nvfp4(tally, seed + 3);

  if (options.progress) options.progress("the CPU model of the mailbox carrying both boundaries, " + std::to_string(tp) +
                                         " ranks as threads");
  Inputs in;
  in.x = normal_bf16(size_t(kCap) * kH, seed + 4);
  in.m = normal_bf16(size_t(kCap) * kP, seed + 5);
  in.w_pool = normal_bf16(size_t(kP) * kH, seed + 6, 1.0f / 16);
  in.w_unp = normal_bf16(size_t(kH) * kP, seed + 7, 1.0f / 16);
  in.norm_w = normal_bf16(kP, seed + 8, 0.2f);
  Models models(tp);
  std::vector<std::exception_ptr> errors(tp);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < tp; ++rank)
    ranks.emplace_back([&, rank] {
      try {
        int64_t call = 0;
        check_protocol(tally, models.protocol_p, tp, rank, seed + 9, call);
        check_protocol(tally, models.protocol_h, tp, rank, seed + 10, call);
        check_unpooler_boundary(tally, models.hidden, in, tp, rank);
        check_pooler_boundary(tally, models.pooled, in, tp, rank, options.corrupt_reference);
      } catch (...) {
        errors[rank] = std::current_exception();
      }
    });
  for (auto& t : ranks) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  report.checks = tally.checks();
  report.notes.push_back("No GPU ran: the model's shapes, the kernels and the stock path's GPU kernels need one; "
                         "`spark-decode verify` on a GPU machine checks them.");
  return report;
}

}  // namespace spark_decode::tool
