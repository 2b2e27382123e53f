#!/usr/bin/env bash
# session 21, call 4 (tree exp/kept, .baseline = `git archive main --prefix=.baseline/ | tar x`):
# the kept channels-last forward's A/B by kernel time (variants: main; this tree; this tree with
# NORMJIT_SPLIT=l2, i.e. streamed twice; this tree with 16-byte deep rows), then the GPU suite.
S="--timer cupti --dtypes fp16 --layouts ndhwc --shapes 2,128,32,32,32 2,256,16,16,16 1,64,58,58,60 2,16,32,32,32 2,320,8,8,8 2,320,4,4,4"
BENCH=kernel_times COMPARE_ENVS="NORMJIT_SPLIT=l2 NORMJIT_NHWC_MIN_ROW_BYTES=16" OUT=$OUT/ab timeout 240 \
  bench/compare_baseline.sh .baseline $S > $OUT/ab.log 2>&1
cat $OUT/ab/ab_table.md || tail -30 $OUT/ab.log
OUT=$OUT/suite timeout 330 scripts/gpu_check.sh build tests > /dev/null 2>&1
tail -c 1200 $OUT/suite/tests.log; cat $OUT/suite/summary.tsv
