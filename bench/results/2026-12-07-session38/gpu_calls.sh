#!/usr/bin/env bash
# Session 38's device calls, rerunnable: OUT=... bash bench/results/2026-12-07-session38/gpu_calls.sh A|...
# Every A/B runs bench/env_ab.sh: CUPTI kernel times, interleaved rounds, on the tree sent.
# Ran (H100, after twelve refused starts): `gpu_calls.sh A; gpu_calls.sh B2` in one command, on main
# d9eacf4 + tested_tree.patch (balance in both directions; main since 3a66484 balances the forward
# only, so NORMJIT_RESIDENT_BALANCE=0 there changes the forward rows alone). S, PS, AT: prepared.
# A (~150 s, measurement only; main d04e5e0 + the resident split's step-balanced chunks): those
#   chunks against the plan's fewest (NORMJIT_RESIDENT_BALANCE=0) on the shapes whose chunks moved
#   (normjit explain --device H100), both directions, two rounds; the clocks sampled every second.
# S (~100 s, measurement only): the resident split's slot count (NORMJIT_RESIDENT_SLOTS 4 =
#   default, 3, 6) on the fp16 resident shapes: (2,64,64^3) forward ran 9.2 steps of 19 chunks.
# PS (~150 s, measurement only): the streamed split's L2 prefetch (default 25 %) at 0, 12 and 37 %
#   on the fp32 backwards that stream by default (two rounds); at 0 against 25 % on the smaller
#   ones and on the fp16/bf16 backwards forced to stream (NORMJIT_SPLIT=l2), one round.
# B2 (~250 s): the GPU suite (build, ctest, pytest) on the tree sent.
# BW (~120 s, prepared; apply backward_within_grid.patch here first, then B2 for its suite): the
#   backward's balanced chunks where an instance stays within one grid, against
#   NORMJIT_RESIDENT_BALANCE=0, two rounds, fp16/bf16, on shapes whose backward chunks then move
#   (normjit explain --device H100 --direction bwd), and (1,32,128^3) as a control (unchanged).
# AT (~150 s, measurement only): autotune's choice (NORMJIT_AUTOTUNE=1) against the defaults on the
#   mid stages, both layouts, with each search's candidate timings (NORMJIT_LOG=autotune).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
OUT=${OUT:-./session38_out}
CUPTI=(--timer cupti --layouts ncdhw)
case "${1:-}" in
  A) mkdir -p "$OUT/A"
     scripts/gpu_check.sh build > /tmp/nj_build_a.log 2>&1 || { tail -30 /tmp/nj_build_a.log; exit 1; }
     bench/sample_clocks.sh "$OUT/A/clocks.csv" & sampler=$!
     echo "B start $(date +%T)"
     bench/env_ab.sh "$OUT/A/balance.log" 2 "default NORMJIT_RESIDENT_BALANCE=0" "${CUPTI[@]}" --modes fwd \
       --dtypes fp16,fp32 --shapes 2,64,64,64,64 1,64,64,64,64 1,8,64,64,64 2,8,64,64,64 2,48,96,96,96 \
       2,8,80,192,160 1,2,64,256,256 > /dev/null
     bench/env_ab.sh "$OUT/A/balance.log" 2 "default NORMJIT_RESIDENT_BALANCE=0" "${CUPTI[@]}" --modes bwd \
       --dtypes fp16 --shapes 1,32,128,128,128 2,8,80,192,160 2,48,96,96,96 | tee "$OUT/A/balance_table.md"
     echo "end $(date +%T)"
     kill $sampler
     awk -F', ' 'NR == 1 || NR % 30 == 2' "$OUT/A/clocks.csv" ;;
  S) scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; exit 1; }
     mkdir -p "$OUT/S"
     NORMJIT_AB_TIMEOUT=60 bench/env_ab.sh "$OUT/S/slots.log" 2 \
       "default NORMJIT_RESIDENT_SLOTS=3 NORMJIT_RESIDENT_SLOTS=6" "${CUPTI[@]}" \
       --modes fwd,bwd --dtypes fp16 --shapes 2,64,64,64,64 1,64,64,64,64 2,32,128,128,128 | tee "$OUT/S/slots_table.md" ;;
  PS) scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; exit 1; }
     mkdir -p "$OUT/PS"
     bench/env_ab.sh "$OUT/PS/prefetch.log" 2 \
       "default NORMJIT_L2_PREFETCH=0 NORMJIT_L2_PREFETCH=12 NORMJIT_L2_PREFETCH=37" "${CUPTI[@]}" \
       --modes bwd --dtypes fp32 --shapes 2,32,128,128,128 2,32,80,192,160 > /dev/null
     bench/env_ab.sh "$OUT/PS/prefetch.log" 1 "default NORMJIT_L2_PREFETCH=0" "${CUPTI[@]}" \
       --modes bwd --dtypes fp16,fp32 --shapes 1,32,128,128,128 2,128,32,32,32 1,64,64,64,64 > /dev/null
     bench/env_ab.sh "$OUT/PS/prefetch.log" 1 "NORMJIT_SPLIT=l2 NORMJIT_SPLIT=l2,NORMJIT_L2_PREFETCH=0" "${CUPTI[@]}" \
       --modes bwd --dtypes fp16,bf16 --shapes 2,32,128,128,128 2,32,80,192,160 | tee "$OUT/PS/prefetch_table.md" ;;
  BW) scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; exit 1; }
     mkdir -p "$OUT/BW"
     bench/env_ab.sh "$OUT/BW/backward_balance.log" 2 "default NORMJIT_RESIDENT_BALANCE=0" "${CUPTI[@]}" \
       --modes bwd --dtypes fp16,bf16 --shapes 2,48,96,96,96 2,32,112,112,112 2,32,80,80,80 1,48,80,80,80 \
       2,16,96,96,96 1,32,128,128,128 | tee "$OUT/BW/backward_balance_table.md" ;;
  B2) mkdir -p "$OUT/B2"
     OUT=$OUT/B2 timeout 330 scripts/gpu_check.sh build tests > /dev/null 2>&1
     cat "$OUT/B2/summary.tsv"; grep -E "passed|failed|FAILED" "$OUT/B2/tests.log" | tail -4 ;;
  AT) scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; exit 1; }
     mkdir -p "$OUT/AT"
     NORMJIT_LOG=autotune NORMJIT_AB_TIMEOUT=150 bench/env_ab.sh "$OUT/AT/autotune_times.log" 1 \
       "default NORMJIT_AUTOTUNE=1" --timer cupti --layouts ncdhw,ndhwc --modes fwd,bwd --dtypes fp16,fp32 \
       --shapes 2,64,64,64,64 1,64,64,64,64 2,128,32,32,32 2,256,16,16,16 | tee "$OUT/AT/autotune_table.md"
     ;;
  *) echo "usage: gpu_calls.sh A|S|PS|B2|BW|AT" >&2; exit 2 ;;
esac
