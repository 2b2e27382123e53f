"""Times normjit's forward and backward kernels separately, one configuration per line.

    python3 bench/kernel_times.py --layouts ncdhw --modes bwd --dtypes fp16,bf16 \
        --shapes 2,32,128,128,128 2,64,64,64,64
    NORMJIT_RESIDENT_THREADS=512 python3 bench/kernel_times.py ...    # the same, another choice

Calls the registered ops (torch.ops.normjit.instance_norm_fwd / _bwd) directly, so a backward is
timed without the forward or the autograd engine: medians of benchlib.gpu_time_us
(triton.testing.do_bench), L2 flushed before every repetition, each with its effective bandwidth
(the bytes the kernel must move) and its share of a device-to-device copy measured at the start
of the run. Meant for A/B runs of a heuristic or a kernel, one process per setting of the
measurement variables (NORMJIT_RESIDENT_THREADS, NORMJIT_NHWC_BWD_ITEMS, NORMJIT_SPLIT, ...: they
are read once per process). Every configuration is first checked against float64 torch; near
an activation's kink (|pre-activation| < 1e-3) a low-precision input can land on the other side,
so those elements are left out of the gradient check and counted. bench_instance_norm.py is the
benchmark with peers; this is the microscope.

`--timer cupti` times the kernels themselves instead (torch.profiler's CUPTI kernel records, the
sum of a call's kernels, how many it launched): event times include the gap from the start event
to the kernel, which matters for the deep stages' few-µs kernels (session 2: 4.0-4.3 µs in
Nsight Compute where events said 5.8-6.0).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402

DTYPES = ("fp16", "bf16", "fp32")
LAYOUTS = ("ncdhw", "ndhwc")
MODES = ("fwd", "bwd")
TIMERS = ("events", "cupti")
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
    ap.add_argument("--no-affine", action="store_true",
                    help="no weight and bias (affine=False, MONAI's default): no dweight/dbias either")
    ap.add_argument("--no-check", action="store_true", help="skip the float64 check")
    ap.add_argument("--no-weight-grads", action="store_true",
                    help="time the backward without dweight/dbias (what their cross-CTA sum costs: "
                         "compare with a run without this flag; the check still covers them)")
    ap.add_argument("--timer", choices=TIMERS, default="events",
                    help="events: CUDA events around each call (do_bench; includes the gap from the "
                         "event to the kernel's start); cupti: the kernels' own execution from the "
                         "profiler's kernel records (issue 3's 'GPU time per kernel')")
    ap.add_argument("--table", nargs="+", metavar="LOG",
                    help="no GPU run: read earlier runs' output and print one markdown row per kernel "
                         "with every tag's median (A/B runs: bench/compare_baseline.sh)")
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


def kernel_bytes(shape, dtype, mode, residual, activation):
    """Bytes the kernel must move at least: the forward reads x (and the residual) and writes y;
    the backward reads x and dy (and, under an activation, the residual) and writes dx (and
    d(residual))."""
    residual_tensors = 0 if not residual else 1 if mode == "fwd" else 1 + (activation is not None)
    return bl.ideal_bytes(shape, dtype, mode) + residual_tensors * bl.numel(shape) * bl.DTYPE_SIZES[dtype]


def timing(mode, us, nbytes, copy_tbps, kernels=None):
    """'bwd 291.0 us (2.77 TB/s, 66 % of copy)': the fields --table reads come first; with
    `kernels` (the cupti timer) also how many kernels the call launched."""
    rate = bl.tbps(nbytes, us)
    pct = bl.pct_of(rate, copy_tbps)
    return (f"  {mode} {us:8.1f} us ({rate:.2f} TB/s" + (f", {pct:.0f} % of copy" if pct is not None else "")
            + (f", {kernels} kernel{'s' if kernels != 1 else ''}" if kernels is not None else "") + ")")


def time_call(timer, fn):
    """(µs, kernels per call or None) of fn by the chosen timer, L2 flushed before every call."""
    if timer == "cupti":
        return bl.kernel_time_us(fn)
    return bl.gpu_time_us(fn), None


def parse_line(line):
    """One output line -> (tag, config, {"fwd": us, "bwd": us}), or None for other lines."""
    words = line.split()
    if len(words) < 6 or not words[4].startswith("act=") or not words[5].startswith("residual="):
        return None
    ncfg = 7 if len(words) > 6 and words[6].startswith("affine=") else 6  # "affine=0": --no-affine
    times = {}
    for i in range(ncfg, len(words) - 2):  # "fwd 163.0 us", "bwd 296.8 us"
        if words[i] in MODES and words[i + 2] == "us":
            try:
                times[words[i]] = float(words[i + 1])
            except ValueError:
                return None
    return (words[0], " ".join(words[1:ncfg]), times) if times else None


def sm_clock_mhz(line):
    """The SM clock a timing line recorded ('clocks sm 1980 MHz, ...'), or None."""
    words = line.split()
    for i in range(len(words) - 3):
        if words[i] == "clocks" and words[i + 1] == "sm" and words[i + 3].startswith("MHz"):
            try:
                return float(words[i + 2])
            except ValueError:
                return None
    return None


def ab_table(lines):
    """Markdown: a row per (kernel config, mode), a column per tag in order of appearance, each the
    median of that tag's runs, then each tag's ratio to the first tag's; where the lines recorded
    clocks, a last row with each tag's median SM clock (a tag that ran slower at a lower clock
    measured the GPU's state, not the code)."""
    runs, tags, clocks = {}, [], {}
    for line in lines:
        parsed = parse_line(line)
        if parsed is None:
            continue
        tag, config, times = parsed
        if tag not in tags:
            tags.append(tag)
        for mode, us in times.items():
            runs.setdefault((config, mode), {}).setdefault(tag, []).append(us)
        if (mhz := sm_clock_mhz(line)) is not None:
            clocks.setdefault(tag, []).append(mhz)
    if not runs:
        return ""
    rows = ["| kernel | " + " | ".join(f"{t} (µs)" for t in tags) + "".join(f" | {t} / {tags[0]}" for t in tags[1:]) + " |",
            "| --- |" + " --- |" * (2 * len(tags) - 1)]
    for (config, mode), by_tag in runs.items():
        med = {t: bl.median(v) for t, v in by_tag.items()}
        cells = [f"{med[t]:.1f}" + (f" ({len(by_tag[t])} runs)" if len(by_tag[t]) > 1 else "") if t in med else "-"
                 for t in tags]
        base = med.get(tags[0])
        ratios = [f"{med[t] / base:.3f}" if base and t in med else "-" for t in tags[1:]]
        rows.append(f"| {config} {mode} | " + " | ".join(cells + ratios) + " |")
    if clocks:
        cells = [f"{bl.median(clocks[t]):.0f}" if t in clocks else "-" for t in tags]
        rows.append("| SM clock after each timing (MHz, median) | " + " | ".join(cells + ["-"] * (len(tags) - 1)) + " |")
    return "\n".join(rows) + "\n"


