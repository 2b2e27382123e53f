#!/usr/bin/env bash
# Session 25's measurements (no kernel change; ~150 s), from main's tree:
# 1. PERF_NOTES 000: where the channels-last split's arrivals wait. Every CTA stamps its arrivals
#    (phase_clocks.py --every 1), and --summarize splits each wait into the peers' skew and the
#    round trip after the last peer was ready.
# 2. PERF_NOTES 000a: normjit's deep NCDHW forward beside torch.compile's Triton kernel, in one
#    Nsight Compute profile (bench/deep_peer_probe.py), and the Triton source Inductor generated.
#   OUT=... bash bench/results/2026-12-06-session25/probes.sh
set -u
OUT=${OUT:-./probes_out}; mkdir -p "$OUT"
timeout 90 python3 bench/phase_clocks.py --no-times --every 1 --layouts ndhwc \
  --shapes 2,128,32,32,32 2,256,16,16,16 2,64,64,64,64 > "$OUT/arrivals.log" 2>&1
python3 bench/phase_clocks.py --summarize "$OUT/arrivals.log" | tee "$OUT/arrivals_summary.txt"
TORCH_LOGS=output_code timeout 120 python3 bench/deep_peer_probe.py > "$OUT/inductor_code.log" 2>&1
grep -n "def triton\|num_warps\|XBLOCK\|R0_BLOCK\|RBLOCK\|grid=" "$OUT/inductor_code.log" | head -40
timeout 150 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section LaunchStats \
  --section Occupancy --section WarpStateStats --section SchedulerStats --section InstructionStats \
  python3 bench/deep_peer_probe.py > "$OUT/deep_peers_ncu.txt" 2>&1
grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Block Size|Grid Size|Achieved Occupancy|Executed Instructions  |Warp Cycles Per Issued|No Eligible|Stall" "$OUT/deep_peers_ncu.txt" | head -80
