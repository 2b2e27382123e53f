#!/usr/bin/env bash
# Does a refactor of the kernel templates change any machine code? Compiles every config of the
# bounded set (`normjit warmup --all`) of a range of fusions with a base tree's command line and
# with this tree's, then compares the cubins kernel by kernel (bench/same_code.py). Needs NVRTC,
# not a GPU: a kernel change whose cubins are all identical behaves identically on the GPU.
#
# Usage: bench/same_code.sh BASE_TREE
#   BASE_TREE: a source tree, e.g. `git archive main --prefix=.baseline/ | tar x` then .baseline
#   (its command line is built in BASE_TREE/build-same-code; this tree's is build/normjit, or
#   $NORMJIT_CLI).
# Environment: ARCHS (default "90"; "90 80" doubles the time), SAME_CODE_QUICK=1 (fp16 only, 8
# fusions, 696 kernels: ~5 minutes on 2 cores; all 39 fusions take ~25).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BASE=${1:?usage: bench/same_code.sh BASE_TREE}
CLI=${NORMJIT_CLI:-build/normjit}
[ -x "$CLI" ] || { echo "same_code: $CLI not found; build first (cmake --build build)" >&2; exit 2; }
echo "same_code: building $BASE's command line"
if ! { cmake -S "$BASE" -B "$BASE/build-same-code" -DCMAKE_BUILD_TYPE=Release -DNORMJIT_BUILD_TESTS=OFF \
          -DNORMJIT_BUILD_BENCHMARKS=OFF &&
        cmake --build "$BASE/build-same-code" --target normjit_cli -j "$(nproc)"; } >"$BASE/build-same-code.log" 2>&1; then
  tail -30 "$BASE/build-same-code.log"
  exit 2
fi
BASE_CLI=$BASE/build-same-code/normjit
CACHE=$(mktemp -d)
trap 'rm -rf "$CACHE"' EXIT

fusions() {
  if [ "${SAME_CODE_QUICK:-0}" = 1 ]; then dtypes="f16"; epilogues="identity,leaky_relu_residual"
  else dtypes="f16 bf16 f32"; epilogues="identity,leaky_relu_residual,gelu_noaffine"; fi
  for layout in ncdhw ndhwc; do for dir in fwd bwd; do for dt in $dtypes; do
    for e in ${epilogues//,/ }; do
      case $e in
        identity) extra="" ;;
        leaky_relu_residual) extra="--activation leaky_relu --residual" ;;
        gelu_noaffine) extra="--activation gelu --no-affine" ;;
      esac
      echo "--layout $layout --direction $dir --dtype $dt $extra"
    done
  done; done; done
  if [ "${SAME_CODE_QUICK:-0}" != 1 ]; then
    echo "--direction fwd --running"
    echo "--direction fwd --eval --activation silu"
    echo "--layout ndhwc --direction fwd --eval --weight-dtype same --dtype bf16"
  fi
}

n=0
while read -r fusion; do
  for arch in ${ARCHS:-90}; do
    # shellcheck disable=SC2086 # the fusion's options are words
    NORMJIT_CACHE_DIR=$CACHE/base "$BASE_CLI" warmup --all --quiet --arch "$arch" $fusion >/dev/null
    # shellcheck disable=SC2086
    NORMJIT_CACHE_DIR=$CACHE/new "$CLI" warmup --all --quiet --arch "$arch" $fusion >/dev/null
  done
  n=$((n + 1))
  echo "same_code: $n fusions compiled ($fusion)"
done < <(fusions)
python3 bench/same_code.py "$CACHE/base" "$CACHE/new"
