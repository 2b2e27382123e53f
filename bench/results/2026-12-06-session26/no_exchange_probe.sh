#!/usr/bin/env bash
# Do the deep stages' kernels run faster without the split exchange's code compiled in? Every
# kernel carries the exchange behind a run-time `p.chunks > 1`, also the tiers that hold a unit
# whole and never split. ptxas -v (sm_90, session 26): the channels-last deep tiers of
# (2,320,8^3) and (2,320,4^3) use 126-128 registers with it and 72-123 without, and compile in
# half the time (0.48 -> 0.24 s for a forward pair); the NCDHW ones 56 -> 48 (forward).
# no_exchange_probe.patch puts the exchange behind NJ_NO_EXCHANGE (default 0), so that
# NORMJIT_NVRTC_OPTIONS=-DNJ_NO_EXCHANGE=1 compiles it out. A probe only: a kernel of a launch
# with chunks > 1 would be wrong under it, so only shapes that never split are timed (each line
# is still checked against float64 torch). If it wins, the real change is a config bit (or
# dropping the channels-last cached split, whose kernels are the tiers' configs): PERF_NOTES.
# From main with the patch applied and .baseline = main:
#   git apply bench/results/2026-12-06-session26/no_exchange_probe.patch
#   git archive main --prefix=.baseline/ | tar x
#   OUT=... bash bench/results/2026-12-06-session26/no_exchange_probe.sh      (give it >= 200 s)
set -u
OUT=${OUT:-./no_exchange_out}; mkdir -p "$OUT"
S="--timer cupti --layouts ndhwc,ncdhw --modes fwd,bwd --dtypes fp16,bf16 --shapes 2,320,8,8,8 2,320,4,4,4 2,320,5,5,5 1,320,8,8,8 4,128,8,8,8"
COMPARE_ENVS="NORMJIT_NVRTC_OPTIONS=-DNJ_NO_EXCHANGE=1" BENCH=kernel_times OUT=$OUT/ab timeout 300 \
  bench/compare_baseline.sh .baseline $S > "$OUT/ab.log" 2>&1
cat "$OUT/ab/ab_table.md" 2>/dev/null || tail -30 "$OUT/ab.log"
