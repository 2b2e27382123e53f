#!/usr/bin/env python3
"""Merge the benchmarks' outputs into one results.json and one results.md (used by
scripts/gpu_check.sh, whose output folder may hold only a few files), and print a compact
summary that fits at the end of a console log.

Inputs are the --out folders of bench_instance_norm.py (plain and activation runs),
bench_host_overhead.py, bench_unet.py, bench_policy.py and bench_cold_start.py, plus a
step-status file written by gpu_check.sh (lines 'step<TAB>status<TAB>seconds<TAB>note'). Any of
them may be missing: a step that failed early must not stop the report. Needs no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cold_start  # noqa: E402
import bench_policy  # noqa: E402
import benchlib as bl  # noqa: E402


def load_json(path: str | None) -> dict | None:
    """A JSON document, or None when the file is missing or unreadable (the reason is printed)."""
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        print(f"report: cannot read {path}: {exc}", file=sys.stderr)
        return None


def read_steps(path: str | None) -> list[dict]:
    """Parse gpu_check.sh's step file into [{'step', 'status', 'seconds', 'note'}]."""
    steps = []
    if not path or not os.path.exists(path):
        return steps
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 3 or parts[0].startswith("#"):
                continue
            try:
                seconds = float(parts[2])
            except ValueError:
                seconds = None
            steps.append({"step": parts[0], "status": parts[1], "seconds": seconds,
                          "note": parts[3] if len(parts) > 3 else ""})
    return steps


def steps_table(steps: list[dict]) -> str:
    """step | status | seconds | note."""
    return bl.md_table(["step", "status", "s", "note"],
                       [[s["step"], s["status"], bl.fmt_float(s["seconds"], 1), s["note"]]
                        for s in steps])


def full_markdown(docs: dict, steps: list[dict]) -> str:
    """Everything, in one markdown file: steps, kernel tables (all dtypes), host, U-Net, policy,
    cold start."""
    parts = ["# normjit GPU check", ""]
    if steps:
        parts += ["## Steps", "", steps_table(steps), ""]
    if docs.get("kernel"):
        parts += [bl.kernel_markdown(docs["kernel"], level=2), ""]
    if docs.get("kernel_activation"):
        parts += [bl.kernel_markdown(docs["kernel_activation"], level=2)
                  .replace("## InstanceNorm3d kernels", "## InstanceNorm3d + activation kernels", 1),
                  ""]
    if docs.get("host_overhead"):
        parts += ["## Host overhead per call", "", _host_note(docs["host_overhead"]), "",
                  bl.host_table(docs["host_overhead"]), ""]
    if docs.get("unet"):
        parts += ["## nnU-Net-style 3D U-Net training step", "", _unet_note(docs["unet"]), "",
                  bl.unet_table(docs["unet"]), ""]
    if docs.get("policy"):
        parts += [bench_policy.policy_markdown(docs["policy"], level=2), ""]
    if docs.get("cold_start"):
        parts += [bench_cold_start.cold_markdown(docs["cold_start"], level=2), ""]
    return "\n".join(parts)


def _host_note(doc: dict) -> str:
    return (f"tensor {bl.fmt_shape(doc.get('shape', []))} {doc.get('dtype')}, "
            f"{doc.get('calls')} back-to-back calls, median of {doc.get('repeats')}; µs/call "
            "includes the final synchronize; issue µs stops when the last call returns")


def _unet_note(doc: dict) -> str:
    patch = "x".join(str(p) for p in doc.get("patch", []))
    return (f"batch {doc.get('batch')}, patch {patch}, fp16 autocast, median of "
            f"{doc.get('steps')} steps after {doc.get('warmup_steps')} warm-up steps; first step "
            "includes cuDNN autotuning and any compilation")


