#!/usr/bin/env bash
# From exp/narrow-bwd's tree with .baseline = `git archive main --prefix=.baseline/ | tar x` (main
# 45539c5, the cluster's weight gradients): the channels-last deep backward narrows its channel
# tiles as the forward does where it ends without the last CTA's weight-gradient pass (N = 1, or
# 2-8 samples in clusters on sm_90): (2,320,4^3) 10 CTAs of 256 -> 40 of 64. Part 1 (~200 s): A/B
# by CUPTI, plain (fp16, bf16) and with LeakyReLU (fp16); (2,320,8^3) and (16,320,4^3) do not
# change (controls). Part 2 (~350 s): the whole GPU suite on the branch.
#   bash bench/results/2026-12-06-session24/narrow_bwd.sh      (give it >= 580 s)
S="--timer cupti --layouts ndhwc --modes bwd --shapes 2,320,4,4,4 1,320,4,4,4 4,320,4,4,4 8,320,4,4,4 2,128,4,4,4 2,320,5,5,5 2,320,8,8,8 16,320,4,4,4"
BENCH=kernel_times OUT=$OUT/ab_none timeout 130 bench/compare_baseline.sh .baseline $S --dtypes fp16,bf16 \
  > $OUT/ab_none.log 2>&1
cat $OUT/ab_none/ab_table.md 2>/dev/null || tail -30 $OUT/ab_none.log
BENCH=kernel_times OUT=$OUT/ab_leaky_relu timeout 100 bench/compare_baseline.sh .baseline $S --dtypes fp16 \
  --activation leaky_relu > $OUT/ab_leaky_relu.log 2>&1
cat $OUT/ab_leaky_relu/ab_table.md 2>/dev/null || tail -30 $OUT/ab_leaky_relu.log
OUT=$OUT/suite timeout 400 scripts/gpu_check.sh build tests > /dev/null 2>&1
cat $OUT/suite/summary.tsv; grep -E "tests passed|passed|failed|FAILED" $OUT/suite/tests.log | tail -8
