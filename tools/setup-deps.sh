#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks to build spark-decode and
# its tests. The CUDA toolkit (nvcc, cuBLAS) must already be there.
set -euo pipefail

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
for pkg in cmake ninja-build g++ libgtest-dev nlohmann-json3-dev libcli11-dev libopenmpi-dev openmpi-bin; do
  have_pkg "$pkg" || need+=("$pkg")
done
if ((${#need[@]})); then
  echo "setup-deps: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! command -v nvcc >/dev/null; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    echo "setup-deps: nvcc is in /usr/local/cuda/bin; add it to PATH" >&2
  else
    echo "setup-deps: the CUDA toolkit (nvcc 12.8 or newer) is required and was not found" >&2
  fi
  exit 1
fi
