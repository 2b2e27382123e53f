#!/usr/bin/env bash
# Nsight Compute's full set with the SASS source view, for normjit's kernels on a few shapes:
# where each kernel's warps stall, instruction by instruction. Run on the GPU machine after
# `scripts/gpu_check.sh install`:
#
#   OUT=/tmp/prof bench/ncu_source.sh --shapes 2,320,8,8,8 --layouts ncdhw,ndhwc
#
# Arguments go to bench/ncu_probe.py (one forward and one backward per shape and layout). Writes
# $OUT/ncu.ncu-rep (open it in Nsight Compute), $OUT/details.txt (speed of light, occupancy,
# warp state statistics per kernel) and $OUT/source.csv (per-SASS-instruction samples and stall
# reasons; bench/ncu_stalls.py summarizes it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-./ncu_out}
mkdir -p "$OUT"
# -lineinfo ties each SASS instruction to its line of the embedded kernel template (kernels/*.cuh),
# which --import-source needs; it is part of the disk-cache key, so these kernels compile afresh.
export NORMJIT_NVRTC_OPTIONS="${NORMJIT_NVRTC_OPTIONS:-} -lineinfo"
ncu --clock-control none --set full --import-source yes -k regex:normjit -f -o "$OUT/ncu" \
  python3 bench/ncu_probe.py "$@" > "$OUT/probe.log" 2>&1 || { tail -20 "$OUT/probe.log"; exit 1; }
ncu -i "$OUT/ncu.ncu-rep" --page details \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  > "$OUT/details.txt"
ncu -i "$OUT/ncu.ncu-rep" --page source --print-source sass --csv > "$OUT/source.csv"
grep -E "normjit_|Duration|Elapsed Cycles|Registers|Achieved Occupancy|Warp Cycles Per Issued" "$OUT/details.txt"
