#!/usr/bin/env bash
# Session 33's device calls. Set-up (here, on the CPU machine):
#   git archive main --prefix=.baseline/ | tar x        # main 09bf0e8: the kept split backward
# KC (~250 s, no suite): the kept split's chunk size and channel tile width, through the
#   measurement knobs NORMJIT_KEPT_CHUNK_TILES and NORMJIT_KEPT_ROW_BYTES (heuristics.cpp, unset =
#   main's plans), on the mid-stage shapes that run it, fp16 forward and backward. "new" is the
#   working tree with the knobs unset: a second baseline, so its ratio is the run's noise.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
OUT=${OUT:-./session33_out}
case "${1:-}" in
  KC) COMPARE_TREES="t1=.,NORMJIT_KEPT_CHUNK_TILES=1 t3=.,NORMJIT_KEPT_CHUNK_TILES=3 r64=.,NORMJIT_KEPT_ROW_BYTES=64 \
r32=.,NORMJIT_KEPT_ROW_BYTES=32" SKIP_SUITE=1 AB_TIMEOUT=${AB_TIMEOUT:-330} OUT=$OUT/KC \
        bench/ab_then_suite.sh .baseline --layouts ndhwc --modes fwd,bwd --dtypes fp16 --shapes 2,256,16,16,16 \
        2,256,14,14,14 4,320,12,12,12 1,96,16,16,16 3,72,20,21,22 2,128,32,32,32 ;;
  # KN (~450 s, the landing call): the kept split at 32-byte rows where its natural tiles leave
  #   SMs idle (nhwc_kept_split), against main 09bf0e8, then the GPU suite on the working tree.
  KN) SKIP_SUITE=0 AB_TIMEOUT=${AB_TIMEOUT:-150} SUITE_TIMEOUT=${SUITE_TIMEOUT:-330} OUT=$OUT/KN \
        bench/ab_then_suite.sh .baseline --layouts ndhwc --modes fwd,bwd --dtypes fp16 --shapes 1,96,16,16,16 \
        3,72,20,21,22 2,80,20,20,20 1,40,24,24,24 1,128,16,16,16 2,256,16,16,16 ;;
  # NCW (~470 s, the landing call, for session 34): the NCDHW backward's weight gradients in
  #   thread-block clusters (ncdhw_cluster_wgrad.patch: the tiers of one instance a CTA with 2-8
  #   samples, sm_90) against main, fp16 and bf16, then the GPU suite on it. Set-up:
  #     git archive main --prefix=.baseline/ | tar x
  #     git apply bench/results/2026-12-07-session33/ncdhw_cluster_wgrad.patch
  NCW) SKIP_SUITE=0 AB_TIMEOUT=${AB_TIMEOUT:-150} SUITE_TIMEOUT=${SUITE_TIMEOUT:-330} OUT=$OUT/NCW \
         bench/ab_then_suite.sh .baseline --layouts ncdhw --modes bwd --dtypes fp16,bf16 --shapes 2,256,16,16,16 \
         2,256,12,12,12 2,128,32,32,32 4,128,32,32,32 8,64,32,32,32 3,17,11,13,17 2,320,8,8,8 ;;
  *) echo "usage: gpu_calls.sh KC|KN|NCW" >&2; exit 2 ;;
esac