# Largest error (relative to the largest reference value) each dtype's outputs may have against
# float64 torch: benchlib's tolerances (bench_instance_norm.py's check), bf16 looser for its 8x
# coarser rounding. 30x and more the largest errors in the logs of bench/results (fp16 4.4e-4,
# bf16 3.4e-3, fp32 4.5e-7), far below what a wrong kernel gives (a lost chunk, a misread slot:
# 1e-1 and up, NaN).
ERROR_LIMITS = {**bl.TOLERANCES, "bf16": 1e-1}


def wrong_outputs(dtype, errors):
    """The names of the outputs whose error is above the dtype's limit (NaN counts as above)."""
    limit = ERROR_LIMITS[dtype]
    return [name for name, err in errors.items() if not err <= limit]


def check(torch, F, x, w, b, r, dy, act, slope, outputs):
    """Forward and backward outputs against float64 torch: (y error, dx/dres error, dw error, kinks)."""
    from normjit.functional import apply_activation

    y, dx, dw, dres = outputs
    xd = x.double().requires_grad_(True)
    wd = w.double().requires_grad_(True) if w is not None else None
    bd = b.double().requires_grad_(True) if b is not None else None
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
    w_err = relative_error(dw, wd.grad) if wd is not None else 0.0
    return y_err, g_err, w_err, int(kinks.sum().item()) if kinks is not None else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.table:
        lines = []
        for path in args.table:
            with open(path, encoding="utf-8") as f:
                lines += f.read().splitlines()
        table = ab_table(lines)
        print(table or "kernel_times: no kernel timings in " + ", ".join(args.table), end="" if table else "\n")
        return 0 if table else 1
    ready = bl.require_gpu_normjit("kernel_times")
    if ready is None:
        return 2
    torch, _ = ready
    import torch.nn.functional as F
    from normjit.functional import ACTIVATIONS

    if args.activation not in ACTIVATIONS:
        print(f"kernel_times: unknown activation {args.activation!r}", file=sys.stderr)
        return 2
    act, slope = ACTIVATIONS[args.activation], 0.01
    copy_tbps = bl.copy_bandwidth()["tbps"]
    print(f"{args.tag:16s} device-to-device copy: {copy_tbps:.2f} TB/s; timer: {args.timer}", flush=True)
    fwd = torch.ops.normjit.instance_norm_fwd.default
    bwd = torch.ops.normjit.instance_norm_bwd.default
    wrong = 0
    for layout in args.layouts:
        for shape in args.shapes:
            for name in args.dtypes:
                g = torch.Generator(device="cuda").manual_seed(0)
                x = torch.randn(shape, device="cuda", dtype=getattr(torch, bl.TORCH_DTYPE_NAMES[name]), generator=g) * 2 + 3
                if layout == "ndhwc":
                    x = x.to(memory_format=torch.channels_last_3d)
                affine = not args.no_affine
                w = torch.rand(shape[1], device="cuda") + 0.5 if affine else None
                b = torch.randn(shape[1], device="cuda") if affine else None
                r = torch.randn_like(x) if args.residual else None
                dy = torch.randn_like(x)
                mask = [True, affine, r is not None]
                y, mean, rstd = fwd(x, w, b, r, None, None, True, 0.1, 1e-5, act, slope)
                dx, dw, _, dres = bwd(dy, x, w, b, r, mean, rstd, act, slope, mask)
                line = (f"{args.tag:16s} {layout} {','.join(map(str, shape)):18s} {name} "
                        f"act={args.activation or 'none'} residual={int(args.residual)}"
                        + ("" if affine else " affine=0"))
                if "fwd" in args.modes:
                    t, k = time_call(args.timer, lambda: fwd(x, w, b, r, None, None, True, 0.1, 1e-5, act, slope))
                    line += timing("fwd", t, kernel_bytes(shape, name, "fwd", r is not None, args.activation),
                                   copy_tbps, k)
                if "bwd" in args.modes:
                    timed_mask = [True, affine and not args.no_weight_grads, mask[2]]
                    t, k = time_call(args.timer, lambda: bwd(dy, x, w, b, r, mean, rstd, act, slope, timed_mask))
                    line += timing("bwd", t, kernel_bytes(shape, name, "bwd", r is not None, args.activation),
                                   copy_tbps, k)
                clocks = bl.gpu_clocks()  # right after the timings: what they ran at
                if clocks:
                    line += "  clocks " + clocks
                if not args.no_check:
                    y_err, g_err, w_err, kinks = check(torch, F, x, w, b, r, dy, act, slope, (y, dx, dw, dres))
                    line += (f"  error (relative to max) y {y_err:.1e}, dx/dres {g_err:.1e} "
                             f"({kinks} kink elements left out), dweight {w_err:.1e}")
                    bad = wrong_outputs(name, {"y": y_err, "dx/dres": g_err, "dweight": w_err})
                    if bad:
                        line += f"  WRONG: {', '.join(bad)} above {ERROR_LIMITS[name]:.0e}"
                        wrong += 1
                print(line, flush=True)
                del x, y, dy, r, dx, dres
                torch.cuda.empty_cache()
    if wrong:
        print(f"kernel_times: {wrong} configuration(s) gave WRONG outputs (above)", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
