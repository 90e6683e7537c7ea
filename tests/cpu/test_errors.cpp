#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "spark_decode/error.h"
#include "spark_decode/trace.h"
#include "spark_decode/types.h"

namespace sd = spark_decode;

TEST(Errors, CheckThrowsInvalidArgumentWithItsReason) {
  try {
    SPARK_CHECK(1 + 1 == 3, "arithmetic is off by ", 1);
    FAIL() << "no throw";
  } catch (const sd::InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "arithmetic is off by 1");
  }
  EXPECT_NO_THROW(SPARK_CHECK(true, "never"));
}

TEST(Errors, RuntimeCheckThrowsRuntimeError) {
  EXPECT_THROW(SPARK_CHECK_RUNTIME(false, "x"), sd::RuntimeError);
}

// A call whose text differs from its error's name, so that the message's
// two parts are checked apart.
namespace {
cudaError_t failing_runtime_call(int) { return cudaErrorInvalidValue; }
}  // namespace

TEST(Errors, CudaCheckNamesTheErrorAndTheCall) {
  int line = 0;
  try {
    line = __LINE__ + 1;
    CUDA_CHECK(failing_runtime_call(7));
    FAIL() << "no throw";
  } catch (const sd::RuntimeError& e) {
    const std::string what = e.what();
    const std::string want = "CUDA error " + std::to_string(static_cast<int>(cudaErrorInvalidValue)) +
                             " (cudaErrorInvalidValue: " + cudaGetErrorString(cudaErrorInvalidValue) +
                             ") in failing_runtime_call(7) at ";
    EXPECT_EQ(what.rfind(want, 0), 0u) << what;
    EXPECT_NE(what.find("test_errors.cpp:" + std::to_string(line)), std::string::npos) << what;
  }
}

TEST(TensorRef, ContiguousViewsAndDescriptions) {
  alignas(16) static uint16_t storage[64];
  auto t = sd::TensorRef::contiguous(storage, sd::DType::bf16, {4, 16}, 0);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.numel(), 64);
  EXPECT_EQ(t.describe(), "[4, 16] bf16 on cuda:0");
  auto rows = t.narrow_rows(2, 2);
  EXPECT_EQ(rows.data, storage + 32);
  EXPECT_EQ(rows.shape[0], 2);
  t.stride[0] = 32;
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_THROW(t.narrow_rows(3, 2), sd::InvalidArgument);
}

// The default build carries no trace code, and says how to get it.
TEST(Trace, OffUnlessConfiguredAndSaysHow) {
#ifdef SPARK_DECODE_TRACE
  GTEST_SKIP() << "this build traces (SPARK_DECODE_TRACE=ON)";
#else
  EXPECT_FALSE(sd::trace::compiled_in());
  try {
    sd::trace::start(16);
    FAIL() << "start() without the trace compiled in did not throw";
  } catch (const sd::RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("-DSPARK_DECODE_TRACE=ON"), std::string::npos) << e.what();
  }
  EXPECT_THROW(sd::trace::stop(), sd::RuntimeError);
#endif
  EXPECT_STREQ(sd::trace::kernel_name(sd::trace::kSplitKMma), "splitk_mma");
  EXPECT_STREQ(sd::trace::kernel_name(sd::trace::kGatherNorm), "gather_norm");
  EXPECT_STREQ(sd::trace::kernel_name(sd::trace::kRingMma), "ring_mma");
  EXPECT_STREQ(sd::trace::kernel_name(sd::trace::kOnchipMma), "onchip_mma");
  EXPECT_STREQ(sd::trace::kernel_name(0), "unknown");
}
