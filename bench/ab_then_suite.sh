#!/usr/bin/env bash
# One device call that decides whether a kernel change lands: an A/B of kernel times by CUPTI
# (bench/compare_baseline.sh with BENCH=kernel_times, base = a baseline tree) on the shapes the
# change is about, then the whole GPU test suite (scripts/gpu_check.sh build tests) on this tree.
# Prints the A/B table, then the suite's summary and its pass/fail lines.
#
# Usage (on the GPU machine, from the repository root; .baseline = the commit to compare with):
#   git archive main --prefix=.baseline/ | tar x                     # here, before the call
#   OUT=... bench/ab_then_suite.sh .baseline --layouts ndhwc --modes fwd,bwd --dtypes fp16 \
#       --shapes 2,320,8,8,8 2,128,32,32,32
# Arguments after the baseline go to bench/kernel_times.py (--timer cupti is added). Give the call
# about 150 s for a few shapes plus 330 s for the suite. AB_TIMEOUT / SUITE_TIMEOUT (seconds)
# bound each half; SKIP_SUITE=1 runs the A/B alone.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BASE=${1:?usage: bench/ab_then_suite.sh BASELINE_DIR [kernel_times args...]}
shift
OUT=${OUT:-./ab_then_suite_out}
mkdir -p "$OUT"
BENCH=kernel_times OUT=$OUT/ab timeout "${AB_TIMEOUT:-200}" bench/compare_baseline.sh "$BASE" --timer cupti "$@" \
  > "$OUT/ab.log" 2>&1
cat "$OUT/ab/ab_table.md" 2>/dev/null || tail -30 "$OUT/ab.log"
[ "${SKIP_SUITE:-0}" = 1 ] && exit 0
OUT=$OUT/suite timeout "${SUITE_TIMEOUT:-360}" scripts/gpu_check.sh build tests > /dev/null 2>&1
cat "$OUT/suite/summary.tsv"
grep -E "tests passed|passed|failed|FAILED" "$OUT/suite/tests.log" | tail -8
