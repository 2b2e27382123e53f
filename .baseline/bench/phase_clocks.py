"""Where a resident-split step's or a channels-last kernel's time goes, on the GPU (kernels/phase_clock.cuh).

    python3 bench/phase_clocks.py --shapes 2,32,128,128,128 2,64,64,128,128
    python3 bench/phase_clocks.py --layouts ndhwc --shapes 2,128,32,32,32 2,256,16,16,16 | tee log
    python3 bench/phase_clocks.py --summarize log     # no GPU: the channels-last lines in µs

Compiles normjit's kernels with -DNJ_PHASE_CLOCKS=1 (added to NORMJIT_NVRTC_OPTIONS here, before
normjit loads: a disk-cache key of its own) and runs one forward and one backward (fp16, affine) per
shape and layout (--layouts, default NCDHW), after a warm-up call. Thread 0 of every 33rd CTA prints, from the GPU, its
mean SM cycles per phase of a steady step:

    nj_phase backward chunks 342 grid 264 cta 0 steps 86 (counted 78): cycles a step 8318 = A 370 + ...

Then each kernel runs again in the default build (this process cannot switch builds, so a child
process runs bench/kernel_times.py) for its time in µs: cycles a step x steps against that time
gives the clock the cycles ran at. Shapes whose instances do not take the resident split print no
nj_phase lines (`normjit explain` says which split a shape takes).

Channels-last kernels (`--layouts ndhwc`) print one nj_nhwc_phase line per sampled CTA: its
cycles in each phase of its round (the statistics pass's loads and sums, the CTA sums, the
exchange's arrival, merge and second arrival, the output pass, the deep backward's cluster step) and %globaltimer at its start and
end. `--summarize` turns a saved log into, per kernel, the sampled CTAs' mean of each phase in µs
(each CTA's cycles at its own clock: cycles over its globaltimer span) and how far apart the
CTAs started and ended. With `--every 1` every CTA prints, and the summary adds, per arrival of the
split's exchange, how long a CTA waited and how much of that was the peers' skew (until the
instance's last CTA was ready to arrive) and how much the round trip after it.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402

PROBE_OPTION = "-DNJ_PHASE_CLOCKS=1"
EVERY_OPTION = "-DNJ_PHASE_CLOCKS_EVERY="  # + N: every N-th CTA prints (phase_clock.cuh; 33 unless given)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["2,32,128,128,128", "2,64,64,128,128"], help="N,C,D,H,W")
    ap.add_argument("--layouts", default="ncdhw", help="comma list of ncdhw,ndhwc")
    ap.add_argument("--no-times", action="store_true", help="skip the default build's kernel times")
    ap.add_argument("--every", type=int, default=0, metavar="N",
                    help="every N-th CTA prints (default: the kernel's 33); 1 stamps every CTA of an instance, "
                         "so that --summarize splits the channels-last arrivals into skew and round trip")
    ap.add_argument("--summarize", metavar="LOG", help="no GPU run: the channels-last phases of a saved log, in µs")
    args = ap.parse_args(argv)
    try:
        args.shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes]
    except ValueError:
        ap.error(f"--shapes: expected N,C,D,H,W integers, got {args.shapes}")
    args.layouts = bl.parse_choices(args.layouts, ("ncdhw", "ndhwc"), "--layouts")
    if args.every < 0:
        ap.error(f"--every: expected a positive number of CTAs, got {args.every}")
    return args


NHWC_PHASES = ("load", "reduce", "arrive", "merge", "merged_arrive", "output", "cluster")
ARRIVAL_FIELDS = ("instance", "ready", "released", "ready2", "released2")  # %globaltimer ns; 0: none
OPTIONAL_PHASES = ("cluster",)  # not in the logs before session 24: 0 there


def parse_nhwc_line(line):
    """One nj_nhwc_phase line -> dict(kernel, chunks, grid, cta, cycles {phase: n}, start_ns, end_ns),
    or None for other lines."""
    words = line.replace(";", " ").replace(":", " ").split()
    if not words or words[0] != "nj_nhwc_phase":
        return None
    try:
        at = {w: i for i, w in enumerate(words)}
        cycles = {name: int(words[at[name] + 1]) if name in at or name not in OPTIONAL_PHASES else 0
                  for name in NHWC_PHASES}
        row = dict(kernel=words[1], chunks=int(words[at["chunks"] + 1]), grid=int(words[at["grid"] + 1]),
                   cta=int(words[at["cta"] + 1]), cycles=cycles, start_ns=int(words[at["globaltimer"] + 1]),
                   end_ns=int(words[at["to"] + 1]))
        if "arrivals" in at:  # not in the logs before session 25
            row["arrivals"] = {name: int(words[at[name] + 1]) for name in ARRIVAL_FIELDS}
        return row
    except (KeyError, ValueError, IndexError):
        return None


def summarize(lines):
    """Per (kernel, chunks, grid): the sampled CTAs' mean µs per phase and the spread of their
    starts and ends, as text lines."""
    groups = {}
    segment = 0  # the lines between two other lines (phase_clocks' headers): one launch of a kernel
    warm_up = False  # after a "warm-up calls" header: left out, so that only measured launches count
    for line in lines:
        r = parse_nhwc_line(line)
        if r is None:
            segment += 1
            if line.startswith("phase_clocks:"):
                warm_up = "warm-up calls" in line
            continue
        if warm_up:
            continue
        r["segment"] = segment
        groups.setdefault((r["kernel"], r["chunks"], r["grid"]), []).append(r)
    out = []
    for (kernel, chunks, grid), rows in groups.items():
        phases_us = {name: [] for name in NHWC_PHASES}
        for r in rows:
            total = sum(r["cycles"].values())
            span_ns = r["end_ns"] - r["start_ns"]
            if total <= 0 or span_ns <= 0:
                continue
            ns_per_cycle = span_ns / total
            for name in NHWC_PHASES:
                phases_us[name].append(r["cycles"][name] * ns_per_cycle / 1000.0)
        starts = [r["start_ns"] for r in rows]
        ends = [r["end_ns"] for r in rows]
        means = " + ".join(f"{name} {sum(v) / len(v):.2f}" for name, v in phases_us.items() if v)
        out.append(f"{kernel} chunks {chunks} grid {grid}: {len(rows)} CTAs sampled; mean µs {means}; "
                   f"starts spread {(max(starts) - min(starts)) / 1000.0:.2f} µs, ends spread "
                   f"{(max(ends) - min(ends)) / 1000.0:.2f} µs, first start to last end "
                   f"{(max(ends) - min(starts)) / 1000.0:.2f} µs")
        out.extend(summarize_arrivals(chunks, rows))
    return out


def summarize_arrivals(chunks, rows):
    """The split's waits, where all `chunks` CTAs of an instance printed their arrivals (--every 1): per
    arrival, the mean wait of a CTA (ready to released), the part of it spent on the peers' skew
    (until the instance's last CTA was ready) and the round trip after that, in µs."""
    by_instance = {}  # (launch, instance): the warm-up and the measured call are not mixed
    for r in rows:
        a = r.get("arrivals")
        if a and a["instance"] >= 0 and a["ready"] > 0:
            by_instance.setdefault((r.get("segment", 0), a["instance"]), []).append(a)
    out = []
    for number, (ready, released) in enumerate((("ready", "released"), ("ready2", "released2")), start=1):
        wait, skew, trip = [], [], []
        for stamps in by_instance.values():
            if len(stamps) < chunks or any(s[ready] == 0 or s[released] == 0 for s in stamps):
                continue  # not every peer stamped: the last ready time is unknown
            last_ready = max(s[ready] for s in stamps)
            for s in stamps:
                wait.append(s[released] - s[ready])
                skew.append(last_ready - s[ready])
                trip.append(s[released] - last_ready)
        if wait:
            mean = lambda v: sum(v) / len(v) / 1000.0  # noqa: E731
            out.append(f"  arrival {number}: {len(wait)} CTAs of whole instances; mean wait {mean(wait):.2f} µs = "
                       f"skew {mean(skew):.2f} + round trip {mean(trip):.2f} (round trip min "
                       f"{min(trip) / 1000.0:.2f}, max {max(trip) / 1000.0:.2f})")
    return out


def probe_env(environ, every=0) -> dict:
    """`environ` with the measurement build's options added to NORMJIT_NVRTC_OPTIONS."""
    env = dict(environ)
    added = PROBE_OPTION + (f" {EVERY_OPTION}{every}" if every else "")
    env["NORMJIT_NVRTC_OPTIONS"] = (env.get("NORMJIT_NVRTC_OPTIONS", "") + " " + added).strip()
    return env


def default_env(environ) -> dict:
    """`environ` with the measurement build's options taken out again (the other options kept)."""
    env = dict(environ)
    options = [o for o in env.get("NORMJIT_NVRTC_OPTIONS", "").split()
               if o != PROBE_OPTION and not o.startswith(EVERY_OPTION)]
    if options:
        env["NORMJIT_NVRTC_OPTIONS"] = " ".join(options)
    else:
        env.pop("NORMJIT_NVRTC_OPTIONS", None)
    return env


def probe(shapes, layouts=("ncdhw",), every=0) -> int:
    os.environ.update(probe_env(os.environ, every))
    ready = bl.require_gpu_normjit("phase_clocks")
    if ready is None:
        return 2
    torch, _ = ready
    fwd = torch.ops.normjit.instance_norm_fwd.default
    bwd = torch.ops.normjit.instance_norm_bwd.default
    for shape, layout in [(s, l) for s in shapes for l in layouts]:
        fmt = torch.channels_last_3d if layout == "ndhwc" else torch.contiguous_format
        x = (torch.randn(shape, device="cuda", dtype=torch.float16) * 2 + 3).contiguous(memory_format=fmt)
        w = torch.rand(shape[1], device="cuda") + 0.5
        b = torch.randn(shape[1], device="cuda")
        dy = torch.randn_like(x)
        for label in ("warm-up", "measured"):
            print(f"phase_clocks: {','.join(map(str, shape))} fp16 {layout}, {label} calls", flush=True)
            y, mean, rstd = fwd(x, w, b, None, None, None, True, 0.1, 1e-5, 0, 0.01)
            torch.cuda.synchronize()  # the GPU's printf lines come out here
            bwd(dy, x, w, b, None, mean, rstd, 0, 0.01, [True, True, False])
            torch.cuda.synchronize()
        del x, y, dy
        torch.cuda.empty_cache()
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.summarize:
        with open(args.summarize, encoding="utf-8", errors="replace") as f:
            lines = summarize(f)
        print("\n".join(lines) if lines else f"{args.summarize}: no nj_nhwc_phase lines")
        return 0 if lines else 1
    rc = probe(args.shapes, args.layouts, args.every)
    if rc or args.no_times:
        return rc
    return subprocess.call(times_command(args.shapes, args.layouts), env=default_env(os.environ))


def times_command(shapes, layouts=("ncdhw",)) -> list:
    """The child that times the default build's kernels of `shapes`."""
    here = os.path.dirname(os.path.abspath(__file__))
    return [sys.executable, os.path.join(here, "kernel_times.py"), "--layouts", ",".join(layouts), "--dtypes", "fp16",
            "--tag", "default", "--shapes", *[",".join(map(str, s)) for s in shapes]]


if __name__ == "__main__":
    sys.exit(main())
