#!/usr/bin/env bash
# From exp/narrow-plain's tree with .baseline = `git archive main --prefix=.baseline/ | tar x` (main
# 24a0f38, the narrow deep backward with weights): the channels-last deep backward without weights
# (affine=False, MONAI's default), which has no weight-gradient pass, narrows its channel tiles too:
# (2,320,4^3) 10 CTAs of 256 -> 40 of 64. Part 1 (~100 s): A/B by CUPTI of the backward without
# weights (kernel_times --no-affine); (2,320,8^3) is already narrow (control). Part 2 (~60 s): the
# phase clocks of the deep channels-last kernels (the cluster step now has its own mark). Part 3
# (~350 s): the whole GPU suite on the branch.
#   bash bench/results/2026-12-06-session24/narrow_plain.sh      (give it >= 590 s)
S="--timer cupti --layouts ndhwc --modes bwd --no-affine --dtypes fp16,bf16 --shapes 2,320,4,4,4 1,320,4,4,4 4,320,4,4,4 16,320,4,4,4 2,320,5,5,5 2,320,8,8,8"
BENCH=kernel_times OUT=$OUT/ab_plain timeout 110 bench/compare_baseline.sh .baseline $S > $OUT/ab_plain.log 2>&1
cat $OUT/ab_plain/ab_table.md 2>/dev/null || tail -30 $OUT/ab_plain.log
timeout 70 python3 bench/phase_clocks.py --layouts ndhwc --shapes 2,320,8,8,8 2,320,4,4,4 4,128,8,8,8 \
  > $OUT/phase_deep.log 2>&1
python3 bench/phase_clocks.py --summarize $OUT/phase_deep.log; grep -E "fwd|bwd" $OUT/phase_deep.log | tail -8
OUT=$OUT/suite timeout 400 scripts/gpu_check.sh build tests > /dev/null 2>&1
cat $OUT/suite/summary.tsv; grep -E "tests passed|passed|failed|FAILED" $OUT/suite/tests.log | tail -8
