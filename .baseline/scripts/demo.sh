#!/usr/bin/env bash
# The main job (README): build normjit and run `normjit demo` on the default nnU-Net shapes.
# With a GPU it runs and checks the kernels; without one it says so and still explains, compiles
# and caches them.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DNORMJIT_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target normjit_cli
exec "$BUILD_DIR/normjit" demo "$@"
