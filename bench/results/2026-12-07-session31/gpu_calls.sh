#!/usr/bin/env bash
# Session 31's device calls. Set-up, here, from main (see session 30's gpu_calls.sh for the others):
#   git archive main --prefix=.baseline/ | tar x
#   T=bench/results/2026-12-07-session30 U=bench/results/2026-12-07-session31
#   for v in stasync:$T/stasync_push nodiv:$U/no_divisions kw:$T/kept_whole c8:bench/results/2026-12-07-session29/cluster_split_items8; do
#     d=.variants/${v%%:*}; mkdir -p $d && git archive main | tar x -C $d && git apply --directory=$d ${v#*:}.patch; done
#   git apply $T/stasync_push.patch $U/no_divisions.patch   # the working tree, "new" below
# (C1 and C2 ran on main e09be60; no_divisions.patch has landed since, as e582215. KW is for main
# after it.)
# C1 (~560 s, the landing call): the st.async push (stasync), the division-free round loop and unit
#   split (nodiv) and both (new) against main on the deep shapes of both layouts and a streamed
#   control, fp16; then the GPU suite on this tree (both changes).
# C2 (~220 s, no suite): bf16 of the same deep kernels, and the mid-stage channels-last forward
#   candidates of session 30's B (c8, kw1, kw2, kw16) on (2,256,16^3) and its neighbours.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
OUT=${OUT:-./session31_out}
case "${1:-}" in
  # setup (here, on the CPU machine, from a clean main): .baseline, .variants/{kw,hs,st,stl} and the
  #   working tree = main + both heuristics patches, as KW and ST expect.
  setup)
    U=bench/results/2026-12-07-session31
    git diff --quiet || { echo "gpu_calls.sh setup: the working tree has changes; start from a clean main" >&2; exit 1; }
    rm -rf .baseline .variants
    git archive HEAD --prefix=.baseline/ | tar x
    for v in kw:kept_whole_default hs:half_sector_tiles st:stasync_push_on_e582215 stl:stasync_late_arm; do
      d=.variants/${v%%:*}
      mkdir -p "$d" && git archive HEAD | tar x -C "$d" && git apply --directory="$d" "$U/${v#*:}.patch" || exit 1
    done
    git apply "$U/kept_whole_default.patch" "$U/half_sector_tiles.patch" ;;
  C1) COMPARE_TREES="stasync=.variants/stasync nodiv=.variants/nodiv" SKIP_SUITE=0 AB_TIMEOUT=${AB_TIMEOUT:-220} \
        SUITE_TIMEOUT=${SUITE_TIMEOUT:-330} OUT=$OUT/C1 bench/ab_then_suite.sh .baseline --layouts ncdhw,ndhwc \
        --modes fwd,bwd --dtypes fp16 --shapes 2,320,8,8,8 2,320,4,4,4 8,320,4,4,4 4,256,8,8,8 2,128,32,32,32 ;;
  C2) COMPARE_TREES="stasync=.variants/stasync nodiv=.variants/nodiv" SKIP_SUITE=1 AB_TIMEOUT=${AB_TIMEOUT:-110} \
        OUT=$OUT/C2a bench/ab_then_suite.sh .baseline --layouts ncdhw,ndhwc --modes fwd,bwd --dtypes bf16 \
        --shapes 2,320,8,8,8 2,320,4,4,4 8,320,4,4,4
      COMPARE_TREES="c8=.variants/c8,NORMJIT_CLUSTER_SPLIT=1,NORMJIT_CLUSTER_SPLIT_ITEMS=8 kw1=.variants/kw,NORMJIT_KEPT_WHOLE=1 kw2=.variants/kw,NORMJIT_KEPT_WHOLE=2 kw16=.variants/kw,NORMJIT_KEPT_WHOLE=2,NORMJIT_NHWC_MIN_ROW_BYTES=16" \
        SKIP_SUITE=1 AB_TIMEOUT=${AB_TIMEOUT:-130} OUT=$OUT/C2b bench/ab_then_suite.sh .baseline --layouts ndhwc \
        --modes fwd --dtypes fp16 --shapes 2,256,16,16,16 1,320,12,12,12 3,200,9,10,11 2,128,32,32,32 ;;
  # KW (~400 s, the next landing call; here, from main): .baseline = main; .variants/kw = main +
  #   kept_whole_default.patch (the kept forward with one chunk a unit where a unit of 16-byte rows is
  #   at most 36 KB); .variants/hs = main + half_sector_tiles.patch (the deep tiers' tiles of one
  #   16-byte vector where no 32-byte-row tile holds a unit); the working tree = main + both ("new"):
  #   git archive main --prefix=.baseline/ | tar x
  #   for v in kw:kept_whole_default hs:half_sector_tiles; do d=.variants/${v%%:*}; mkdir -p $d &&
  #     git archive main | tar x -C $d && git apply --directory=$d bench/results/2026-12-07-session31/${v#*:}.patch; done
  #   git apply bench/results/2026-12-07-session31/kept_whole_default.patch bench/results/2026-12-07-session31/half_sector_tiles.patch
  # A/B (fp16, forward and backward) on the shapes each rule takes and two controls, then the suite on both.
  # Land each tree whose rows win and none lose by more than noise (update README's tier row).
  KW) COMPARE_TREES="kw=.variants/kw hs=.variants/hs" SKIP_SUITE=0 AB_TIMEOUT=${AB_TIMEOUT:-150} \
        SUITE_TIMEOUT=${SUITE_TIMEOUT:-330} OUT=$OUT/KW bench/ab_then_suite.sh .baseline --layouts ndhwc --modes fwd,bwd \
        --dtypes fp16 --shapes 2,256,12,12,12 1,320,12,12,12 3,200,11,12,13 2,320,5,12,10 3,200,9,10,11 \
        2,256,10,10,10 2,256,16,16,16 2,320,8,8,8 ;;
  # ST (~120 s, no suite): the st.async push (st, session 30's rebased) and the same with the inbox armed
  #   and the start announced behind the tile's loads (stl: first load back at instruction ~65 from
  #   ~86, nvdisasm sm_90) against .baseline = main on the cluster backwards, fp16 and bf16. Set-up:
  #   for v in st:stasync_push_on_e582215 stl:stasync_late_arm; do d=.variants/${v%%:*}; mkdir -p $d &&
  #     git archive main | tar x -C $d && git apply --directory=$d bench/results/2026-12-07-session31/${v#*:}.patch; done
  #   If stl wins every row, its suite: cd .variants/stl && OUT=$OUT/stl_suite scripts/gpu_check.sh build tests
  ST) COMPARE_TREES="st=.variants/st stl=.variants/stl" SKIP_SUITE=1 AB_TIMEOUT=${AB_TIMEOUT:-150} OUT=$OUT/ST \
        bench/ab_then_suite.sh .baseline --layouts ndhwc --modes bwd --dtypes fp16,bf16 --shapes 2,320,8,8,8 \
        2,320,4,4,4 8,320,4,4,4 4,256,8,8,8 3,200,5,7,11 ;;
  *) echo "usage: gpu_calls.sh setup|C1|C2|KW|ST" >&2; exit 2 ;;
esac
