#!/usr/bin/env bash
# Session 40's device calls, rerunnable: OUT=... bash bench/results/2026-12-07-session40/gpu_calls.sh A|CM|PO|MID|BWB|X|T
# Every call writes into a scratch folder and packs it into one $OUT/<call>.tgz at the end, so the
# device tool's limit on returned files never drops a log; the key lines also go to stdout.
# A (~480 s): the GPU suite on the tree sent (build, ctest's gpu label, pytest with its 15 slowest
#   tests), then MID and PO below on that build (A_SKIP_PO=1: without PO, ~380 s; A_SUITE_ONLY=1:
#   the suite alone, ~290 s). $OUT/A.tgz is
#   rewritten after each part, so a call cut short still returns what finished.
# MID (~100 s, measurement only): session 39's MID (the 32^3 stage's fp16/bf16 backward, a CTA of
#   512 an instance, against its split forms forced by NORMJIT_TIER_ITEMS=4).
# PO (~120 s, measurement only): does timing normjit right after the torch.compile peer slow it?
#   bench_instance_norm on the two host-bound README shapes, fp16 and bf16 NCDHW, with the compile
#   peer (fp16 only, as gpu_check's bench_kernel) and without it, twice each, interleaved.
# CM (~200 s; A's fallback where less device time is left): build, ctest's gpu label, then MID.
# BWB (~380 s): session 39's BWB (backward_within_grid.patch, its A/B, the suite on it).
# X (~120 s): README's activation and host-overhead tables (bench_act, bench_host).
# T (~220 s): README's results table alone (gpu_check's bench_kernel) on the GPU it gets; meant for
#   an H200, whose table (issue 3's targets are the H200's) was last run in sessions 8-9.
set -u
export GPU_CHECK_CTEST=gpu
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
FINAL_OUT=${OUT:-./session40_out}
mkdir -p "$FINAL_OUT"
gpu() { nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader; }
pack() { tar czf "$FINAL_OUT/$1.tgz" -C "$2" . ; }
suite_lines() { cat "$1/summary.tsv"; grep -E "passed|failed|FAILED" "$1/tests.log" | tail -4; }
mid() {  # $1: folder. Session 39's MID arguments, repeated: calling its case would reinstall (~34 s)
  mkdir -p "$1"
  timeout 150 bench/env_ab.sh "$1/mid_backward.log" 2 "default NORMJIT_TIER_ITEMS=4 \
NORMJIT_TIER_ITEMS=4,NORMJIT_SPLIT=resident NORMJIT_TIER_ITEMS=4,NORMJIT_SPLIT=registers" --timer cupti \
    --layouts ncdhw --modes bwd --dtypes fp16,bf16 --shapes 2,128,32,32,32 1,128,32,32,32
}
peer_order() {  # $1: folder
  local round peers tag
  for round in 1 2; do
    for peers in eager,compile,normjit eager,normjit; do
      tag=${peers//,/_}_r$round
      echo "== PO $tag $(date +%T)"
      timeout 90 python3 bench/bench_instance_norm.py --out "$1/$tag" --peers "$peers" \
        --shapes 2,128,32,32,32 2,64,64,64,64 --dtypes fp16,bf16 --compile-dtypes fp16 \
        --layouts ncdhw --no-plot --no-check 2>&1 | grep -E '^\[' || echo "PO $tag exited $?"
    done
  done
}
case "${1:-}" in
  A) gpu; S=$(mktemp -d)
     OUT=$S timeout 360 scripts/gpu_check.sh build tests > "$S/gpu_check.out" 2>&1
     suite_lines "$S"; grep -A17 "slowest 15" "$S/tests.log"; pack A "$S"
     [ "${A_SUITE_ONLY:-0}" = 1 ] && exit 0
     echo "MID start $(date +%T)"; mid "$S/MID"; pack A "$S"
     [ "${A_SKIP_PO:-0}" = 1 ] && exit 0
     echo "PO start $(date +%T)"; peer_order "$S/PO"; pack A "$S" ;;
  CM) gpu; S=$(mktemp -d)
     OUT=$S timeout 150 scripts/gpu_check.sh build ctest > "$S/gpu_check.out" 2>&1
     cat "$S/summary.tsv"; grep -E "tests passed|FAILED" "$S/tests.log" | tail -3; pack CM "$S"
     echo "MID start $(date +%T)"; mid "$S/MID"; pack CM "$S" ;;
  MID) gpu; S=$(mktemp -d)
     OUT=$S scripts/gpu_check.sh build > /dev/null 2>&1 || { tail -30 "$S/build.log"; exit 1; }
     mid "$S/MID"; pack MID "$S" ;;
  PO) gpu; S=$(mktemp -d)
     OUT=$S scripts/gpu_check.sh build > /dev/null 2>&1 || { tail -30 "$S/build.log"; exit 1; }
     peer_order "$S/PO"; pack PO "$S" ;;
  T) gpu; S=$(mktemp -d)
     OUT=$S timeout 420 scripts/gpu_check.sh build bench_kernel > "$S/gpu_check.out" 2>&1
     cat "$S/summary.tsv" "$S/results.md"; pack T "$S" ;;
  BWB|X) gpu; S=$(mktemp -d)
     OUT=$S bash bench/results/2026-12-07-session39/gpu_calls.sh "$1"
     pack "$1" "$S" ;;
  *) echo "usage: gpu_calls.sh A|CM|PO|MID|BWB|X|T" >&2; exit 2 ;;
esac