def console_summary(docs: dict, max_rows: int = 40) -> str:
    """The compact version for the end of a log: fp16 kernel tables (other dtypes as geometric
    means), every failed check, host overhead and U-Net tables."""
    parts = []
    for key, title in (("kernel", "kernels, fp16"),
                       ("kernel_activation", "kernels + activation, fp16")):
        doc = docs.get(key)
        if not doc:
            continue
        nj = doc.get("normjit", {})
        parts += [f"## {title} | {doc.get('device')} | copy "
                  f"{bl.fmt_float(doc.get('copy', {}).get('tbps'))} TB/s | normjit "
                  + ("available" if nj.get("available") else f"NOT AVAILABLE ({nj.get('reason')})")]
        table = bl.kernel_table(doc, dtypes=["fp16"])
        lines = table.splitlines()
        if len(lines) > max_rows + 2:
            lines = lines[: max_rows + 2] + [f"... ({len(lines) - max_rows - 2} more rows in "
                                             "results.md)"]
        parts += lines
        dtypes = {m["dtype"] for m in doc.get("measurements", [])}
        if dtypes - {"fp16"}:
            parts += ["", bl.kernel_speedup_summary(doc)]
        suspects = [c for c in doc.get("checks", []) if c.get("ok") and c.get("suspect")]
        if suspects:
            parts.append(f"?? {len(suspects)} checks within tolerance but over 10x torch eager's "
                         "error (WARN in results.md)")
        problems = bl.failed_checks(doc) + bl.kernel_errors(doc)
        if problems:
            parts.append(f"!! {len(bl.failed_checks(doc))} failed checks, "
                         f"{len(bl.kernel_errors(doc))} errors:")
            for p in problems[:12]:
                what = p.get("error") or f"worst {bl.fmt_sci(p.get('worst'))} > {p.get('tol')}"
                parts.append(f"   {p.get('peer')} {bl.fmt_shape(p['shape'])} {p['dtype']} "
                             f"{p['layout']} {p['mode']} {p.get('activation', 'none')}: {what}")
        parts.append("")
    if docs.get("host_overhead"):
        parts += ["## host overhead (" + _host_note(docs["host_overhead"]) + ")",
                  bl.host_table(docs["host_overhead"]), ""]
    if docs.get("unet"):
        parts += ["## U-Net (" + _unet_note(docs["unet"]) + ")", bl.unet_table(docs["unet"]), ""]
    if docs.get("policy"):
        parts += _policy_console(docs["policy"])
    if docs.get("cold_start"):
        parts += _cold_console(docs["cold_start"])
    return "\n".join(parts)


def _policy_console(doc: dict, max_rows: int = 6) -> list[str]:
    """The summary sentence, then only the configurations outside the tolerance (the full table
    is in results.md), then problems; at most max_rows of each, to keep the log tail short."""
    parts = [f"## policy: bounded vs exact | {doc.get('device')}", bench_policy.summary_line(doc)]
    outside = [r for r in doc.get("comparisons", []) if r.get("within") is False]
    if outside:
        parts += ["outside the tolerance:",
                  bench_policy.policy_table(dict(doc, comparisons=outside[:max_rows]))]
        if len(outside) > max_rows:
            parts.append(f"... ({len(outside) - max_rows} more in results.md)")
    issues = bench_policy.problems(doc)
    parts += [f"!! {line}" for line in issues[:max_rows]]
    if len(issues) > max_rows:
        parts.append(f"!! ... ({len(issues) - max_rows} more in results.md)")
    return parts + [""]


def _cold_console(doc: dict) -> list[str]:
    """The cold-start table without its notes column, the levels table, then problems."""
    patch = "x".join(str(p) for p in doc.get("patch") or [])
    parts = [f"## cold start (U-Net fwd+bwd, batch {doc.get('batch')}, patch {patch}; cost = "
             "first step - warm step, new process per row; targets <= 1000 ms cold, <= 50 ms "
             "warm)", bench_cold_start.cold_table(doc, notes=False)]
    lv = doc.get("levels")
    if lv:
        parts += ["", "cache levels:", bench_cold_start.levels_table(lv)]
        parts += [f"?? {line}" for line in bench_cold_start.levels_notes(lv)]
    parts += [f"!! {line}" for line in bench_cold_start.failures(doc)]
    return parts + [""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for results.json, results.md, "
                                                "bandwidth.png")
    p.add_argument("--kernel", help="bench_instance_norm.py --out folder (plain)")
    p.add_argument("--kernel-act", help="bench_instance_norm.py --out folder (activation)")
    p.add_argument("--host", help="bench_host_overhead.py --out folder")
    p.add_argument("--unet", help="bench_unet.py --out folder")
    p.add_argument("--policy", help="bench_policy.py --out folder")
    p.add_argument("--cold", help="bench_cold_start.py --out folder")
    p.add_argument("--steps", help="gpu_check.sh step-status file")
    p.add_argument("--console", action="store_true", help="print the compact summary")
    args = p.parse_args(argv)

    def join(folder, name):
        return os.path.join(folder, name) if folder else None

    docs = {
        "kernel": load_json(join(args.kernel, "results.json")),
        "kernel_activation": load_json(join(args.kernel_act, "results.json")),
        "host_overhead": load_json(join(args.host, "host_overhead.json")),
        "unet": load_json(join(args.unet, "unet.json")),
        "policy": load_json(join(args.policy, "policy.json")),
        "cold_start": load_json(join(args.cold, "cold_start.json")),
    }
    steps = read_steps(args.steps)
    os.makedirs(args.out, exist_ok=True)
    merged = {"gpu_check": {"steps": steps, "date": bl.now_iso(), "git": bl.git_revision()}}
    merged.update({k: v for k, v in docs.items() if v is not None})
    bl.write_json(os.path.join(args.out, "results.json"), merged)
    bl.write_text(os.path.join(args.out, "results.md"), full_markdown(docs, steps))
    png = join(args.kernel, "bandwidth.png")
    if png and os.path.exists(png):
        shutil.copyfile(png, os.path.join(args.out, "bandwidth.png"))
    if args.console:
        print(console_summary(docs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
