#!/usr/bin/env bash
# The next GPU session's first call (~250 s, no suite): session 28's call 2, which session 29 had
# no device time left for. The tagged channels-last exchange and the backward's dx as three
# per-channel factors, each a tree of its own, against main on the channels-last splits, fp16.
# Set-up, here, from main (both patches pass `git apply --check` against main b9fcda6):
#   git archive main --prefix=.baseline/ | tar x
#   R=bench/results/2026-12-06-session28
#   for v in tagged:tagged_nhwc_on_bb24f1e coef:dx_coefs; do d=.variants/${v%%:*}; mkdir -p $d && \
#     git archive main | tar x -C $d && git apply --directory=$d $R/${v#*:}.patch; done
# Call: OUT=$OUT bash bench/results/2026-12-07-session29/next_gpu_call.sh
# A tree that wins then needs its own suite run (scripts/gpu_check.sh build tests, ~330 s) on
# main + its patch before it lands. Remove .baseline and .variants afterwards.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../2026-12-06-session28/streamed_ab.sh"
