# Tests of the rendezvous, symmetric memory and mailbox (issue 3).
target_sources(spark_decode_cpu_tests PRIVATE
  ${PROJECT_SOURCE_DIR}/tests/cpu/test_mailbox_model.cpp
  ${PROJECT_SOURCE_DIR}/tests/cpu/test_group.cpp
)
target_sources(spark_decode_gpu_tests PRIVATE
  ${PROJECT_SOURCE_DIR}/tests/gpu/test_mailbox.cu
)

# Multi-process tests: `mpirun -np 2 <exe>` as one ctest entry each.
if(TARGET spark_decode_mpi)
  set(SPARK_MPIEXEC_FLAGS ${MPIEXEC_NUMPROC_FLAG} 2)
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version
                  OUTPUT_VARIABLE _spark_mpiexec_version ERROR_QUIET)
  if(_spark_mpiexec_version MATCHES "Open MPI|OpenRTE")
    # CI runs as root; 2 ranks on a 2-core machine need oversubscription.
    list(APPEND SPARK_MPIEXEC_FLAGS --oversubscribe --allow-run-as-root)
  endif()

  add_executable(spark_decode_mpi_cpu_tests ${PROJECT_SOURCE_DIR}/tests/cpu/test_mpi_group.cpp)
  target_include_directories(spark_decode_mpi_cpu_tests PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(spark_decode_mpi_cpu_tests PRIVATE spark_decode_mpi GTest::gtest)
  add_test(NAME mpi_group_np2
           COMMAND ${MPIEXEC_EXECUTABLE} ${SPARK_MPIEXEC_FLAGS} ${MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:spark_decode_mpi_cpu_tests> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(mpi_group_np2 PROPERTIES LABELS cpu TIMEOUT 120
                       SKIP_REGULAR_EXPRESSION "every test skipped on every rank")

  add_executable(spark_decode_mpi_gpu_tests
    ${PROJECT_SOURCE_DIR}/tests/gpu/gpu_test_util.cu
    ${PROJECT_SOURCE_DIR}/tests/gpu/test_mailbox_mpi.cu)
  target_include_directories(spark_decode_mpi_gpu_tests PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(spark_decode_mpi_gpu_tests PRIVATE spark_decode_mpi GTest::gtest)
  add_test(NAME mailbox_mpi_np2
           COMMAND ${MPIEXEC_EXECUTABLE} ${SPARK_MPIEXEC_FLAGS} ${MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:spark_decode_mpi_gpu_tests> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(mailbox_mpi_np2 PROPERTIES LABELS gpu TIMEOUT 600
                       SKIP_REGULAR_EXPRESSION "every test skipped on every rank")
endif()
