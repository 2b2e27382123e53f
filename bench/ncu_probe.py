"""Runs a few normjit kernels once each, for Nsight Compute to count their DRAM traffic.

    ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        -k regex:normjit python3 bench/ncu_probe.py

The ideal traffic is x read once + y written once (forward), x and dy read once + dx written once
(backward); DRAM bytes above that are second reads that missed L2.
"""
import argparse

import torch

import normjit


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["2,32,128,128,128", "2,64,64,64,64"])
    ap.add_argument("--layouts", default="ncdhw,ndhwc")
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"))
    args = ap.parse_args()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    for shape in args.shapes:
        size = tuple(int(v) for v in shape.split(","))
        for layout in args.layouts.split(","):
            x = torch.randn(size, device="cuda", dtype=dtype)
            if layout == "ndhwc":
                x = x.to(memory_format=torch.channels_last_3d)
            x.requires_grad_(True)
            w = torch.ones(size[1], device="cuda", requires_grad=True)
            b = torch.zeros(size[1], device="cuda", requires_grad=True)
            y = normjit.functional.instance_norm(x, weight=w, bias=b)
            y.backward(torch.ones_like(y))
            torch.cuda.synchronize()
            mb = x.numel() * x.element_size() / 1e6
            print(f"{shape} {layout}: x is {mb:.1f} MB (fwd ideal {2 * mb:.1f} MB, bwd ideal {3 * mb:.1f} MB)")


if __name__ == "__main__":
    main()
