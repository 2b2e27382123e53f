"""Times normjit's forward and backward kernels separately, one configuration per line.

    python3 bench/kernel_times.py --layouts ncdhw --modes bwd --dtypes fp16,bf16 \
        --shapes 2,32,128,128,128 2,64,64,64,64
    NORMJIT_RESIDENT_THREADS=512 python3 bench/kernel_times.py ...    # the same, another choice

Calls the registered ops (torch.ops.normjit.instance_norm_fwd / _bwd) directly, so a backward is
timed without the forward or the autograd engine: medians of triton.testing.do_bench, L2 flushed
before every repetition. Meant for A/B runs of a heuristic or a kernel, one process per setting of
the measurement variables (NORMJIT_RESIDENT_THREADS, NORMJIT_NHWC_BWD_ITEMS, NORMJIT_SPLIT, ...:
they are read once per process). Every configuration is first checked against float64 torch; near
an activation's kink (|pre-activation| < 1e-3) a low-precision input can land on the other side,
so those elements are left out of the gradient check and counted. bench_instance_norm.py is the
benchmark with peers; this is the microscope.
"""
from __future__ import annotations

import argparse
import sys

DTYPES = ("fp16", "bf16", "fp32")
LAYOUTS = ("ncdhw", "ndhwc")
MODES = ("fwd", "bwd")
KINK = 1e-3


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["2,32,128,128,128", "2,64,64,64,64"],
                    help="N,C,D,H,W shapes")
    ap.add_argument("--dtypes", default="fp16", help="comma list of " + ",".join(DTYPES))
    ap.add_argument("--layouts", default="ncdhw,ndhwc", help="comma list of " + ",".join(LAYOUTS))
    ap.add_argument("--modes", default="fwd,bwd", help="comma list of " + ",".join(MODES))
    ap.add_argument("--activation", default=None, help="none, relu, leaky_relu, gelu, ... (normjit's names)")
    ap.add_argument("--residual", action="store_true", help="add a residual before the activation")
    ap.add_argument("--tag", default="", help="a label printed on every line (the setting under test)")
    ap.add_argument("--no-check", action="store_true", help="skip the float64 check")
    args = ap.parse_args(argv)
    for name, allowed in (("dtypes", DTYPES), ("layouts", LAYOUTS), ("modes", MODES)):
        values = getattr(args, name).split(",")
        bad = [v for v in values if v not in allowed]
        if bad:
            ap.error(f"--{name}: unknown {bad}; expected a comma list of {', '.join(allowed)}")
        setattr(args, name, values)
    try:
        args.shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes]
    except ValueError:
        ap.error(f"--shapes: expected N,C,D,H,W integers, got {args.shapes}")
    if args.activation == "none":
        args.activation = None
    return args


def relative_error(got, want, skip=None):
    """max |got - want| / max |want| over the elements not in `skip` (a bool mask or None)."""
    diff = (got.double() - want).abs()
    if skip is not None:
        diff[skip] = 0
    return diff.max().item() / max(want.abs().max().item(), 1e-30)


def check(torch, F, x, w, b, r, dy, act, slope, outputs):
    """Forward and backward outputs against float64 torch: (y error, dx/dres error, dw error, kinks)."""
    from normjit.functional import apply_activation

    y, dx, dw, dres = outputs
    xd = x.double().requires_grad_(True)
    wd = w.double().requires_grad_(True)
    bd = b.double().requires_grad_(True)
    rd = r.double().requires_grad_(True) if r is not None else None
    z = F.instance_norm(xd, weight=wd, bias=bd)
    if rd is not None:
        z = z + rd
    out = apply_activation(z, act, slope)
    out.backward(dy.double())
    kinks = (z.detach().abs() < KINK) if act != 0 else None
    y_err = relative_error(y, out.detach())
    g_err = relative_error(dx, xd.grad, kinks)
    if rd is not None:
        g_err = max(g_err, relative_error(dres, rd.grad, kinks))
    w_err = relative_error(dw, wd.grad)
    return y_err, g_err, w_err, int(kinks.sum().item()) if kinks is not None else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("kernel_times: needs a CUDA GPU (none here)", file=sys.stderr)
        return 2
    import triton

    import normjit
    from normjit.functional import ACTIVATIONS

    if not normjit.is_available():
        print(f"kernel_times: normjit is not available: {normjit.unavailable_reason()}", file=sys.stderr)
        return 2
    if args.activation not in ACTIVATIONS:
        print(f"kernel_times: unknown activation {args.activation!r}", file=sys.stderr)
        return 2
    act, slope = ACTIVATIONS[args.activation], 0.01
    fwd = torch.ops.normjit.instance_norm_fwd.default
    bwd = torch.ops.normjit.instance_norm_bwd.default
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    for layout in args.layouts:
        for shape in args.shapes:
            for name in args.dtypes:
                g = torch.Generator(device="cuda").manual_seed(0)
                x = torch.randn(shape, device="cuda", dtype=dtypes[name], generator=g) * 2 + 3
                if layout == "ndhwc":
                    x = x.to(memory_format=torch.channels_last_3d)
                w = torch.rand(shape[1], device="cuda") + 0.5
                b = torch.randn(shape[1], device="cuda")
                r = torch.randn_like(x) if args.residual else None
                dy = torch.randn_like(x)
                mask = [True, True, r is not None]
                y, mean, rstd = fwd(x, w, b, r, None, None, True, 0.1, 1e-5, act, slope)
                dx, dw, _, dres = bwd(dy, x, w, b, r, mean, rstd, act, slope, mask)
                line = (f"{args.tag:16s} {layout} {','.join(map(str, shape)):18s} {name} "
                        f"act={args.activation or 'none'} residual={int(args.residual)}")
                if "fwd" in args.modes:
                    t = triton.testing.do_bench(
                        lambda: fwd(x, w, b, r, None, None, True, 0.1, 1e-5, act, slope), return_mode="median")
                    line += f"  fwd {t * 1e3:8.1f} us"
                if "bwd" in args.modes:
                    t = triton.testing.do_bench(
                        lambda: bwd(dy, x, w, b, r, mean, rstd, act, slope, mask), return_mode="median")
                    line += f"  bwd {t * 1e3:8.1f} us"
                if not args.no_check:
                    y_err, g_err, w_err, kinks = check(torch, F, x, w, b, r, dy, act, slope, (y, dx, dw, dres))
                    line += (f"  error (relative to max) y {y_err:.1e}, dx/dres {g_err:.1e} "
                             f"({kinks} kink elements left out), dweight {w_err:.1e}")
                print(line, flush=True)
                del x, y, dy, r, dx, dres
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
