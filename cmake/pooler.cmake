# The Pooler, ExpertNorm and NVFP4 (issue 4): sources added to the library
# and to the benchmark library here.
target_sources(spark_decode PRIVATE
  ${PROJECT_SOURCE_DIR}/src/reference/nvfp4.cpp
  ${PROJECT_SOURCE_DIR}/src/expert_norm.cu
  ${PROJECT_SOURCE_DIR}/src/pooler_gemm_table.cpp
  ${PROJECT_SOURCE_DIR}/src/pooler_gemm.cu
  ${PROJECT_SOURCE_DIR}/src/pooler_layer.cpp
  ${PROJECT_SOURCE_DIR}/src/pooler.cu
)
target_sources(spark_decode_bench PRIVATE
  ${PROJECT_SOURCE_DIR}/bench/bench_pooler.cpp
)
