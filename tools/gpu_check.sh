#!/usr/bin/env bash
# One call on a lent GPU machine: build for sm_90a, run the GPU tests and the
# benchmarks, leave logs and JSON in $OUT (default /tmp/spark-out).
#   tools/gpu_check.sh [build] [test] [sanitize] [tune] [tune-pdl] [tune-pooler] [bench] [gather] [publish] [pooler]
#                      [python-bench] [trace] [verify] [step]
#   verify: spark-decode verify at the GPU count and at tp 2 on one GPU;
#   step: spark-decode step at the GPU count, JSON, markdown and plot in $OUT.
#   (default: build test bench). trace: a -DSPARK_DECODE_TRACE=ON build in
#   build/trace, per-CTA timelines of the unpooler's PDL chain and of
#   Pooler.run (tp 1, and tp 2 where two GPUs are), summarised into the log,
#   the CSVs as $OUT/traces.tgz.
# Test filters: GTEST_FILTER=... as usual.
set -uo pipefail
cd "$(dirname "$0")/.."
# Never NVLink multicast on shared machines (see DEVELOPERS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/spark-out}
mkdir -p "$OUT"
LOG="$OUT/log.txt"
# The Python with torch: $PYTHON, else the first python3 / python on PATH
# that imports torch (its tests and the NCCL of its wheel); none: no torch.
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for c in python3 python; do
    if command -v "$c" >/dev/null && "$c" -c "import torch" 2>/dev/null; then PY=$(command -v "$c"); break; fi
  done
