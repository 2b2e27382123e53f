#!/usr/bin/env python3
"""Host overhead: what one InstanceNorm call costs the CPU, on a tensor too small to matter.

On a tiny (2,8,4,4,4) fp16 CUDA tensor the kernels take a few µs, so back-to-back calls measure
the per-call host path: argument checking, dispatch, cache lookups and the launch itself. For
each peer, after a warm-up (which also triggers any compilation), we time N back-to-back calls with
time.perf_counter, synchronizing the device before the start and after the end, and take the
median over several repetitions:
- total µs/call: (end after synchronize - start) / N; the honest number when the host is the
  bottleneck (if the GPU were slower, this would be GPU time instead);
- issue µs/call: time until the last call returned, before synchronizing; the CPU's share alone.

No L2 flush: host time is what is measured. Two grad modes:
- no_grad: inside torch.no_grad() (inference, or the fastest possible path);
- grad: x and the affine parameters require grad, so autograd records a node per call (training).

Peers: x.add_(0) (the floor of any torch op), F.instance_norm, torch.nn.InstanceNorm3d forward,
normjit.functional.instance_norm, normjit.nn.InstanceNorm3d forward, and torch.compile of
torch.nn.InstanceNorm3d (dynamic=False). The ratio column divides by F.instance_norm in the same
grad mode.

Writes host_overhead.json and host_overhead.md to --out; prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402

SHAPE = (2, 8, 4, 4, 4)
REFERENCE_PEER = "F.instance_norm"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--calls", type=int, default=None, help="back-to-back calls per repetition "
                                                           "(default 2000, 500 with --quick)")
    p.add_argument("--repeats", type=int, default=5, help="repetitions; the median is reported")
    p.add_argument("--warmup-calls", type=int, default=100)
    p.add_argument("--modes", default="no_grad,grad", help="no_grad and/or grad")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    p.add_argument("--out", default=bl.default_out_dir())
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if args.calls is None:
        args.calls = 500 if args.quick else 2000
    args.modes = bl.parse_choices(args.modes, ("no_grad", "grad"), "mode")
    return args


def time_calls(fn, calls: int, repeats: int, warmup_calls: int) -> dict:
    """Median over repeats of (issue, total) µs per call of `calls` back-to-back fn() calls."""
    import torch

    for _ in range(warmup_calls):
        fn()
    torch.cuda.synchronize()
    issue, total = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        issue.append((t1 - t0) * 1e6 / calls)
        total.append((t2 - t0) * 1e6 / calls)
    return {"issue_us": bl.median(issue), "total_us": bl.median(total),
            "total_us_all": total, "issue_us_all": issue}


def build_peers(normjit, mode: str, compile_peer: bool) -> dict:
    """name -> zero-argument callable for one grad mode. Creating a peer may compile (torch.compile
    happens at the first call, inside the warm-up)."""
    import torch
    import torch.nn.functional as F

    grad = mode == "grad"
    c = SHAPE[1]
    x = torch.randn(SHAPE, device="cuda", dtype=torch.float16).requires_grad_(grad)
    floor = torch.randn(SHAPE, device="cuda", dtype=torch.float16)
    w = torch.ones(c, device="cuda", requires_grad=grad)
    b = torch.zeros(c, device="cuda", requires_grad=grad)
    torch_mod = torch.nn.InstanceNorm3d(c, affine=True).cuda().requires_grad_(grad)

    peers = {
        "x.add_(0)": lambda: floor.add_(0),
        REFERENCE_PEER: lambda: F.instance_norm(x, weight=w, bias=b, eps=1e-5),
        "torch.nn.InstanceNorm3d": lambda: torch_mod(x),
    }
    if normjit is not None:
        inorm = normjit.functional.instance_norm
        peers["normjit.functional.instance_norm"] = lambda: inorm(x, weight=w, bias=b, eps=1e-5)
        try:
            nj_mod = normjit.nn.InstanceNorm3d(c, eps=1e-5, momentum=0.1, affine=True,
                                               track_running_stats=False)
            nj_mod = nj_mod.cuda().requires_grad_(grad)
            peers["normjit.nn.InstanceNorm3d"] = lambda: nj_mod(x)
        except Exception as exc:  # noqa: BLE001
            peers["normjit.nn.InstanceNorm3d"] = exc
    if compile_peer:
        compiled = torch.compile(torch.nn.InstanceNorm3d(c, affine=True).cuda()
                                 .requires_grad_(grad), dynamic=False)
        peers["torch.compile(InstanceNorm3d)"] = lambda: compiled(x)
    return peers


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "host_overhead.json")
    md_path = os.path.join(args.out, "host_overhead.md")

    import torch
    import torch._dynamo

    if not torch.cuda.is_available():
        bl.log("bench_host_overhead: no CUDA device")
        return 2
    normjit, nj_info = bl.load_normjit()
    failures = 0
    if normjit is None:
        bl.log(f"!! normjit is NOT available ({nj_info['reason']}); measuring the peers only")
        failures += 1

    doc = dict(bl.environment(), benchmark="host_overhead", shape=list(SHAPE), dtype="fp16",
               calls=args.calls, repeats=args.repeats, reference_peer=REFERENCE_PEER,
               normjit=nj_info, results=[], started=bl.now_iso())
    for mode in args.modes:
        ctx = torch.no_grad() if mode == "no_grad" else contextlib.nullcontext()
        try:
            peers = build_peers(normjit, mode, not args.no_compile)
        except Exception as exc:  # noqa: BLE001
            bl.log(f"{mode}: building peers failed: {bl.short_error(exc)}")
            failures += 1
            continue
        for name, fn in peers.items():
            rec = {"peer": name, "mode": mode, "error": None}
            try:
                if isinstance(fn, Exception):
                    raise fn
                with ctx:
                    rec.update(time_calls(fn, args.calls, args.repeats, args.warmup_calls))
                bl.log(f"{mode:8s} {name:36s} {rec['total_us']:8.2f} µs/call "
                       f"(issue {rec['issue_us']:.2f})")
            except Exception as exc:  # noqa: BLE001
                rec["error"] = bl.short_error(exc)
                bl.log(f"{mode:8s} {name:36s} ERROR {rec['error']}")
                if name.startswith("normjit"):
                    failures += 1
            doc["results"].append(rec)
            bl.write_json(json_path, doc)
        del peers
        torch._dynamo.reset()
        bl.free_gpu_memory()

    doc["normjit"]["cache_info_end"] = bl.normjit_cache_info(normjit)
    doc["finished"] = bl.now_iso()
    doc["failures"] = failures
    bl.write_json(json_path, doc)
    markdown = "\n".join([
        "# Host overhead per call",
        "",
        f"device: {doc['device']} | torch {doc['torch']} | tensor {bl.fmt_shape(SHAPE)} fp16, "
        f"{args.calls} back-to-back calls, median of {args.repeats}; µs/call includes the final "
        "synchronize, issue µs stops when the last call returns",
        "",
        bl.host_table(doc),
        "",
    ])
    bl.write_text(md_path, markdown)
    bl.log("")
    bl.log(markdown)
    bl.log(f"bench_host_overhead failures: {failures} (normjit "
           f"{'available' if normjit else 'NOT available'})")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
