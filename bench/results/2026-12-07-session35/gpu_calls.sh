#!/usr/bin/env bash
# Session 35's device calls (run from the repository root or anywhere; results under $OUT).
# L (~380 s, the landing call for session 34's no_materialized_grads.patch; `git apply` it first):
#   the GPU suite on exactly that code, then the peers' GPU time per call on the deep and mid
#   stages (README's peers table; normjit's activities are listed by name, so any fill kernel
#   shows), then normjit's forward+backward wall time on the same shapes.
# H (~480 s, the landing call for both the fill fix and the NCDHW streamed split's fill; `git
#   apply` session 34's patch and `git archive <main before the fill> --prefix=.baseline/ | tar x`
#   first): the A/B of the streamed backwards' kernel times against .baseline, then L.
# S (~450 s, the landing call for the streamed split's chunks by tile steps; .baseline as for H):
#   the A/B of every plan it changes (fp32 (2,32,128^3) and fp16 (1,64,64^3) backward, the odd
#   (1,3,101,103,107) both ways; the rest of each line is a control), then the GPU suite.
# R (~200 s, a measurement for the next session): the NCDHW backward's split modes on the big
#   shapes, by CUPTI, two rounds: the default against the resident split (at 256 and at 512
#   threads a CTA) and the streamed one (NORMJIT_SPLIT=l2), fp16 and fp32. Is
#   resident_backward_pays's rule (fitted on the H200 in session 4) still right on the H100?
# A (~480 s, for the next session: the landing call for aligned_chunks.patch). Set-up here:
#     git archive main --prefix=.baseline/ | tar x
#     git apply bench/results/2026-12-07-session35/aligned_chunks.patch
#   The A/B of NCDHW kernel times (CUPTI, two rounds) of main (base), the patch (new: chunks
#   rounded up to whole 128-byte lines), the patch with NORMJIT_CHUNK_ALIGN_BYTES=16 (the
#   balanced chunks of main, from the patched build: the knob's control), and the default
#   streamed split forced to 66 chunks (NORMJIT_STREAMED_CHUNKS; (2,32,80,192,160)'s backward on
#   132 CTAs instead of 100) with and without aligned chunks, on the resident and streamed splits,
#   then the GPU suite.
# M (~440 s): README's main table: scripts/gpu_check.sh's kernel, activation, host and U-Net
#   benchmarks (build first if needed).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
OUT=${OUT:-./session35_out}
SHAPES="2,320,4,4,4;2,320,8,8,8;2,320,5,12,10;2,256,12,12,12;2,256,16,16,16"
case "${1:-}" in
  L) OUT=$OUT/suite timeout 320 scripts/gpu_check.sh build tests > /dev/null 2>&1
     cat "$OUT/suite/summary.tsv"; grep -E "passed|failed|FAILED" "$OUT/suite/tests.log" | tail -5
     mkdir -p "$OUT/peers"
     timeout 110 python3 bench/bench_instance_norm.py --dtypes fp16 --layouts ncdhw,ndhwc --modes fwd,fwdbwd \
       --kernel-times --no-plot --out "$OUT/peers" --shapes "$SHAPES" > "$OUT/peers/peers.log" 2>&1
     grep -E "^\| 2,|^- " "$OUT/peers/results.md" | head -40
     timeout 25 python3 bench/bench_instance_norm.py --dtypes fp16 --peers normjit --modes fwdbwd \
       --no-plot --out "$OUT/wall" --shapes "$SHAPES" > "$OUT/wall.log" 2>&1
     grep -E "^\| 2," "$OUT/wall/results.md" ;;
  H) AB_TIMEOUT=140 SKIP_SUITE=1 OUT=$OUT bench/ab_then_suite.sh .baseline --layouts ncdhw --modes bwd \
       --dtypes fp16,fp32 --shapes 2,32,128,128,128 2,32,80,192,160
     OUT=$OUT bash "$0" L ;;
  S) AB_TIMEOUT=200 SUITE_TIMEOUT=330 OUT=$OUT bench/ab_then_suite.sh .baseline --layouts ncdhw \
       --modes fwd,bwd --dtypes fp16,fp32 --shapes 2,32,128,128,128 1,64,64,64,64 1,3,101,103,107 ;;
  R) scripts/gpu_check.sh build > /dev/null 2>&1 || { echo "build failed"; exit 1; }
     mkdir -p "$OUT/R"
     for round in 1 2; do
       for v in default NORMJIT_SPLIT=resident NORMJIT_SPLIT=resident,NORMJIT_RESIDENT_THREADS=512 NORMJIT_SPLIT=l2; do
         envs=(); [ $v != default ] && IFS=, read -ra envs <<< "$v"
         env "${envs[@]}" timeout 45 python3 bench/kernel_times.py --timer cupti --tag "$v" --layouts ncdhw \
           --modes bwd --dtypes fp16,fp32 --shapes 2,32,80,192,160 2,32,128,128,128 2,64,64,64,64 \
           > "$OUT/R/${v//[=,]/_}_$round.log" 2>&1
       done
     done
     python3 bench/kernel_times.py --table "$OUT"/R/default_*.log "$OUT"/R/NORMJIT_*.log | tee "$OUT/R/split_modes_table.md" ;;
  A) COMPARE_ENVS="NORMJIT_CHUNK_ALIGN_BYTES=16 NORMJIT_STREAMED_CHUNKS=66 NORMJIT_STREAMED_CHUNKS=66,NORMJIT_CHUNK_ALIGN_BYTES=16" \
     AB_TIMEOUT=240 SUITE_TIMEOUT=330 OUT=$OUT \
       bench/ab_then_suite.sh .baseline --layouts ncdhw --modes fwd,bwd --dtypes fp16,fp32 \
       --shapes 2,32,128,128,128 2,64,64,64,64 2,32,80,192,160 ;;
  M) mkdir -p "$OUT"; OUT=$OUT/main timeout 560 scripts/gpu_check.sh build bench_kernel bench_act bench_host bench_unet \
       > "$OUT/main.log" 2>&1; tail -c 9000 "$OUT/main.log" ;;
  *) echo "usage: gpu_calls.sh H|L|S|R|A|M" >&2; exit 2 ;;
esac
