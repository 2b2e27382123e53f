#!/usr/bin/env bash
# Interleaved A/B of environment settings on main's own build: for each round, for each variant,
# runs `python3 bench/kernel_times.py --tag VARIANT ARGS...` with that variant's variables set,
# appending to LOG; then prints the markdown table of every tag's median (kernel_times --table).
# A variant is "default" (nothing set) or one or more VAR=value joined by commas
# ("NORMJIT_L2_PREFETCH=0,NORMJIT_SPLIT=l2"). Interleaving rounds spreads clock and thermal drift
# over all variants. A/Bs of two source trees need bench/compare_baseline.sh instead.
# Usage: bench/env_ab.sh LOG ROUNDS "VARIANT VARIANT..." KERNEL_TIMES_ARGS...
#   e.g. bench/env_ab.sh "$OUT/slots.log" 2 "default NORMJIT_RESIDENT_SLOTS=6" --timer cupti \
#          --layouts ncdhw --modes fwd --dtypes fp16 --shapes 2,64,64,64,64
# NORMJIT_AB_TIMEOUT (seconds, default 60) bounds each kernel_times run, so one hang costs one row;
# PYTHON (default python3) runs it.
set -u
log=$(realpath -m "${1:?usage: bench/env_ab.sh LOG ROUNDS VARIANTS KERNEL_TIMES_ARGS...}")
rounds=${2:?rounds}
variants=${3:?variants}
shift 3
cd "$(dirname "${BASH_SOURCE[0]}")/.."
for ((round = 1; round <= rounds; round++)); do
  for variant in $variants; do
    settings=()
    [ "$variant" != default ] && IFS=, read -r -a settings <<< "$variant"
    env "${settings[@]}" timeout "${NORMJIT_AB_TIMEOUT:-60}" "${PYTHON:-python3}" bench/kernel_times.py --tag "$variant" "$@" \
      >> "$log" 2>&1 || echo "env_ab: $variant, round $round: kernel_times exited $?" | tee -a "$log" >&2
  done
done
"${PYTHON:-python3}" bench/kernel_times.py --table "$log"
