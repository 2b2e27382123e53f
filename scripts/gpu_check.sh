#!/usr/bin/env bash
# The whole GPU check in one command, run from anywhere in the repository on a machine with a GPU:
# configure and build, C++ tests, install the Python package, Python tests, benchmarks.
#
# Usage: scripts/gpu_check.sh [STEP|GROUP ...]          (default: all)
#   groups: build = cmake install | tests = ctest pytest | bench = bench_kernel bench_act
#           bench_host bench_unet bench_policy bench_cold | all
#   steps:  cmake ctest install pytest bench_kernel bench_act bench_host bench_unet bench_policy
#           bench_cold
#   bench_policy: bounded vs NORMJIT_POLICY=exact kernel times (is bounded within 10 %?), one
#   process per policy; bench_cold: cold start of a U-Net fwd+bwd with an empty and a warm disk
#   cache, normjit.warmup, torch.compile's (not --quick) and what each cache level costs.
#   Steps always run in the order above. ctest builds first when build-gpu/ has no tests yet;
#   pytest and the benchmarks install first when `import normjit` fails or the sources changed
#   since this script last installed them (GPU_CHECK_NO_AUTO_INSTALL=1: never).
#
# Environment (all optional):
#   OUT                   output folder (default ./gpu_out). It receives at most 7 files:
#                         build.log tests.log bench.log summary.tsv results.json results.md
#                         bandwidth.png
#   GPU_CHECK_QUICK=1     quick benchmarks (3 shapes, fp16, small U-Net patch, no torch.compile
#                         peer in the U-Net and cold-start benchmarks)
#   GPU_CHECK_TMP         scratch folder (default /tmp/normjit-gpu-check): fresh per-step
#                         NORMJIT_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR, so
#                         every step starts from cold caches, and the benchmarks' own output
#                         folders before they are merged into $OUT
#   GPU_CHECK_TIMEOUT     seconds any one step may run (default 900)
#   GPU_CHECK_CTEST=gpu   ctest runs only the tests labelled gpu (they run kernels); the cpu ones
#                         (codegen, compiles, ptxas reports, heuristics: 418 of the 519
#                         test-seconds in session 32's 83 s ctest on an H100 at -j8) are left to
#                         the CPU run of scripts/run_tests.sh, which CI makes on every commit
#                         with the same CUDA 13.0 toolkit. Default: all
#   PYTHON                interpreter (default python3); JOBS build parallelism (default 16)
#
# Every step is timed and may fail without stopping the others. The end of the output is a
# summary (each step's status and seconds), then the benchmark tables, so that the last 12,000
# characters of a log hold everything. Exit status: 0 when every selected step passed.

set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu_out}
PY=${PYTHON:-python3}
JOBS=${JOBS:-16}
QUICK=${GPU_CHECK_QUICK:-0}
TMP_ROOT=${GPU_CHECK_TMP:-/tmp/normjit-gpu-check}
STEP_TIMEOUT=${GPU_CHECK_TIMEOUT:-900}
case "${GPU_CHECK_CTEST:-all}" in
  all) CTEST_SELECT=() ;;
  gpu) CTEST_SELECT=(-L gpu) ;;
  *) echo "gpu_check: GPU_CHECK_CTEST must be all or gpu, not '$GPU_CHECK_CTEST'" >&2; exit 2 ;;
esac
BENCH_DIR=$TMP_ROOT/bench
SUMMARY=$OUT/summary.tsv
export PYTHONUNBUFFERED=1

ALL_STEPS=(cmake ctest install pytest bench_kernel bench_act bench_host bench_unet bench_policy
           bench_cold)
BENCH_STEPS=(bench_kernel bench_act bench_host bench_unet bench_policy bench_cold)

