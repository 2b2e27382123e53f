#!/usr/bin/env python3
"""Kernel benchmark: InstanceNorm3d forward and forward+backward, normjit against its peers.

What is measured, for every (shape, dtype, layout, mode, peer):
- the median GPU time of one call (fwd) or of one forward+backward (fwdbwd), with the L2 cache
  flushed before each repetition (triton.testing.do_bench, else CUDA events + a 256 MB write);
- the effective bandwidth over ideal bytes (fwd: read x, write y; fwdbwd: that plus read x, dy and
  write dx), in TB/s and as a percentage of a device-to-device copy measured in the same run;
- for torch.compile, the first call's wall time (compile_s), with dynamo reset before every
  configuration so that its recompile limit never silently hands us eager;
- for normjit, the first call's wall time (first_call_s, includes NVRTC compiles unless the disk
  cache already holds them) and a correctness check against torch eager computed in fp32 from the
  same inputs: a benchmark of a wrong kernel is worthless.

Peers: eager (F.instance_norm), compile (torch.compile of nn.InstanceNorm3d(affine=True),
dynamic=False), normjit (normjit.functional.instance_norm). With --activation leaky_relu each peer
computes InstanceNorm + LeakyReLU: eager and compile in torch, normjit fused in one kernel, and
'normjit_unfused' = normjit's plain norm followed by torch's leaky_relu.

Affine weights are random around 1 (weight = 1 + 0.1·N(0,1), bias = 0.1·N(0,1)) and fp32 by
default, as in an nnU-Net module under fp16 autocast (--param-dtype same gives them x's dtype).
Inputs are N(0.5, 1.5²) so that a non-zero mean exercises the variance computation.

Outputs in --out: results.json (raw, rewritten after every measurement), results.md and
bandwidth.png. The markdown table is printed at the end. Exit status: 0 when every requested
measurement ran and every check passed, 1 otherwise (normjit missing counts as a failure, but the
peers are still measured).
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402


@dataclass(frozen=True)
class Config:
    """One benchmarked configuration."""

    shape: tuple
    dtype: str
    layout: str
    mode: str
    activation: str

    def label(self) -> str:
        return f"{bl.fmt_shape(self.shape)} {self.dtype} {self.layout} {self.mode} {self.activation}"

    def record(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype, "layout": self.layout,
                "mode": self.mode, "activation": self.activation}


@dataclass
class Inputs:
    """Tensors of one configuration. dy is None in fwd mode; in fwdbwd x, w and b require grad."""

    x: object
    w: object
    b: object
    dy: object | None


# --------------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=None,
                   help="N,C,D,H,W shapes (several arguments or ';'-separated); default: the "
                        "nnU-Net ladder at batch 2 plus 2,32,80,192,160")
    p.add_argument("--dtypes", default=None, help="comma list of fp16,bf16,fp32 (default all)")
    p.add_argument("--compile-dtypes", default=None,
                   help="dtypes for which the compile peer runs (default: all of --dtypes); "
                        "torch.compile costs seconds per configuration")
    p.add_argument("--layouts", default="ncdhw,ndhwc", help="ncdhw and/or ndhwc (channels_last_3d)")
    p.add_argument("--modes", default="fwd,fwdbwd", help="fwd and/or fwdbwd")
    p.add_argument("--peers", default="eager,compile,normjit", help="eager, compile, normjit")
    p.add_argument("--activation", default="none",
                   help="none or leaky_relu (or both, comma-separated): leaky_relu compares "
                        "normjit fused vs normjit unfused vs torch IN + LeakyReLU")
    p.add_argument("--negative-slope", type=float, default=0.01)
    p.add_argument("--eps", type=float, default=1e-5)
    p.add_argument("--param-dtype", choices=("fp32", "same"), default="fp32",
                   help="dtype of the affine weight and bias: fp32 (nnU-Net under autocast) or "
                        "the input's dtype")
    p.add_argument("--warmup", type=float, default=25, help="warm-up time per timing, ms")
    p.add_argument("--rep", type=float, default=100, help="repetition time per timing, ms")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    p.add_argument("--no-plot", action="store_true", help="skip bandwidth.png")
    p.add_argument("--kernel-times", action="store_true",
                   help="also each peer's GPU time per call by CUPTI (torch.profiler): its kernels' "
                        "own execution, without the gap from a CUDA event to the first kernel that "
                        "dominates the deep stages' event times")
    p.add_argument("--out", default=bl.default_out_dir(), help="output folder ($OUT if set)")
    p.add_argument("--quick", action="store_true",
                   help="3 shapes (largest, medium, smallest) and fp16 only, unless --shapes or "
                        "--dtypes say otherwise")
    args = p.parse_args(argv)

    if args.shapes:
        args.shapes = bl.parse_shapes(args.shapes)
    else:
        args.shapes = list(bl.QUICK_SHAPES if args.quick else bl.DEFAULT_SHAPES)
    dtypes = args.dtypes or ("fp16" if args.quick else "fp16,bf16,fp32")
    args.dtypes = bl.parse_choices(dtypes, tuple(bl.DTYPE_SIZES), "dtype")
    args.compile_dtypes = (bl.parse_choices(args.compile_dtypes, tuple(bl.DTYPE_SIZES), "dtype")
                           if args.compile_dtypes else list(args.dtypes))
    args.layouts = bl.parse_choices(args.layouts, bl.LAYOUTS, "layout")
    args.modes = bl.parse_choices(args.modes, bl.MODES, "mode")
    args.peers = bl.parse_choices(args.peers, bl.PEERS, "peer")
    args.activations = bl.parse_choices(args.activation, bl.ACTIVATIONS, "activation")
    return args


def configs(args: argparse.Namespace) -> list[Config]:
    """All configurations, activation-major then shape-major, so that partial runs stay useful."""
    return [Config(tuple(s), d, lay, mode, act)
            for act in args.activations
            for s in args.shapes
            for d in args.dtypes
            for lay in args.layouts
            for mode in args.modes]


def peers_for(cfg: Config, args: argparse.Namespace) -> list[str]:
    """Peers measured for one configuration, in order: eager, normjit, then torch.compile.

    torch.compile goes last because the host path of whatever is timed right after it is slowed
    for a while: normjit's (2,128,32^3) fp16 forward+backward, bound by host time, measured 207-238
    µs right after the compile peer and 94-101 µs without it (H100, session 41, docs/PERF_NOTES.md).
    """
    peers = [p for p in args.peers if p == "eager"]
    if "normjit" in args.peers:
        if cfg.activation != "none":
            peers.append("normjit_unfused")
        peers.append("normjit")
    if "compile" in args.peers and cfg.dtype in args.compile_dtypes:
        peers.append("compile")
    return peers


# --------------------------------------------------------------------------------------------------
# Building inputs and the function each peer runs
# --------------------------------------------------------------------------------------------------


def make_inputs(cfg: Config, args: argparse.Namespace) -> Inputs:
    """x ~ N(0.5, 1.5²) in the requested layout, random affine parameters, and dy for fwdbwd."""
    import torch

    dtype = bl.torch_dtype(cfg.dtype)
    pdtype = torch.float32 if args.param_dtype == "fp32" else dtype
    fmt = torch.channels_last_3d if cfg.layout == "ndhwc" else torch.contiguous_format
    torch.manual_seed(args.seed)
    x = torch.empty(cfg.shape, device="cuda", dtype=dtype, memory_format=fmt).normal_(0.5, 1.5)
    c = cfg.shape[1]
    w = (1 + 0.1 * torch.randn(c, device="cuda")).to(pdtype)
    b = (0.1 * torch.randn(c, device="cuda")).to(pdtype)
    dy = None
    if cfg.mode == "fwdbwd":
        dy = torch.empty(cfg.shape, device="cuda", dtype=dtype, memory_format=fmt).normal_()
        for t in (x, w, b):
            t.requires_grad_(True)
    return Inputs(x, w, b, dy)


def build_forward(peer: str, cfg: Config, inp: Inputs, normjit, args: argparse.Namespace):
    """Return (forward, leaves): forward() computes the output of this peer; leaves are the
    tensors whose .grad the backward fills (x, weight, bias)."""
    import torch
    import torch.nn.functional as F

    x, w, b = inp.x, inp.w, inp.b
    eps, slope = args.eps, args.negative_slope
    fused = cfg.activation == "leaky_relu"

    if peer == "eager":
        def forward():
            y = F.instance_norm(x, weight=w, bias=b, eps=eps)
            return F.leaky_relu(y, slope) if fused else y
        return forward, [x, w, b]

    if peer == "compile":
        norm = torch.nn.InstanceNorm3d(cfg.shape[1], eps=eps, affine=True)
        norm = norm.to(device="cuda", dtype=w.dtype)
        with torch.no_grad():
            norm.weight.copy_(w)
            norm.bias.copy_(b)
        norm.requires_grad_(cfg.mode == "fwdbwd")
        module = torch.nn.Sequential(norm, torch.nn.LeakyReLU(slope)) if fused else norm
        compiled = torch.compile(module, dynamic=False)
        return (lambda: compiled(x)), [x, norm.weight, norm.bias]

    if peer == "normjit":
        inorm = normjit.functional.instance_norm
        if fused:
            return (lambda: inorm(x, weight=w, bias=b, eps=eps, activation="leaky_relu",
                                  negative_slope=slope)), [x, w, b]
        return (lambda: inorm(x, weight=w, bias=b, eps=eps)), [x, w, b]

    if peer == "normjit_unfused":
        inorm = normjit.functional.instance_norm
        return (lambda: F.leaky_relu(inorm(x, weight=w, bias=b, eps=eps), slope)), [x, w, b]

    raise ValueError(f"unknown peer {peer}")


def make_step(forward, leaves, dy):
    """The timed closure: forward() alone, or forward().backward(dy) with the leaves' grads set
    to None first (so every repetition allocates and writes dx, dweight, dbias afresh)."""
    if dy is None:
        return forward

    def step():
        for t in leaves:
            t.grad = None
        forward().backward(dy)

    return step


# --------------------------------------------------------------------------------------------------
# Correctness
# --------------------------------------------------------------------------------------------------


def run_outputs(forward, leaves, dy) -> dict:
    """One call; returns y (and dx, dweight, dbias for fwdbwd) as fp32 tensors."""
    for t in leaves:
        t.grad = None
    y = forward()
    out = {"y": y.detach().float()}
    if dy is not None:
        y.backward(dy)
        for name, t in zip(("dx", "dweight", "dbias"), leaves):
            out[name] = t.grad.float() if t.grad is not None else None
    return out


def reference_outputs(cfg: Config, inp: Inputs, args: argparse.Namespace) -> dict:
    """torch eager in fp32 from the same (rounded) inputs: the reference both eager-in-dtype and
    normjit are compared with."""
    import torch.nn.functional as F

    need_grad = inp.dy is not None
    x = inp.x.detach().float().requires_grad_(need_grad)
    w = inp.w.detach().float().requires_grad_(need_grad)
    b = inp.b.detach().float().requires_grad_(need_grad)

    def forward():
        y = F.instance_norm(x, weight=w, bias=b, eps=args.eps)
        return F.leaky_relu(y, args.negative_slope) if cfg.activation == "leaky_relu" else y

    dy = inp.dy.float() if need_grad else None
    return run_outputs(forward, [x, w, b], dy)


def compare(out: dict, ref: dict, tol: float) -> dict:
    """Max abs difference per tensor and the worst normalized error (see benchlib.kernel_header).
    Elementwise |a-b|/(1+|ref|) for y and dx (allclose with atol = rtol = tol), and
    |a-b|/max(1, max|ref|) for the per-channel sums dweight and dbias."""
    import math

    max_abs, normalized = {}, {}
    for name, r in ref.items():
        a = out.get(name)
        if r is None:
            continue
        if a is None:
            max_abs[name], normalized[name] = None, float("inf")
            continue
        diff = (a - r).abs()
        max_abs[name] = bl.finite_or_none(diff.max().item())
        if name in ("y", "dx"):
            norm = (diff / (1 + r.abs())).max().item()
        else:
            norm = diff.max().item() / max(1.0, r.abs().max().item())
        normalized[name] = norm if math.isfinite(norm) else float("inf")
    worst = max(normalized.values()) if normalized else float("inf")
    return {"max_abs": max_abs,
            "normalized": {k: bl.finite_or_none(v) for k, v in normalized.items()},
            "worst": bl.finite_or_none(worst),
            "ok": math.isfinite(worst) and worst <= tol}


def check_normjit(cfg: Config, inp: Inputs, normjit, args: argparse.Namespace) -> dict:
    """Time normjit's first call (cold: includes its compiles), then compare normjit and eager
    (both in cfg.dtype) with the fp32 reference. Warnings normjit raises (e.g. a fallback to torch)
    are recorded."""
    tol = bl.TOLERANCES[cfg.dtype]
    rec = dict(cfg.record(), peer="normjit", tol=tol, error=None)
    info_before = bl.normjit_cache_info(normjit)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forward, leaves = build_forward("normjit", cfg, inp, normjit, args)
        rec["first_call_s"] = bl.wall_time_s(make_step(forward, leaves, inp.dy))
        if not args.no_check:
            ref = reference_outputs(cfg, inp, args)
            got = run_outputs(forward, leaves, inp.dy)
            rec.update(compare(got, ref, tol))
            del got
            eager_fwd, eager_leaves = build_forward("eager", cfg, inp, normjit, args)
            eager = compare(run_outputs(eager_fwd, eager_leaves, inp.dy), ref, tol)
            rec["eager_worst"] = eager["worst"]
            rec["eager_max_abs"] = eager["max_abs"]
            rec["suspect"] = bl.is_suspect(rec.get("worst"), eager["worst"])
            del ref
        else:
            rec["ok"], rec["worst"] = True, None
    # Counters over the first call and the check: compiles, cache misses, layout copies, ...
    rec["normjit_counters"] = bl.counter_delta(info_before, bl.normjit_cache_info(normjit))
    rec["warnings"] = sorted({str(w.message)[:300] for w in caught})[:5]
    for t in (inp.x, inp.w, inp.b):
        t.grad = None
    return rec


# --------------------------------------------------------------------------------------------------
# One configuration
# --------------------------------------------------------------------------------------------------


def measure_peer(peer: str, cfg: Config, inp: Inputs, normjit, args, copy_tbps) -> dict:
    """Median time of one peer on one configuration, with its derived bandwidth."""
    import torch
    import torch._dynamo

    rec = dict(cfg.record(), peer=peer, median_us=None, error=None,
               bytes=bl.ideal_bytes(cfg.shape, cfg.dtype, cfg.mode))
    info_before = bl.normjit_cache_info(normjit) if peer.startswith("normjit") else None
    try:
        if peer == "compile":
            torch._dynamo.reset()
        forward, leaves = build_forward(peer, cfg, inp, normjit, args)
        step = make_step(forward, leaves, inp.dy)
        first = bl.wall_time_s(step)
        if peer == "compile":
            rec["compile_s"] = first
        else:
            rec["first_call_s"] = first
        t_us = bl.gpu_time_us(step, warmup_ms=args.warmup, rep_ms=args.rep)
        rec["median_us"] = bl.finite_or_none(t_us)
        rec["tbps"] = bl.tbps(rec["bytes"], rec["median_us"])
        rec["pct_copy"] = bl.pct_of(rec["tbps"], copy_tbps)
        if args.kernel_times:
            try:
                names: list[str] = []
                k_us, per_call = bl.kernel_time_us(step, name_prefix=None, calls=20, names_out=names)
                rec["kernel_us"], rec["gpu_activities_per_call"] = bl.finite_or_none(k_us), per_call
                rec["gpu_activity_names"] = names
            except Exception as exc:  # noqa: BLE001 - the event time stands without it
                rec["kernel_error"] = bl.short_error(exc)
        if info_before is not None:
            # Anything but cache hits while timing (a compile, a layout copy) is worth seeing.
            rec["normjit_counters"] = bl.counter_delta(info_before,
                                                       bl.normjit_cache_info(normjit))
    except Exception as exc:  # noqa: BLE001 - one failure must not lose the run
        rec["error"] = bl.short_error(exc)
    finally:
        for t in (inp.x, inp.w, inp.b):
            t.grad = None
        if peer == "compile":
            torch._dynamo.reset()
    return rec


def progress_line(index: int, total: int, cfg: Config, recs: list[dict], check: dict | None) -> str:
    parts = [f"[{index}/{total}] {cfg.label()}"]
    for r in recs:
        if r.get("error"):
            parts.append(f"{r['peer']} ERROR ({r['error']})")
            continue
        extra = ""
        if r["peer"] == "compile" and r.get("compile_s") is not None:
            extra = f" (compile {r['compile_s']:.1f} s)"
        if r["peer"] == "normjit":
            extra = f" {bl.fmt_float(r.get('tbps'))} TB/s {bl.fmt_pct(r.get('pct_copy'))}"
        parts.append(f"{r['peer']} {bl.fmt_time(r['median_us'])} µs{extra}")
    if check is not None:
        max_abs = ", ".join(f"{k} {bl.fmt_sci(v)}" for k, v in (check.get("max_abs") or {}).items())
        parts.append("check " + bl.check_cell(check) + (f" (max abs {max_abs})" if max_abs else ""))
        if check.get("first_call_s") is not None:
            parts.append(f"normjit first call {check['first_call_s'] * 1e3:.0f} ms")
        counters = check.get("normjit_counters") or {}
        shown = {k: v for k, v in counters.items()
                 if k in ("compiles", "disk_hits", "layout_copies", "fallbacks")}
        if shown:
            parts.append(" ".join(f"{k} {v}" for k, v in shown.items()))
    return " | ".join(parts)


# --------------------------------------------------------------------------------------------------
# Plot
# --------------------------------------------------------------------------------------------------


def plot_bandwidth(doc: dict, path: str) -> bool:
    """% of copy bandwidth per shape, one bar per peer, for fp16 NCDHW and NDHWC, fwd and fwdbwd
    panels. Returns False when there is nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [m for m in doc["measurements"]
            if m["dtype"] == "fp16" and m.get("activation", "none") == "none"]
    if not rows:
        return False
    layouts = [lay for lay in bl.LAYOUTS if any(m["layout"] == lay for m in rows)]
    modes = [mode for mode in bl.MODES if any(m["mode"] == mode for m in rows)]
    shapes = []
    for m in rows:
        if tuple(m["shape"]) not in shapes:
            shapes.append(tuple(m["shape"]))
    peers = [p for p in bl.PEER_ORDER if any(m["peer"] == p for m in rows)]
    colors = {"eager": "#999999", "compile": "#4c72b0", "normjit_unfused": "#dd8452",
              "normjit": "#2ca02c"}

    fig, axes = plt.subplots(len(layouts), len(modes), squeeze=False,
                             figsize=(1.3 * len(shapes) * len(modes) + 2, 3.6 * len(layouts)))
    width = 0.8 / max(1, len(peers))
    for i, layout in enumerate(layouts):
        for j, mode in enumerate(modes):
            ax = axes[i][j]
            for k, peer in enumerate(peers):
                values = []
                for shape in shapes:
                    m = next((m for m in rows if tuple(m["shape"]) == shape and m["peer"] == peer
                              and m["layout"] == layout and m["mode"] == mode), None)
                    values.append((m or {}).get("pct_copy") or 0.0)
                xs = [s + (k - (len(peers) - 1) / 2) * width for s in range(len(shapes))]
                bars = ax.bar(xs, values, width, label=bl.PEER_LABELS[peer], color=colors[peer])
                for bar, v in zip(bars, values):
                    if v > 0:
                        ax.text(bar.get_x() + bar.get_width() / 2, v + 1, f"{v:.0f}",
                                ha="center", va="bottom", fontsize=6)
            ax.axhline(100, color="black", linewidth=0.6, linestyle="--")
            ax.set_xticks(range(len(shapes)))
            ax.set_xticklabels([bl.fmt_shape(s) for s in shapes], rotation=25, fontsize=7,
                               ha="right")
            top = max([115.0] + [(m.get("pct_copy") or 0) * 1.1 for m in rows])
            ax.set_ylim(0, top)
            ax.set_ylabel("% of copy bandwidth")
            ax.set_title(f"fp16 {layout.upper()} {mode}", fontsize=10)
            if i == 0 and j == 0:
                ax.legend(fontsize=8)
    copy = doc.get("copy", {}).get("tbps")
    fig.suptitle(f"InstanceNorm3d effective bandwidth on {doc.get('device')} "
                 f"(copy = {bl.fmt_float(copy)} TB/s; ideal bytes)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "results.json")
    md_path = os.path.join(args.out, "results.md")

    import torch

    if not torch.cuda.is_available():
        bl.log("bench_instance_norm: no CUDA device; nothing to measure")
        return 2

    failures = 0
    normjit, nj_info = (None, {"available": False, "reason": "not requested"})
    if "normjit" in args.peers:
        normjit, nj_info = bl.load_normjit()
        if normjit is None:
            bl.log(f"!! normjit is NOT available ({nj_info['reason']}); measuring the peers only")
            args.peers = [p for p in args.peers if p != "normjit"]
            failures += 1

    doc = dict(bl.environment(), benchmark="instance_norm", timer=bl.timer_name(),
               normjit=nj_info, started=bl.now_iso(), settings=vars(args),
               measurements=[], checks=[])
    doc["normjit"]["cache_info_start"] = bl.normjit_cache_info(normjit)
    bl.log(f"device {doc['device']} | torch {doc['torch']} | triton {doc['triton']} | "
           f"timer {doc['timer']} | normjit {'available' if normjit else 'NOT available'}")

    try:
        copy = bl.copy_bandwidth()
        bl.log(f"device-to-device copy: {copy['tbps']:.2f} TB/s ({copy['median_us']:.0f} µs for "
               f"{copy['bytes'] / 2**30:.0f} GiB read+written)")
    except Exception as exc:  # noqa: BLE001 - keep measuring; % of copy will be missing
        copy = {"tbps": None, "error": bl.short_error(exc)}
        bl.log(f"!! copy bandwidth failed: {copy['error']}")
    doc["copy"] = copy
    bl.write_json(json_path, doc)

    all_cfgs = configs(args)
    for index, cfg in enumerate(all_cfgs, 1):
        recs, check = [], None
        inp = None
        try:
            inp = make_inputs(cfg, args)
            if normjit is not None:
                try:
                    check = check_normjit(cfg, inp, normjit, args)
                except Exception as exc:  # noqa: BLE001
                    check = dict(cfg.record(), peer="normjit", ok=False, worst=None,
                                 tol=bl.TOLERANCES[cfg.dtype], error=bl.short_error(exc))
                bl.free_gpu_memory()
                doc["checks"].append(check)
                failures += 0 if check.get("ok") and not check.get("error") else 1
            for peer in peers_for(cfg, args):
                rec = measure_peer(peer, cfg, inp, normjit, args, copy["tbps"])
                if check is not None and peer == "normjit" and "first_call_s" in check:
                    rec["first_call_s"] = check["first_call_s"]
                recs.append(rec)
                doc["measurements"].append(rec)
                if rec["error"] and peer.startswith("normjit"):
                    failures += 1
                bl.write_json(json_path, doc)
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory while making inputs
            rec = dict(cfg.record(), peer="inputs", median_us=None, error=bl.short_error(exc))
            doc["measurements"].append(rec)
            recs.append(rec)
            failures += 1
        finally:
            del inp
            bl.free_gpu_memory()
        bl.log(progress_line(index, len(all_cfgs), cfg, recs, check))
        bl.write_json(json_path, doc)
        bl.write_text(md_path, bl.kernel_markdown(doc, level=1))

    try:
        end = bl.copy_bandwidth()
        doc["copy"]["tbps_end"] = end["tbps"]
    except Exception as exc:  # noqa: BLE001
        bl.log(f"copy bandwidth at the end failed: {bl.short_error(exc)}")
    doc["normjit"]["cache_info_end"] = bl.normjit_cache_info(normjit)
    doc["finished"] = bl.now_iso()
    doc["failures"] = failures
    bl.write_json(json_path, doc)
    markdown = bl.kernel_markdown(doc, level=1)
    bl.write_text(md_path, markdown)

    if not args.no_plot:
        try:
            if plot_bandwidth(doc, os.path.join(args.out, "bandwidth.png")):
                bl.log(f"wrote {os.path.join(args.out, 'bandwidth.png')}")
            else:
                bl.log("bandwidth.png: no fp16 plain-norm measurements to plot")
        except Exception as exc:  # noqa: BLE001
            bl.log(f"bandwidth.png failed: {bl.short_error(exc)}")

    bl.log("")
    bl.log(markdown)
    bl.log(f"wrote {json_path} and {md_path}")
    bl.log(f"bench_instance_norm failures: {failures} ({len(bl.failed_checks(doc))} failed checks, "
           f"{len(bl.kernel_errors(doc))} errors, normjit "
           f"{'available' if normjit else 'NOT available'})")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
