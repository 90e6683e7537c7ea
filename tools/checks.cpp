#include "checks.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

#include "reference/mailbox_payload.h"
#include "spark_decode/bf16.h"
#include "spark_decode/reference.h"

namespace spark_decode::tool {

using reference::splitmix64;
namespace {


// Runs fn(begin, end) over [0, n) split across the host's threads.
template <typename Fn>
void parallel_for(int n, Fn fn) {
  const int threads = std::max(1, std::min<int>(n, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] { fn(int(int64_t(n) * t / threads), int(int64_t(n) * (t + 1) / threads)); });
  for (auto& th : pool) th.join();
}

}  // namespace

const char* rule_name(Rule rule) {
  switch (rule) {
    case Rule::bits: return "bit for bit";
    case Rule::bits_but_zero: return "bit for bit but +-0";
    case Rule::gemm_bound: return "GEMM bound";
    case Rule::one_ulp: return "1 BF16 ulp";
    case Rule::nvfp4_boundary: return "boundary cases";
  }
  return "?";
}

std::string rule_text(Rule rule) {
  switch (rule) {
    case Rule::bits: return "bit for bit: every byte equal (a published -0.0 arrives as +0.0, as the mailbox defines)";
    case Rule::bits_but_zero:
      return "bit for bit but +-0: equal except that +0.0 and -0.0 count as equal (publishers store -0.0 as +0.0; "
             "docs/design.md, \"Exact semantics\", Bit-exactness)";
    case Rule::gemm_bound:
      return "GEMM bound: |got - exact| <= 2^-8 |exact| + K 2^-23 sum_k |x w| + 2^-126 (the final BF16 rounding, twice "
             "FP32's worst summation error, the smallest normal)";
    case Rule::one_ulp:
      return "1 BF16 ulp: |got - exact| <= one BF16 ulp of exact's binade (rsqrt.approx and FP32 against FP64)";
    case Rule::nvfp4_boundary:
      return "boundary cases: equal, except a scale byte that is a neighbour within 2^-20 of an E4M3 midpoint or a "
             "code that is a same-sign neighbour within 2^-20 of an E2M1 threshold (rcp.approx against exact "
             "division), fewer than 1 in 10^4; padding zero";
  }
  return "?";
}

int64_t count_bf16_mismatches(const uint16_t* got, const uint16_t* want, size_t n, bool zero_sign_free) {
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    if (got[i] == want[i]) continue;
    if (zero_sign_free && (got[i] & 0x7fff) == 0 && (want[i] & 0x7fff) == 0) continue;
    ++bad;
  }
  return bad;
}

int64_t count_byte_mismatches(const uint8_t* got, const uint8_t* want, size_t n) {
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += got[i] != want[i];
  return bad;
}

void reference_gemm(const uint16_t* x, const uint16_t* w, int m, int n, int k, std::vector<double>& exact,
                    std::vector<double>& magnitude) {
  exact.assign(size_t(m) * n, 0.0);
  magnitude.assign(size_t(m) * n, 0.0);
  parallel_for(n, [&](int n0, int n1) {
    if (n1 == n0) return;
    std::vector<uint16_t> out(size_t(m) * (n1 - n0));
    std::vector<double> e, g;
    reference::gemm_bf16(x, w + size_t(n0) * k, out.data(), m, n1 - n0, k, &e, &g);
    for (int i = 0; i < m; ++i)
      for (int j = n0; j < n1; ++j) {
        exact[size_t(i) * n + j] = e[size_t(i) * (n1 - n0) + (j - n0)];
        magnitude[size_t(i) * n + j] = g[size_t(i) * (n1 - n0) + (j - n0)];
      }
  });
}

int64_t count_gemm_violations(const uint16_t* got, const std::vector<double>& exact,
                              const std::vector<double>& magnitude, int rows, int n, int k) {
  int64_t bad = 0;
  for (size_t i = 0; i < size_t(rows) * n; ++i) {
    const double bound = std::ldexp(std::fabs(exact[i]), -8) + k * std::ldexp(magnitude[i], -23) + 0x1p-126;
    if (!(std::fabs(double(bf16_to_float(got[i])) - exact[i]) <= bound)) ++bad;
  }
  return bad;
}

int64_t count_ulp_violations(const uint16_t* got, const double* exact, size_t n) {
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double ulp = std::ldexp(1.0, std::max(std::ilogb(exact[i]), -126) - 7);
    if (!(std::fabs(double(bf16_to_float(got[i])) - exact[i]) <= ulp)) ++bad;
  }
  return bad;
}

