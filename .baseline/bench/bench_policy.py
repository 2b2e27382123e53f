#!/usr/bin/env python3
"""Bounded vs exact kernel policy: is the bounded default within 10 % of the exact policy?

The policy (NORMJIT_POLICY=exact, else bounded) is read from the environment when a plan is
built, and plans are cached for the life of a process, so each policy runs the kernel benchmark
(bench_instance_norm.py, the same timer, inputs and correctness check) in a fresh process of its
own, with a fresh NORMJIT_CACHE_DIR so that its compile count is the number of distinct kernels
the policy needs. The bounded run also measures torch eager, the peer, for scale.

Default: the nnU-Net ladder (bench_instance_norm.py's default shapes), fp16, NCDHW and NDHWC,
fwd and fwd+bwd. Per configuration: bounded µs, exact µs, their ratio and whether bounded is
within the tolerance (bounded <= 1.10 x exact).

Outputs in --out: policy.json and policy.md (the comparison), bounded/ and exact/ (each run's own
results.json and results.md). Exit status: 0 when both runs measured everything and every check
passed (a ratio over the tolerance is reported, not failed: it is a target), 1 otherwise, 2 without
a GPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchlib as bl  # noqa: E402

POLICIES = ("bounded", "exact")
KERNEL_BENCH = os.path.join(HERE, "bench_instance_norm.py")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=None,
                   help="N,C,D,H,W shapes; default: bench_instance_norm.py's (the nnU-Net "
                        "ladder), or its 3 --quick shapes")
    p.add_argument("--dtypes", default="fp16", help="comma list of fp16,bf16,fp32")
    p.add_argument("--layouts", default="ncdhw,ndhwc", help="ncdhw and/or ndhwc")
    p.add_argument("--modes", default="fwd,fwdbwd", help="fwd and/or fwdbwd")
    p.add_argument("--tolerance", type=float, default=0.10,
                   help="bounded may be this much slower than exact (0.10 = 10 %%)")
    p.add_argument("--warmup", type=float, default=25, help="warm-up time per timing, ms")
    p.add_argument("--rep", type=float, default=100, help="repetition time per timing, ms")
    p.add_argument("--no-eager", action="store_true", help="skip the torch eager peer")
    p.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    p.add_argument("--timeout", type=float, default=600, help="seconds per policy run")
    p.add_argument("--keep-caches", action="store_true",
                   help="keep the per-policy disk caches (their paths are printed)")
    p.add_argument("--out", default=bl.default_out_dir(), help="output folder ($OUT if set)")
    p.add_argument("--quick", action="store_true", help="3 shapes (largest, medium, smallest)")
    args = p.parse_args(argv)
    if args.shapes:
        args.shapes = bl.parse_shapes(args.shapes)
    else:
        args.shapes = list(bl.QUICK_SHAPES if args.quick else bl.DEFAULT_SHAPES)
    args.dtypes = bl.parse_choices(args.dtypes, tuple(bl.DTYPE_SIZES), "dtype")
    args.layouts = bl.parse_choices(args.layouts, bl.LAYOUTS, "layout")
    args.modes = bl.parse_choices(args.modes, bl.MODES, "mode")
    if not 0 <= args.tolerance < 10:
        p.error("--tolerance is a fraction, e.g. 0.10")
    return args


def child_command(policy: str, out_dir: str, args: argparse.Namespace) -> list[str]:
    """bench_instance_norm.py for one policy: normjit (plus eager in the bounded run), no plot."""
    peers = "normjit" if policy == "exact" or args.no_eager else "eager,normjit"
    cmd = [sys.executable, KERNEL_BENCH, "--out", out_dir, "--peers", peers,
           "--shapes", *(bl.fmt_shape(s) for s in args.shapes),
           "--dtypes", ",".join(args.dtypes), "--layouts", ",".join(args.layouts),
           "--modes", ",".join(args.modes), "--warmup", str(args.warmup), "--rep", str(args.rep),
           "--no-plot"]
    return cmd + (["--no-check"] if args.no_check else [])


# --------------------------------------------------------------------------------------------------
# Comparison (pure Python: tested in test_bench_tools.py)
# --------------------------------------------------------------------------------------------------


def _normjit_by_config(doc: dict | None) -> tuple[dict, dict, dict]:
    """({config: normjit measurement}, {config: eager measurement}, {config: check})."""
    nj, eager, checks = {}, {}, {}
    for m in (doc or {}).get("measurements", []):
        if m.get("peer") == "normjit":
            nj[bl.config_key(m)] = m
        elif m.get("peer") == "eager":
            eager[bl.config_key(m)] = m
    for c in (doc or {}).get("checks", []):
        checks[bl.config_key(c)] = c
    return nj, eager, checks


def _check_state(check: dict | None) -> str | None:
    """'ok', 'FAIL' or None (not checked)."""
    if check is None:
        return None
    return "ok" if check.get("ok") and not check.get("error") else "FAIL"


def compare(bounded: dict | None, exact: dict | None, tolerance: float) -> list[dict]:
    """One row per configuration of either run: both normjit times, eager's, ratio, within."""
    b_nj, b_eager, b_checks = _normjit_by_config(bounded)
    e_nj, _, e_checks = _normjit_by_config(exact)
    keys = list(b_nj) + [k for k in e_nj if k not in b_nj]
    rows = []
    for key in keys:
        shape, dtype, layout, mode, act = key
        b_us = (b_nj.get(key) or {}).get("median_us")
        e_us = (e_nj.get(key) or {}).get("median_us")
        ratio = b_us / e_us if b_us and e_us else None
        errors = [f"{p}: {m['error']}" for p, m in (("bounded", b_nj.get(key)),
                                                    ("exact", e_nj.get(key)))
                  if m and m.get("error")]
        rows.append({
            "shape": list(shape), "dtype": dtype, "layout": layout, "mode": mode,
            "activation": act, "bounded_us": b_us, "exact_us": e_us,
            "eager_us": (b_eager.get(key) or {}).get("median_us"),
            "ratio": ratio, "within": None if ratio is None else ratio <= 1 + tolerance,
            "check_bounded": _check_state(b_checks.get(key)),
            "check_exact": _check_state(e_checks.get(key)),
            "error": "; ".join(errors) or None,
        })
    return rows


