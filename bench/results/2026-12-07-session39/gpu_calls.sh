#!/usr/bin/env bash
# Session 39's device calls, rerunnable: OUT=... bash bench/results/2026-12-07-session39/gpu_calls.sh MS|MT|MK|BWB|X|MID
# Ran: MK alone (H100, 279 s, on main 1f068fb), after thirteen failed starts (H100 and H200
# alternately), five refusals and a pause of the loans; 83 s were left. The other times below are
# estimates from sessions 36-38's steps, without the start.
# MS (~480 s): the GPU suite (build, ctest, pytest) on the tree sent, then README's results table
#   (gpu_check's bench_kernel, with its peers) and the U-Net step (bench_unet), all into $OUT.
# BWB (~380 s): backward_within_grid.patch (here: session 38's, rebased on aa0f199; the same plans
#   as session 38's on its base over normjit explain's sweep) applied to the tree sent, then its A/B
#   (session 38's call BW: the backward's balanced chunks where an instance stays within one grid,
#   against NORMJIT_RESIDENT_BALANCE=0, two interleaved rounds by CUPTI), then the GPU suite on
#   that tree. The patch moves no shape of README's table (normjit explain --direction bwd, H100
#   and H200), so MS's table holds either way.
# MT (~420 s): MS without the U-Net step.
# MK (ran, 279 s; MS's fallback where less device time was left): ctest and README's table only.
# X (~120 s): README's activation and host-overhead tables (bench_act, bench_host).
# MID (~100 s, measurement only): the 32^3 stage's fp16/bf16 NCDHW backward (a CTA of 512 an
#   instance, one an SM: (2,128,32^3) runs 256 CTAs in two waves) against its split forms, which
#   NORMJIT_TIER_ITEMS=4 forces (no register tier then holds an instance): streamed twice, the
#   resident split (NORMJIT_SPLIT=resident) and cached in registers (NORMJIT_SPLIT=registers);
#   (1,128,32^3), one wave already, as the control. Two interleaved rounds by CUPTI.
# Every suite here runs ctest's gpu label only (GPU_CHECK_CTEST=gpu: session 32's ctest spent
# 418 of its 519 test-seconds on the cpu ones, which CI runs on every commit, same toolkit).
set -u
export GPU_CHECK_CTEST=gpu
HERE=bench/results/2026-12-07-session39
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
OUT=${OUT:-./session39_out}
gpu() { nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader; }
suite_lines() { cat "$1/summary.tsv"; grep -E "passed|failed|FAILED" "$1/tests.log" | tail -4; }
case "${1:-}" in
  MS) gpu; mkdir -p "$OUT"
      timeout 585 scripts/gpu_check.sh build tests bench_kernel bench_unet > /tmp/nj_ms.log 2>&1
      suite_lines "$OUT"; cat "$OUT/results.md" ;;
  MT) gpu; mkdir -p "$OUT"
      timeout 540 scripts/gpu_check.sh build tests bench_kernel > /tmp/nj_mt.log 2>&1
      suite_lines "$OUT"; cat "$OUT/results.md" ;;
  MK) gpu; mkdir -p "$OUT"
      timeout 400 scripts/gpu_check.sh build ctest bench_kernel > /tmp/nj_mk.log 2>&1
      cat "$OUT/summary.tsv"; grep -E "tests passed|FAILED" "$OUT/tests.log" | tail -3; cat "$OUT/results.md" ;;
  BWB) gpu; mkdir -p "$OUT/BW" "$OUT/B2"
      git apply "$HERE/backward_within_grid.patch" 2>/dev/null || patch -p1 < "$HERE/backward_within_grid.patch" \
        || { echo "patch failed"; exit 1; }
      scripts/gpu_check.sh build > /tmp/nj_bw_build.log 2>&1 || { tail -30 /tmp/nj_bw_build.log; exit 1; }
      echo "BW start $(date +%T)"
      bench/env_ab.sh "$OUT/BW/backward_balance.log" 2 "default NORMJIT_RESIDENT_BALANCE=0" --timer cupti \
        --layouts ncdhw --modes bwd --dtypes fp16,bf16 --shapes 2,48,96,96,96 2,32,112,112,112 \
        2,32,80,80,80 1,48,80,80,80 2,16,96,96,96 1,32,128,128,128
      echo "B2 start $(date +%T)"
      OUT=$OUT/B2 timeout 340 scripts/gpu_check.sh build tests > /dev/null 2>&1
      suite_lines "$OUT/B2" ;;
  X) gpu; mkdir -p "$OUT"
     timeout 300 scripts/gpu_check.sh build bench_act bench_host > /tmp/nj_x.log 2>&1
     cat "$OUT/summary.tsv"; cat "$OUT/results.md" ;;
  MID) gpu; scripts/gpu_check.sh build > /tmp/nj_mid_build.log 2>&1 || { tail -30 /tmp/nj_mid_build.log; exit 1; }
     mkdir -p "$OUT/MID"
     bench/env_ab.sh "$OUT/MID/mid_backward.log" 2 "default NORMJIT_TIER_ITEMS=4 \
NORMJIT_TIER_ITEMS=4,NORMJIT_SPLIT=resident NORMJIT_TIER_ITEMS=4,NORMJIT_SPLIT=registers" --timer cupti \
       --layouts ncdhw --modes bwd --dtypes fp16,bf16 --shapes 2,128,32,32,32 1,128,32,32,32 ;;
  *) echo "usage: gpu_calls.sh MS|MT|MK|BWB|X|MID" >&2; exit 2 ;;
esac
