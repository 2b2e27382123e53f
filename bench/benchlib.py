"""Helpers shared by normjit's Python benchmarks.

The first half of this module is pure Python (argument parsing, byte counting, statistics,
markdown tables, JSON output) so that it can be unit-tested on a machine without torch or a GPU:
see ``test_benchlib.py``. The second half (``gpu_*`` and environment helpers) imports torch lazily,
inside the functions that need it.

Conventions used by every benchmark:
- times are medians, in microseconds (``*_us``) or milliseconds (``*_ms``), never means;
- effective bandwidth counts *ideal* bytes (each input read once, each output written once) over
  the median time, and is reported as TB/s and as a percentage of a device-to-device copy measured
  in the same run;
- every measurement is a dict appended to a list and the whole document is rewritten atomically
  after each one, so a crash or a time-out keeps what was measured so far.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterable, Sequence

# --------------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------------

#: Element size in bytes of the dtypes the benchmarks accept, by short name.
DTYPE_SIZES = {"fp16": 2, "bf16": 2, "fp32": 4}
#: torch attribute name of each short dtype name.
TORCH_DTYPE_NAMES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
#: Memory layouts: ncdhw = contiguous, ndhwc = torch.channels_last_3d.
LAYOUTS = ("ncdhw", "ndhwc")
MODES = ("fwd", "fwdbwd")
PEERS = ("eager", "compile", "normjit")
ACTIVATIONS = ("none", "leaky_relu")
#: Order of peer columns in tables. normjit_unfused = normjit's plain norm + torch's activation.
PEER_ORDER = ("eager", "compile", "normjit_unfused", "normjit")
PEER_LABELS = {
    "eager": "eager",
    "compile": "compile",
    "normjit_unfused": "normjit unfused",
    "normjit": "normjit",
}
#: Correctness tolerances on normalized outputs (and gradients), by dtype.
TOLERANCES = {"fp32": 1e-3, "fp16": 2e-2, "bf16": 2e-2}

#: The nnU-Net ladder at batch 2, plus one non-cubic stage-0 patch and one channel count that is
#: not a multiple of 8 (30: channels-last moves 4-byte vectors of 2 fp16 channels, not 16 bytes).
DEFAULT_SHAPES = (
    (2, 32, 128, 128, 128),
    (2, 64, 64, 64, 64),
    (2, 128, 32, 32, 32),
    (2, 256, 16, 16, 16),
    (2, 320, 8, 8, 8),
    (2, 320, 4, 4, 4),
    (2, 32, 80, 192, 160),
    (2, 30, 128, 128, 128),
)
#: --quick: the largest, a medium and the smallest instance size.
QUICK_SHAPES = ((2, 32, 128, 128, 128), (2, 128, 32, 32, 32), (2, 320, 4, 4, 4))


# --------------------------------------------------------------------------------------------------
# Argument parsing
# --------------------------------------------------------------------------------------------------


def run_test_functions(namespace: dict) -> int:
    """Runs every test_* function of a test module without pytest (scripts/run_tests.sh falls back
    to this where pytest is missing); prints one line per test and returns the exit status."""
    failures = 0
    for name, fn in sorted(namespace.items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print(f"ok   {name}")
            except Exception as exc:  # noqa: BLE001
                failures += 1
                print(f"FAIL {name}: {type(exc).__name__}: {exc}")
    print(f"{failures} failed")
    return 1 if failures else 0


def parse_shape(text: str) -> tuple[int, ...]:
    """Parse '2,32,128,128,128' (or '2x32x128x128x128', with optional parentheses) into a tuple."""
    cleaned = text.strip().strip("()[]").replace("x", ",").replace(" ", "")
    parts = [p for p in cleaned.split(",") if p]
    if len(parts) != 5:
        raise ValueError(f"shape {text!r}: expected 5 sizes N,C,D,H,W, got {len(parts)}")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError as exc:
        raise ValueError(f"shape {text!r}: sizes must be integers") from exc
    if any(s <= 0 for s in shape):
        raise ValueError(f"shape {text!r}: sizes must be positive")
    return shape


def parse_shapes(items: Iterable[str]) -> list[tuple[int, ...]]:
    """Parse shapes given as separate arguments and/or separated by ';' within one argument."""
    shapes = []
    for item in items:
        for piece in item.split(";"):
            if piece.strip():
                shapes.append(parse_shape(piece))
    if not shapes:
        raise ValueError("no shapes given")
    return shapes


def parse_choices(text: str, allowed: Sequence[str], what: str) -> list[str]:
    """Parse a comma-separated list, checking every item against ``allowed``; keeps order, no dups."""
    items = []
    for raw in text.split(","):
        item = raw.strip().lower()
        if not item:
            continue
        if item not in allowed:
            raise ValueError(f"unknown {what} {item!r}; expected one of {', '.join(allowed)}")
        if item not in items:
            items.append(item)
    if not items:
        raise ValueError(f"no {what} given")
    return items


def default_out_dir() -> str:
    """--out default: $OUT when set (the GPU machine's result folder), else ./bench_out."""
    return os.environ.get("OUT") or os.path.join(os.getcwd(), "bench_out")


# --------------------------------------------------------------------------------------------------
# Byte counting and derived metrics
# --------------------------------------------------------------------------------------------------


def numel(shape: Sequence[int]) -> int:
    """Number of elements of a tensor of this shape."""
    return math.prod(shape)


def ideal_bytes(shape: Sequence[int], dtype: str, mode: str) -> int:
    """Bytes an ideal kernel moves: fwd reads x and writes y (2 tensors); the backward reads x and
    dy and writes dx (3 tensors), so fwd+bwd moves 5. Per-channel parameters, statistics and weight
    gradients are ignored: they are at most a few kilobytes. A fused activation changes nothing
    (the backward recomputes the mask from x)."""
    tensors = {"fwd": 2, "bwd": 3, "fwdbwd": 5}[mode]
    return tensors * numel(shape) * DTYPE_SIZES[dtype]


def tbps(nbytes: float, time_us: float | None) -> float | None:
    """Effective bandwidth in TB/s (10^12 bytes per second) of moving nbytes in time_us µs."""
    if time_us is None or time_us <= 0:
        return None
    return nbytes / (time_us * 1e-6) / 1e12


def pct_of(value: float | None, reference: float | None) -> float | None:
    """value as a percentage of reference (None when either is missing)."""
    if value is None or not reference:
        return None
    return 100.0 * value / reference


def speedup(peer_us: float | None, subject_us: float | None) -> float | None:
    """How many times faster the subject is than the peer: peer time / subject time."""
    if peer_us is None or subject_us is None or subject_us <= 0:
        return None
    return peer_us / subject_us


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence."""
    return statistics.median(values)


def geomean(values: Iterable[float | None]) -> float | None:
    """Geometric mean of the positive values, ignoring None; None when there are none."""
    vals = [v for v in values if v is not None and v > 0]
    if not vals:
        return None
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


# --------------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------------

DASH = "—"


def fmt_shape(shape: Sequence[int]) -> str:
    """(2, 32, 128, 128, 128) -> '2,32,128,128,128'."""
    return ",".join(str(int(s)) for s in shape)


def fmt_time(value: float | None) -> str:
    """A time with 3–4 significant digits: 6972, 377, 41.3, 7.25; a dash when missing."""
    if value is None:
        return DASH
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_float(value: float | None, digits: int = 2) -> str:
    """A fixed-point number, or a dash when missing."""
    return DASH if value is None else f"{value:.{digits}f}"


def fmt_pct(value: float | None) -> str:
    """A percentage with one decimal, or a dash."""
    return DASH if value is None else f"{value:.1f} %"


def fmt_x(value: float | None) -> str:
    """A speed-up factor such as '12.3×' or '0.85×', or a dash."""
    if value is None:
        return DASH
    return f"{value:.1f}×" if value >= 10 else f"{value:.2f}×"


def fmt_sci(value: float | None) -> str:
    """A small error such as 3.1e-03, or a dash."""
    return DASH if value is None else f"{value:.1e}"


def md_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A GitHub markdown table. Cells are converted with str(); '|' inside cells is escaped."""

    def cell(value: object) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |",
             "| " + " | ".join("---" for _ in headers) + " |"]
    for row in rows:
        row = list(row)
        if len(row) != len(headers):
            raise ValueError(f"row has {len(row)} cells, table has {len(headers)} columns")
        lines.append("| " + " | ".join(cell(c) for c in row) + " |")
    return "\n".join(lines)


