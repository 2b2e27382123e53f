#!/usr/bin/env bash
# Why the whole-tiers patch (session 26) made the fp16 channels-last tier of (2,320,4^3) ~10 %
# slower (CUPTI: 3.2 -> 3.5 us fwd, 3.9 -> 4.3 bwd) while its bf16 twin and the (2,320,8^3)
# tiers got faster: bench/ncu_source.sh (Nsight Compute's full set with the SASS view; fp16) on
# the baseline tree and on this one, and bench/ncu_stalls.py's summary of each. From a tree with
# the patch applied and .baseline = main (as whole_tiers.sh):
#   OUT=... bash bench/results/2026-12-06-session27/ncu_deep_tier.sh      (~200 s)
set -u
OUT=${OUT:-./ncu_deep_out}; mkdir -p "$OUT"
BASE_SITE=/tmp/ncu_base_site
python3 -m pip install -q --no-build-isolation --no-deps . > "$OUT/install_new.log" 2>&1 &
python3 -m pip install -q --no-build-isolation --no-deps --target "$BASE_SITE" .baseline > "$OUT/install_base.log" 2>&1 &
wait
for v in base new; do
  pp=""; [ $v = base ] && pp=$BASE_SITE
  echo "=== $v"
  PYTHONPATH=$pp OUT=$OUT/$v timeout 150 bench/ncu_source.sh --shapes 2,320,4,4,4 2,320,8,8,8 --layouts ndhwc
  python3 bench/ncu_stalls.py "$OUT/$v/source.csv" --top 12 > "$OUT/stalls_$v.txt" 2>&1
  rm -f "$OUT/$v/ncu.ncu-rep"
done
head -c 6000 "$OUT/stalls_new.txt"