def summarize(rows: list[dict], tolerance: float) -> dict:
    """How many configurations are within the tolerance, the geometric-mean and worst ratio."""
    measured = [r for r in rows if r["ratio"] is not None]
    worst = max(measured, key=lambda r: r["ratio"], default=None)
    return {
        "configs": len(rows),
        "measured": len(measured),
        "within": sum(1 for r in measured if r["within"]),
        "tolerance": tolerance,
        "geomean_ratio": bl.geomean(r["ratio"] for r in measured),
        "worst_ratio": worst["ratio"] if worst else None,
        "worst_config": _label(worst) if worst else None,
    }


def _label(row: dict) -> str:
    return f"{bl.fmt_shape(row['shape'])} {row['dtype']} {row['layout']} {row['mode']}"


def _checks_cell(row: dict) -> str:
    states = [row.get("check_bounded"), row.get("check_exact")]
    if states == [None, None]:
        return bl.DASH
    return " / ".join(s or bl.DASH for s in states)


def policy_table(doc: dict) -> str:
    """shape | dtype | layout | mode | eager µs | bounded µs | exact µs | bounded/exact | within |
    checks (bounded / exact)."""
    tol = doc.get("tolerance", 0.10)
    rows = []
    for r in doc.get("comparisons", []):
        within = bl.DASH if r.get("within") is None else ("yes" if r["within"] else "NO")
        rows.append([bl.fmt_shape(r["shape"]), r["dtype"], r["layout"], r["mode"],
                     bl.fmt_time(r.get("eager_us")), bl.fmt_time(r.get("bounded_us")),
                     bl.fmt_time(r.get("exact_us")), bl.fmt_float(r.get("ratio")),
                     within, _checks_cell(r)])
    return bl.md_table(["shape", "dtype", "layout", "mode", "eager µs", "bounded µs", "exact µs",
                        "bounded / exact", f"within {tol:.0%}", "check b / e"], rows)


def summary_line(doc: dict) -> str:
    """One sentence: within count, geomean and worst ratio, kernels each policy compiled."""
    s = doc.get("summary") or {}
    runs = doc.get("runs") or {}
    kernels = ", ".join(f"{p} {runs[p].get('kernels_compiled', bl.DASH)}"
                        for p in POLICIES if p in runs)
    text = (f"bounded within {s.get('tolerance', 0.10):.0%} of exact on {s.get('within', 0)} of "
            f"{s.get('measured', 0)} configurations; geomean bounded/exact "
            f"{bl.fmt_float(s.get('geomean_ratio'), 3)}, "
            f"worst {bl.fmt_float(s.get('worst_ratio'), 3)}"
            + (f" ({s['worst_config']})" if s.get("worst_config") else ""))
    if kernels:
        text += f"; kernels compiled (fresh disk cache each): {kernels}"
    return text


