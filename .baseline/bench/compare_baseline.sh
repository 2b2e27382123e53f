#!/usr/bin/env bash
# A/B on one GPU in one run: the kernel benchmark on a baseline source tree and on this one,
# alternating, each variant in its own process with a disk cache of its own (fresh in round 1).
#
# Usage (on the GPU machine, from the repository root):
#   git archive BASE_COMMIT --prefix=.baseline/ | tar x     # here; carry .baseline to the device
#   bench/compare_baseline.sh .baseline [bench_instance_norm.py args...]
#
# Variants (OUT/<name>.md and .json each): "base" (the baseline tree, installed with pip --target
# into a scratch folder that PYTHONPATH puts first) and "new" (this tree, installed as usual), then
# one per extra environment setting in COMPARE_ENVS, e.g.
#   COMPARE_ENVS="NORMJIT_OUTPUT_ORDER=forward" bench/compare_baseline.sh .baseline --quick
# runs "new_NORMJIT_OUTPUT_ORDER_forward" too; an entry may set several variables, separated by
# commas ("NORMJIT_RESIDENT_THREADS=256,NORMJIT_SPLIT=resident"). ROUNDS (default 2) repeats the
# whole sequence, so that drift of the GPU shows up as disagreement between rounds rather than as
# a difference.
#
# COMPARE_TREES measures more source trees in the same run, each a variant of its own, installed
# like the baseline: "NAME=DIR[,ENV=VALUE...] ...", e.g. experiment branches exported here with
#   for b in resident-128 early-slot-read; do git archive exp/$b --prefix=.variants/$b/ | tar x; done
#   COMPARE_TREES="r128=.variants/resident-128,NORMJIT_RESIDENT_THREADS=128 early=.variants/early-slot-read"
# The trees install in parallel with the baseline; a tree named twice installs once.
#
# BENCH=kernel_times times the kernels alone instead (bench/kernel_times.py: a forward or backward
# kernel without the autograd engine, checked against float64 torch; its arguments then follow
# BASELINE_SRC_DIR) and ends with OUT/ab_table.md, the median of each variant per kernel beside
# its ratio to the baseline, and OUT/ab_runs.log, every run's output:
#   BENCH=kernel_times bench/compare_baseline.sh .baseline --layouts ncdhw --shapes 2,32,128,128,128
set -uo pipefail
shopt -s nullglob
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
BASE_SRC=${1:?usage: bench/compare_baseline.sh BASELINE_SRC_DIR [bench args...]}
shift
OUT=${OUT:-$PWD/compare_out}
TMP=${COMPARE_TMP:-/tmp/normjit-compare}
ROUNDS=${ROUNDS:-2}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# kernel_times' logs, one per variant and round, stay in $LOGS; $OUT gets them all in one file
# (ab_runs.log) beside ab_table.md, since the device machine returns only a few files.
LOGS=$TMP/logs
rm -rf "$LOGS"
mkdir -p "$OUT" "$TMP" "$LOGS"
rm -f "$OUT/ab_runs.log"

# This tree (unless installed already), the baseline and every extra tree install side by side,
# each a cmake build of its own.
site_of() { echo "$TMP/site_${1//[^A-Za-z0-9]/_}"; }
pids=()
if ! (cd /tmp && "$PY" -c 'import normjit' 2>/dev/null); then
  "$PY" -m pip install -q --no-build-isolation --no-deps . >"$(site_of .).log" 2>&1 &
  pids+=("$!:.")
fi
declare -A SITES=(["$BASE_SRC"]=1)
for t in ${COMPARE_TREES:-}; do
  dir=${t#*=}
  SITES[${dir%%,*}]=1
done
for src in "${!SITES[@]}"; do
  site=$(site_of "$src")
  rm -rf "$site"
  "$PY" -m pip install -q --no-build-isolation --no-deps --target "$site" "$src" \
    >"$site.log" 2>&1 &
  pids+=("$!:$src")
done
# Every install is waited for before a failure stops the run: no build is left running behind it.
failed=()
for entry in "${pids[@]}"; do
  wait "${entry%%:*}" || failed+=("${entry#*:}")
done
for src in "${failed[@]}"; do
  echo "install of $src failed:"
  tail -30 "$(site_of "$src").log"
done
[ ${#failed[@]} -eq 0 ] || exit 1

run_variant() {  # NAME ROUND PYTHONPATH_PREFIX [ENV=VALUE]
  local name=$1 round=$2 path=$3
  shift 3
  # Round 1 compiles into a fresh disk cache; later rounds reuse it, since they time the same
  # cubins and would otherwise spend most of a device call compiling them again.
  local cache=$TMP/cache-$name
  [ "$round" = 1 ] && rm -rf "$cache"
  echo "=== $name (round $round)"
  if [ "${BENCH:-}" = kernel_times ]; then
    env "$@" NORMJIT_CACHE_DIR="$cache" PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}" \
      "$PY" bench/kernel_times.py --tag "$name" "${BENCH_ARGS[@]}" 2>&1 | tee "$LOGS/$name-$round.log"
    cat "$LOGS/$name-$round.log" >>"$OUT/ab_runs.log"
    return
  fi
  env "$@" NORMJIT_CACHE_DIR="$cache" PYTHONPATH="$path${PYTHONPATH:+:$PYTHONPATH}" \
    "$PY" bench/bench_instance_norm.py --peers normjit --no-plot --out "$TMP/$name-$round" "${BENCH_ARGS[@]}" |
    grep -E '^\| [0-9]' || true
  cp "$TMP/$name-$round/results.md" "$OUT/$name-$round.md" 2>/dev/null
  cp "$TMP/$name-$round/results.json" "$OUT/$name-$round.json" 2>/dev/null
}

BENCH_ARGS=("$@")
for round in $(seq 1 "$ROUNDS"); do
  run_variant base "$round" "$(site_of "$BASE_SRC")"
  run_variant new "$round" ""
  for e in ${COMPARE_ENVS:-}; do
    IFS=, read -ra settings <<<"$e"
    run_variant "new_${e//[^A-Za-z0-9]/_}" "$round" "" "${settings[@]}"
  done
  for t in ${COMPARE_TREES:-}; do
    IFS=, read -ra parts <<<"${t#*=}"
    run_variant "${t%%=*}" "$round" "$(site_of "${parts[0]}")" "${parts[@]:1}"
  done
done
status=0
if [ "${BENCH:-}" = kernel_times ]; then
  if grep -l WRONG /dev/null "$LOGS"/*-[0-9]*.log; then
    echo "compare_baseline: the variants in the logs above gave WRONG outputs (lines with WRONG)"
    status=1
  fi
  # The baseline's logs first: ratios are to the first tag.
  logs=("$LOGS"/base-[0-9]*.log "$LOGS"/new-[0-9]*.log "$LOGS"/new_*-[0-9]*.log)
  for t in ${COMPARE_TREES:-}; do logs+=("$LOGS/${t%%=*}"-[0-9]*.log); done
  "$PY" bench/kernel_times.py --table "${logs[@]}" | tee "$OUT/ab_table.md"
fi
exit $status
