// Built against the installed package only (tests/install/CMakeLists.txt):
// the library's host code, with its kernels linked in, runs in a plain C++17
// program on a machine without a GPU. Exit status 0 when every check holds.
#include <cstdio>
#include <cstdint>
#include <string>

#include "spark_decode/bf16.h"
#include "spark_decode/reference.h"
#include "spark_decode/types.h"
#include "spark_decode/unpooler.h"

namespace sd = spark_decode;

static int failures = 0;
static void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what.c_str());
  failures += ok ? 0 : 1;
}

int main() {
  // The CPU reference on a case worked by hand: x = [1, 2], W = [[3, 4],
  // [0.5, -1]] gives y = [1*3 + 2*4, 1*0.5 - 2*1] = [11, -1.5], exact in BF16.
  const uint16_t x[2] = {sd::float_to_bf16_rne(1.0f), sd::float_to_bf16_rne(2.0f)};
  const uint16_t w[4] = {sd::float_to_bf16_rne(3.0f), sd::float_to_bf16_rne(4.0f), sd::float_to_bf16_rne(0.5f),
                         sd::float_to_bf16_rne(-1.0f)};
  uint16_t y[2] = {0, 0};
  sd::reference::gemm_bf16(x, w, y, 1, 2, 2);
  check(sd::bf16_to_float(y[0]) == 11.0f && sd::bf16_to_float(y[1]) == -1.5f, "reference GEMM [1,2] x [[3,4],[0.5,-1]]^T");

  // Validation from unpooler.cu (the translation unit with the kernels): a
  // host-memory shard is refused with its reason, S = 3 is not a split.
  alignas(16) uint16_t host_weight[16 * 64] = {};
  const auto weight = sd::TensorRef::contiguous(host_weight, sd::DType::bf16, {16, 64}, -1);
  const auto reason = sd::Unpooler::unsupported(weight);
  check(reason && reason->find("device memory") != std::string::npos,
        "host shard refused: " + reason.value_or("(no reason)"));
  check(sd::launch_unsupported(8192, 4096, 3, 256, 2).has_value(), "S = 3 refused");

  // The tactic table is there and serves the model's largest shape.
  const sd::SplitKTactic t = sd::unpooler_tactic(8192, 4096);
  check(!sd::launch_unsupported(8192, 4096, t), "table tactic for [8192, 4096]: " + t.to_string());
  return failures == 0 ? 0 : 1;
}
