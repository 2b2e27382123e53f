"""Runs normjit's and torch.compile's forward of the deep NCDHW stages once each, for Nsight Compute.

PERF_NOTES 000a: by CUPTI, normjit's forward of (2,320,8^3) fp16 takes 2.96 us and
torch.compile's Triton kernel 2.21. Session 23 ruled out the grid (CTAs of 64 time the same as
CTAs of 256); this puts the two kernels side by side in one profile, so that their stalls,
instruction counts and launch shapes can be compared:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section LaunchStats --section Occupancy --section WarpStateStats \
        --section SchedulerStats --section InstructionStats python3 bench/deep_peer_probe.py
    TORCH_LOGS=output_code python3 bench/deep_peer_probe.py 2> inductor_code.log   # the Triton source

Both run on the same tensors in training mode with affine parameters (x requires grad, so both
also produce the statistics a backward needs). Only the measured launches sit between
cudaProfilerStart and cudaProfilerStop: torch.compile's own autotuning launches are left out.
--backward profiles a forward and a backward of each instead (every kernel of both, the peers'
weight-gradient reductions too), for the mid stages' backward gap (PERF_NOTES 000a, session 33):

    ncu ... python3 bench/deep_peer_probe.py --backward --shapes 2,256,16,16,16 2,256,12,12,12
"""
import argparse

import torch
import torch.nn.functional as F

import normjit


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["2,320,8,8,8", "2,320,4,4,4"])
    ap.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"))
    ap.add_argument("--backward", action="store_true", help="profile a forward and a backward of each peer")
    args = ap.parse_args()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]

    for shape in args.shapes:
        size = tuple(int(v) for v in shape.split(","))
        x = torch.randn(size, device="cuda", dtype=dtype, requires_grad=True)
        w = torch.randn(size[1], device="cuda", requires_grad=True)
        b = torch.randn(size[1], device="cuda", requires_grad=True)

        dy = torch.randn_like(x)

        torch._dynamo.reset()  # a fresh graph per shape, as bench_instance_norm.py does
        compiled = torch.compile(lambda t: F.instance_norm(t, weight=w, bias=b))
        ours = lambda t: normjit.functional.instance_norm(t, weight=w, bias=b)  # noqa: E731

        def run(fn):
            """The peer's forward (and with --backward its backward); returns y, or dx."""
            y = fn(x)
            if not args.backward:
                return y
            x.grad = w.grad = b.grad = None
            y.backward(dy)
            return x.grad

        for _ in range(3):  # compile, autotune, warm
            ref = run(compiled)
            out = run(ours)
        torch.cuda.synchronize()
        err = (out.float() - ref.float()).abs().max().item()

        torch.cuda.profiler.start()
        run(compiled)
        run(ours)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        what = "forward and backward" if args.backward else "forward"
        print(f"{shape} {args.dtype}: profiled one torch.compile and one normjit {what} "
              f"(max |normjit - torch.compile| of {'dx' if args.backward else 'y'} = {err:.3g})")


if __name__ == "__main__":
    main()
