# `cmake --install`: the library, its public headers and a CMake package, so
# that a serving stack's C++ build takes it with
#   find_package(spark_decode CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE spark_decode::spark_decode)
# (and spark_decode::spark_decode_mpi for MpiGroup where MPI was found).
# The headers are C++17; the archive holds sm_90a / sm_100a machine code and
# links the static CUDA runtime unless the consumer target sets
# SPARK_DECODE_SHARED_CUDART (a process that already has one, e.g. torch's).
# tests/install builds such a consumer from the installed tree (ctest -L cpu).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

target_include_directories(spark_decode PUBLIC $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(spark_decode INTERFACE cxx_std_17)
set(_sd_targets spark_decode)
set(SPARK_DECODE_INSTALLED_MPI OFF)
if(TARGET spark_decode_mpi)
  list(APPEND _sd_targets spark_decode_mpi)
  set(SPARK_DECODE_INSTALLED_MPI ON)
endif()
set(_sd_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/spark_decode)
install(TARGETS ${_sd_targets} EXPORT spark_decodeTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/spark_decode DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT spark_decodeTargets NAMESPACE spark_decode:: DESTINATION ${_sd_cmake_dir})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/spark_decodeConfig.cmake.in
  ${CMAKE_BINARY_DIR}/spark_decodeConfig.cmake INSTALL_DESTINATION ${_sd_cmake_dir})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/spark_decodeConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/spark_decodeConfig.cmake ${CMAKE_BINARY_DIR}/spark_decodeConfigVersion.cmake
  DESTINATION ${_sd_cmake_dir})
