#!/usr/bin/env bash
# Session 28, for the next GPU session (not run): cluster_split.patch, the prototype of PERF_NOTES
# 000c, timed against main by CUPTI (kernel_times checks every line against float64 torch; this
# is the kernel's first run on a GPU). The training forward of a channels-last unit too long for
# one CTA, cut into 2-8 chunks held in registers, one thread-block cluster per unit merging the
# chunks' statistics through distributed shared memory; opt-in (NORMJIT_CLUSTER_SPLIT=1). Main
# runs (2,256,16^3) as the kept split: 16 chunks, exchange through L2, 10.1 us fp16 (session 26).
# Before the call, here, from main:
#   git archive main --prefix=.baseline/ | tar x
#   mkdir -p .variants/cluster && git archive main | tar x -C .variants/cluster && \
#     git apply --directory=.variants/cluster bench/results/2026-12-06-session28/cluster_split.patch
# Call (~200 s): OUT=... bash bench/results/2026-12-06-session28/cluster_split_ab.sh
# If it is right and faster: the suite with NORMJIT_CLUSTER_SPLIT=1 (its forward shapes of
# tests/python and tests/cpp that qualify), then a default (and the backward's half).
COMPARE_TREES="cluster=.variants/cluster,NORMJIT_CLUSTER_SPLIT=1" SKIP_SUITE=1 AB_TIMEOUT=${AB_TIMEOUT:-240} \
  OUT=${OUT:-./cluster_split_ab_out} bench/ab_then_suite.sh .baseline --layouts ndhwc --modes fwd --dtypes fp16,bf16 \
  --shapes 2,256,16,16,16 1,256,16,16,16 4,128,16,16,16 2,48,16,16,16 1,320,12,12,12 3,200,9,10,11
