#!/usr/bin/env bash
# Session 41's device calls, rerunnable: OUT=... bash bench/results/2026-12-08-session41/gpu_calls.sh OW|OW2|A
# Ran: OW (H100, 359 s, on bcef5e6; the patch landed as 9232079, so OW reruns on bcef5e6 only).
# OW (~420 s): shared_dy.patch (the NCDHW backward's register tier that keeps dy in shared memory:
#   a CTA of 256 x 16 vectors, two an SM, where the CTA of 512 x 8 vectors takes more than one
#   wave) applied to the tree sent; its A/B against NORMJIT_SHARED_DY=0 (the CTA of 512, as on
#   main) on every shape where it applies in the nnU-Net ladder and four others, fp16 and bf16,
#   backward kernel by CUPTI, two interleaved rounds; then the GPU suite on that tree (ctest's gpu
#   label, pytest). Land the patch only if it wins and its suite passes. OW_SHAPES="..." replaces
#   the A/B's shapes (fewer where less device time is left).
# OW2 (~420 s): the same for shared_dy8.patch, on main after OW landed (7441e94): the tier one size
#   down, a CTA of 256 x 8 vectors with 32 KB of dy, where the CTA of 512 x 4 (one an SM in the
#   backward) takes more waves: (2,128,24^3) fp16 and the like (1025-2048 vectors an instance).
#   NORMJIT_SHARED_DY=0 turns both tiers off, so it is the baseline for these shapes too.
# A: session 40's A (the suite on the tree sent, then MID and PO; A_SKIP_PO=1, A_SUITE_ONLY=1).
# Everything goes into one $OUT/<call>.tgz, repacked after each part; key lines to stdout.
set -u
export GPU_CHECK_CTEST=gpu
HERE=bench/results/2026-12-08-session41
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
FINAL_OUT=${OUT:-./session41_out}
mkdir -p "$FINAL_OUT"
gpu() { nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader; }
pack() { tar czf "$FINAL_OUT/$1.tgz" -C "$2" . ; }
case "${1:-}" in
  OW|OW2) gpu; S=$(mktemp -d)
      if [ "$1" = OW ]; then patch_file=shared_dy.patch
        shapes="2,128,32,32,32 4,128,32,32,32 2,80,28,28,28 3,47,24,29,31 1,140,16,32,40"
      else patch_file=shared_dy8.patch
        shapes="2,128,24,24,24 2,70,16,16,40 2,256,16,24,32 1,160,20,20,24 1,128,24,24,24"
      fi
      git apply "$HERE/$patch_file" || { echo "patch failed"; exit 1; }
      OUT=$S scripts/gpu_check.sh build > "$S/build.out" 2>&1 || { tail -30 "$S/build.log"; pack "$1" "$S"; exit 1; }
      echo "AB start $(date +%T)"
      NORMJIT_AB_TIMEOUT=90 timeout 200 bench/env_ab.sh "$S/shared_dy.log" 2 "default NORMJIT_SHARED_DY=0" \
        --timer cupti --layouts ncdhw --modes bwd --dtypes fp16,bf16 --shapes ${OW_SHAPES:-$shapes}
      pack "$1" "$S"
      echo "suite start $(date +%T)"
      mkdir -p "$S/suite"
      OUT=$S/suite timeout 330 scripts/gpu_check.sh tests > "$S/suite.out" 2>&1
      cat "$S/suite/summary.tsv"; grep -E "passed|failed|FAILED" "$S/suite/tests.log" | tail -6
      grep -A17 "slowest 15" "$S/suite/tests.log"
      pack "$1" "$S" ;;
  A) bash bench/results/2026-12-07-session40/gpu_calls.sh A ;;
  *) echo "usage: gpu_calls.sh OW|OW2|A" >&2; exit 2 ;;
esac
