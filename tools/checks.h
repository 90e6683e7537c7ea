// The comparison rules of `spark-decode verify` (docs/design.md, "Exact
// semantics"), host-only: each counts the elements that break its rule, so
// that a report says how many, not just the first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "spark_decode/nvfp4.h"

namespace spark_decode::tool {

// How two results must agree; each rule's full text is rule_text().
enum class Rule {
  bits,             // bit for bit
  bits_but_zero,    // bit for bit, except that +0.0 and -0.0 are equal (the edge layers' normed rows)
  gemm_bound,       // |got - exact| <= 2^-8 |exact| + K 2^-23 sum_k |x w| + 2^-126
  one_ulp,          // |got - exact| <= one BF16 ulp of exact's binade (2^-133 below 2^-126)
  nvfp4_boundary,   // equal, but for neighbours at a rounding boundary (within 2^-20), fewer than 1 in 10^4
};
const char* rule_name(Rule rule);
std::string rule_text(Rule rule);

// BF16 elements of got[n] that differ from want[n] (bits_but_zero: the
// sign of a zero ignored).
int64_t count_bf16_mismatches(const uint16_t* got, const uint16_t* want, size_t n, bool zero_sign_free = false);
int64_t count_byte_mismatches(const uint8_t* got, const uint8_t* want, size_t n);

// The FP64 GEMM reference of x[m, k] @ w[n, k]^T (reference::gemm_bf16 over
// the host's threads): exact sums and sum |x w|, [m][n].
void reference_gemm(const uint16_t* x, const uint16_t* w, int m, int n, int k, std::vector<double>& exact,
                    std::vector<double>& magnitude);
// Elements of got [rows][n] outside the GEMM bound of the first `rows` rows
// of (exact, magnitude) [.][n].
int64_t count_gemm_violations(const uint16_t* got, const std::vector<double>& exact,
                              const std::vector<double>& magnitude, int rows, int n, int k);
// Elements of got[n] farther than one BF16 ulp from exact[n].
int64_t count_ulp_violations(const uint16_t* got, const double* exact, size_t n);

// A quantizer's a and a_sf (in `layout`, padding included) for y [rows, cols]
// BF16 with global scale gs against the CPU reference: `violations` break
// the rule (not neighbours, not at a boundary, padding not zero),
// `boundary` differ as the rule allows (rcp.approx against exact division).
struct Nvfp4Comparison {
  int64_t elements = 0, violations = 0, boundary = 0;
};
Nvfp4Comparison compare_nvfp4_with_reference(const uint16_t* y, int rows, int cols, float gs, const uint8_t* a,
                                             const uint8_t* a_sf, ScaleLayout layout);

// N(0, scale^2) BF16 values from `seed` (host).
std::vector<uint16_t> normal_bf16(size_t count, uint64_t seed, float scale = 1.0f);
// Rows as the norm sees them: normal at a random scale per row (2^-8..2^8),
// some with zero blocks of either sign, some with subnormals.
std::vector<uint16_t> varied_rows(int rows, int cols, uint64_t seed);

}  // namespace spark_decode::tool
