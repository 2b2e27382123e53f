#!/usr/bin/env bash
# From exp/lean-arrive's tree with .baseline = `git archive main --prefix=.baseline/ | tar x`:
# the split exchange's arrival as one release reduction (red.release.gpu) and its poll as an
# acquire load, instead of __threadfence + relaxed atomicAdd + volatile poll + __threadfence, and
# no fence of each channels-last row-0 thread before the CTA barrier (PERF_NOTES 000: the round
# trip after the last peer is ready was 0.9-1.7 us an arrival).
# Part 1 (~200 s): A/B by CUPTI of the split shapes, both layouts, fp16, forward and backward.
# Part 2 (~60 s): the channels-last arrivals again, every CTA stamped, split into skew + trip.
# The suite runs in a call of its own (SUITE=1 runs only it).
#   OUT=... bash bench/results/2026-12-06-session26/lean_arrive.sh      (give it >= 300 s)
set -u
OUT=${OUT:-./lean_arrive_out}; mkdir -p "$OUT"
if [ "${SUITE:-0}" = 1 ]; then
  OUT=$OUT/suite timeout 420 scripts/gpu_check.sh build tests > /dev/null 2>&1
  cat "$OUT/suite/summary.tsv"; grep -E "tests passed|passed|failed|FAILED" "$OUT/suite/tests.log" | tail -8
  exit 0
fi
S="--timer cupti --layouts ndhwc,ncdhw --modes fwd,bwd --dtypes fp16 --shapes 2,128,32,32,32 2,256,16,16,16 2,64,64,64,64 2,32,80,192,160"
BENCH=kernel_times OUT=$OUT/ab timeout 330 bench/compare_baseline.sh .baseline $S > "$OUT/ab.log" 2>&1
cat "$OUT/ab/ab_table.md" 2>/dev/null || tail -30 "$OUT/ab.log"
(cd /tmp && python3 -c 'import normjit') 2>/dev/null || exit 0
timeout 90 python3 bench/phase_clocks.py --no-times --every 1 --layouts ndhwc \
  --shapes 2,128,32,32,32 2,256,16,16,16 2,64,64,64,64 > "$OUT/arrivals.log" 2>&1
python3 bench/phase_clocks.py --summarize "$OUT/arrivals.log" | tee "$OUT/arrivals_summary.txt"
