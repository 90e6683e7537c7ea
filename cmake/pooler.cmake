# The Pooler, ExpertNorm and NVFP4 (issue 4): their sources in the library.
target_sources(spark_decode PRIVATE
  ${PROJECT_SOURCE_DIR}/src/reference/nvfp4.cpp
  ${PROJECT_SOURCE_DIR}/src/expert_norm.cu
  ${PROJECT_SOURCE_DIR}/src/pooler_gemm_table.cpp
  ${PROJECT_SOURCE_DIR}/src/pooler_gemm.cu
  ${PROJECT_SOURCE_DIR}/src/pooler_layer.cpp
  ${PROJECT_SOURCE_DIR}/src/pooler.cu
)
