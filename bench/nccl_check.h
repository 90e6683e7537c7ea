// NCCL calls of the baselines: a failure throws RuntimeError with NCCL's text.
#pragma once

#include <nccl.h>

#include "spark_decode/error.h"

#define NCCL_CHECK(expr)                                                                              \
  do {                                                                                                \
    ncclResult_t r_ = (expr);                                                                         \
    SPARK_CHECK_RUNTIME(r_ == ncclSuccess, "NCCL error ", ncclGetErrorString(r_), " in ", #expr); \
  } while (0)
