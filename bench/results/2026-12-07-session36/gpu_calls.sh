#!/usr/bin/env bash
# Session 36's device calls, rerunnable: OUT=... bash bench/results/2026-12-07-session36/gpu_calls.sh W|M|C|S|K
# (Session 35's A and R calls, which this session ran first, are in ../2026-12-07-session35/gpu_calls.sh.)
# W (~480 s): the landing call for the NCDHW backward's CTA of 512 (resident_plan,
#   resident_backward_pays). Set-up here: git archive <commit before the change> --prefix=.baseline/ | tar x
#   A/B of backward kernel times (CUPTI, two rounds) of the baseline against this tree on every
#   shape whose plan the change moves, fp16/bf16/fp32, with (2,64,64^3) unchanged as the control,
#   then the GPU suite.
# M (~440 s): README's main table: scripts/gpu_check.sh's kernel, activation, host and U-Net
#   benchmarks.
# C (~420 s, for the next session: the landing call for forward_cta_512.patch). Set-up here:
#     git apply bench/results/2026-12-07-session36/forward_cta_512.patch
#   The resident forward's CTA of 512 (resident_plan's rule for both directions), and whether the
#   fp16 resident kernels slow down as the GPU warms. Samples SM and memory clocks, power,
#   temperature and throttle reasons every second all along (clocks.csv); times NCDHW forward
#   kernels, the tree's default against NORMJIT_RESIDENT_THREADS=256 (main's forward plans), two
#   interleaved rounds, on the cold GPU; runs the GPU suite (which heats it); times them again.
# S (~150 s, measurement only, main's code): the resident split's slot count (NORMJIT_RESIDENT_SLOTS
#   3-6; 4 is the default, fitted on the H200 on (2,32,128^3)): fewer, larger chunks or more,
#   smaller ones. Does (2,64,64^3), whose fp16 forward has only 9 steps of 19 chunks (80 % of
#   copy), gain from more steps? fp16 forward and backward, two interleaved rounds.
# K (~120 s, measurement only, main's code): the same forward times, main's default against
#   NORMJIT_RESIDENT_THREADS=512, on a cold GPU, with the clocks sampled.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
OUT=${OUT:-./session36_out}
case "${1:-}" in
  W) AB_TIMEOUT=270 SUITE_TIMEOUT=320 OUT=$OUT bench/ab_then_suite.sh .baseline --layouts ncdhw --modes bwd \
       --dtypes fp16,bf16,fp32 --shapes 2,32,128,128,128 2,32,80,192,160 2,64,64,64,64 2,8,80,192,160 \
       2,32,112,112,112 2,48,96,96,96 2,64,48,160,160 ;;
  M) mkdir -p "$OUT"; OUT=$OUT/main timeout 560 scripts/gpu_check.sh build bench_kernel bench_act bench_host bench_unet \
       > "$OUT/main.log" 2>&1; tail -c 9000 "$OUT/main.log" ;;
  C) mkdir -p "$OUT/C"
     bench/sample_clocks.sh "$OUT/C/clocks.csv" &
     sampler=$!
     times() {  # $1: cold|hot
       for round in 1 2; do
         for v in default NORMJIT_RESIDENT_THREADS=256; do
           envs=(); [ $v != default ] && envs=($v)
           echo "== $1 round $round $v $(date +%T)" >> "$OUT/C/times_$1.log"
           env "${envs[@]}" timeout 60 python3 bench/kernel_times.py --timer cupti --tag "$1 $v" --layouts ncdhw \
             --modes fwd --dtypes fp16,fp32 --shapes 2,32,128,128,128 2,32,80,192,160 2,64,64,64,64 \
             2,8,80,192,160 2,32,112,112,112 2,64,48,160,160 >> "$OUT/C/times_$1.log" 2>&1
         done
       done
     }
     scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; kill $sampler; exit 1; }
     echo "cold start $(date +%T)"; times cold
     echo "suite $(date +%T)"; OUT=$OUT/suite timeout 320 scripts/gpu_check.sh build tests > /dev/null 2>&1
     cat "$OUT/suite/summary.tsv"; grep -E "passed|failed|FAILED" "$OUT/suite/tests.log" | tail -5
     echo "hot start $(date +%T)"; times hot
     kill $sampler
     python3 bench/kernel_times.py --table "$OUT/C/times_cold.log" "$OUT/C/times_hot.log" | tee "$OUT/C/forward_cta_table.md"
     awk -F', ' 'NR == 1 || NR % 15 == 2' "$OUT/C/clocks.csv" ;;
  K) mkdir -p "$OUT/C"
     bench/sample_clocks.sh "$OUT/C/clocks.csv" &
     sampler=$!
     scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; kill $sampler; exit 1; }
     for round in 1 2; do
       for v in default NORMJIT_RESIDENT_THREADS=512; do
         envs=(); [ $v != default ] && envs=($v)
         env "${envs[@]}" timeout 60 python3 bench/kernel_times.py --timer cupti --tag "cold $v" --layouts ncdhw \
           --modes fwd --dtypes fp16,fp32 --shapes 2,32,128,128,128 2,32,80,192,160 2,64,64,64,64 \
           2,8,80,192,160 2,32,112,112,112 2,64,48,160,160 >> "$OUT/C/times_cold.log" 2>&1
       done
     done
     kill $sampler
     python3 bench/kernel_times.py --table "$OUT/C/times_cold.log" | tee "$OUT/C/forward_cta_cold_table.md"
     awk -F', ' 'NR == 1 || NR % 10 == 2' "$OUT/C/clocks.csv" ;;
  S) scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; exit 1; }
     mkdir -p "$OUT/S"
     for round in 1 2; do
       for slots in 4 3 5 6; do
         NORMJIT_RESIDENT_SLOTS=$slots timeout 60 python3 bench/kernel_times.py --timer cupti --tag "slots=$slots" \
           --layouts ncdhw --modes fwd,bwd --dtypes fp16 --shapes 2,64,64,64,64 1,64,64,64,64 2,32,128,128,128 \
           >> "$OUT/S/slots.log" 2>&1
       done
     done
     python3 bench/kernel_times.py --table "$OUT/S/slots.log" | tee "$OUT/S/slots_table.md" ;;
  *) echo "usage: gpu_calls.sh W|M|C|S|K" >&2; exit 2 ;;
esac