def short_error(exc: BaseException, limit: int = 300) -> str:
    """'TypeName: first line of the message', cut to ``limit`` characters."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    msg = f"{type(exc).__name__}: {first}"
    return msg if len(msg) <= limit else msg[: limit - 1] + "…"


def log(*parts: object) -> None:
    """Print a progress line immediately (benchmarks run under tee and time limits)."""
    print(*parts, flush=True)


# --------------------------------------------------------------------------------------------------
# Output files
# --------------------------------------------------------------------------------------------------


def sanitize(obj: object) -> object:
    """A copy of obj that strict JSON accepts: NaN and infinities become None, tuples lists,
    unknown objects their repr."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [sanitize(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return repr(obj)


def _publish(tmp: str, path: str) -> None:
    """Give a temporary file the usual permissions (mkstemp makes it private) and rename it."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


def write_json(path: str, doc: object) -> None:
    """Write JSON atomically (temp file + rename), so a reader never sees half a document."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(sanitize(doc), f, indent=1, allow_nan=False)
            f.write("\n")
        _publish(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text(path: str, text: str) -> None:
    """Write a text file atomically."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".txt", dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write(text if text.endswith("\n") else text + "\n")
    _publish(tmp, path)


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN/inf: map them to None."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def now_iso() -> str:
    """Local time as an ISO-8601 string, to date a run."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def git_revision() -> str | None:
    """The repository's HEAD commit (with '+dirty' when the tree has changes), if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        rev = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain"],
                               capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


# --------------------------------------------------------------------------------------------------
# Child processes (bench_policy.py, bench_cold_start.py)
# --------------------------------------------------------------------------------------------------


def child_env(overrides: dict[str, str | None]) -> dict[str, str]:
    """os.environ with overrides applied; a None value removes the variable."""
    env = dict(os.environ)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    return env


def run_child(cmd: Sequence[str], env: dict[str, str] | None = None,
              timeout: float | None = None) -> dict:
    """Run cmd to completion with its output going straight to ours (so that a log under tee sees
    it live); returns {'returncode', 'seconds', 'timed_out'}. Settings that a process reads once
    (NORMJIT_POLICY, the plan cache, CUDA and NVRTC start-up) are only cold in a fresh process,
    hence children. On a time-out the child is killed and returncode is None. The child stays in
    our process group: a `timeout` around the parent still reaches it."""
    sys.stdout.flush()
    sys.stderr.flush()
    t0 = time.perf_counter()
    proc = subprocess.Popen(list(cmd), env=env)
    try:
        returncode = proc.wait(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        returncode, timed_out = None, True
    except BaseException:  # KeyboardInterrupt, SIGTERM turned into an exception: no orphans
        proc.kill()
        proc.wait()
        raise
    return {"returncode": returncode, "seconds": time.perf_counter() - t0, "timed_out": timed_out}


def child_failure(run: dict) -> str | None:
    """Why a run_child() result is a failure ('timed out after 12 s', 'exit status 1'), or None."""
    if run.get("timed_out"):
        return f"timed out after {run.get('seconds', 0):.0f} s"
    if run.get("returncode"):
        return f"exit status {run['returncode']}"
    return None


# --------------------------------------------------------------------------------------------------
# Kernel-benchmark tables (used by bench_instance_norm.py and report.py)
# --------------------------------------------------------------------------------------------------


def config_key(m: dict) -> tuple:
    """The configuration a measurement or check belongs to."""
    return (tuple(m["shape"]), m["dtype"], m["layout"], m["mode"], m.get("activation", "none"))


def group_by_config(measurements: Iterable[dict]) -> dict[tuple, dict[str, dict]]:
    """{config: {peer: measurement}}, configs in first-seen order."""
    grouped: dict[tuple, dict[str, dict]] = {}
    for m in measurements:
        grouped.setdefault(config_key(m), {})[m["peer"]] = m
    return grouped


def is_suspect(worst: float | None, eager_worst: float | None) -> bool:
    """Within tolerance but clearly less accurate than torch eager in the same dtype (more than
    10x its error, and above 1e-3): the signature of a subtle bug (say, a biased variance on
    small instances) that a half-precision tolerance alone lets through."""
    if worst is None or eager_worst is None:
        return False
    return worst > max(10 * eager_worst, 1e-3)


def check_cell(check: dict | None) -> str:
    """'ok 3.1e-03' / 'WARN 5.0e-03' (ok, but suspect) / 'FAIL 5.0e-01' / 'error' / a dash: the
    worst normalized error of a check."""
    if check is None:
        return DASH
    if check.get("error"):
        return "error"
    worst = check.get("worst")
    if not check.get("ok"):
        return "FAIL " + fmt_sci(worst)
    return ("WARN " if check.get("suspect") else "ok ") + fmt_sci(worst)


def kernel_table(doc: dict, *, dtypes: Sequence[str] | None = None,
                 activation: str | None = None) -> str:
    """Markdown table of a kernel-benchmark document: one row per configuration.

    Columns: shape | dtype | layout | mode | <peer> µs for each peer measured | normjit TB/s |
    % of copy | × vs <peer> for each other peer | check. With the three default peers this is
    the spec's table plus the correctness column. ``dtypes``/``activation`` filter the rows."""
    measurements = [m for m in doc.get("measurements", [])
                    if (dtypes is None or m["dtype"] in dtypes)
                    and (activation is None or m.get("activation", "none") == activation)]
    grouped = group_by_config(measurements)
    peers = [p for p in PEER_ORDER if any(p in by_peer for by_peer in grouped.values())]
    others = [p for p in peers if p != "normjit"]
    checks = {config_key(c): c for c in doc.get("checks", [])}

    headers = ["shape", "dtype", "layout", "mode"]
    headers += [f"{PEER_LABELS[p]} µs" for p in peers]
    headers += ["normjit TB/s", "% of copy"]
    headers += [f"× vs {PEER_LABELS[p]}" for p in others]
    headers += ["check"]

    rows = []
    for key, by_peer in grouped.items():
        shape, dtype, layout, mode, _act = key
        times = {p: (by_peer.get(p) or {}).get("median_us") for p in peers}
        nj = by_peer.get("normjit") or {}
        row = [fmt_shape(shape), dtype, layout, mode]
        row += [fmt_time(times[p]) for p in peers]
        row += [fmt_float(nj.get("tbps")), fmt_pct(nj.get("pct_copy"))]
        row += [fmt_x(speedup(times[p], times.get("normjit"))) for p in others]
        row += [check_cell(checks.get(key))]
        rows.append(row)
    return md_table(headers, rows)


def kernel_time_table(doc: dict) -> str:
    """Markdown table of the peers' GPU time per call by CUPTI (bench_instance_norm.py
    --kernel-times): one row per configuration that has one, each peer's µs and, in brackets, the
    GPU activities (kernels, copies, memsets) a call launched; '—' where it was not measured and
    'error' where the profiler's records did not add up."""
    grouped = group_by_config(m for m in doc.get("measurements", [])
                              if "kernel_us" in m or "kernel_error" in m)
    peers = [p for p in PEER_ORDER if any(p in by_peer for by_peer in grouped.values())]
    others = [p for p in peers if p != "normjit"]
    headers = ["shape", "dtype", "layout", "mode"] + [f"{PEER_LABELS[p]} GPU µs" for p in peers]
    headers += [f"× vs {PEER_LABELS[p]}" for p in others] if "normjit" in peers else []
    rows = []
    for (shape, dtype, layout, mode, _act), by_peer in grouped.items():
        row = [fmt_shape(shape), dtype, layout, mode]
        for p in peers:
            m = by_peer.get(p) or {}
            if m.get("kernel_us") is not None:
                row.append(f"{fmt_time(m['kernel_us'])} ({m.get('gpu_activities_per_call')})")
            else:
                row.append("error" if m.get("kernel_error") else "—")
        if "normjit" in peers:
            nj = (by_peer.get("normjit") or {}).get("kernel_us")
            row += [fmt_x(speedup((by_peer.get(p) or {}).get("kernel_us"), nj)) for p in others]
        rows.append(row)
    return md_table(headers, rows)


def short_activity_name(name: str, limit: int = 70) -> str:
    """A GPU activity's name without 'void ' and its parameter list, cut at `limit` characters."""
    name = name.removeprefix("void ")
    depth = 0
    for i, ch in enumerate(name):  # the parameter list: the first '(' outside template brackets
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0:
            name = name[:i]
            break
    return name if len(name) <= limit else name[:limit - 1] + "…"


def normjit_work_lines(doc: dict) -> list[str]:
    """One markdown line per (layout, mode, GPU activities of one normjit call) that --kernel-times
    recorded, with its shapes: work beside normjit's own kernels (autograd's zero-fills, casts,
    layout copies) shows here, where the activity counts in the table above only hint at it."""
    seen: dict[tuple, dict[str, None]] = {}
    for m in doc.get("measurements", []):
        names = m.get("gpu_activity_names")
        if m.get("peer") == "normjit" and names:
            key = (m["layout"], m["mode"], tuple(short_activity_name(n) for n in names))
            seen.setdefault(key, {})[fmt_shape(m["shape"])] = None
    return [f"- {layout} {mode} ({'; '.join(shapes)}): {', '.join(names)}"
            for (layout, mode, names), shapes in seen.items()]


def kernel_speedup_summary(doc: dict) -> str:
    """Geometric-mean speed-up of normjit over each peer, per (activation, dtype, layout, mode)."""
    grouped = group_by_config(doc.get("measurements", []))
    peers = [p for p in PEER_ORDER if p != "normjit"
             and any(p in by_peer for by_peer in grouped.values())]
    buckets: dict[tuple, dict[str, list]] = {}
    for (shape, dtype, layout, mode, act), by_peer in grouped.items():
        nj = (by_peer.get("normjit") or {}).get("median_us")
        bucket = buckets.setdefault((act, dtype, layout, mode), {p: [] for p in peers})
        bucket.setdefault("pct", []).append((by_peer.get("normjit") or {}).get("pct_copy"))
        for p in peers:
            bucket[p].append(speedup((by_peer.get(p) or {}).get("median_us"), nj))
    headers = ["activation", "dtype", "layout", "mode", "shapes"]
    headers += [f"geomean × vs {PEER_LABELS[p]}" for p in peers] + ["normjit mean % of copy"]
    rows = []
    for (act, dtype, layout, mode), bucket in buckets.items():
        pcts = [v for v in bucket["pct"] if v is not None]
        row = [act, dtype, layout, mode, len(bucket["pct"])]
        row += [fmt_x(geomean(bucket[p])) for p in peers]
        row += [fmt_pct(sum(pcts) / len(pcts) if pcts else None)]
        rows.append(row)
    return md_table(headers, rows)


def failed_checks(doc: dict) -> list[dict]:
    """Checks that failed or raised."""
    return [c for c in doc.get("checks", []) if c.get("error") or not c.get("ok")]


def kernel_errors(doc: dict) -> list[dict]:
    """Measurements that raised."""
    return [m for m in doc.get("measurements", []) if m.get("error")]


def kernel_header(doc: dict) -> str:
    """A few lines naming the device, versions, timer and copy bandwidth of a kernel run."""
    nj = doc.get("normjit", {})
    copy = doc.get("copy", {})
    lines = [
        f"device: {doc.get('device')} | torch {doc.get('torch')} | triton {doc.get('triton')} | "
        f"timer: {doc.get('timer')} | normjit: "
        + ("available" if nj.get("available") else f"NOT AVAILABLE ({nj.get('reason')})"),
        f"device-to-device copy: {fmt_float(copy.get('tbps'))} TB/s "
        f"(1 GiB copy_, bytes read + written; end of run: {fmt_float(copy.get('tbps_end'))} TB/s)",
        "times are medians in µs; TB/s and % of copy use ideal bytes (fwd: read x + write y; "
        "fwd+bwd: also read x, dy + write dx)",
        "check: worst normalized error of normjit vs torch eager computed in fp32 from the same "
        "inputs: |a-b|/(1+|ref|) for y and dx, |a-b|/max(1,max|ref|) for dweight and dbias; "
        "ok when <= 1e-3 (fp32) or 2e-2 (fp16, bf16); WARN: ok, but over 10x the error of torch "
        "eager in the same dtype (and over 1e-3)",
    ]
    return "\n".join(lines)


def kernel_markdown(doc: dict, *, dtypes: Sequence[str] | None = None, level: int = 2) -> str:
    """The whole markdown report of a kernel-benchmark document: header, one table per activation,
    the geometric-mean summary, and every failed check or error spelled out."""
    h = "#" * level
    parts = [f"{h} InstanceNorm3d kernels", "", kernel_header(doc), ""]
    activations = []
    for m in doc.get("measurements", []):
        act = m.get("activation", "none")
        if act not in activations:
            activations.append(act)
    for act in activations:
        title = "plain InstanceNorm3d (affine)" if act == "none" else \
            f"InstanceNorm3d + {act} (normjit = fused; normjit unfused = normjit norm + torch {act})"
        parts += [f"{h}# {title}", "", kernel_table(doc, dtypes=dtypes, activation=act), ""]
    if doc.get("measurements"):
        parts += [f"{h}# Geometric-mean speed-up of normjit", "", kernel_speedup_summary(doc), ""]
    if any("kernel_us" in m or "kernel_error" in m for m in doc.get("measurements", [])):
        parts += [f"{h}# GPU time per call by CUPTI (the work's own execution; in brackets the GPU "
                  "activities a call launched)", "", kernel_time_table(doc), ""]
        work = normjit_work_lines(doc)
        if work:
            parts += [f"{h}# The GPU activities of one normjit call, in launch order", "", *work, ""]
    problems = failed_checks(doc)
    errors = kernel_errors(doc)
    suspects = [c for c in doc.get("checks", []) if c.get("ok") and c.get("suspect")]
    if problems or errors or suspects:
        parts += [f"{h}# Problems", ""]
        for c in suspects:
            parts.append(f"- warn {fmt_shape(c['shape'])} {c['dtype']} {c['layout']} {c['mode']} "
                         f"{c.get('activation', 'none')}: worst {fmt_sci(c.get('worst'))} vs "
                         f"torch eager {fmt_sci(c.get('eager_worst'))} in the same dtype")
        for c in problems:
            parts.append(f"- check {fmt_shape(c['shape'])} {c['dtype']} {c['layout']} {c['mode']} "
                         f"{c.get('activation', 'none')}: "
                         + (c.get("error") or f"worst {fmt_sci(c.get('worst'))} > tol {c.get('tol')} "
                            "(max abs " + ", ".join(f"{k} {fmt_sci(v)}" for k, v in
                                                    (c.get("max_abs") or {}).items()) + ")"))
        for m in errors:
            parts.append(f"- {m['peer']} {fmt_shape(m['shape'])} {m['dtype']} {m['layout']} "
                         f"{m['mode']} {m.get('activation', 'none')}: {m['error']}")
        parts.append("")
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------------
# Host-overhead and U-Net tables (used by their benchmarks and report.py)
# --------------------------------------------------------------------------------------------------


def host_table(doc: dict) -> str:
    """peer | µs/call for each grad mode | ratio to F.instance_norm in that mode."""
    results = doc.get("results", [])
    modes = []
    for r in results:
        if r["mode"] not in modes:
            modes.append(r["mode"])
    peers = []
    for r in results:
        if r["peer"] not in peers:
            peers.append(r["peer"])
    by = {(r["peer"], r["mode"]): r for r in results}
    ref_peer = doc.get("reference_peer", "F.instance_norm")
    headers = ["peer"]
    for mode in modes:
        headers += [f"{mode} µs/call", f"{mode} issue µs", f"{mode} × {ref_peer}"]
    rows = []
    for peer in peers:
        row = [peer]
        for mode in modes:
            r = by.get((peer, mode), {})
            ref = by.get((ref_peer, mode), {}).get("total_us")
            if r.get("error"):
                row += ["error", DASH, DASH]
                continue
            total = r.get("total_us")
            ratio = None if total is None or not ref else total / ref
            row += [fmt_time(total), fmt_time(r.get("issue_us")), fmt_float(ratio)]
        rows.append(row)
    return md_table(headers, rows)


def unet_table(doc: dict) -> str:
    """variant | first step s | median step ms | × vs the first variant | losses | compiles."""
    variants = doc.get("variants", [])
    ref = next((v for v in variants if v.get("median_ms") and not v.get("error")), None)
    headers = ["variant", "first step s", "median step ms", "× vs " + (ref["name"] if ref else "ref"),
               "loss@1", "loss@3", "Δloss@1 vs ref", "normjit compiles", "note"]
    rows = []
    for v in variants:
        losses = v.get("losses") or []
        l1 = losses[0] if len(losses) > 0 else None
        l3 = losses[2] if len(losses) > 2 else None
        ref_l1 = (ref.get("losses") or [None])[0] if ref else None
        dl1 = None if l1 is None or ref_l1 is None else abs(l1 - ref_l1)
        note = v.get("error") or v.get("note") or ""
        rows.append([
            v.get("name"),
            fmt_float(v.get("first_step_s")),
            fmt_time(v.get("median_ms")),
            fmt_x(speedup(ref.get("median_ms") if ref else None, v.get("median_ms"))),
            fmt_float(l1, 4), fmt_float(l3, 4), fmt_sci(dl1),
            DASH if v.get("normjit_compiles") is None else str(v["normjit_compiles"]),
            note,
        ])
    return md_table(headers, rows)


# --------------------------------------------------------------------------------------------------
# GPU side (torch imported lazily)
# --------------------------------------------------------------------------------------------------


#: What gpu_clocks() asks nvidia-smi for, in this order.
CLOCK_FIELDS = ("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw", "clocks_throttle_reasons.active")


def parse_clocks(csv_line: str) -> str:
    """nvidia-smi's 'noheader,nounits' CSV of CLOCK_FIELDS (or of all but the last) -> 'sm 1980
    MHz, mem 2619 MHz, 52 C, 310 W, throttle 0x0'; '' for anything else (an error message, a field
    the driver does not report)."""
    parts = [p.strip() for p in csv_line.strip().split(",")]
    if len(parts) not in (len(CLOCK_FIELDS), len(CLOCK_FIELDS) - 1):
        return ""
    try:
        sm, mem, temp, power = (float(p) for p in parts[:4])
        throttle = f", throttle {int(parts[4], 16):#x}" if len(parts) > 4 else ""
    except ValueError:
        return ""
    return f"sm {sm:.0f} MHz, mem {mem:.0f} MHz, {temp:.0f} C, {power:.0f} W{throttle}"


def gpu_clocks() -> str:
    """The GPU's clocks, temperature, power and throttle reasons now (parse_clocks' text), or ''
    where nvidia-smi is missing or fails. For telling apart timings of one build that differ
    between device calls (the fp16 resident kernels varied 10-15 %, session 36): read it right
    after a timing, while the clocks still are what the timed kernels ran at. The device is the
    first of CUDA_VISIBLE_DEVICES where that is an index, else the current CUDA device."""
    if shutil.which("nvidia-smi") is None:
        return ""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if visible.isdigit():
        index = visible
    else:
        import torch

        index = str(torch.cuda.current_device()) if torch.cuda.is_available() else "0"
    for fields in (CLOCK_FIELDS, CLOCK_FIELDS[:-1]):  # drivers that renamed the throttle reasons
        try:
            out = subprocess.run(["nvidia-smi", "--id=" + index, "--query-gpu=" + ",".join(fields),
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return ""
        if out.returncode == 0:
            return parse_clocks(out.stdout)
    return ""


def torch_dtype(name: str):
    """The torch dtype for a short name ('fp16' -> torch.float16)."""
    import torch

    return getattr(torch, TORCH_DTYPE_NAMES[name])


def environment() -> dict:
    """Device name, versions and the repository revision, recorded in every result file."""
    import torch

    env = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "git": git_revision(),
        "date": now_iso(),
        "normjit_cache_dir": os.environ.get("NORMJIT_CACHE_DIR"),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:  # noqa: BLE001 - triton is optional
        env["triton"] = None
    return env


def load_normjit() -> tuple[object | None, dict]:
    """Import normjit and ask whether it can run here. Returns (module or None, info dict)."""
    info: dict = {"available": False, "reason": None, "version": None}
    try:
        import normjit
    except Exception as exc:  # noqa: BLE001 - report any import failure, keep benchmarking peers
        info["reason"] = "import failed: " + short_error(exc)
        return None, info
    info["version"] = getattr(normjit, "__version__", None)
    for sub in ("functional", "nn"):
        if not hasattr(normjit, sub):
            try:
                importlib.import_module(f"normjit.{sub}")
            except Exception as exc:  # noqa: BLE001
                info["reason"] = f"import normjit.{sub} failed: " + short_error(exc)
                return None, info
    try:
        ok = bool(normjit.is_available())
    except Exception as exc:  # noqa: BLE001
        info["reason"] = "is_available() raised: " + short_error(exc)
        return None, info
    if not ok:
        why = getattr(normjit, "unavailable_reason", lambda: "")
        try:
            why = why()
        except Exception as exc:  # noqa: BLE001
            why = short_error(exc)
        info["reason"] = "normjit.is_available() is False" + (f": {why}" if why else "")
        return None, info
    info["available"] = True
    return normjit, info


def require_gpu_normjit(prog: str):
    """(torch, normjit) for a script that runs normjit's kernels, or None after saying on stderr why
    it cannot run here (no CUDA GPU, or normjit not available)."""
    import torch

    if not torch.cuda.is_available():
        print(f"{prog}: needs a CUDA GPU (none here)", file=sys.stderr)
        return None
    import normjit

    if not normjit.is_available():
        print(f"{prog}: normjit is not available: {normjit.unavailable_reason()}", file=sys.stderr)
        return None
    return torch, normjit


def normjit_cache_info(normjit) -> dict | None:
    """normjit.cache_info() as a JSON-friendly dict, or None if it is missing or raises."""
    if normjit is None:
        return None
    try:
        return sanitize(dict(normjit.cache_info()))
    except Exception as exc:  # noqa: BLE001
        return {"error": short_error(exc)}


def compile_count(info: dict | None) -> int | None:
    """The number of NVRTC compiles in a cache_info() dict: the key 'compiles' when present, else
    the first integer-valued key whose name mentions 'compile' and is not a time."""
    if not info or "error" in info:
        return None
    if isinstance(info.get("compiles"), int):
        return info["compiles"]
    for key, value in info.items():
        low = key.lower()
        if "compile" in low and isinstance(value, int) and not isinstance(value, bool) \
                and not any(t in low for t in ("time", "_s", "_ms", "_us", "sec")):
            return value
    return None


def counter_delta(before: dict | None, after: dict | None) -> dict:
    """Changes of the integer counters between two cache_info() dicts (keys that changed only),
    e.g. {'compiles': 2, 'plan_misses': 2, 'layout_copies': 0}: what one configuration cost."""
    if not before or not after:
        return {}
    delta = {}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and isinstance(old, int) \
                and value != old:
            delta[key] = value - old
    return delta


_TIMER = None


def timer_name() -> str:
    """'triton.testing.do_bench' when triton imports, else 'cuda_events+l2_flush'."""
    global _TIMER
    if _TIMER is None:
        try:
            from triton.testing import do_bench  # noqa: F401

            _TIMER = "triton.testing.do_bench"
        except Exception:  # noqa: BLE001
            _TIMER = "cuda_events+l2_flush"
    return _TIMER


def gpu_time_us(fn: Callable[[], object], warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median GPU time of fn() in µs, with the L2 cache flushed before every repetition.

    Uses triton.testing.do_bench (CUDA events, a 256 MB buffer zeroed between reps) when triton
    imports, else the same procedure written out with CUDA events."""
    if timer_name() == "triton.testing.do_bench":
        from triton.testing import do_bench

        return 1000.0 * do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    return _events_time_us(fn, warmup_ms, rep_ms)


def l2_flush_buffer():
    """256 MB on the GPU, more than any L2: zeroing it between repetitions evicts what fn left."""
    import torch

    return torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")


def _events_time_us(fn: Callable[[], object], warmup_ms: float, rep_ms: float) -> float:
    """CUDA-event timing with an L2 flush (write a 256 MB buffer) between repetitions."""
    import torch

    flush = l2_flush_buffer()
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush.zero_()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)
    n_warmup = max(1, int(warmup_ms / estimate_ms))
    n_rep = max(1, int(rep_ms / estimate_ms))
    for _ in range(n_warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    for i in range(n_rep):
        flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return 1000.0 * median([s.elapsed_time(e) for s, e in zip(starts, ends)])


def _per_call_groups(records: Sequence[tuple], calls: int, what: str) -> list[list[tuple]]:
    """`records` ((start, end, ...) of every GPU activity of `calls` calls of one function) in
    start order, cut into one group per call: a call's activities are consecutive."""
    if calls <= 0 or not records or len(records) % calls:
        raise ValueError(f"{len(records)} {what} cannot be {calls} calls of the same {what}")
    size = len(records) // calls
    ordered = sorted(records)
    return [ordered[i:i + size] for i in range(0, len(ordered), size)]


def per_call_kernel_times_us(kernels: Sequence[tuple[float, float]], calls: int) -> tuple[float, int]:
    """(median over calls of the GPU time a call's kernels took, kernels per call) from the
    (start, end) µs of every kernel the profiler saw in `calls` calls of one function.

    A call that launches k kernels contributes the sum of its k durations (gaps between them are
    not counted: they are launch latency)."""
    groups = _per_call_groups(kernels, calls, "kernels")
    return median([sum(end - start for start, end in g) for g in groups]), len(groups[0])


def per_call_times_after_flush(records: Sequence[tuple[float, float, str]], calls: int,
                               flush_name: str, names_out: list[str] | None = None) -> tuple[float, int]:
    """(median over calls of the GPU time of a call's own work, GPU activities per call) from the
    (start, end, name) of every GPU activity the profiler saw in `calls` iterations of [the L2
    flush, the call]: in start order, each iteration's first activity must be the flush (named
    `flush_name`), and the rest of the iteration is the call's (kernels, copies, memsets of a peer
    whose kernel names are not known in advance: torch eager, torch.compile). names_out, when
    given, receives the names of one call's activities in launch order."""
    groups = _per_call_groups(records, calls, "GPU activities")
    if len(groups[0]) < 2:
        raise ValueError("the calls launched no GPU work of their own")
    for g in groups:
        if g[0][2] != flush_name:
            raise ValueError(f"an iteration starts with {g[0][2]!r}, not the L2 flush {flush_name!r}: "
                             "the calls do not launch the same work every time")
    if names_out is not None:
        names_out.extend(name for _, _, name in groups[0][1:])
    return median([sum(end - start for start, end, _ in g[1:]) for g in groups]), len(groups[0]) - 1


def kernel_time_us(fn: Callable[[], object], name_prefix: str | None = "normjit_",
                   calls: int = 50, names_out: list[str] | None = None) -> tuple[float, int]:
    """(median GPU time of the kernels fn() launches whose names start with name_prefix, kernels
    per call), from CUPTI's kernel records (torch.profiler), with the L2 flushed before every call.
    name_prefix None: all the GPU work fn() launches (a peer's), told from the flush's by position
    (per_call_times_after_flush), its names in launch order into names_out when given.

    gpu_time_us measures from a CUDA event before fn to one after it, so it also counts the gap
    from the event to the kernel's start (session 2: the NCDHW deep kernels 4.0-4.3 µs in Nsight
    Compute, 5.8-6.0 by events); this counts only the kernels' own execution, the "GPU time per
    kernel" of issue 3's deep-stage target."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    flush = l2_flush_buffer()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()

    def gpu_records(body):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            body()
            torch.cuda.synchronize()
        return [(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                if e.device_type == DeviceType.CUDA]

    def iterations():
        for _ in range(calls):
            flush.zero_()
            fn()

    if name_prefix is None:
        flush_names = {name for _, _, name in gpu_records(flush.zero_)}
        if len(flush_names) != 1:
            raise ValueError(f"the L2 flush launched {sorted(flush_names)}, not one GPU activity")
        return per_call_times_after_flush(gpu_records(iterations), calls, flush_names.pop(), names_out)
    kernels = [(start, end) for start, end, name in gpu_records(iterations) if name.startswith(name_prefix)]
    return per_call_kernel_times_us(kernels, calls)


def copy_bandwidth(nbytes: int = 1 << 30) -> dict:
    """Device-to-device copy bandwidth: dst.copy_(src) of an nbytes tensor, counting bytes read
    plus bytes written, over the median time. This is the practical ceiling that % of copy uses."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t_us = gpu_time_us(lambda: dst.copy_(src))
    moved = 2 * nbytes
    del src, dst
    torch.cuda.empty_cache()
    return {"bytes": moved, "median_us": t_us, "tbps": tbps(moved, t_us)}


def wall_time_s(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of one call of fn, synchronizing the device before and after: used for
    first calls, which include run-time compilation."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def free_gpu_memory() -> None:
    """Return cached blocks so that the next configuration starts from a clean allocator."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
