#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks to build spark-decode and
# its tests (with --tests, also what the tests alone need). The CUDA toolkit
# (nvcc, cuBLAS) must already be there.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"

# What each package provides, probed directly: a machine may have it from
# another source than dpkg (a GPU image built from source, headers carried
# in .deps/include where no registry is reachable).
have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_header() {
  local d
  for d in /usr/include /usr/local/include "$root/.deps/include"; do [ -e "$d/$1" ] && return 0; done
  return 1
}
provided() {
  case "$1" in
    cmake) have_cmd cmake ;;
    ninja-build) have_cmd ninja ;;
    g++) have_cmd g++ ;;
    libgtest-dev) have_header gtest/gtest.h ;;
    nlohmann-json3-dev) have_header nlohmann/json.hpp ;;
    libcli11-dev) have_header CLI/CLI.hpp ;;
    libopenmpi-dev) have_cmd mpicxx ;;
    openmpi-bin) have_cmd mpirun ;;
    python3-dev) python3 -c 'import os, sysconfig; assert os.path.exists(sysconfig.get_paths()["include"] + "/Python.h")' 2>/dev/null ;;
    pybind11-dev) have_header pybind11/pybind11.h || python3 -c 'import pybind11' 2>/dev/null ;;
    *) return 1 ;;
  esac
}
need=()
for pkg in cmake ninja-build g++ libgtest-dev nlohmann-json3-dev libcli11-dev libopenmpi-dev openmpi-bin \
           python3-dev pybind11-dev; do
  provided "$pkg" || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "setup-deps: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  # Where no registry is reachable, say what is missing and go on: CMake
  # then names whatever the build cannot do without.
  if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null; }; then
    echo "setup-deps: could not install ${need[*]} (no package registry?); going on without them" >&2
  fi
fi

# pip_into NAME WHAT PACKAGE...: PyPI packages into .deps/NAME (log in
# .deps/NAME.log); where that fails, says that WHAT will be skipped and goes
# on (a machine without PyPI still builds and tests the rest).
pip_into() {
  local name=$1 what=$2
  shift 2
  if ! python3 -m pip --version >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-pip >/dev/null
  fi
  echo "setup-deps: installing $* into .deps/$name"
  mkdir -p "$root/.deps"
  if ! python3 -m pip install --quiet --disable-pip-version-check --timeout 20 --retries 1 \
         --target "$root/.deps/$name" "$@" >"$root/.deps/$name.log" 2>&1; then
    rm -rf "${root:?}/.deps/$name"
    echo "setup-deps: could not install them (.deps/$name.log); $what will be skipped" >&2
  fi
}

# cuobjdump and nvdisasm, for tools/check_sass.py (a CPU test that reads the
# built kernels' machine code), where the CUDA toolkit lacks them: NVIDIA's
# PyPI wheels.
if ! { [ -x /usr/local/cuda/bin/cuobjdump ] && [ -x /usr/local/cuda/bin/nvdisasm ]; } &&
   ! [ -x "$root/.deps/cuda-tools/nvidia/cu13/bin/nvdisasm" ]; then
  pip_into cuda-tools "the machine-code check" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
fi

# With --tests (the README's test command, CI): torch, numpy and pytest for
# the torch layer's CPU tests (python_torch_cpu: the operators' fake
# implementations, the group adapter, argument errors) where the interpreter
# lacks them (about 5 GB: torch's wheel and its NVIDIA libraries; the tests
# run without a GPU). The main job does not need them.
if [ "${1:-}" = "--tests" ] && ! python3 -c "import torch, pytest" >/dev/null 2>&1 &&
   ! [ -d "$root/.deps/torch/torch" ]; then
  pip_into torch "the torch layer's CPU tests" "torch==2.11.*" numpy pytest
fi

if ! command -v nvcc >/dev/null; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "setup-deps: nvcc is in /usr/local/cuda/bin; add it to PATH" >&2
  else
    echo "setup-deps: the CUDA toolkit (nvcc 12.8 or newer) is required and was not found" >&2
  fi
  exit 1
fi
