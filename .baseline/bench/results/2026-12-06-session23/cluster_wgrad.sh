#!/usr/bin/env bash
# From exp/cluster-wgrad's tree with .baseline = `git archive main --prefix=.baseline/ | tar x`:
# the channels-last backward of 2-8 samples sums dweight/dbias in a thread-block cluster per channel
# tile instead of the last CTA's pass. Part 1 (~160 s): A/B by CUPTI, plain and with LeakyReLU
# (base = main, new, and new with NORMJIT_CLUSTER_WEIGHT_GRADS=0, whose kernels are main's since
# the cluster became a config bit; (2,256,16^3), a split, is the control). Part 2 (~310 s): the
# whole GPU suite on the branch.
#   bash bench/results/2026-12-06-session23/cluster_wgrad.sh      (give it >= 540 s)
S="--timer cupti --dtypes fp16,bf16 --layouts ndhwc --modes bwd --shapes 2,320,8,8,8 2,320,4,4,4 4,128,8,8,8 3,200,5,7,11 2,256,16,16,16"
for act in none leaky_relu; do
  BENCH=kernel_times COMPARE_ENVS="NORMJIT_CLUSTER_WEIGHT_GRADS=0" OUT=$OUT/ab_$act timeout 120 \
    bench/compare_baseline.sh .baseline $S --activation $act > $OUT/ab_$act.log 2>&1
  cat $OUT/ab_$act/ab_table.md 2>/dev/null || tail -30 $OUT/ab_$act.log
done
OUT=$OUT/suite timeout 400 scripts/gpu_check.sh build tests > /dev/null 2>&1
cat $OUT/suite/summary.tsv; grep -E "tests passed|passed|failed|FAILED" $OUT/suite/tests.log | tail -8
