#!/usr/bin/env bash
# Which kernels spill registers: every config of the bounded set (`normjit warmup --all`) of 72
# fusions (both layouts and directions; fp16, bf16, fp32; identity, leaky_relu, gelu; with and
# without a residual), compiled by NVRTC for sm_90 with ptxas's report, then the kernels that the
# nnU-Net ladder shapes select. Needs NVRTC, not a GPU; ~20 minutes on 2 cores.
#
# Usage: bench/spill_survey.sh [OUT_DIR]      (default: ./spill_survey; needs build/normjit)
# Writes OUT_DIR/all.txt (every kernel: stack, spill stores and loads in bytes a thread),
# OUT_DIR/spilling.txt (those that spill) and OUT_DIR/selected.txt (the spilling kernels the
# shapes of OUT_DIR/shapes.txt select, one line per kernel and shape).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${1:-spill_survey}
CLI=${NORMJIT_CLI:-build/normjit}
[ -x "$CLI" ] || { echo "spill_survey: $CLI not found; build first (cmake --build build)" >&2; exit 2; }
mkdir -p "$OUT"
CACHE=$(mktemp -d)
trap 'rm -rf "$CACHE"' EXIT

cat >"$OUT/shapes.txt" <<'EOF'
# nnU-Net ladders (128^3 and 80x192x160 patches, batch 2), batch 1 and 4, a 64^3 ladder
2x32x128x128x128
2x64x64x64x64
2x128x32x32x32
2x256x16x16x16
2x320x8x8x8
2x320x4x4x4
2x32x80x192x160
2x64x40x96x80
2x128x20x48x40
2x256x10x24x20
2x320x5x12x10
2x320x5x6x5
1x32x128x128x128
4x32x96x96x96
2x32x64x64x64
2x64x32x32x32
2x128x16x16x16
2x256x8x8x8
EOF

fusions() {
  for layout in ncdhw ndhwc; do for dir in fwd bwd; do for dt in f16 bf16 f32; do
    for act in identity leaky_relu gelu; do for res in "" --residual; do
      echo "--layout $layout --direction $dir --dtype $dt --activation $act $res"
    done; done
  done; done; done
}

: >"$OUT/all.txt"
: >"$OUT/picked.txt"
while read -r fusion; do
  # shellcheck disable=SC2086 # the fusion's options are words
  NORMJIT_CACHE_DIR=$CACHE NORMJIT_NVRTC_OPTIONS=--ptxas-options=-v "$CLI" warmup --all --quiet $fusion 2>&1 |
    awk '/NVRTC log of/ {name = $5; sub(":", "", name)}
         /spill stores/ {print name, "stack", $3, "spill_stores", $7, "spill_loads", $11}' >>"$OUT/all.txt"
  # shellcheck disable=SC2086
  "$CLI" explain $fusion --shapes-file "$OUT/shapes.txt" |
    awk -v d="$(echo "$fusion" | awk '{print $4}')" '$2 == d {print $3, $1}' >>"$OUT/picked.txt"
done < <(fusions)

awk '$5 > 0' "$OUT/all.txt" | sort >"$OUT/spilling.txt"
sort -u "$OUT/picked.txt" | join - <(awk '{print $1, $5}' "$OUT/spilling.txt") |
  awk '{print $1, $2, "spill_stores", $3}' >"$OUT/selected.txt"
rm "$OUT/picked.txt"
echo "kernels compiled: $(wc -l <"$OUT/all.txt"), spilling: $(wc -l <"$OUT/spilling.txt"), spilling" \
  "kernels the shapes select: $(cut -d' ' -f1 "$OUT/selected.txt" | sort -u | wc -l)"
