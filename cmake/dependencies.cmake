# Header-only helpers of the tool: Debian's packages on the development and CI
# machines (tools/setup-deps.sh installs them); on the GPU machine, which has
# no package registry, the same headers carried in .deps/include.
set(SPARK_DECODE_DEPS_DIR "${PROJECT_SOURCE_DIR}/.deps/include")

if(SPARK_DECODE_BUILD_TOOLS)  # JSON and CLI11 serve the tool and its benchmarks only
find_package(nlohmann_json 3.10 QUIET)
if(nlohmann_json_FOUND)
  add_library(spark_decode::json ALIAS nlohmann_json::nlohmann_json)
else()
  find_path(SPARK_JSON_INCLUDE nlohmann/json.hpp HINTS ${SPARK_DECODE_DEPS_DIR} REQUIRED)
  add_library(spark_decode_json INTERFACE)
  target_include_directories(spark_decode_json SYSTEM INTERFACE ${SPARK_JSON_INCLUDE})
  add_library(spark_decode::json ALIAS spark_decode_json)
endif()

find_package(CLI11 2.1 QUIET)
if(CLI11_FOUND)
  add_library(spark_decode::cli11 ALIAS CLI11::CLI11)
else()
  find_path(SPARK_CLI11_INCLUDE CLI/CLI.hpp HINTS ${SPARK_DECODE_DEPS_DIR} REQUIRED)
  add_library(spark_decode_cli11 INTERFACE)
  target_include_directories(spark_decode_cli11 SYSTEM INTERFACE ${SPARK_CLI11_INCLUDE})
  add_library(spark_decode::cli11 ALIAS spark_decode_cli11)
endif()
endif()

if(SPARK_DECODE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
