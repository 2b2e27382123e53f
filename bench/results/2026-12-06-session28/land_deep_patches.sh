#!/usr/bin/env bash
# Written in session 28 (not run: no machine could be started). One device call (<= 560 s):
# session 27's two deep-stage patches applied together
# (early_push.patch: channels-last cluster backwards only; ncdhw_whole_tiers.patch: NCDHW training
# kernels of group 8/32 only; bench/same_code.sh found the two sets disjoint), timed against main
# by CUPTI on both layouts, then the whole GPU suite on the patched tree. The kernels each patch
# changes do not overlap, so the NCDHW rows measure ncdhw_whole_tiers and the NDHWC backward rows
# early_push; the NDHWC forward rows are the control. (Session 27's next_gpu_call.sh also timed
# each patch alone: four trees, too long for one call together with the suite.)
# Before the call, here, from main:
#   R=bench/results/2026-12-06-session27; git archive main --prefix=.baseline/ | tar x
#   git apply $R/early_push.patch $R/ncdhw_whole_tiers.patch
# Call: OUT=... bash bench/results/2026-12-06-session28/land_deep_patches.sh
AB_TIMEOUT=${AB_TIMEOUT:-200} SUITE_TIMEOUT=${SUITE_TIMEOUT:-340} OUT=${OUT:-./land_deep_out} \
  bench/ab_then_suite.sh .baseline \
  --layouts ncdhw,ndhwc --modes fwd,bwd --dtypes fp16,bf16 \
  --shapes 2,320,8,8,8 2,320,4,4,4 8,320,4,4,4 3,200,5,7,11
