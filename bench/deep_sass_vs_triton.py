"""The deep NCDHW forward's machine code beside a Triton kernel like torch.compile's (no GPU needed).

docs/PERF_NOTES.md 000a: torch.compile's one Triton kernel runs the deep forwards ((2,320,8^3),
(2,320,4^3)) about 0.6 us faster than normjit's. This compiles, for sm_90 and without a GPU, a
Triton kernel of the shape Inductor generates for instance norm's training forward (a persistent
reduction: one instance a program, the reduction length a compile-time constant, two tl.sum
reductions, affine, mean and rstd saved), disassembles it and normjit's kernel from a disk cache,
and prints for each: instructions, where the first global load issues (normjit's: the
weight's, a few before x's), and the reductions' SHFL/BAR.

Usage (nvdisasm on PATH, from pip install nvidia-cuda-nvdisasm, or NVDISASM=path):
  NORMJIT_CACHE_DIR=/tmp/deep ./normjit warmup --device H100 --layout ncdhw --direction fwd \
      --dtype f16 2,320,8,8,8
  python3 bench/deep_sass_vs_triton.py /tmp/deep --spatial 512 --warps 4
"""

from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import same_code  # noqa: E402  (reads normjit's disk cache entries)
import spill_sites  # noqa: E402  (finds nvdisasm and runs it on a cache entry)


def sass_lines(cubin: bytes) -> list[str]:
    return instructions(spill_sites.disassemble(spill_sites.find_nvdisasm(), cubin) or "")


def instructions(listing: str) -> list[str]:
    """The instructions of an `nvdisasm -c` listing, predicates kept, in order."""
    return [m.group(1).strip() for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+([^;]*);", listing)]


def summary(name: str, lines: list[str]) -> str:
    ops = [re.sub(r"^@!?U?P\w+\s+", "", line).split()[0] for line in lines]
    first_ldg = next((i for i, op in enumerate(ops) if op.startswith("LDG")), -1)
    count = lambda prefix: sum(op.startswith(prefix) for op in ops)  # noqa: E731
    return (f"{name}: {len(ops)} instructions, first LDG at instruction {first_ldg}; "
            f"LDG {count('LDG')}, STG {count('STG')}, SHFL {count('SHFL')}, BAR {count('BAR')}, "
            f"MUFU {count('MUFU')}, integer divide steps (I2F.RP) {count('I2F.RP')}")


def triton_cubin(spatial: int, warps: int, arch: int) -> bytes:
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def instance_norm_forward(x, w, b, y, mean_out, rstd_out, instances, C, RBLOCK: tl.constexpr):
        inst = tl.program_id(0)
        live = inst < instances
        r = tl.arange(0, RBLOCK)
        v = tl.load(x + inst * RBLOCK + r, mask=live, other=0.0).to(tl.float32)
        mean = tl.sum(v, 0) / RBLOCK
        d = v - mean
        rstd = tl.rsqrt(tl.sum(d * d, 0) / RBLOCK + 1e-5)
        c = inst % C
        out = d * rstd * tl.load(w + c, mask=live) + tl.load(b + c, mask=live)
        tl.store(y + inst * RBLOCK + r, out.to(tl.float16), mask=live)
        tl.store(mean_out + inst, mean, mask=live)
        tl.store(rstd_out + inst, rstd, mask=live)

    signature = {"x": "*fp16", "w": "*fp32", "b": "*fp32", "y": "*fp16", "mean_out": "*fp32", "rstd_out": "*fp32",
                 "instances": "i32", "C": "i32", "RBLOCK": "constexpr"}
    source = ASTSource(fn=instance_norm_forward, signature=signature, constexprs={"RBLOCK": spatial})
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps}).asm["cubin"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache_dir", help="a normjit disk cache holding the deep forward kernel(s)")
    ap.add_argument("--spatial", type=int, default=512, help="elements an instance (a power of two)")
    ap.add_argument("--warps", type=int, default=4, help="the Triton kernel's num_warps")
    ap.add_argument("--arch", type=int, default=90)
    args = ap.parse_args()
    for (name, arch), cubin in sorted(same_code.cubins(args.cache_dir).items()):
        if arch == f"sm_{args.arch}" and "_fwd_" in name:
            print(summary(name, sass_lines(cubin)))
    print(summary(f"triton persistent reduction, {args.spatial} a program, {args.warps} warps",
                  sass_lines(triton_cubin(args.spatial, args.warps, args.arch))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
