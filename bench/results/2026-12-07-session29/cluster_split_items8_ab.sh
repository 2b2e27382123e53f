#!/usr/bin/env bash
# Not run yet. The cluster split prototype (PERF_NOTES 000c) with 8 vectors a thread, so that a
# (2,256,16^3) unit fits 8 ranks in 32-channel tiles (64-byte rows) instead of session 29's
# 16-channel ones (32-byte rows: 10.1 -> 13.9 us). The tree: main + cluster_split_items8.patch
# (session 28's cluster_split.patch rebased on main b9fcda6, plus NORMJIT_CLUSTER_SPLIT_ITEMS).
# Plans (normjit explain, H100): (2,256,16^3) 128 CTAs in clusters of 8 (main: the kept split,
# 128 CTAs, 16 chunks through L2); (1,320,12^3) 35 CTAs, clusters of 7; (3,200,9,10,11) 48 CTAs,
# clusters of 4. ptxas sm_90: no spills, 128 registers fp16/bf16, 96 fp32.
# Set-up, here, from main:
#   git archive main --prefix=.baseline/ | tar x
#   (next_gpu_call.sh's set-up makes .variants/c8)
# Call (~200 s, no suite): OUT=$OUT bash bench/results/2026-12-07-session29/cluster_split_items8_ab.sh
COMPARE_TREES="c8=.variants/c8,NORMJIT_CLUSTER_SPLIT=1,NORMJIT_CLUSTER_SPLIT_ITEMS=8 c4=.variants/c8,NORMJIT_CLUSTER_SPLIT=1" \
  SKIP_SUITE=1 AB_TIMEOUT=${AB_TIMEOUT:-240} OUT=${OUT:-./cluster_split_items8_out} \
  bench/ab_then_suite.sh .baseline --layouts ndhwc --modes fwd --dtypes fp16,bf16 \
  --shapes 2,256,16,16,16 1,256,16,16,16 4,128,16,16,16 1,320,12,12,12 3,200,9,10,11
