#!/usr/bin/env bash
# The channels-last tiers without the split exchange's code (whole_tiers.patch, written in
# session 26 without a GPU). Every channels-last kernel carried the exchange behind a run-time
# `p.chunks > 1`, also the cached kernels (the tiers), which hold a unit whole and never split:
# ptxas -v (sm_90) counted 126-128 registers a thread in the deep tiers of (2,320,8^3) and
# (2,320,4^3) with it and 72-123 without, and a forward pair compiled in 0.24 s instead of 0.48.
# The patch leaves it out of every cached channels-last kernel (NJ_NHWC_SPLITS) and so drops the
# channels-last split held in registers (an autotune candidate and NORMJIT_SPLIT=registers only;
# its autotune slots now offer the streamed split at the same chunk counts). same_code: 340 of
# 748 cubins differ, all of them channels-last cached kernels.
# Part 1 (~150 s): A/B by CUPTI of the deep stages (every kernel a tier) and of two splits (the
# control: their cubins are identical). Part 2 (~300 s): the whole GPU suite.
# From main with the patch applied and .baseline = main:
#   git apply bench/results/2026-12-06-session26/whole_tiers.patch
#   git archive main --prefix=.baseline/ | tar x
#   OUT=... bash bench/results/2026-12-06-session26/whole_tiers.sh      (give it >= 480 s)
# (Since session 27 it calls bench/ab_then_suite.sh, which runs the same two parts.)
AB_TIMEOUT=200 SUITE_TIMEOUT=360 OUT=${OUT:-./whole_tiers_out} bench/ab_then_suite.sh .baseline \
  --layouts ndhwc --modes fwd,bwd --dtypes fp16,bf16 --shapes 2,320,8,8,8 2,320,4,4,4 2,320,5,5,5 1,320,8,8,8 4,128,8,8,8 2,128,32,32,32 2,256,16,16,16
