"""Whether two disk caches hold the same machine code for the same kernels.

A kernel's cache entry is keyed by its source text, so a refactor of kernels/*.cuh (a function
moved, a comment added) gives new entries; this pairs them by kernel name and architecture and
compares their cubins byte for byte. NVRTC's cubin depends on the code alone: a comment added at
the top of common.cuh leaves all 60 cubins of the fp16 forward byte-identical. Identical cubins
run identically, so a refactor that keeps every cubin needs no GPU to be trusted.

Usage: python3 bench/same_code.py CACHE_DIR_A CACHE_DIR_B   (bench/same_code.sh fills both)
Prints a summary and the kernels that differ or exist on one side only; exit 0 when every kernel
of A has an identical twin in B and B has no other.
"""

from __future__ import annotations

import glob
import os
import struct
import sys

MAGIC = b"NJITCACH"
HEADER = struct.Struct("<8sIIQQQ")  # magic, format version, key length, payload length, checksum


def read_entry(path: str):
    """(kernel name, arch) and the cubin of one .njc file (src/compile/disk_cache.cpp's layout)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER.size:
        raise ValueError(f"{path}: shorter than a cache entry's header")
    magic, _, key_len, payload_len, _, _ = HEADER.unpack_from(data)
    if magic != MAGIC or len(data) != HEADER.size + key_len + payload_len:
        raise ValueError(f"{path}: not a complete normjit cache entry")
    key = data[HEADER.size:HEADER.size + key_len].decode()
    fields = dict(line.split(" ", 1) for line in key.splitlines() if " " in line)
    if "name" not in fields or "arch" not in fields:
        raise ValueError(f"{path}: the key names no kernel or arch")
    return (fields["name"], fields["arch"]), data[HEADER.size + key_len:]


def cubins(cache_dir: str) -> dict:
    out = {}
    for path in sorted(glob.glob(os.path.join(cache_dir, "*.njc"))):
        kernel, cubin = read_entry(path)
        out[kernel] = cubin
    return out


def compare(a: dict, b: dict) -> dict:
    """Kernels identical, different, only in a, only in b (each a sorted list of (name, arch))."""
    return {"identical": sorted(k for k in a if b.get(k) == a[k]),
            "different": sorted(k for k in a if k in b and b[k] != a[k]),
            "only_a": sorted(k for k in a if k not in b),
            "only_b": sorted(k for k in b if k not in a)}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: same_code.py CACHE_DIR_A CACHE_DIR_B", file=sys.stderr)
        return 2
    a, b = cubins(argv[0]), cubins(argv[1])
    if not a:
        print(f"same_code: no cache entries in {argv[0]}", file=sys.stderr)
        return 2
    r = compare(a, b)
    for what in ("different", "only_a", "only_b"):
        for name, arch in r[what]:
            print(f"{what:9s} {name} {arch}")
    print(f"same_code: {len(r['identical'])} of {len(a)} kernels identical, {len(r['different'])} different, "
          f"{len(r['only_a'])} only in A, {len(r['only_b'])} only in B")
    return 0 if len(r["identical"]) == len(a) == len(b) else 1


if __name__ == "__main__":
    sys.exit(main())
