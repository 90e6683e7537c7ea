# Tests of the Pooler, ExpertNorm and NVFP4 (issue 4).
target_sources(spark_decode_cpu_tests PRIVATE
  ${PROJECT_SOURCE_DIR}/tests/cpu/test_nvfp4.cpp
  ${PROJECT_SOURCE_DIR}/tests/cpu/test_pooler_validation.cpp
)
target_sources(spark_decode_gpu_tests PRIVATE
  ${PROJECT_SOURCE_DIR}/tests/gpu/test_pooler_kernels.cu
  ${PROJECT_SOURCE_DIR}/tests/gpu/test_pooler_fused.cu
  ${PROJECT_SOURCE_DIR}/tests/gpu/test_pooler.cu
)
