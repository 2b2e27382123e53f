"""Where a kernel's register spills sit: in which loops, and how busy those loops are.

ptxas -v says how many bytes a kernel spills, not where; 50 bytes stored once per launch cost
nothing, 50 bytes in the tile loop cost a lot. This disassembles each cubin of a normjit disk
cache (nvdisasm with its live-register column), finds the loops (a branch back to an earlier
label), and prints every local-memory access (STL/LDL: the spills) with the loops around it, plus
the most registers live in each loop.

Usage (NVRTC, no GPU needed):
  NORMJIT_CACHE_DIR=/tmp/c CUDA_CACHE_DISABLE=1 build/normjit warmup --device H100 \
      --layout ndhwc --direction bwd --dtype f16 --residual 2x30x128x128x128
  python3 bench/spill_sites.py /tmp/c
nvdisasm comes with the CUDA toolkit or `pip install nvidia-cuda-nvdisasm`; NVDISASM=path
overrides the search.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from same_code import cubins  # noqa: E402

INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);(?:.*?//\s*\|\s*(\d+)\s*\|)?")
LABEL = re.compile(r"^\s*(\.L_x_\d+):")
BRANCH = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")


def parse(listing: str):
    """[(address, text, live GPRs or None)] and {label: address of the next instruction}."""
    instrs, labels, pending = [], {}, []
    for line in listing.splitlines():
        m = LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = INSTR.search(line)
        if m:
            addr = int(m.group(1), 16)
            for label in pending:
                labels[label] = addr
            pending = []
            instrs.append((addr, m.group(2).strip(), int(m.group(3)) if m.group(3) else None))
    return instrs, labels


def loops(instrs, labels):
    """(start, end) of each loop: a branch at `end` back to a label at `start` <= end."""
    out = []
    for addr, text, _ in instrs:
        m = BRANCH.search(text)
        if m and labels.get(m.group(1), addr + 1) <= addr:
            out.append((labels[m.group(1)], addr))
    return sorted(out)


def spill_sites(listing: str):
    """Each STL/LDL as (address, text, [(loop start, loop instructions), ...] outermost first),
    and each loop's (start, end, instructions, most live GPRs)."""
    instrs, labels = parse(listing)
    found = loops(instrs, labels)
    sites = []
    for addr, text, _ in instrs:
        if re.match(r"(@!?U?P\w+\s+)?(STL|LDL)\b", text):
            around = [(s, (e - s) // 16 + 1) for s, e in found if s <= addr <= e]
            sites.append((addr, text, around))
    summary = []
    for s, e in found:
        live = [n for a, _, n in instrs if s <= a <= e and n is not None]
        summary.append((s, e, (e - s) // 16 + 1, max(live) if live else None))
    return sites, summary


def find_nvdisasm() -> str:
    if os.environ.get("NVDISASM"):
        return os.environ["NVDISASM"]
    on_path = shutil.which("nvdisasm")
    if on_path:
        return on_path
    for root in sys.path:  # the pip package nvidia-cuda-nvdisasm
        hits = glob.glob(os.path.join(root, "nvidia", "cu*", "bin", "nvdisasm"))
        if hits:
            return hits[0]
    sys.exit("spill_sites: no nvdisasm (set NVDISASM, or pip install nvidia-cuda-nvdisasm)")


def disassemble(tool: str, cubin: bytes, *flags: str):
    """`nvdisasm -c FLAGS` of a cache entry's cubin (its ELF image); None when it holds none."""
    elf = cubin.find(b"\x7fELF")
    if elf < 0:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin[elf:])
        return subprocess.run([tool, "-c", *flags, path], check=True, capture_output=True, text=True).stdout


def report(name: str, listing: str) -> None:
    sites, summary = spill_sites(listing)
    print(f"== {name}: {len(sites)} local accesses, {len(summary)} loops")
    for s, e, n, live in summary:
        if n >= 100:  # the tile and round loops; the small ones are polls and unrolled rests
            print(f"   loop {s:#x}-{e:#x}: {n} instructions, at most {live} registers live")
    for addr, text, around in sites:
        where = " in ".join(f"loop {s:#x} ({n})" for s, n in reversed(around)) or "outside every loop"
        print(f"   {addr:#07x} {text[:44]:44s} {where}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    tool = find_nvdisasm()
    for (kernel, arch), cubin in cubins(argv[0]).items():
        listing = disassemble(tool, cubin, "-plr", "-lrm", "count")
        if listing is None:
            print(f"== {kernel} {arch}: no ELF image in its cache entry")
            continue
        report(f"{kernel} {arch}", listing)
    return 0


if __name__ == "__main__":
    sys.exit(main())
