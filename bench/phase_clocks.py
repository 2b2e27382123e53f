"""Where a resident-split step's time goes, on the GPU (kernels/phase_clock.cuh).

    python3 bench/phase_clocks.py --shapes 2,32,128,128,128 2,64,64,128,128

Compiles normjit's kernels with -DNJ_PHASE_CLOCKS=1 (added to NORMJIT_NVRTC_OPTIONS here, before
normjit loads: a disk-cache key of its own) and runs one forward and one backward (fp16, NCDHW,
affine) per shape, after a warm-up call. Thread 0 of every 33rd CTA prints, from the GPU, its
mean SM cycles per phase of a steady step:

    nj_phase backward chunks 342 grid 264 cta 0 steps 86 (counted 78): cycles a step 8318 = A 370 + ...

Then each kernel runs again in the default build (this process cannot switch builds, so a child
process runs bench/kernel_times.py) for its time in µs: cycles a step x steps against that time
gives the clock the cycles ran at. Shapes whose instances do not take the resident split print no
nj_phase lines (`normjit explain` says which split a shape takes).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402

PROBE_OPTION = "-DNJ_PHASE_CLOCKS=1"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["2,32,128,128,128", "2,64,64,128,128"], help="N,C,D,H,W")
    ap.add_argument("--no-times", action="store_true", help="skip the default build's kernel times")
    args = ap.parse_args(argv)
    try:
        args.shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes]
    except ValueError:
        ap.error(f"--shapes: expected N,C,D,H,W integers, got {args.shapes}")
    return args


def probe_env(environ) -> dict:
    """`environ` with the measurement build's option added to NORMJIT_NVRTC_OPTIONS."""
    env = dict(environ)
    env["NORMJIT_NVRTC_OPTIONS"] = (env.get("NORMJIT_NVRTC_OPTIONS", "") + " " + PROBE_OPTION).strip()
    return env


def default_env(environ) -> dict:
    """`environ` with the measurement build's option taken out again (the other options kept)."""
    env = dict(environ)
    options = [o for o in env.get("NORMJIT_NVRTC_OPTIONS", "").split() if o != PROBE_OPTION]
    if options:
        env["NORMJIT_NVRTC_OPTIONS"] = " ".join(options)
    else:
        env.pop("NORMJIT_NVRTC_OPTIONS", None)
    return env


def probe(shapes) -> int:
    os.environ.update(probe_env(os.environ))
    ready = bl.require_gpu_normjit("phase_clocks")
    if ready is None:
        return 2
    torch, _ = ready
    fwd = torch.ops.normjit.instance_norm_fwd.default
    bwd = torch.ops.normjit.instance_norm_bwd.default
    for shape in shapes:
        x = torch.randn(shape, device="cuda", dtype=torch.float16) * 2 + 3
        w = torch.rand(shape[1], device="cuda") + 0.5
        b = torch.randn(shape[1], device="cuda")
        dy = torch.randn_like(x)
        for label in ("warm-up", "measured"):
            print(f"phase_clocks: {','.join(map(str, shape))} fp16 ncdhw, {label} calls", flush=True)
            y, mean, rstd = fwd(x, w, b, None, None, None, True, 0.1, 1e-5, 0, 0.01)
            torch.cuda.synchronize()  # the GPU's printf lines come out here
            bwd(dy, x, w, b, None, mean, rstd, 0, 0.01, [True, True, False])
            torch.cuda.synchronize()
        del x, y, dy
        torch.cuda.empty_cache()
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    rc = probe(args.shapes)
    if rc or args.no_times:
        return rc
    return subprocess.call(times_command(args.shapes), env=default_env(os.environ))


def times_command(shapes) -> list:
    """The child that times the default build's kernels of `shapes`."""
    here = os.path.dirname(os.path.abspath(__file__))
    return [sys.executable, os.path.join(here, "kernel_times.py"), "--layouts", "ncdhw", "--dtypes", "fp16",
            "--tag", "default", "--shapes", *[",".join(map(str, s)) for s in shapes]]


if __name__ == "__main__":
    sys.exit(main())
