#!/usr/bin/env bash
# session 19, call 1: the GPU suite on exp/wgrad (main + slot_read patch + batched last-CTA
# loads), then an A/B of the deep stages kernel times (cupti): exp/slot-read (base) vs exp/wgrad (new);
# the backward without weight gradients.
# needs .baseline = `git archive exp/slot-read --prefix=.baseline/ | tar x` beside the tree
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$OUT/suite timeout 400 scripts/gpu_check.sh build tests > /dev/null 2>&1
tail -c 1000 $OUT/suite/tests.log; cat $OUT/suite/summary.tsv
S="--dtypes fp16 --layouts ncdhw,ndhwc --shapes 2,320,8,8,8 2,320,4,4,4"
BENCH=kernel_times OUT=$OUT/ab timeout 200 bench/compare_baseline.sh .baseline --timer cupti $S > $OUT/ab.log 2>&1
cat $OUT/ab/ab_table.md || tail -30 $OUT/ab.log
timeout 40 python3 bench/kernel_times.py --timer cupti --tag nodw --modes bwd --no-weight-grads $S 2>&1 | tail -7
