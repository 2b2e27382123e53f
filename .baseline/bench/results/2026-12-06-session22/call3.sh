#!/usr/bin/env bash
# session 22, call 3 (tree exp/kept-all: the kept channels-last forward also where its chunks are
# fewer than the exchange's columns; .baseline = main 96fb0ea, kept with that rule): the GPU suite, then the
# A/B by CUPTI of the shapes it changes ((2,256,16^3) and (3,72,20,21,22) fp16 forwards; (2,128,32^3)
# as the unchanged control), then PERF_NOTES 000a: bf16 against fp16 (2,128,32^3) NCDHW, the
# kernels by CUPTI and forward+backward by do_bench with normjit and eager as peers.
OUT=$OUT/suite timeout 390 scripts/gpu_check.sh build tests > /dev/null 2>&1
cat $OUT/suite/summary.tsv; grep -E "tests passed|passed|failed" $OUT/suite/tests.log | tail -4
S="--timer cupti --dtypes fp16 --layouts ndhwc --modes fwd --shapes 2,256,16,16,16 3,72,20,21,22 2,128,32,32,32"
BENCH=kernel_times OUT=$OUT/ab timeout 100 bench/compare_baseline.sh .baseline $S > $OUT/ab.log 2>&1
cat $OUT/ab/ab_table.md 2>/dev/null || grep -E "^(base|new) " $OUT/ab.log
timeout 45 python3 bench/kernel_times.py --timer cupti --dtypes fp16,bf16 --layouts ncdhw --modes fwd,bwd \
  --shapes 2,128,32,32,32 > $OUT/bf16_kernels.log 2>&1; grep -E "fp16|bf16" $OUT/bf16_kernels.log | cut -c1-150
timeout 45 python3 bench/bench_instance_norm.py --dtypes fp16,bf16 --layouts ncdhw --modes fwd,fwdbwd \
  --peers eager,normjit --shapes 2,128,32,32,32 --no-plot --out $OUT/bf16_wall > $OUT/bf16_wall.log 2>&1
grep -E "^\| 2,128" $OUT/bf16_wall/results.md | head -8 || tail -5 $OUT/bf16_wall.log
