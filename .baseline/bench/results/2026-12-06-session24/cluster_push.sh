#!/usr/bin/env bash
# From exp/cluster-push's tree with .baseline = `git archive main --prefix=.baseline/ | tar x`:
# the cluster's weight gradients pushed into rank 0's shared memory with remote stores (one
# barrier that only rank 0 waits at) instead of rank 0 reading each rank's floats one by one
# between two barriers that every rank waits at (1.6-1.9 us a CTA by session 24's phase clocks).
# Written in session 24, which had no device time left to run it; run in session 25 (its A/B is
# bench/results/2026-12-06-session25/wgrad_three_way_ab.md, the "push" column). Part 1 (~80 s): A/B by CUPTI
# of the channels-last deep backward, N = 2-8 (the cluster kernels; nothing else changed:
# same_code 712 of 748 identical, the 36 cluster kernels different). Part 2 (~40 s): the phase
# clocks of two cluster kernels (the `cluster` column). Part 3 (~350 s): the whole GPU suite
# (GpuKernelsChannelsLastDeep.ClusterWeightGradsMatchDoubleReference: N = 2, 3, 5, 8 against the
# double reference, the same bits twice, 2-byte vectors).
#   bash bench/results/2026-12-06-session24/cluster_push.sh      (give it >= 560 s)
S="--timer cupti --layouts ndhwc --modes bwd --dtypes fp16,bf16 --shapes 2,320,8,8,8 2,320,4,4,4 4,128,8,8,8 8,320,4,4,4 3,200,5,7,11"
BENCH=kernel_times OUT=$OUT/ab timeout 110 bench/compare_baseline.sh .baseline $S > $OUT/ab.log 2>&1
cat $OUT/ab/ab_table.md 2>/dev/null || tail -30 $OUT/ab.log
timeout 50 python3 bench/phase_clocks.py --no-times --layouts ndhwc --shapes 2,320,8,8,8 4,128,8,8,8 > $OUT/phase.log 2>&1
python3 bench/phase_clocks.py --summarize $OUT/phase.log
OUT=$OUT/suite timeout 400 scripts/gpu_check.sh build tests > /dev/null 2>&1
cat $OUT/suite/summary.tsv; grep -E "tests passed|passed|failed|FAILED" $OUT/suite/tests.log | tail -8
