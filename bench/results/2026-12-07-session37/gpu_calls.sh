#!/usr/bin/env bash
# Session 37's device calls (H100), rerunnable: OUT=... bash bench/results/2026-12-07-session37/gpu_calls.sh CP|N|Q|R|PS|H2|AT
# On main since a75fce4 (the forward's CTA of 512) and the L2 prefetch commit, the variables below
# give each variant: NORMJIT_RESIDENT_THREADS=256 main's earlier forward plans, NORMJIT_L2_PREFETCH=0
# the streamed backward without the prefetch (the kernel's branch not taken).
# CP (~470 s; ran on main d6f3777 + session 36's forward_cta_512.patch + the prefetch at 100 %
#   default): NCDHW forward kernel times, default against NORMJIT_RESIDENT_THREADS=256; the
#   streamed backwards at NORMJIT_L2_PREFETCH=0 and 100; two interleaved rounds each by CUPTI, the
#   clocks sampled every second; then the GPU suite (which passed on that tree).
# N (~110 s; ran after the suite on main + forward_cta_512.patch alone, which passed): Nsight
#   Compute's DRAM bytes, L2 hit rate and DRAM throughput of the fp32 streamed backwards.
# Q (~110 s): those backwards at 0, 25 and 100 %, two rounds; Nsight Compute at 100 %.
# R (~220 s; ran on the landed code, default 25 %): the GPU suite, then 25, 50 and 0 %, one round.
# PS (~150 s, prepared for the next session, measurement only, main's code): the prefetch between
#   12 and 37 % on the fp32 streamed backwards, and at 25 % on the other shapes that stream by
#   default (fp32 (1,32,128^3), (2,128,32^3); fp16 (1,64,64^3)) and on the fp16/bf16 backwards
#   forced to stream (NORMJIT_SPLIT=l2), two interleaved rounds.
# H2 (~200 s, prepared, measurement only; meant for an H200, where session 10 measured the
#   resident forward 4-7 % faster at 256): sessions 36-37's plans on this GPU. Forward and backward
#   kernel times, default against NORMJIT_RESIDENT_THREADS=256, on the shapes whose plans moved
#   (fp16/fp32), and the fp32 streamed backwards at NORMJIT_L2_PREFETCH=0 and 25; two rounds.
# AT (~150 s, prepared, measurement only): where the defaults lose to autotune's candidates on the
#   mid stages (the fp16 (2,128,32^3) NCDHW backward runs one CTA of 512 an instance, 256 CTAs on
#   132 SMs; 28-29 us in session 16, ~57 % of copy): kernel times with NORMJIT_AUTOTUNE=1 against the default, and each
#   search's candidate timings (NORMJIT_LOG=autotune, autotune.log).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
OUT=${OUT:-./session37_out}
SHAPES_F32="2,32,128,128,128 2,32,80,192,160 1,32,128,128,128 2,128,32,32,32"
NCU_METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,dram__throughput.avg.pct_of_peak_sustained_elapsed
suite() {
  OUT=$OUT/suite timeout 300 scripts/gpu_check.sh build tests > /dev/null 2>&1
  cat "$OUT/suite/summary.tsv"; grep -E "passed|failed|FAILED" "$OUT/suite/tests.log" | tail -4
}
backward_times() {  # $1: log, $2...: percentages
  local log=$1; shift
  for pct in "$@"; do
    NORMJIT_L2_PREFETCH=$pct timeout 40 python3 bench/kernel_times.py --timer cupti --tag "prefetch=$pct" \
      --layouts ncdhw --modes bwd --dtypes fp32 --shapes 2,32,128,128,128 2,32,80,192,160 >> "$log" 2>&1
  done
}
ncu_backward() {  # $1: percentage, $2: output
  NORMJIT_L2_PREFETCH=$1 NORMJIT_CACHE_DIR=/tmp/njc_ncu$1 timeout 120 ncu --clock-control none \
    -k regex:normjit_instance_norm_backward --metrics $NCU_METRICS python3 bench/ncu_probe.py --dtype fp32 \
    --layouts ncdhw --shapes 2,32,128,128,128 2,32,80,192,160 > "$2" 2>&1
  grep -E "normjit_instance|duration|bytes|hit_rate|throughput" "$2"
}
case "${1:-}" in
  CP) mkdir -p "$OUT/CP"
     bench/sample_clocks.sh "$OUT/CP/clocks.csv" &
     sampler=$!
     scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; kill $sampler; exit 1; }
     echo "A/B start $(date +%T)"
     for round in 1 2; do
       for v in default NORMJIT_RESIDENT_THREADS=256; do
         envs=(); [ $v != default ] && envs=($v)
         env "${envs[@]}" timeout 50 python3 bench/kernel_times.py --timer cupti --tag "$v" --layouts ncdhw \
           --modes fwd --dtypes fp16,fp32 --shapes 2,32,128,128,128 2,32,80,192,160 2,64,64,64,64 \
           2,8,80,192,160 2,32,112,112,112 2,64,48,160,160 >> "$OUT/CP/forward.log" 2>&1
       done
       for pct in 0 100; do
         NORMJIT_L2_PREFETCH=$pct timeout 50 python3 bench/kernel_times.py --timer cupti --tag "prefetch=$pct" \
           --layouts ncdhw --modes bwd --dtypes fp32 --shapes $SHAPES_F32 >> "$OUT/CP/prefetch.log" 2>&1
         NORMJIT_L2_PREFETCH=$pct timeout 30 python3 bench/kernel_times.py --timer cupti --tag "prefetch=$pct" \
           --layouts ncdhw --modes bwd --dtypes fp16 --shapes 1,64,64,64,64 >> "$OUT/CP/prefetch.log" 2>&1
       done
     done
     python3 bench/kernel_times.py --table "$OUT/CP/forward.log" | tee "$OUT/CP/forward_table.md"
     python3 bench/kernel_times.py --table "$OUT/CP/prefetch.log" | tee "$OUT/CP/prefetch_table.md"
     echo "suite start $(date +%T)"; suite
     kill $sampler
     awk -F', ' 'NR == 1 || NR % 20 == 2' "$OUT/CP/clocks.csv" ;;
  N) scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; exit 1; }
     suite; mkdir -p "$OUT/N"; ncu_backward 0 "$OUT/N/ncu_base.txt" ;;
  Q) scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; exit 1; }
     mkdir -p "$OUT/Q"; backward_times "$OUT/Q/q.log" 0 25 100; backward_times "$OUT/Q/q.log" 0 25 100
     python3 bench/kernel_times.py --table "$OUT/Q/q.log" | tee "$OUT/Q/q_table.md"
     ncu_backward 100 "$OUT/Q/ncu_pf100.txt" ;;
  R) suite; mkdir -p "$OUT/R"; backward_times "$OUT/R/r.log" 25 50 0
     python3 bench/kernel_times.py --table "$OUT/R/r.log" | tee "$OUT/R/r_table.md" ;;
  PS) scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; exit 1; }
     mkdir -p "$OUT/PS"
     for round in 1 2; do
       backward_times "$OUT/PS/sweep.log" 0 12 25 37
       for pct in 0 25; do
         NORMJIT_L2_PREFETCH=$pct timeout 40 python3 bench/kernel_times.py --timer cupti --tag "others prefetch=$pct" \
           --layouts ncdhw --modes bwd --dtypes fp32 --shapes 1,32,128,128,128 2,128,32,32,32 >> "$OUT/PS/others.log" 2>&1
         NORMJIT_L2_PREFETCH=$pct timeout 30 python3 bench/kernel_times.py --timer cupti --tag "others prefetch=$pct" \
           --layouts ncdhw --modes bwd --dtypes fp16 --shapes 1,64,64,64,64 >> "$OUT/PS/others.log" 2>&1
         NORMJIT_SPLIT=l2 NORMJIT_L2_PREFETCH=$pct timeout 40 python3 bench/kernel_times.py --timer cupti \
           --tag "l2 prefetch=$pct" --layouts ncdhw --modes bwd --dtypes fp16,bf16 \
           --shapes 2,32,128,128,128 2,32,80,192,160 >> "$OUT/PS/forced.log" 2>&1
       done
     done
     for f in sweep others forced; do python3 bench/kernel_times.py --table "$OUT/PS/$f.log" | tee "$OUT/PS/${f}_table.md"; done ;;
  H2) scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; exit 1; }
     mkdir -p "$OUT/H2"; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/H2/gpu.csv"
     for round in 1 2; do
       for v in default NORMJIT_RESIDENT_THREADS=256; do
         envs=(); [ $v != default ] && envs=($v)
         env "${envs[@]}" timeout 60 python3 bench/kernel_times.py --timer cupti --tag "$v" --layouts ncdhw \
           --modes fwd,bwd --dtypes fp16,fp32 --shapes 2,32,128,128,128 2,32,80,192,160 2,64,64,64,64 \
           2,32,112,112,112 2,64,48,160,160 >> "$OUT/H2/cta.log" 2>&1
       done
       backward_times "$OUT/H2/prefetch.log" 0 25
     done
     python3 bench/kernel_times.py --table "$OUT/H2/cta.log" | tee "$OUT/H2/cta_table.md"
     python3 bench/kernel_times.py --table "$OUT/H2/prefetch.log" | tee "$OUT/H2/prefetch_table.md" ;;
  AT) scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; exit 1; }
     mkdir -p "$OUT/AT"
     for v in default NORMJIT_AUTOTUNE=1; do
       envs=(NORMJIT_LOG=autotune); [ $v != default ] && envs+=($v)
       env "${envs[@]}" timeout 120 python3 bench/kernel_times.py --timer cupti --tag "$v" --layouts ncdhw,ndhwc \
         --modes fwd,bwd --dtypes fp16,fp32 --shapes 2,64,64,64,64 1,64,64,64,64 2,128,32,32,32 2,256,16,16,16 \
         >> "$OUT/AT/times.log" 2>> "$OUT/AT/autotune.log"
     done
     python3 bench/kernel_times.py --table "$OUT/AT/times.log" | tee "$OUT/AT/autotune_table.md"
     grep -c . "$OUT/AT/autotune.log" ;;
  *) echo "usage: gpu_calls.sh CP|N|Q|R|PS|H2|AT" >&2; exit 2 ;;
esac
