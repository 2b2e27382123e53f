#!/usr/bin/env bash
# The test command (README): builds normjit and runs every test this machine can run.
#   C++: GoogleTest through CTest (GPU tests skip, saying so, where no GPU exists; they carry the
#   label gpu, the others cpu: `ctest -L gpu` runs the first alone).
#   Python: pytest over tests/python (skipped, saying so, where torch is not installed), and the
#   benchmarks' CPU-only tests in bench/ (tables, arguments, report, child-process plumbing).
# BUILD_DIR (default build) and JOBS (default: all cores) may be set.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
cmake --build "$BUILD_DIR" -j "$JOBS"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS"

if python3 -c "import torch" 2>/dev/null; then
  # The PyTorch binding is built and installed the way users install it.
  python3 -m pip install -q --no-build-isolation --no-deps .
  (cd tests/python && python3 -m pytest . -q -rs)
else
  echo "torch is not installed: the Python front-end tests are skipped (pip install torch, then rerun)."
  if python3 -c "import pytest" 2>/dev/null; then
    # Still collect them: every module skips itself cleanly without torch.
    set +e
    python3 -m pytest tests/python -q -rs
    rc=$?
    set -e
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then exit "$rc"; fi
  fi
fi

# The benchmarks' own tests need no GPU and no torch (the few that use torch return early).
if python3 -c "import pytest" 2>/dev/null; then
  python3 -m pytest bench -q
else
  python3 bench/test_benchlib.py
  python3 bench/test_bench_tools.py
fi
