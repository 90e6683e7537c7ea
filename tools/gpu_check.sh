#!/usr/bin/env bash
# One call on a lent GPU machine: build for sm_90a, run the GPU tests and the
# benchmarks, leave logs and JSON in $OUT (default /tmp/spark-out).
#   tools/gpu_check.sh [build] [test] [tune] [bench] [gather] [publish] [pooler]   (default: all but tune)
# Test filters: GTEST_FILTER=... as usual.
set -uo pipefail
cd "$(dirname "$0")/.."
# Never NVLink multicast on shared machines (see DEVELOPERS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/spark-out}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
NCCL_DIR=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl 2>/dev/null | head -1)
export LD_LIBRARY_PATH="${NCCL_DIR:+$NCCL_DIR/lib:}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(build test bench)
has() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
say() { echo "== $*" | tee -a "$LOG"; }
rc=0

if has build; then
  say "build $(date -u +%T)"
  if ! { cmake --preset h200 ${NCCL_DIR:+-DSPARK_DECODE_NCCL_DIR=$NCCL_DIR} &&
         cmake --build --preset h200 -j "$(nproc)"; } >"$OUT/build.log" 2>&1; then
    tail -60 "$OUT/build.log" | tee -a "$LOG"
    exit 1
  fi
  rm -f "$OUT/build.log"
  build/h200/spark-decode info 2>&1 | tee -a "$LOG"
fi
if has test; then
  say "gpu tests $(date -u +%T)"
  (cd build/h200 && ctest -L gpu --output-on-failure --timeout 240) 2>&1 | tee -a "$LOG" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if has tune; then
  say "tune $(date -u +%T)"
  build/h200/spark-decode tune unpooler --out "$OUT" 2>&1 | tee -a "$LOG" || rc=1
  # The pooler GEMM's shapes, where the Pooler's MMA engine serves b >= 3.
  build/h200/spark-decode tune unpooler --pooler-shapes --m 4,8,16 --out "$OUT" 2>&1 | tee -a "$LOG" || rc=1
fi
if has bench; then
  say "bench $(date -u +%T)"
  build/h200/spark-decode bench unpooler --out "$OUT" 2>&1 | tee -a "$LOG" || rc=1
fi
if has publish; then
  say "bench unpooler --publish $(date -u +%T)"
  build/h200/spark-decode bench unpooler --publish --out "$OUT" 2>&1 | tee -a "$LOG" || rc=1
fi
if has pooler; then
  say "bench pooler $(date -u +%T)"
  build/h200/spark-decode bench pooler --out "$OUT" 2>&1 | tee -a "$LOG" || rc=1
fi
if has gather; then
  say "bench gather $(date -u +%T)"
  build/h200/spark-decode bench gather --out "$OUT" 2>&1 | tee -a "$LOG" || rc=1
fi
say "done rc=$rc $(date -u +%T)"
exit $rc
