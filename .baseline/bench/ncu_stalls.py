#!/usr/bin/env python3
"""Summarizes the SASS source view that bench/ncu_source.sh exports (source.csv): for each kernel,
where its warps were sampled (the stall reasons' shares) and the instructions that collected the
most samples, with the stall that dominated each. No GPU needed:

    python3 bench/ncu_stalls.py $OUT/source.csv [--top 15]

The export holds one block per profiled kernel: a line `"Kernel Name","<name>",` and then a CSV
table with a header row, one row per SASS instruction.
"""
import argparse
import csv
import io
import sys


def kernel_blocks(text):
    """Yields (kernel name, list of row dicts) for each kernel block of the export."""
    name, lines = None, []
    for line in text.splitlines():
        if line.startswith('"Kernel Name"'):
            if name is not None:
                yield name, list(csv.DictReader(io.StringIO("\n".join(lines))))
            name, lines = next(csv.reader([line]))[1], []
        elif name is not None:
            lines.append(line)
    if name is not None:
        yield name, list(csv.DictReader(io.StringIO("\n".join(lines))))


def number(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return 0.0


def stall_columns(row):
    return [k for k in row if k.startswith("stall_") and "(Not Issued)" not in k]


def summarize(name, rows, top):
    out = []
    total = sum(number(r.get("Warp Stall Sampling (All Samples)", 0)) for r in rows)
    out.append(f"## {name}: {len(rows)} instructions, {total:.0f} samples")
    if not rows or total == 0:
        return out
    stalls = stall_columns(rows[0])
    shares = {s: sum(number(r.get(s, 0)) for r in rows) for s in stalls}
    stall_total = sum(shares.values()) or 1.0
    ranked = sorted(shares.items(), key=lambda kv: -kv[1])
    out.append("stalls: " + ", ".join(f"{s[6:]} {100 * v / stall_total:.1f} %" for s, v in ranked if v > 0))
    out.append(f"top {top} instructions by samples (share, dominant stall, address, SASS):")
    by_samples = sorted(rows, key=lambda r: -number(r.get("Warp Stall Sampling (All Samples)", 0)))
    for r in by_samples[:top]:
        samples = number(r.get("Warp Stall Sampling (All Samples)", 0))
        if samples == 0:
            break
        worst = max(stalls, key=lambda s: number(r.get(s, 0)))
        out.append(f"  {100 * samples / total:5.1f} %  {worst[6:]:<12} {r.get('Address', '')}  {r.get('Source', '').strip()}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", help="source.csv from bench/ncu_source.sh")
    ap.add_argument("--top", type=int, default=15, help="instructions listed per kernel")
    args = ap.parse_args(argv)
    with open(args.csv, encoding="utf-8", errors="replace") as f:
        text = f.read()
    blocks = list(kernel_blocks(text))
    if not blocks:
        print(f"{args.csv}: no '\"Kernel Name\"' block found; is this ncu's --page source --csv export?")
        return 1
    for name, rows in blocks:
        print("\n".join(summarize(name, rows, args.top)))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
