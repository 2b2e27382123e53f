#!/usr/bin/env bash
# Session 30's device calls (no suite in A or B; a tree that wins needs its own suite run,
# OUT=$OUT/suite scripts/gpu_check.sh build tests, ~255 s, on main + its patch before it lands).
# Set-up, here, from main:
#   git archive main --prefix=.baseline/ | tar x
#   R=bench/results/2026-12-06-session28 S=bench/results/2026-12-07-session29 T=bench/results/2026-12-07-session30
#   for v in tagged:$R/tagged_nhwc_on_bb24f1e coef:$R/dx_coefs c8:$S/cluster_split_items8 stasync:$T/stasync_push kw:$T/kept_whole; do
#     d=.variants/${v%%:*}; mkdir -p $d && git archive main | tar x -C $d && git apply --directory=$d ${v#*:}.patch; done
# A (~150 s): the channels-last A/B of fp16 kernels against main: session 28's tagged exchange and
#   dx_coefs on the streamed shapes, and the st.async weight-gradient push (stasync) on the
#   deep cluster backwards (every other row is its noise control).
# B (~120 s): the mid-stage channels-last training forwards, fp16 and bf16, against main's kept
#   split (16 chunks and two exchanges for (2,256,16^3)): session 29's cluster split with 8
#   vectors a thread (c8) and with 4 (c4); and kept_whole.patch, one CTA a unit holding it all in
#   shared memory, no exchange (kw1: the widest tile that fits; kw2: the narrowest with 32-byte
#   rows; kw16: the narrowest with 16-byte rows).
# L (~320 s, the short landing call): this working tree (main + stasync_push.patch applied) against
#   .baseline on the deep cluster backwards, fp16 and bf16, then the GPU suite on this tree.
# X (~180 s, no suite: what to land next): this working tree (stasync) and the mid-stage forward
#   candidates (c8, kw1, kw2, kw16) against .baseline in one A/B, fp16, forward and backward.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
OUT=${OUT:-./session30_out}
case "${1:-}" in
  A) COMPARE_TREES="tagged=.variants/tagged coef=.variants/coef stasync=.variants/stasync" SKIP_SUITE=1 \
       AB_TIMEOUT=${AB_TIMEOUT:-280} OUT=$OUT/A bench/ab_then_suite.sh .baseline --layouts ndhwc --modes fwd,bwd \
       --dtypes fp16 --shapes 2,128,32,32,32 2,256,16,16,16 2,64,64,64,64 2,32,128,128,128 2,320,8,8,8 \
       2,320,4,4,4 8,320,4,4,4 ;;
  B) COMPARE_TREES="c8=.variants/c8,NORMJIT_CLUSTER_SPLIT=1,NORMJIT_CLUSTER_SPLIT_ITEMS=8 c4=.variants/c8,NORMJIT_CLUSTER_SPLIT=1 kw1=.variants/kw,NORMJIT_KEPT_WHOLE=1 kw2=.variants/kw,NORMJIT_KEPT_WHOLE=2 kw16=.variants/kw,NORMJIT_KEPT_WHOLE=2,NORMJIT_NHWC_MIN_ROW_BYTES=16" \
       SKIP_SUITE=1 AB_TIMEOUT=${AB_TIMEOUT:-240} OUT=$OUT/B bench/ab_then_suite.sh .baseline --layouts ndhwc \
       --modes fwd --dtypes fp16,bf16 --shapes 2,256,16,16,16 1,256,16,16,16 4,128,16,16,16 1,320,12,12,12 3,200,9,10,11 ;;
  L) SKIP_SUITE=0 AB_TIMEOUT=${AB_TIMEOUT:-120} SUITE_TIMEOUT=${SUITE_TIMEOUT:-330} OUT=$OUT/L \
       bench/ab_then_suite.sh .baseline --layouts ndhwc --modes bwd --dtypes fp16,bf16 \
       --shapes 2,320,8,8,8 2,320,4,4,4 8,320,4,4,4 4,256,8,8,8 ;;
  X) COMPARE_TREES="c8=.variants/c8,NORMJIT_CLUSTER_SPLIT=1,NORMJIT_CLUSTER_SPLIT_ITEMS=8 kw1=.variants/kw,NORMJIT_KEPT_WHOLE=1 kw2=.variants/kw,NORMJIT_KEPT_WHOLE=2 kw16=.variants/kw,NORMJIT_KEPT_WHOLE=2,NORMJIT_NHWC_MIN_ROW_BYTES=16" \
       SKIP_SUITE=1 AB_TIMEOUT=${AB_TIMEOUT:-280} OUT=$OUT/X bench/ab_then_suite.sh .baseline --layouts ndhwc \
       --modes fwd,bwd --dtypes fp16 --shapes 2,256,16,16,16 1,320,12,12,12 3,200,9,10,11 2,320,8,8,8 2,320,4,4,4 \
       8,320,4,4,4 ;;
  *) echo "usage: gpu_calls.sh A|B|L|X" >&2; exit 2 ;;
esac
