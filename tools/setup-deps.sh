#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks to build spark-decode and
# its tests. The CUDA toolkit (nvcc, cuBLAS) must already be there.
set -euo pipefail

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
for pkg in cmake ninja-build g++ libgtest-dev nlohmann-json3-dev libcli11-dev libopenmpi-dev openmpi-bin \
           python3-dev pybind11-dev; do
  have_pkg "$pkg" || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "setup-deps: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# cuobjdump and nvdisasm, for tools/check_sass.py (a CPU test that reads the
# built kernels' machine code), where the CUDA toolkit lacks them: NVIDIA's
# PyPI wheels, into .deps/cuda-tools.
root="$(cd "$(dirname "$0")/.." && pwd)"
if ! { [ -x /usr/local/cuda/bin/cuobjdump ] && [ -x /usr/local/cuda/bin/nvdisasm ]; } &&
   ! [ -x "$root/.deps/cuda-tools/nvidia/cu13/bin/nvdisasm" ]; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-pip >/dev/null
  fi
  echo "setup-deps: installing cuobjdump and nvdisasm into .deps/cuda-tools"
  mkdir -p "$root/.deps"
  if ! python3 -m pip install --quiet --disable-pip-version-check --target "$root/.deps/cuda-tools" \
         nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm >"$root/.deps/cuda-tools.log" 2>&1; then
    echo "setup-deps: could not install them (.deps/cuda-tools.log); the machine-code check will be skipped" >&2
  fi
fi

# torch, numpy and pytest for the torch layer's CPU tests (python_torch_cpu: the
# operators' fake implementations, the group adapter, argument errors), from
# PyPI into .deps/torch where the interpreter lacks them (about 5 GB: torch's
# wheel and its NVIDIA libraries; the tests run without a GPU).
if ! python3 -c "import torch, pytest" >/dev/null 2>&1 && ! [ -d "$root/.deps/torch/torch" ]; then
  echo "setup-deps: installing torch 2.11, numpy and pytest into .deps/torch (the torch layer's CPU tests)"
  mkdir -p "$root/.deps"
  if ! python3 -m pip install --quiet --disable-pip-version-check --timeout 20 --retries 1 --target "$root/.deps/torch" \
         "torch==2.11.*" numpy pytest >"$root/.deps/torch.log" 2>&1; then
    rm -rf "$root/.deps/torch"
    echo "setup-deps: could not install them (.deps/torch.log); the torch layer's CPU tests will be skipped" >&2
  fi
fi

if ! command -v nvcc >/dev/null; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "setup-deps: nvcc is in /usr/local/cuda/bin; add it to PATH" >&2
  else
    echo "setup-deps: the CUDA toolkit (nvcc 12.8 or newer) is required and was not found" >&2
  fi
  exit 1
fi
