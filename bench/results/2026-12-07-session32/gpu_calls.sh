#!/usr/bin/env bash
# Session 32's device calls. Set-up (here, on the CPU machine, from a clean main 2e76e70):
#   bash bench/results/2026-12-07-session31/gpu_calls.sh setup       # .baseline, .variants/{kw,hs,st,stl},
#                                                                    # working tree = main + kw + hs
#   d=.variants/kwhs; mkdir -p $d && git archive HEAD | tar x -C $d && git diff | git apply --directory=$d
#   git apply bench/results/2026-12-07-session32/kept_whole_backward.patch   # the working tree, "new"
# KWB (~550 s, the landing call): A/B of the kept whole forward (kw), the half-sector deep tiles
#   (hs), both (kwhs) and both with the kept whole backward (new: x and dy kept in shared memory,
#   one CTA a unit, weight gradients in clusters) against main, fp16, forward and backward; then
#   the GPU suite on the working tree (all three).
# ST (~120 s, no suite): session 31's st.async push (st) and its late-armed inbox (stl) against main.
#   .variants/uc = main + session 31's ncdhw_unit_count.patch, for UC.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
OUT=${OUT:-./session32_out}
case "${1:-}" in
  KWB) COMPARE_TREES="kw=.variants/kw hs=.variants/hs kwhs=.variants/kwhs" SKIP_SUITE=0 AB_TIMEOUT=${AB_TIMEOUT:-230} \
         SUITE_TIMEOUT=${SUITE_TIMEOUT:-330} OUT=$OUT/KWB bench/ab_then_suite.sh .baseline --layouts ndhwc \
         --modes fwd,bwd --dtypes fp16 --shapes 2,256,12,12,12 1,320,12,12,12 3,200,11,12,13 2,320,5,12,10 \
         3,200,9,10,11 2,256,13,13,13 2,256,16,16,16 2,320,8,8,8 ;;
  ST) COMPARE_TREES="st=.variants/st stl=.variants/stl" SKIP_SUITE=1 AB_TIMEOUT=${AB_TIMEOUT:-150} OUT=$OUT/ST \
        bench/ab_then_suite.sh .baseline --layouts ndhwc --modes bwd --dtypes fp16,bf16 --shapes 2,320,8,8,8 \
        2,320,4,4,4 8,320,4,4,4 4,256,8,8,8 3,200,5,7,11 ;;
  # KWB2 (~450 s): KWB without the single-patch trees, where the device time left is short.
  KWB2) COMPARE_TREES="kwhs=.variants/kwhs" SKIP_SUITE=0 AB_TIMEOUT=${AB_TIMEOUT:-150} \
          SUITE_TIMEOUT=${SUITE_TIMEOUT:-330} OUT=$OUT/KWB2 bench/ab_then_suite.sh .baseline --layouts ndhwc \
          --modes fwd,bwd --dtypes fp16 --shapes 2,256,12,12,12 1,320,12,12,12 3,200,11,12,13 2,320,5,12,10 \
          3,200,9,10,11 2,256,13,13,13 2,256,16,16,16 2,320,8,8,8 ;;
  # UC (~120 s, no suite): session 31's ncdhw_unit_count.patch (.variants/uc: one helper for the NCDHW
  #   units' product; ptxas shares it, the deep forward's first load moves from instruction 77 to 65).
  UC) COMPARE_TREES="uc=.variants/uc" SKIP_SUITE=1 AB_TIMEOUT=${AB_TIMEOUT:-150} OUT=$OUT/UC \
        bench/ab_then_suite.sh .baseline --layouts ncdhw --modes fwd,bwd --dtypes fp16 --shapes 2,320,8,8,8 \
        2,320,4,4,4 8,320,4,4,4 2,128,32,32,32 ;;
  # KSB (~450 s, for session 33, from main f4f510a or later): the kept split backward
  #   (kept_split_backward.patch: nhwc_kept_split for the backward too, x and dy in the slots with the
  #   exchange; (2,256,16^3) fp16 16 chunks of 2 tiles) against main, then the suite on it. Set-up:
  #   git archive HEAD --prefix=.baseline/ | tar x
  #   git apply bench/results/2026-12-07-session32/kept_split_backward.patch
  KSB) SKIP_SUITE=0 AB_TIMEOUT=${AB_TIMEOUT:-130} SUITE_TIMEOUT=${SUITE_TIMEOUT:-330} OUT=$OUT/KSB \
         bench/ab_then_suite.sh .baseline --layouts ndhwc --modes bwd --dtypes fp16 --shapes 2,256,16,16,16 \
         2,256,14,14,14 4,320,12,12,12 1,96,16,16,16 3,72,20,21,22 2,128,32,32,32 ;;
  *) echo "usage: gpu_calls.sh KWB|KWB2|ST|UC|KSB" >&2; exit 2 ;;
esac
