#!/usr/bin/env bash
# Session 36's device calls, rerunnable: OUT=... bash bench/results/2026-12-07-session36/gpu_calls.sh W|M
# (Session 35's A and R calls, which this session ran first, are in ../2026-12-07-session35/gpu_calls.sh.)
# W (~480 s): the landing call for the NCDHW backward's CTA of 512 (resident_plan,
#   resident_backward_pays). Set-up here: git archive <commit before the change> --prefix=.baseline/ | tar x
#   A/B of backward kernel times (CUPTI, two rounds) of the baseline against this tree on every
#   shape whose plan the change moves, fp16/bf16/fp32, with (2,64,64^3) unchanged as the control,
#   then the GPU suite.
# M (~440 s): README's main table: scripts/gpu_check.sh's kernel, activation, host and U-Net
#   benchmarks.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
OUT=${OUT:-./session36_out}
case "${1:-}" in
  W) AB_TIMEOUT=270 SUITE_TIMEOUT=320 OUT=$OUT bench/ab_then_suite.sh .baseline --layouts ncdhw --modes bwd \
       --dtypes fp16,bf16,fp32 --shapes 2,32,128,128,128 2,32,80,192,160 2,64,64,64,64 2,8,80,192,160 \
       2,32,112,112,112 2,48,96,96,96 2,64,48,160,160 ;;
  M) mkdir -p "$OUT"; OUT=$OUT/main timeout 560 scripts/gpu_check.sh build bench_kernel bench_act bench_host bench_unet \
       > "$OUT/main.log" 2>&1; tail -c 9000 "$OUT/main.log" ;;
  *) echo "usage: gpu_calls.sh W|M" >&2; exit 2 ;;
esac
