#!/usr/bin/env bash
# Session 23, from exp/both's tree (exp/batch-tile + exp/deep-cta) with .baseline = `git archive
# main --prefix=.baseline/ | tar x`: the A/B by CUPTI of both deep-stage experiments in one run.
#   base = main; new = both; new_NORMJIT_SAMPLE_SLICES_0 = the channels-last backward as on main;
#   new_NORMJIT_FILL_THREADS_256 = the NCDHW deep tiers as on main.
#   bash bench/results/2026-12-06-session23/ab_both.sh     (~200 s)
S="--timer cupti --dtypes fp16,bf16 --layouts ncdhw,ndhwc --modes fwd,bwd --shapes 2,320,8,8,8 2,320,4,4,4 1,320,4,4,4 4,128,8,8,8"
BENCH=kernel_times COMPARE_ENVS="NORMJIT_SAMPLE_SLICES=0 NORMJIT_FILL_THREADS=256" OUT=$OUT/ab timeout 320 \
  bench/compare_baseline.sh .baseline $S > $OUT/ab.log 2>&1
cat $OUT/ab/ab_table.md 2>/dev/null || tail -30 $OUT/ab.log