# ---------------------------------------------------------------------------------------------
# Which steps
# ---------------------------------------------------------------------------------------------
declare -A WANT=()
if [ $# -eq 0 ]; then set -- all; fi
for arg in "$@"; do
  case "$arg" in
    all)   for s in "${ALL_STEPS[@]}"; do WANT[$s]=1; done ;;
    build) WANT[cmake]=1; WANT[install]=1 ;;
    tests|test) WANT[ctest]=1; WANT[pytest]=1 ;;
    bench|benchmarks) for s in "${BENCH_STEPS[@]}"; do WANT[$s]=1; done ;;
    cmake|ctest|install|pytest|bench_kernel|bench_act|bench_host|bench_unet|bench_policy|bench_cold)
      WANT[$arg]=1 ;;
    # The header comment, up to the first line that is not one.
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"
               exit 0 ;;
    *) echo "gpu_check: unknown step '$arg' (try --help)" >&2; exit 2 ;;
  esac
done
wanted() { [ -n "${WANT[$1]:-}" ]; }

mkdir -p "$OUT" "$TMP_ROOT" || exit 2
if [ "$QUICK" = 1 ]; then QUICK_ARG=(--quick); else QUICK_ARG=(); fi

# Start the logs the selected steps write to; keep the others (an earlier run's, locally).
if wanted cmake || wanted install; then : >"$OUT/build.log"; fi
if wanted ctest || wanted pytest; then : >"$OUT/tests.log"; fi
any_bench=0
for s in "${BENCH_STEPS[@]}"; do wanted "$s" && any_bench=1; done
if [ $any_bench = 1 ]; then
  : >"$OUT/bench.log"
  rm -rf "$BENCH_DIR"
fi
printf '#step\tstatus\tseconds\tnote\n' >"$SUMMARY"

# ---------------------------------------------------------------------------------------------
# Running one step
# ---------------------------------------------------------------------------------------------
FAILED=0
declare -A STATUS=()

now() { if [ -n "${EPOCHREALTIME:-}" ]; then echo "${EPOCHREALTIME/,/.}"; else date +%s.%N; fi; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# record NAME STATUS SECONDS NOTE: remember a step's outcome and append it to summary.tsv at once,
# so that a run cut short still says how far it got.
record() {
  STATUS[$1]=$2
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$SUMMARY"
  case "$2" in ok|skipped*) ;; *) FAILED=1 ;; esac
}

# run_step NAME LOG TEE NOTE_PATTERN CMD...: run CMD with a fresh NORMJIT_CACHE_DIR and a time
# limit, appending its output to LOG (and to the console when TEE=1). NOTE_PATTERN picks the line
# of the output that goes into the summary (e.g. ctest's "tests passed" line).
run_step() {
  local name=$1 log=$2 tee=$3 pattern=$4
  shift 4
  local cache=$TMP_ROOT/cache-$name
  rm -rf "$cache" && mkdir -p "$cache"
  touch "$log"
  local start_line
  start_line=$(wc -l <"$log")
  echo "=== [$name] $(date '+%F %T') caches in $cache: $*" | tee -a "$log"
  local t0 rc
  t0=$(now)
  # Cold caches for normjit, and for torch.compile (Inductor, Triton) too, so that first-call
  # and compile times are reproducible from run to run.
  local envs=(NORMJIT_CACHE_DIR="$cache" TORCHINDUCTOR_CACHE_DIR="$cache/inductor"
              TRITON_CACHE_DIR="$cache/triton")
  if [ "$tee" = 1 ]; then
    env "${envs[@]}" timeout --kill-after=30 "$STEP_TIMEOUT" "$@" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
  else
    env "${envs[@]}" timeout --kill-after=30 "$STEP_TIMEOUT" "$@" >>"$log" 2>&1
    rc=$?
  fi
  local secs status note=""
  secs=$(elapsed "$t0" "$(now)")
  if [ -n "$pattern" ]; then
    note=$(tail -n +"$((start_line + 1))" "$log" | grep -E "$pattern" | tail -n 1 | tr -d '\t' |
           sed 's/^[= ]*//; s/[= ]*$//' | cut -c1-120)
  fi
  case $rc in
    0) status=ok ;;
    124|137) status=TIMEOUT; note="after ${STEP_TIMEOUT}s; $note" ;;
    *) status="FAILED($rc)" ;;
  esac
  if [ "$status" != ok ] && [ "$tee" != 1 ]; then
    echo "--- last lines of $name (full output in $(basename "$log")):"
    tail -n +"$((start_line + 1))" "$log" | tail -n 30
    echo "---"
  fi
  echo "=== [$name] $status in ${secs}s${note:+ ($note)}" | tee -a "$log"
  record "$name" "$status" "$secs" "$note"
  return "$rc"
}