Nvfp4Comparison compare_nvfp4_with_reference(const uint16_t* y, int rows, int cols, float gs, const uint8_t* a,
                                             const uint8_t* a_sf, ScaleLayout layout) {
  const int scale_cols = cols / kNvfp4Block;
  const size_t sf_bytes = size_t(nvfp4_scale_rows(rows, layout)) * nvfp4_scale_cols(cols, layout);
  std::vector<uint8_t> ra(size_t(rows) * cols / 2), rsf(sf_bytes);
  reference::nvfp4_quantize(y, rows, cols, gs, ra.data(), rsf.data(), layout);
  Nvfp4Comparison c;
  std::vector<bool> real(sf_bytes, false);
  for (int r = 0; r < rows; ++r)
    for (int blk = 0; blk < scale_cols; ++blk) {
      const int64_t at = nvfp4_scale_offset(r, blk, cols, layout);
      real[at] = true;
      float yb[kNvfp4Block], vmax = 0;
      for (int i = 0; i < kNvfp4Block; ++i) {
        yb[i] = bf16_to_float(y[size_t(r) * cols + blk * kNvfp4Block + i]);
        vmax = std::fmax(vmax, std::fabs(yb[i]));
      }
      ++c.elements;
      if (a_sf[at] != rsf[at]) {
        // Only rcp.approx(6) against the exact 1/6 moves a scale: a neighbour,
        // at an E4M3 midpoint. Its codes then follow another scale.
        const bool allowed = std::abs(int(a_sf[at]) - int(rsf[at])) == 1 &&
                             reference::e4m3_midpoint_distance(gs * (vmax * (1.0f / 6.0f))) <= 0x1p-20;
        ++(allowed ? c.boundary : c.violations);
        c.elements += kNvfp4Block;
        continue;
      }
      const float sff = e4m3_to_float(rsf[at]);
      const float os = sff == 0.0f ? 0.0f : 1.0f / (sff * (1.0f / gs));
      for (int i = 0; i < kNvfp4Block; ++i) {
        ++c.elements;
        const size_t byte = size_t(r) * cols / 2 + blk * 8 + i / 2;
        const uint8_t g = (a[byte] >> (4 * (i & 1))) & 0xf, want = (ra[byte] >> (4 * (i & 1))) & 0xf;
        if (g == want) continue;
        const bool allowed = (g & 8) == (want & 8) && std::abs(int(g & 7) - int(want & 7)) == 1 &&
                             reference::e2m1_threshold_distance(yb[i] * os) <= 0x1p-20;
        ++(allowed ? c.boundary : c.violations);
      }
    }
  for (size_t i = 0; i < sf_bytes; ++i)
    if (!real[i]) {
      ++c.elements;
      c.violations += a_sf[i] != 0;
    }
  return c;
}


std::vector<uint16_t> normal_bf16(size_t count, uint64_t seed, float scale) {
  std::vector<uint16_t> out(count);
  const int chunks = 64;
  parallel_for(chunks, [&](int c0, int c1) {
    for (int c = c0; c < c1; ++c) {
      std::mt19937_64 g(splitmix64(seed) + c);
      std::normal_distribution<float> normal(0.0f, scale);
      for (size_t i = count * c / chunks; i < count * (c + 1) / chunks; ++i) out[i] = float_to_bf16_rne(normal(g));
    }
  });
  return out;
}

std::vector<uint16_t> varied_rows(int rows, int cols, uint64_t seed) {
  std::vector<uint16_t> out(size_t(rows) * cols);
  std::mt19937_64 g(splitmix64(seed));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int r = 0; r < rows; ++r) {
    const float scale = std::ldexp(1.0f, std::uniform_int_distribution<int>(-8, 8)(g));
    const int kind = r % 4;
    uint16_t* row = out.data() + size_t(r) * cols;
    for (int c = 0; c < cols; ++c) {
      row[c] = float_to_bf16_rne(normal(g) * scale);
      if (kind == 3 && unit(g) < 0.3f) row[c] = uint16_t(std::uniform_int_distribution<int>(1, 127)(g) | (unit(g) < 0.5f ? 0x8000 : 0));
    }
    if (kind == 2)
      for (int b = 0; b < cols / kNvfp4Block; ++b)
        if (unit(g) < 0.4f)
          for (int i = 0; i < kNvfp4Block; ++i) row[b * kNvfp4Block + i] = unit(g) < 0.5f ? 0x8000 : 0;
  }
  return out;
}

}  // namespace spark_decode::tool
