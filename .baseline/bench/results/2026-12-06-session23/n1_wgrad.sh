#!/usr/bin/env bash
# Session 23, from exp/n1-wgrad's tree with .baseline = `git archive main --prefix=.baseline/ | tar x`:
# the channels-last backward of N = 1 writes dweight/dbias from each CTA (channel_major) instead of
# the last CTA's pass. Part 1 (~70 s): A/B by CUPTI, N = 2 as the control. Part 2 (~350 s): the
# whole GPU suite on the branch.
#   bash bench/results/2026-12-06-session23/n1_wgrad.sh      (give it >= 540 s)
S="--timer cupti --dtypes fp16,bf16 --layouts ndhwc --modes bwd --shapes 1,320,4,4,4 1,320,8,8,8 1,256,16,16,16 1,32,64,64,64 2,320,8,8,8"
BENCH=kernel_times OUT=$OUT/ab timeout 150 bench/compare_baseline.sh .baseline $S > $OUT/ab.log 2>&1
cat $OUT/ab/ab_table.md 2>/dev/null || tail -30 $OUT/ab.log
OUT=$OUT/suite timeout 420 scripts/gpu_check.sh build tests > /dev/null 2>&1
cat $OUT/suite/summary.tsv; grep -E "tests passed|passed|failed" $OUT/suite/tests.log | tail -4
