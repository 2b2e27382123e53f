#!/usr/bin/env bash
# Session 34's device calls (run from anywhere; results under $OUT).
# NCW: session 33's `gpu_calls.sh NCW` (the NCDHW cluster weight-gradient backward, A/B then the
#   suite), with kept_width_candidates.patch applied too so that one suite covers both. Set-up:
#     git archive main --prefix=.baseline/ | tar x
#     git apply bench/results/2026-12-07-session33/ncdhw_cluster_wgrad.patch
#     git apply bench/results/2026-12-07-session33/kept_width_candidates.patch
# P (~100 s): the peers' GPU time per call on the mid and deep stages (README's peers table), then
#   Nsight Compute on one forward+backward of each peer (bench/deep_peer_probe.py --backward); ran
#   as two calls in session 34 (peers_kernel_times.md; ncu_fwd_bwd_peers.csv, on 2,320,8,8,8 and
#   2,256,12,12,12), which found autograd's two zero-fill kernels in every normjit backward.
# G (~330 s, the landing call for no_materialized_grads.patch; `git apply` it first): the GPU
#   suite, then normjit's forward+backward GPU time (--kernel-times: all its GPU work, so the fills
#   show) and wall time on the deep and mid stages. Before: peers_kernel_times.md (normjit's
#   "(4)" activities: forward, fill, fill, backward).
# T (~150 s): G without the full suite: the Python GPU op tests (test_ops_gpu.py) and the timings.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
OUT=${OUT:-./session34_out}
case "${1:-}" in
  NCW) OUT=$OUT bash bench/results/2026-12-07-session33/gpu_calls.sh NCW ;;
  P) mkdir -p "$OUT/P"
     scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; exit 1; }
     timeout 200 python3 bench/bench_instance_norm.py --dtypes fp16 --layouts ncdhw,ndhwc --modes fwd,fwdbwd \
       --kernel-times --no-plot --out "$OUT/P" --shapes "2,320,4,4,4;2,320,8,8,8;2,256,12,12,12;2,256,16,16,16" \
       > "$OUT/P/peers.log" 2>&1
     grep -E "^\| 2," "$OUT/P"/*.md | cut -d'|' -f2-9
     timeout 150 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section LaunchStats \
       --section Occupancy --section WarpStateStats --section InstructionStats --csv --page details \
       python3 bench/deep_peer_probe.py --backward --shapes 2,256,16,16,16 2,256,12,12,12 > "$OUT/P/ncu_bwd.csv" 2> "$OUT/P/ncu.err"
     python3 - "$OUT/P/ncu_bwd.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; idx = {h: i for i, h in enumerate(hdr)}
want = ("Duration", "Executed Instructions", "Registers Per Thread", "Grid Size", "Block Size",
        "Achieved Occupancy", "Memory Throughput", "Warp Cycles Per Issued Instruction")
seen = {}
for r in rows[1:]:
    k = (r[idx["ID"]], r[idx["Kernel Name"]][:60])
    if r[idx["Metric Name"]] in want:
        seen.setdefault(k, {})[r[idx["Metric Name"]]] = r[idx["Metric Value"]] + " " + r[idx["Metric Unit"]]
for (i, name), m in seen.items():
    print(i, name, " | ".join(f"{w.split()[0]}={m.get(w, '-')}" for w in want))
PY
     ;;
  G|T) if [ "$1" = G ]; then
         OUT=$OUT/suite timeout 330 scripts/gpu_check.sh build tests > /dev/null 2>&1
         cat "$OUT/suite/summary.tsv"; grep -E "passed|failed|FAILED" "$OUT/suite/tests.log" | tail -5
       else
         scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; exit 1; }
         timeout 120 python3 -m pytest tests/python/test_ops_gpu.py -q -rs 2>&1 | tail -5
       fi
       for m in kernel_times wall; do
         a=(); [ $m = kernel_times ] && a=(--kernel-times)
         timeout 40 python3 bench/bench_instance_norm.py --dtypes fp16 --peers normjit --modes fwdbwd "${a[@]}" \
           --no-plot --out "$OUT/$m" --shapes "2,320,4,4,4;2,320,8,8,8;2,256,12,12,12;2,256,16,16,16" > "$OUT/$m.log" 2>&1
         grep -E "^\| 2," "$OUT/$m/results.md"
       done ;;
  *) echo "usage: gpu_calls.sh NCW|P|G|T" >&2; exit 2 ;;
esac
