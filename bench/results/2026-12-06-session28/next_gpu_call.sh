#!/usr/bin/env bash
# The next GPU session's calls, in order (session 28 got no machine: every start was refused).
# Set-up, here, from main (the working tree gets session 27's two deep patches, so the suite of
# call 1 runs on them; .variants gets the channels-last experiments of calls 2 and 3):
#   git archive main --prefix=.baseline/ | tar x
#   S=bench/results/2026-12-06-session27; git apply $S/early_push.patch $S/ncdhw_whole_tiers.patch
#   R=bench/results/2026-12-06-session28
#   for v in tagged:tagged_nhwc_on_bb24f1e coef:dx_coefs cluster:cluster_split; do d=.variants/${v%%:*}; mkdir -p $d && \
#     git archive main | tar x -C $d && git apply --directory=$d $R/${v#*:}.patch; done
# Call 1 (<= 560 s): OUT=$OUT bash bench/results/2026-12-06-session28/next_gpu_call.sh 1
#   the deep patches' A/B (fp16, bf16; both layouts) and the whole suite: land each patch whose
#   rows win (the NCDHW rows are ncdhw_whole_tiers', the NDHWC backward rows early_push's).
# Call 2 (~250 s): OUT=$OUT bash bench/results/2026-12-06-session28/next_gpu_call.sh 2
#   the tagged exchange and the dx factors against main on the channels-last splits.
# Call 3 (~200 s):
#   OUT=$OUT bash bench/results/2026-12-06-session28/next_gpu_call.sh 3
#   the cluster split prototype (PERF_NOTES 000c) against main on the mid-stage forwards.
# Chain the calls (the machine is released after 30 s idle); give_back after the last.
set -u
here=$(dirname "${BASH_SOURCE[0]}")
case "${1:-}" in
  1) exec bash "$here/land_deep_patches.sh" ;;
  2) exec bash "$here/streamed_ab.sh" ;;
  3) exec bash "$here/cluster_split_ab.sh" ;;
  *) echo "usage: next_gpu_call.sh 1|2|3" >&2; exit 2 ;;
esac
