#!/usr/bin/env bash
# From exp/late-leave's tree with .baseline = `git archive main --prefix=.baseline/ | tar x`:
# the counter exchanges' departure atomic is sent when the CTA leaves the exchange but its answer
# (was this CTA the last to leave? then reset the counters) is read only after the output pass,
# so thread 0's warp no longer stalls for the atomic's round trip before writing its output.
# Part 1 (~100 s): A/B by CUPTI, fp16, the channels-last splits and the NCDHW L2-streamed
# backward. Part 2 (~200-270 s): the whole GPU suite.
#   OUT=... bash bench/results/2026-12-06-session26/late_leave.sh      (give it >= 420 s)
# (Since session 27 it calls bench/ab_then_suite.sh, which runs the same two parts.)
AB_TIMEOUT=150 SUITE_TIMEOUT=330 OUT=${OUT:-./late_leave_out} bench/ab_then_suite.sh .baseline \
  --layouts ndhwc,ncdhw --modes fwd,bwd --dtypes fp16 --shapes 2,128,32,32,32 2,256,16,16,16 2,64,64,64,64 2,32,80,192,160
