#!/usr/bin/env bash
# Session 29's first device call (86 s on an H100; the device time left after a dozen refused
# starts did not cover session 28's land_deep_patches.sh, A/B and suite in one call). One A/B by
# CUPTI of three trees, fp16, both layouts, forward and backward, two rounds:
#   base    = .baseline, main 46741f6
#   new     = the working tree: main + session 27's early_push.patch + ncdhw_whole_tiers.patch
#   cluster = .variants/cluster (main + session 28's cluster_split.patch), NORMJIT_CLUSTER_SPLIT=1
# Set-up, here: the header of bench/results/2026-12-06-session28/next_gpu_call.sh.
# The suite then ran (call 2) on main + ncdhw_whole_tiers.patch alone (early_push lost on
# (2,320,4^3)): OUT=$OUT/suite scripts/gpu_check.sh build tests -> whole_tiers_suite.tsv.
COMPARE_TREES="cluster=.variants/cluster,NORMJIT_CLUSTER_SPLIT=1" SKIP_SUITE=1 AB_TIMEOUT=290 \
  OUT=${OUT:-./deep_and_cluster_out} bench/ab_then_suite.sh .baseline --layouts ncdhw,ndhwc --modes fwd,bwd \
  --dtypes fp16 --shapes 2,320,8,8,8 2,320,4,4,4 2,256,16,16,16 1,320,12,12,12 3,200,9,10,11