skip() { echo "=== [$1] skipped: $2"; record "$1" "skipped ($2)" 0 ""; }

normjit_importable() { (cd /tmp && "$PY" -c 'import normjit' >/dev/null 2>&1); }

# A fingerprint of the sources the Python package is built from. The install step stores it, so
# that on a machine kept warm between runs a later `gpu_check.sh bench` reinstalls when the
# sources changed instead of measuring a stale build.
STAMP=$TMP_ROOT/installed.stamp
tree_hash() {
  find src include kernels python cmake tools CMakeLists.txt pyproject.toml -type f \
      ! -path '*/__pycache__/*' 2>/dev/null | LC_ALL=C sort | xargs -d '\n' sha1sum 2>/dev/null |
    sha1sum | cut -c1-16
}
install_is_current() { normjit_importable && [ "$(cat "$STAMP" 2>/dev/null)" = "$(tree_hash)" ]; }

# ---------------------------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------------------------
step_cmake() {
  run_step cmake "$OUT/build.log" 0 '^\[[0-9]+/[0-9]+\]|error:|CMake Error' \
    bash -c "cmake -G Ninja -B build-gpu -DCMAKE_BUILD_TYPE=Release && cmake --build build-gpu -j$JOBS"
}
step_ctest() {
  run_step ctest "$OUT/tests.log" 0 'tests passed|tests failed|No tests were found' \
    ctest --test-dir build-gpu --output-on-failure -j8 "${CTEST_SELECT[@]}"
}
step_install() {
  rm -f "$STAMP"
  run_step install "$OUT/build.log" 0 'Successfully installed|ERROR' \
    "$PY" -m pip install --no-build-isolation --no-deps -v . && tree_hash >"$STAMP"
}
step_pytest() {
  local timeout_arg=(--timeout=900)
  if ! "$PY" -c 'import pytest_timeout' >/dev/null 2>&1; then
    echo "=== pytest-timeout is not installed: running without --timeout" | tee -a "$OUT/tests.log"
    timeout_arg=()
  fi
  run_step pytest "$OUT/tests.log" 0 '(passed|failed|error|skipped|no tests ran)' \
    "$PY" -m pytest tests/python --maxfail=25 -q -rs --durations=15 "${timeout_arg[@]}"
}
step_bench_kernel() {
  local args=("${QUICK_ARG[@]}")
  if [ "$QUICK" != 1 ]; then args=(--dtypes "fp16,bf16,fp32" --compile-dtypes fp16); fi
  run_step bench_kernel "$OUT/bench.log" 1 'failures:' \
    "$PY" bench/bench_instance_norm.py --out "$BENCH_DIR/kernel" "${args[@]}"
}
step_bench_act() {
  # Fused LeakyReLU: the three --quick shapes in fp16 (eager, compile, normjit fused/unfused).
  run_step bench_act "$OUT/bench.log" 1 'failures:' \
    "$PY" bench/bench_instance_norm.py --out "$BENCH_DIR/act" --quick --activation leaky_relu \
    --no-plot
}
step_bench_host() {
  run_step bench_host "$OUT/bench.log" 1 'failures:' \
    "$PY" bench/bench_host_overhead.py --out "$BENCH_DIR/host" "${QUICK_ARG[@]}"
}
step_bench_unet() {
  local args=("${QUICK_ARG[@]}")
  if [ "$QUICK" != 1 ]; then args=(--compile); fi
  run_step bench_unet "$OUT/bench.log" 1 'failures:' \
    "$PY" bench/bench_unet.py --out "$BENCH_DIR/unet" "${args[@]}"
}
step_bench_policy() {
  # Two processes (bounded, exact), normjit only plus eager in the bounded one: ~40 s --quick.
  run_step bench_policy "$OUT/bench.log" 1 'failures:' \
    "$PY" bench/bench_policy.py --out "$BENCH_DIR/policy" "${QUICK_ARG[@]}"
}
step_bench_cold() {
  # One process per measurement (8 --quick, ~60 s; 10 with the torch.compile pair otherwise).
  run_step bench_cold "$OUT/bench.log" 1 'failures:' \
    "$PY" bench/bench_cold_start.py --out "$BENCH_DIR/cold" "${QUICK_ARG[@]}"
}

