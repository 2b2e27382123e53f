#!/usr/bin/env bash
# Session 28, for the next GPU session (not run: no machine could be started this session).
# Two channels-last experiments timed against main by CUPTI, no suite (neither may land from this):
#   tagged: session 26's tagged exchange (tagged_nhwc_on_bb24f1e.patch: the split's partials as
#     64-bit words carrying the launch's tag, polled by their readers; no counter, no release
#     fence). Never timed: its fp16 flat (C = 30) streamed backwards spill (ptxas sm_90, 52-212
#     bytes; bench/spill_sites.py places the residual one's inside the output loop), so the suite's
#     spill test fails. The kernels timed here (C a multiple of 8, no residual) spill nothing in
#     the backward; the C = 64/32 streamed forwards spill 32 bytes. Worth fixing only if it wins.
#   coef: dx_coefs.patch: the channels-last backward's output pass as scale*g + slope*(x-mean) +
#     shift with the factors formed once per round (2-5 % fewer SASS instructions; registers
#     126 -> 118-121 in the fp16 streamed kernels with an activation, 96 -> 109 in the fp16 deep
#     identity tier).
# The "new" variant is the working tree (session 27's deep patches, which change none of the
# streamed kernels timed here: the noise control).
# Before the call, here, from main:
#   R=bench/results/2026-12-06-session28; git archive main --prefix=.baseline/ | tar x
#   for v in tagged:tagged_nhwc_on_bb24f1e coef:dx_coefs; do d=.variants/${v%%:*}; mkdir -p $d && \
#     git archive main | tar x -C $d && git apply --directory=$d $R/${v#*:}.patch; done
# Call (~250 s): OUT=... bash bench/results/2026-12-06-session28/streamed_ab.sh
COMPARE_TREES="tagged=.variants/tagged coef=.variants/coef" SKIP_SUITE=1 AB_TIMEOUT=${AB_TIMEOUT:-300} \
  OUT=${OUT:-./streamed_ab_out} bench/ab_then_suite.sh .baseline --layouts ndhwc --modes fwd,bwd --dtypes fp16 \
  --shapes 2,128,32,32,32 2,256,16,16,16 2,64,64,64,64 2,32,128,128,128 2,320,8,8,8