def problems(doc: dict) -> list[str]:
    """Failed runs, errors and failed checks, one line each."""
    lines = []
    for policy, run in (doc.get("runs") or {}).items():
        if run.get("failure"):
            lines.append(f"{policy} run: {run['failure']}")
    for r in doc.get("comparisons", []):
        if r.get("error"):
            lines.append(f"{_label(r)}: {r['error']}")
        if "FAIL" in (r.get("check_bounded"), r.get("check_exact")):
            lines.append(f"{_label(r)}: check failed (bounded {r.get('check_bounded')}, exact "
                         f"{r.get('check_exact')}); see {{bounded,exact}}/results.md")
        elif r.get("ratio") is None and not r.get("error"):
            lines.append(f"{_label(r)}: not measured by both runs")
    return lines


def policy_markdown(doc: dict, level: int = 1) -> str:
    h = "#" * level
    parts = [f"{h} Bounded vs exact policy", "",
             f"device: {doc.get('device')} | torch {doc.get('torch')} | timer {doc.get('timer')}; "
             "normjit medians in µs, each policy in its own process (NORMJIT_POLICY) with a fresh "
             "disk cache; bounded / exact > 1 means bounded is slower; checks: normjit vs torch "
             "in fp32, as in bench_instance_norm.py",
             "", summary_line(doc), "", policy_table(doc), ""]
    issues = problems(doc)
    if issues:
        parts += [f"{h}# Problems", ""] + [f"- {line}" for line in issues] + [""]
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------


def run_policy(policy: str, args: argparse.Namespace, launch=bl.run_child) -> tuple[dict, dict]:
    """Run the kernel benchmark under one policy; returns (run record, its results.json or {})."""
    out_dir = os.path.join(args.out, policy)
    shutil.rmtree(out_dir, ignore_errors=True)  # a results.json left by an earlier run is not ours
    cache = tempfile.mkdtemp(prefix=f"normjit-policy-{policy}-")
    # NORMJIT_POLICY=bounded is the default spelled out; a disabled disk cache is switched back on
    # because the compile count must be per policy, not per process history.
    env = bl.child_env({"NORMJIT_POLICY": policy, "NORMJIT_CACHE_DIR": cache,
                        "NORMJIT_DISABLE_DISK_CACHE": None})
    bl.log(f"== policy {policy}: {out_dir} (disk cache {cache})")
    try:
        run = launch(child_command(policy, out_dir, args), env=env, timeout=args.timeout)
    finally:
        if args.keep_caches:
            bl.log(f"   kept disk cache {cache}")
        else:
            shutil.rmtree(cache, ignore_errors=True)
    doc = _load(os.path.join(out_dir, "results.json"))
    run = dict(run, out=out_dir, failure=bl.child_failure(run))
    if not doc and not run["failure"]:
        run["failure"] = "no results.json"
    info = (doc.get("normjit") or {}).get("cache_info_end") or {}
    run["kernels_compiled"] = bl.compile_count(info)
    run["normjit_available"] = (doc.get("normjit") or {}).get("available")
    run["child_failures"] = doc.get("failures")
    return run, doc


def _load(path: str) -> dict:
    import json

    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def run_all(args: argparse.Namespace, launch=bl.run_child) -> dict:
    """Both policies, the comparison, policy.json and policy.md; returns the document."""
    os.makedirs(args.out, exist_ok=True)
    doc = {"benchmark": "policy", "started": bl.now_iso(), "git": bl.git_revision(),
           "tolerance": args.tolerance, "settings": vars(args), "runs": {}, "comparisons": []}
    child_docs = {}
    for policy in POLICIES:
        doc["runs"][policy], child_docs[policy] = run_policy(policy, args, launch)
        bl.write_json(os.path.join(args.out, "policy.json"), doc)
    first = child_docs["bounded"] or child_docs["exact"]
    for key in ("device", "torch", "cuda", "triton", "timer"):
        doc[key] = first.get(key)
    doc["comparisons"] = compare(child_docs["bounded"], child_docs["exact"], args.tolerance)
    doc["summary"] = summarize(doc["comparisons"], args.tolerance)
    doc["finished"] = bl.now_iso()
    issues = problems(doc)
    doc["failures"] = len(issues)
    bl.write_json(os.path.join(args.out, "policy.json"), doc)
    bl.write_text(os.path.join(args.out, "policy.md"), policy_markdown(doc))
    return doc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        bl.log("bench_policy: no CUDA device; nothing to measure")
        return 2
    doc = run_all(args)
    bl.log("")
    bl.log(policy_markdown(doc))
    bl.log(f"wrote {os.path.join(args.out, 'policy.json')} and policy.md")
    bl.log(f"bench_policy failures: {doc['failures']}; {summary_line(doc)}")
    return 0 if doc["failures"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
