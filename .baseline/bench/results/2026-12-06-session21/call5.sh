#!/usr/bin/env bash
# session 21, call 5 (tree exp/kept after the merge rule and per-launch slots; .baseline = main):
# the GPU suite first, then the kept forward's A/B by kernel time (variants: main; this tree;
# NORMJIT_SPLIT=l2: streamed; NORMJIT_SPLIT=resident: kept wherever it fits). call6.sh next.
OUT=$OUT/suite timeout 330 scripts/gpu_check.sh build tests > /dev/null 2>&1
tail -c 700 $OUT/suite/tests.log; cat $OUT/suite/summary.tsv
S="--timer cupti --dtypes fp16 --layouts ndhwc --modes fwd --shapes 2,128,32,32,32 2,256,16,16,16 1,64,58,58,60 2,16,32,32,32"
BENCH=kernel_times COMPARE_ENVS="NORMJIT_SPLIT=l2 NORMJIT_SPLIT=resident" OUT=$OUT/ab timeout 130 \
  bench/compare_baseline.sh .baseline $S > $OUT/ab.log 2>&1
cat $OUT/ab/ab_table.md || tail -30 $OUT/ab.log
