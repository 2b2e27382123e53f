#!/usr/bin/env bash
# Not run yet (session 27 had no device time left): two kernel patches for the deep stages, timed
# against main and against each other in one A/B, for the first GPU call of the next session.
#   early_push.patch: the channels-last deep backward's cluster pushes its weight-gradient sums
#     and arrives before the dx output pass (PERF_NOTES 000b);
#   ncdhw_whole_tiers.patch: the NCDHW kernels of several instances a CTA (the small and tiny
#     tiers of the deep stages) leave the split exchange out (NJ_NCDHW_SPLITS, as the
#     channels-last tiers since session 27): the (2,320,8^3) fp16 forward goes from 1160 to 656
#     SASS instructions with no barrier, fence or atomic left (56 -> 48 registers; PERF_NOTES 000a).
# Before the call, here, from main (the working tree gets both patches, so the suite runs on them):
#   R=bench/results/2026-12-06-session27
#   git archive main --prefix=.baseline/ | tar x
#   for v in early_push ncdhw_whole_tiers; do mkdir -p .variants/$v && git archive main | tar x -C .variants/$v \
#     && git apply --directory=.variants/$v $R/$v.patch; done
#   git apply $R/early_push.patch $R/ncdhw_whole_tiers.patch
# Call 1 (~300 s): OUT=... bash bench/results/2026-12-06-session27/next_gpu_call.sh
# Call 2 (~330 s): OUT=... scripts/gpu_check.sh build tests
# Land each patch that wins (ratio < 1 on its rows, the other rows within noise) once call 2
# passed; remove .baseline and .variants afterwards.
export COMPARE_TREES="early_push=.variants/early_push ncdhw_whole_tiers=.variants/ncdhw_whole_tiers"
SKIP_SUITE=1 AB_TIMEOUT=400 OUT=${OUT:-./next_gpu_call_out} bench/ab_then_suite.sh .baseline \
  --layouts ncdhw,ndhwc --modes fwd,bwd --dtypes fp16,bf16 \
  --shapes 2,320,8,8,8 2,320,4,4,4 8,320,4,4,4 4,128,8,8,8 3,200,5,7,11 2,128,32,32,32