echo "=== gpu_check: steps: $(for s in "${ALL_STEPS[@]}"; do wanted "$s" && printf '%s ' "$s"; done)"
echo "=== OUT=$OUT quick=$QUICK python=$("$PY" --version 2>&1) commit=$(git rev-parse --short HEAD 2>/dev/null || echo none)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"

T_START=$(now)

# (a) build
if wanted cmake; then step_cmake; fi

# (b) C++ tests
if wanted ctest; then
  if wanted cmake && [ "${STATUS[cmake]}" != ok ]; then
    skip ctest "build failed"
  else
    if ! wanted cmake && [ ! -f build-gpu/CTestTestfile.cmake ]; then
      echo "=== build-gpu/ has no tests yet: building first"
      step_cmake
    fi
    step_ctest
  fi
fi

# (c) install the Python package (also when a later step needs it and it is not importable)
needs_normjit=0
for s in pytest "${BENCH_STEPS[@]}"; do wanted "$s" && needs_normjit=1; done
if wanted install; then
  step_install
elif [ $needs_normjit = 1 ] && [ "${GPU_CHECK_NO_AUTO_INSTALL:-0}" != 1 ] && ! install_is_current; then
  echo "=== normjit is not installed from these sources: installing first"
  step_install
fi

# (d) Python tests
if wanted pytest; then step_pytest; fi

# (e) benchmarks, each with a cold normjit disk cache
if wanted bench_kernel; then step_bench_kernel; fi
if wanted bench_act; then step_bench_act; fi
if wanted bench_host; then step_bench_host; fi
if wanted bench_unet; then step_bench_unet; fi
if wanted bench_policy; then step_bench_policy; fi
if wanted bench_cold; then step_bench_cold; fi

# ---------------------------------------------------------------------------------------------
# Report: merge the benchmark outputs into $OUT, then print the summary and the tables last.
# ---------------------------------------------------------------------------------------------
CONSOLE=$TMP_ROOT/console.md
: >"$CONSOLE"
if [ $any_bench = 1 ]; then
  if ! "$PY" bench/report.py --out "$OUT" --kernel "$BENCH_DIR/kernel" --kernel-act "$BENCH_DIR/act" \
      --host "$BENCH_DIR/host" --unet "$BENCH_DIR/unet" --policy "$BENCH_DIR/policy" \
      --cold "$BENCH_DIR/cold" --steps "$SUMMARY" --console \
      >"$CONSOLE" 2>>"$OUT/bench.log"; then
    record report "FAILED" 0 "bench/report.py failed; see bench.log"
  fi
fi

TOTAL=$(elapsed "$T_START" "$(now)")
echo
echo "================================ gpu_check summary ================================"
awk -F'\t' 'NR > 1 { printf "%-13s %-16s %8ss  %s\n", $1, $2, $3, $4 }' "$SUMMARY"
echo "total ${TOTAL}s; overall: $([ $FAILED = 0 ] && echo PASS || echo FAIL); files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
if [ -s "$CONSOLE" ]; then
  echo
  cat "$CONSOLE"
fi
exit $FAILED
