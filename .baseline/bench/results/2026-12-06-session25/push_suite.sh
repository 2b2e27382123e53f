#!/usr/bin/env bash
# Session 25, call 3, from exp/cluster-push rebased on main 2e92b2e (the tree it lands as):
# 1. the whole GPU suite (~300 s); it also installs this tree's package, which 2 and 3 use;
# 2. the channels-last split's arrivals, every CTA stamped (phase_clocks.py --every 1), split
#    into the peers' skew and the round trip (PERF_NOTES 000);
# 3. the deep NCDHW kernels with the bounded policy's 4 items a thread against 2 and 1
#    (NORMJIT_TIER_ITEMS; PERF_NOTES 000a: a (2,320,8^3) instance fills 2 of a warp's 4 items,
#    (2,320,4^3) 1 of 8 threads' 4; Nsight Compute counted 2.2x and 3.2x torch.compile's
#    instructions). Items 1 moves 8^3 and 5^3 to CTAs of 128 a instance; 5^3 (vectors of 1,
#    4 items exactly) is the control at 2. (2,320,8^3) in 2 also gives the pushed cluster step.
#   OUT=... bash bench/results/2026-12-06-session25/push_suite.sh      (give it >= 480 s)
#   SUITE=0 ... : install only, no suite (~200 s)
set -u
OUT=${OUT:-./push_suite_out}; mkdir -p "$OUT"
if [ "${SUITE:-1}" = 1 ]; then
  OUT=$OUT/suite timeout 360 scripts/gpu_check.sh build tests > /dev/null 2>&1
  grep -E "tests passed|passed|failed|FAILED" "$OUT/suite/tests.log" | tail -6
else  # SUITE=0: only install this tree's package for 2 and 3
  OUT=$OUT/suite timeout 200 scripts/gpu_check.sh install > /dev/null 2>&1
fi
cat "$OUT/suite/summary.tsv"
timeout 90 python3 bench/phase_clocks.py --no-times --every 1 --layouts ndhwc \
  --shapes 2,128,32,32,32 2,256,16,16,16 2,64,64,64,64 2,320,8,8,8 > "$OUT/arrivals.log" 2>&1
python3 bench/phase_clocks.py --summarize "$OUT/arrivals.log" | tee "$OUT/arrivals_summary.txt"
S="--timer cupti --layouts ncdhw --modes fwd,bwd --dtypes fp16,bf16 --shapes 2,320,8,8,8 2,320,4,4,4 2,320,5,5,5"
timeout 60 python3 bench/kernel_times.py $S --tag items4 > "$OUT/deep_items4.log" 2>&1
NORMJIT_TIER_ITEMS=2 timeout 60 python3 bench/kernel_times.py $S --tag items2 > "$OUT/deep_items2.log" 2>&1
NORMJIT_TIER_ITEMS=1 timeout 60 python3 bench/kernel_times.py $S --tag items1 > "$OUT/deep_items1.log" 2>&1
grep -h " us (" "$OUT"/deep_items*.log | cut -c1-110
