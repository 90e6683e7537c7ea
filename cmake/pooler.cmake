# The Pooler, ExpertNorm and NVFP4 (issue 4): sources added to the library
# and to the benchmark library here.
target_sources(spark_decode PRIVATE
  ${PROJECT_SOURCE_DIR}/src/reference/nvfp4.cpp
)
