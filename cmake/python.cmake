# The Python package (python/spark_decode) and its extension module
# spark_decode._C (python/csrc), built into <build>/python so that
# PYTHONPATH=<build>/python imports it. The module is torch-free (tensors
# cross as descriptions, see python/csrc/module.cpp): it needs Python's
# headers and pybind11 (Debian's pybind11-dev, a pip pybind11, or the copy
# PyTorch's wheel carries), not torch. The package imports torch at run time.
#
# SPARK_DECODE_PYTHON: AUTO (build it where Python's headers and pybind11
# are found), ON (fail without them), OFF. Pick the interpreter with
# -DPython3_EXECUTABLE=... (on the GPU machine: /opt/torch/.venv/bin/python).
set(SPARK_DECODE_PYTHON AUTO CACHE STRING "build the Python package: AUTO, ON or OFF")
set_property(CACHE SPARK_DECODE_PYTHON PROPERTY STRINGS AUTO ON OFF)
# AUTO, or any CMake boolean (ON / 1 / TRUE / YES, OFF / 0 / FALSE / NO).
set(_py_required "")
if(NOT SPARK_DECODE_PYTHON STREQUAL "AUTO")
  if(NOT SPARK_DECODE_PYTHON)
    return()
  endif()
  set(_py_required REQUIRED)
endif()

find_package(Python3 COMPONENTS Interpreter Development.Module ${_py_required})
if(Python3_FOUND)
  find_package(pybind11 CONFIG QUIET)
  if(NOT pybind11_FOUND)
    # PyTorch's wheel carries pybind11's headers under torch/include.
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'include'))"
      OUTPUT_VARIABLE _torch_include OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    unset(SPARK_DECODE_PYBIND11_INCLUDE CACHE)  # searched again at every configure
    find_path(SPARK_DECODE_PYBIND11_INCLUDE pybind11/pybind11.h HINTS ${_torch_include})
  endif()
endif()
if(NOT Python3_FOUND OR (NOT pybind11_FOUND AND NOT SPARK_DECODE_PYBIND11_INCLUDE))
  if(_py_required)
    message(FATAL_ERROR "spark-decode: SPARK_DECODE_PYTHON=${SPARK_DECODE_PYTHON} but pybind11 was not found")
  endif()
  message(STATUS "spark-decode: Python headers or pybind11 not found; the Python package is not built")
  return()
endif()

Python3_add_library(spark_decode_python MODULE WITH_SOABI ${PROJECT_SOURCE_DIR}/python/csrc/module.cpp)
if(pybind11_FOUND)
  target_link_libraries(spark_decode_python PRIVATE pybind11::headers)
else()
  target_include_directories(spark_decode_python SYSTEM PRIVATE ${SPARK_DECODE_PYBIND11_INCLUDE})
endif()
target_link_libraries(spark_decode_python PRIVATE spark_decode)
set(_py_out ${CMAKE_BINARY_DIR}/python/spark_decode)
# One CUDA runtime per process: the module links the shared runtime, the
# one torch loads, so the kernels register with and launch through torch's
# runtime and share its per-thread state (the current device that
# torch.cuda.set_device sets). A static runtime here would be a second one,
# and torch loads libcudart.so with global symbols that would interpose part
# of its entry points.
set_target_properties(spark_decode_python PROPERTIES
  SPARK_DECODE_SHARED_CUDART ON
  CUDA_RUNTIME_LIBRARY Shared
  OUTPUT_NAME _C
  LIBRARY_OUTPUT_DIRECTORY ${_py_out}
  CXX_VISIBILITY_PRESET hidden
  VISIBILITY_INLINES_HIDDEN ON)
target_compile_options(spark_decode_python PRIVATE -Wall -Wextra)
# spark_decode.__version__ (pyproject.toml reads the same project() line).
target_compile_definitions(spark_decode_python PRIVATE SPARK_DECODE_VERSION="${PROJECT_VERSION}")
# Our code binds to our own definitions, and exports nothing but PyInit__C:
# torch loads its libraries with global symbols, among them its own
# instantiations of libstdc++ templates (std::ostream::_M_insert<long>, ...)
# built against another libstdc++; without these flags the library's
# ostringstream calls land in torch's copies and crash (seen on the H200;
# pytorch/pytorch#109923 is the same clash).
target_link_options(spark_decode_python PRIVATE -Wl,-Bsymbolic -Wl,--exclude-libs,ALL)

# The pure-Python part, copied beside the module on every build.
file(GLOB _py_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/python/spark_decode/*.py)
set(_py_copies "")
foreach(src IN LISTS _py_sources)
  get_filename_component(name ${src} NAME)
  add_custom_command(OUTPUT ${_py_out}/${name}
    COMMAND ${CMAKE_COMMAND} -E copy_if_different ${src} ${_py_out}/${name}
    DEPENDS ${src} VERBATIM)
  list(APPEND _py_copies ${_py_out}/${name})
endforeach()
add_custom_target(spark_decode_python_sources ALL DEPENDS ${_py_copies})
add_dependencies(spark_decode_python spark_decode_python_sources)

# `cmake --install <build> --component python`, and what a wheel holds
# (pyproject.toml): the package into <prefix>/spark_decode.
install(TARGETS spark_decode_python LIBRARY DESTINATION spark_decode COMPONENT python)
install(FILES ${_py_sources} DESTINATION spark_decode COMPONENT python)
message(STATUS "spark-decode: Python package for ${Python3_EXECUTABLE} (${Python3_VERSION}) in ${CMAKE_BINARY_DIR}/python")