fi
NCCL_DIR=${SPARK_DECODE_NCCL_DIR:-}
if [ -z "$NCCL_DIR" ] && [ -n "$PY" ]; then
  NCCL_DIR=$("$PY" -c "import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
fi
export LD_LIBRARY_PATH="${NCCL_DIR:+$NCCL_DIR/lib:}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export PATH="/usr/local/cuda/bin:$PATH"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(build test bench)
has() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
say() { echo "== $*" | tee -a "$LOG"; }
rc=0

if has build; then
  say "build $(date -u +%T)"
  # The Python package against torch's interpreter (its tests join -L gpu).
  pyargs=()
  [ -n "$PY" ] && pyargs=(-DPython3_EXECUTABLE="$PY" -DSPARK_DECODE_PYTHON=ON)
  if ! { cmake --preset h200 ${NCCL_DIR:+-DSPARK_DECODE_NCCL_DIR=$NCCL_DIR} "${pyargs[@]}" &&
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
if has sanitize; then
  # compute-sanitizer over the GPU tests (it slows kernels 10-100x):
  # memcheck (out-of-bounds and misaligned accesses, also in distributed
  # shared memory and the mailbox), racecheck (shared-memory
  # hazards: the split-K partials, the norm's block sums), synccheck
  # (barriers under divergence). A clean pass prints "ERROR SUMMARY: 0".
  say "compute-sanitizer $(date -u +%T)"
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  T=build/h200/tests/spark_decode_gpu_tests
  # Every test but those that trap on purpose (the spin timeout) and the
  # opt-in shared-GPU ones; the kernel-level tools over the kernels' tests.
  all="*-*Zz*:SharedGpus.*"
  # (racecheck needs ~10x memcheck's time: PoolerFused's 100,000 rows do not
  # fit its 4 minutes, nor does the chain of [8192, 8192] GEMMs of
  # PoolerGemm.PdlChainEqualsPlainChain or the ring engine's every-distribution
  # test; the same kernels run in PoolerEdge, Pooler.*,
  # PoolerGemm.TableAndEveryEngine* and the publish tests, the ring with several
  # tiles per CTA in PoolerGemmPublish.*SeveralTilesPerCta. The publish tests
  # alone take ~3 minutes under racecheck (6a75a62), so the pooler's half is
  # split in two.)
  kernels="UnpoolerGpu.*:PoolerGemm.*:PoolerExpertNorm.*:PoolerNvfp4.*"
  publish="PoolerGemmPublish.*"
  pooler="PoolerEdge.*:Pooler.SixtyTwo*OneGpu"
  # SANITIZE_RUNS picks runs by number (default all five). They run at once
  # on the one GPU (five in turn do not fit a device call's 600 s; at once
  # they took ~7 minutes at 0a7d2e1), each within SANITIZE_TIMEOUT seconds
  # (default 480); SANITIZE_PARALLEL=0 runs them in turn.
  runs=(memcheck:"$all" racecheck:"$kernels-PoolerGemm.PdlChain*:PoolerGemm.RingEngine*" racecheck:"$publish"
        racecheck:"$pooler" synccheck:"$kernels:$publish:$pooler")
  san_run() {  # n tool filter
    timeout "${SANITIZE_TIMEOUT:-480}" "$SAN" --tool "$2" --error-exitcode 9 "$T" --gtest_filter="$3" \
      >"$OUT/san_${1}_$2.txt" 2>&1
    echo $? >"$OUT/san_${1}_$2.rc"
  }
  picked=()
  for n in ${SANITIZE_RUNS:-1 2 3 4 5}; do
    run=${runs[$((n - 1))]}
    picked+=("$n")
    if [ "${SANITIZE_PARALLEL:-1}" = 1 ]; then san_run "$n" "${run%%:*}" "${run#*:}" &
    else san_run "$n" "${run%%:*}" "${run#*:}"; fi
  done
  wait
  for n in "${picked[@]}"; do
    run=${runs[$((n - 1))]} tool=${run%%:*}
    echo "-- $tool: ${run#*:}" | tee -a "$LOG"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[       OK |ERROR SUMMARY|RACECHECK SUMMARY|^=+ (Invalid|Race|Barrier|Error)" \
      "$OUT/san_${n}_$tool.txt" | sed -E 's/ \([0-9]+ ms\)//' | sort | uniq -c | head -40 | tee -a "$LOG"
    st=$(cat "$OUT/san_${n}_$tool.rc")
    echo "-- $tool exit $st" | tee -a "$LOG"
    [ "$st" -eq 0 ] || rc=1
  done
fi
if has tune; then
  say "tune $(date -u +%T)"
  build/h200/spark-decode tune unpooler --out "$OUT" 2>&1 | tee -a "$LOG" || rc=1
  # The pooler GEMM's shapes, where the Pooler's MMA engine serves b >= 2 (b >= 3 at tp 1).
  build/h200/spark-decode tune unpooler --pooler-shapes --m 4,8,16 --out "$OUT" 2>&1 | tee -a "$LOG" || rc=1
fi
if has tune-pdl; then
  # The same, every tactic timed in a PDL chain (weights prefetched under the
  # previous call's tail): what callers with PDL on (the default) get.
  say "tune --pdl $(date -u +%T)"
  build/h200/spark-decode tune unpooler --pdl --out "$OUT" 2>&1 | tee -a "$LOG" || rc=1
  build/h200/spark-decode tune unpooler --pdl --pooler-shapes --m 4,8,16 --out "$OUT" 2>&1 | tee -a "$LOG" || rc=1
  # Where both modes were tuned in this $OUT: the ranking the table follows.
  for s in "" _pooler_shapes; do
    off="$OUT/unpooler_tune$s.json" pdl="$OUT/unpooler_tune${s}_pdl.json"
    [ -f "$off" ] && [ -f "$pdl" ] && python3 tools/rank_tune.py "$off" "$pdl" --top 4 2>&1 | tee -a "$LOG"
  done
fi
if has tune-pooler; then
  # The pooler GEMM's engine table: every engine and skinny shape in a PDL
  # chain, as Pooler.run launches it, around the skinny/MMA crossover.
  say "tune pooler $(date -u +%T)"
  build/h200/spark-decode tune pooler --b 1,2,3,4,6 --out "$OUT" 2>&1 | tee -a "$LOG" || rc=1
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
  # Pooler.run also on the MMA and ring engines: the engine table weighs the
  # GEMM's two modes and Pooler.run (tools/rank_pooler.py ranks them).
  build/h200/spark-decode bench pooler --run-engines splitk_mma,ring_mma --out "$OUT" 2>&1 | tee -a "$LOG" || rc=1
  [ -f "$OUT/pooler.json" ] && python3 tools/rank_pooler.py "$OUT/pooler.json" 2>&1 | tee -a "$LOG"
fi
if has gather; then
  say "bench gather $(date -u +%T)"
  build/h200/spark-decode bench gather --out "$OUT" 2>&1 | tee -a "$LOG" || rc=1
fi
if has python-bench; then
  # The binding's cost: class calls vs torch ops (eager), the ops inside a
  # graph, the compiled + captured example model vs the stock path.
  say "bench python $(date -u +%T)"
  if [ -n "$PY" ]; then
    PYTHONPATH=build/h200/python "$PY" bench/python_overhead.py --out "$OUT" 2>&1 | tee -a "$LOG" || rc=1
  else
    echo "no Python with torch: skipped" | tee -a "$LOG"
  fi
fi
if has trace; then
  say "trace $(date -u +%T)"
  if { cmake --preset h200 -B build/trace -DSPARK_DECODE_TRACE=ON -DSPARK_DECODE_BUILD_TESTS=OFF \
         ${NCCL_DIR:+-DSPARK_DECODE_NCCL_DIR=$NCCL_DIR} &&
       cmake --build build/trace -j "$(nproc)" --target spark-decode; } >"$OUT/trace_build.log" 2>&1; then
    rm -f "$OUT/trace_build.log"
    T="$OUT/traces"
    mkdir -p "$T"
    gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
    for tm in "1 1" "1 16" "2 1" "2 16"; do
      set -- $tm
      build/trace/spark-decode bench unpooler --tp "$1" --m "$2" --repeats 5 --trace "$T/t" --out "$T/json" 2>&1 |
        grep -E "trace:" | tee -a "$LOG"
    done
    ptp=1
    [ "$gpus" -ge 2 ] && ptp=1,2
    build/trace/spark-decode bench pooler --tp "$ptp" --gemm-tp 1 --b 1,16 --repeats 5 --trace "$T/t" \
      --out "$T/json" 2>&1 | grep -E "trace:|Pooler.run" | tee -a "$LOG"
    build/trace/spark-decode bench pooler --tp "$ptp" --gemm-tp 1 --b 16 --repeats 5 --trace "$T/t" \
      --out "$T/json" 2>&1 | grep -E "trace:" | tee -a "$LOG"
    for f in "$T"/t_*.csv; do
      echo "== $(basename "$f")" | tee -a "$LOG"
      python3 tools/trace_summary.py "$f" --skip 6 --show 6 2>&1 | tee -a "$LOG"
    done
    rm -rf "$T/json"
    (cd "$T" && tar czf "$OUT/traces.tgz" t_*.csv) && rm -rf "$T"
  else
    tail -40 "$OUT/trace_build.log" | tee -a "$LOG"
    rc=1
  fi
fi
if has verify; then
  say "verify $(date -u +%T)"
  build/h200/spark-decode verify 2>&1 | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  build/h200/spark-decode verify --tp 2 --gpus 1 2>&1 | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if has step; then
  say "step $(date -u +%T)"
  build/h200/spark-decode step --out "$OUT" 2>&1 | tee -a "$LOG"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
say "done rc=$rc $(date -u +%T)"
exit $rc
