#!/usr/bin/env bash
# The next GPU session's calls (no suite in either; a tree that wins needs its own suite run,
# scripts/gpu_check.sh build tests, ~330 s, on main + its patch before it lands).
# Set-up, here, from main (all three patches pass `git apply --check` against main 684f4df):
#   git archive main --prefix=.baseline/ | tar x
#   R=bench/results/2026-12-06-session28
#   for v in tagged:$R/tagged_nhwc_on_bb24f1e coef:$R/dx_coefs c8:bench/results/2026-12-07-session29/cluster_split_items8; do
#     d=.variants/${v%%:*}; mkdir -p $d && git archive main | tar x -C $d && git apply --directory=$d ${v#*:}.patch; done
# Call 1 (~250 s): OUT=$OUT bash bench/results/2026-12-07-session29/next_gpu_call.sh 1
#   session 28's call 2: the tagged channels-last exchange and the backward's dx as three
#   per-channel factors against main on the channels-last splits, fp16.
# Call 2 (~200 s): OUT=$OUT bash bench/results/2026-12-07-session29/next_gpu_call.sh 2
#   the cluster split with 8 vectors a thread (64-byte rows) and with 4, against main.
# Chain them (the machine goes back after 30 s idle); remove .baseline and .variants afterwards.
set -u
here=$(dirname "${BASH_SOURCE[0]}")
case "${1:-}" in
  1) exec bash "$here/../2026-12-06-session28/streamed_ab.sh" ;;
  2) exec bash "$here/cluster_split_items8_ab.sh" ;;
  *) echo "usage: next_gpu_call.sh 1|2" >&2; exit 2 ;;
esac
