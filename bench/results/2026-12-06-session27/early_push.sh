#!/usr/bin/env bash
# Not run yet (no device time left in session 27); next_gpu_call.sh, which times it beside
# ncdhw_whole_tiers.patch, is the better first call. The channels-last deep backward's cluster
# weight gradients in two halves (early_push.patch): each rank pushes its sums into rank 0's
# shared memory and arrives *before* the dx output pass, and rank 0 waits and adds them after it.
# Session 27's Nsight Compute run found 12-15 % of the (2,320,8^3) backward's stall samples on the
# arrive's release fence (MEMBAR.ALL.GPU), which ran after the dx stores and so waited for them
# to drain. ptxas -v sm_90: no spills (fp16/bf16, identity/leaky_relu), 109-120 registers (from
# 96-98 for fp16 identity); Cli/Bounded/Autotune/Heuristics ctest 53/53.
# From main with the patch applied and .baseline = main:
#   git apply bench/results/2026-12-06-session27/early_push.patch
#   git archive main --prefix=.baseline/ | tar x
#   OUT=... bash bench/results/2026-12-06-session27/early_push.sh      (give it >= 500 s)
OUT=${OUT:-./early_push_out} bench/ab_then_suite.sh .baseline --layouts ndhwc --modes bwd --dtypes fp16,bf16 \
  --shapes 2,320,8,8,8 2,320,4,4,4 8,320,4,4,4 4,128,8,8,8 3,200,5,7,11 2,128,32,32,32
