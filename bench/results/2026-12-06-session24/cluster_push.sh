#!/usr/bin/env bash
# From exp/cluster-push's tree with .baseline = `git archive main --prefix=.baseline/ | tar x`
# (main 8a4166f): the cluster's weight gradients pushed into rank 0's shared memory with remote
# stores (one barrier that only rank 0 waits at) instead of rank 0 reading each rank's floats
# between two barriers. Part 1 (~80 s): A/B by CUPTI of the channels-last deep backward, N = 2-8.
# Part 2 (~60 s): the C++ GPU tests of the channels-last deep kernels (ClusterWeightGrads covers
# N = 2, 3, 5, 8 against the double reference, the same bits twice, 2-byte vectors) - not the
# whole suite. Part 3 (~30 s): the phase clocks of two cluster kernels.
#   bash bench/results/2026-12-06-session24/cluster_push.sh      (give it >= 240 s)
S="--timer cupti --layouts ndhwc --modes bwd --dtypes fp16,bf16 --shapes 2,320,8,8,8 2,320,4,4,4 4,128,8,8,8 8,320,4,4,4 3,200,5,7,11"
BENCH=kernel_times OUT=$OUT/ab timeout 110 bench/compare_baseline.sh .baseline $S > $OUT/ab.log 2>&1
cat $OUT/ab/ab_table.md 2>/dev/null || tail -30 $OUT/ab.log
OUT=$OUT/build timeout 60 scripts/gpu_check.sh cmake > /dev/null 2>&1; tail -2 $OUT/build/summary.tsv
timeout 60 build-gpu/tests/cpp/normjit_tests --gtest_filter='GpuKernelsChannelsLast*' > $OUT/gtest_channels_last.log 2>&1
grep -E "^\[  (PASSED|FAILED|  OK|SKIPPED) |tests? from .* ran" $OUT/gtest_channels_last.log | tail -12
timeout 45 python3 bench/phase_clocks.py --no-times --layouts ndhwc --shapes 2,320,8,8,8 4,128,8,8,8 > $OUT/phase.log 2>&1
python3 bench/phase_clocks.py --summarize $OUT/phase.log
