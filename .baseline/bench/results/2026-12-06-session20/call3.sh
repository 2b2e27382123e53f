#!/usr/bin/env bash
# session 20, call 3 (tree exp/colsum, .baseline = `git archive main --prefix=.baseline/ | tar x`):
# the warp-first column sums' A/B by kernel time; then the GPU suite if they gained (a (2,320,8^3)
# kernel at <= 0.97 of main's and none above 1.03), else the deep stages' stall profile.
S="--dtypes fp16 --layouts ndhwc --shapes 2,320,8,8,8 2,320,4,4,4 2,16,128,128,128"
BENCH=kernel_times OUT=$OUT/ab timeout 150 bench/compare_baseline.sh .baseline --timer cupti $S > $OUT/ab.log 2>&1
cat $OUT/ab/ab_table.md || tail -30 $OUT/ab.log
verdict=$(awk -F'|' '/ndhwc/ { r = $(NF-1) + 0; if (r > 1.03) bad = 1; if ($2 ~ /2,320,8,8,8/ && r <= 0.97) good = 1 }
                     END { print (good && !bad) ? "gain" : "no-gain" }' $OUT/ab/ab_table.md 2>/dev/null)
echo "verdict: $verdict"
if [ "$verdict" = gain ]; then
  OUT=$OUT/suite timeout 330 scripts/gpu_check.sh build tests > /dev/null 2>&1
  tail -c 600 $OUT/suite/tests.log; cat $OUT/suite/summary.tsv
else
  OUT=$OUT/prof timeout 100 bench/ncu_source.sh --shapes 2,320,8,8,8 --layouts ncdhw,ndhwc > $OUT/prof.log 2>&1
  tail -30 $OUT/prof.log
fi
