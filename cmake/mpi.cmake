# MpiGroup: a separate library, so that the core library keeps depending on
# the CUDA toolkit alone. Only MPI's C API is used, through the C++ compiler
# (the project enables no C language, which FindMPI's C component needs).
set(MPI_CXX_SKIP_MPICXX TRUE)
find_package(MPI COMPONENTS CXX QUIET)
if(MPI_CXX_FOUND)
  add_library(spark_decode_mpi STATIC ${PROJECT_SOURCE_DIR}/src/mpi_group.cpp)
  target_link_libraries(spark_decode_mpi PUBLIC spark_decode MPI::MPI_CXX)
  # The C++ bindings of Open MPI / MPICH are neither needed nor linked.
  target_compile_definitions(spark_decode_mpi PUBLIC SPARK_DECODE_HAS_MPI=1
    OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
  target_compile_options(spark_decode_mpi PRIVATE -Wall -Wextra)
  message(STATUS "spark-decode: MPI found (${MPI_CXX_LIBRARIES}); MpiGroup and the mpirun tests are built")
else()
  message(STATUS "spark-decode: MPI not found; MpiGroup and the mpirun tests are skipped")
endif()
