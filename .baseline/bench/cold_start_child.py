#!/usr/bin/env python3
"""One cold-start measurement, in the fresh process that bench_cold_start.py starts for it.

    cold_start_child.py CASE --result PATH [--layout ncdhw|ndhwc] [--patch ...] ...

Writes one JSON record to PATH (with 'error' set when the measurement failed) and exits 0 when it
succeeded. Cases (the parent chooses the disk cache each one sees through NORMJIT_CACHE_DIR):

- cold, warm: the first forward+backward step of a normjit.convert'ed U-Net (bench_unet.py's),
  fp16 autocast, minus the median of the next steps: what compiling (cold) or loading from disk
  (warm) every kernel costs. Before it, torch itself is warmed up on a twin of the model whose
  norms are replaced by layout-keeping stand-ins, so that cuDNN start-up, convolution algorithm
  choice and the allocator's first blocks are not counted as normjit's;
- warmup: the same, with normjit.warmup(model, x) first (its time reported apart);
- compile_cold, compile_warm: the peer: torch.compile of the unconverted model, same protocol
  (TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR empty or filled by compile_cold);
- levels_compile, levels_disk: what each cache level costs on a hit and a miss, from Python, on
  a tiny tensor (README "When does normjit compile?"). levels_compile starts from an empty disk
  cache; levels_disk is a fresh process on the cache levels_compile filled.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_unet  # noqa: E402
import benchlib as bl  # noqa: E402

CASES = ("cold", "warm", "warmup", "compile_cold", "compile_warm", "levels_compile",
         "levels_disk")
#: Tiny enough that kernel time is noise next to host time; every activation gives a new kernel.
LEVELS_SHAPE = (2, 32, 8, 8, 8)
LEVELS_ACTIVATIONS = ("identity", "relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid",
                      "tanh")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("case", choices=CASES)
    p.add_argument("--result", required=True, help="JSON file to write")
    p.add_argument("--layout", choices=bl.LAYOUTS, default="ncdhw")
    p.add_argument("--patch", default="128", help="U-Net patch (see bench_unet.py)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--warm-steps", type=int, default=3, help="steps after the first (median)")
    p.add_argument("--level-samples", type=int, default=16,
                   help="levels: new shapes timed for the L1 miss; also rounds x 8 kernels")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cudnn-benchmark", action="store_true")
    args = p.parse_args(argv)
    args.patch = bench_unet.parse_patch(args.patch)
    if args.warm_steps < 1:
        p.error("--warm-steps must be at least 1")
    return args


# --------------------------------------------------------------------------------------------------
# The U-Net step
# --------------------------------------------------------------------------------------------------


def make_batch(args):
    """Random input and labels, the input in the requested layout."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    x = torch.randn((args.batch, bench_unet.IN_CHANNELS, *args.patch), device="cuda",
                    generator=gen)
    y = torch.randint(0, bench_unet.NUM_CLASSES, (args.batch, *args.patch), device="cuda",
                      generator=gen)
    if args.layout == "ndhwc":
        x = x.contiguous(memory_format=torch.channels_last_3d)
    return x, y


def place(model, layout: str, normjit=None):
    """On the GPU, converted by normjit when given, in the layout (as bench_unet.py does)."""
    import torch

    model = model.cuda()
    if normjit is not None:
        converted = normjit.convert(model, verbose=False)
        model = converted if converted is not None else model
    if layout == "ndhwc":
        model = model.to(memory_format=torch.channels_last_3d)
    return model


def make_step(runner, params, x, y):
    """forward (fp16 autocast) + cross-entropy + backward; grads set to None first."""
    import torch

    loss_fn = torch.nn.CrossEntropyLoss()
    params = list(params)

    def step():
        for p in params:
            p.grad = None
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(runner(x), y)
        loss.backward()
        return loss

    return step


def layout_keeping_twin(model):
    """A copy of model whose instance norms are per-channel affines done with elementwise ops.

    Elementwise ops keep their input's dtype and memory format, as normjit's kernels do (torch's
    instance norm returns a contiguous tensor for a channels_last_3d input), so the convolutions
    of the twin see the tensors the measured model's will: its steps warm up cuDNN, the algorithm
    choice and the allocator for them."""
    from torch import nn

    class Affine(nn.Module):
        def __init__(self, norm):
            super().__init__()
            self.weight, self.bias = norm.weight, norm.bias

        def forward(self, x):
            shape = (1, -1) + (1,) * (x.dim() - 2)
            return x * self.weight.to(x.dtype).view(shape) + self.bias.to(x.dtype).view(shape)

    def replace(module):
        for name, child in module.named_children():
            if isinstance(child, nn.modules.instancenorm._InstanceNorm):
                setattr(module, name, Affine(child))
            else:
                replace(child)

    twin = copy.deepcopy(model)
    replace(twin)
    return twin


def warm_up_torch(base, x, y, layout: str) -> float:
    """Two steps of the layout-keeping twin; returns the first one's wall ms (torch's own cold
    start, reported for context)."""
    twin = place(layout_keeping_twin(base), layout)
    step = make_step(twin, twin.parameters(), x, y)
    first = bl.wall_time_s(step)
    bl.wall_time_s(step)
    del twin, step
    return 1e3 * first


def first_and_warm(step, warm_steps: int) -> dict:
    """The first step's wall ms, the median of the next ones, and the difference (the cost)."""
    first = 1e3 * bl.wall_time_s(step)
    warm = [1e3 * bl.wall_time_s(step) for _ in range(warm_steps)]
    return {"first_step_ms": first, "warm_steps_ms": warm, "warm_step_ms": bl.median(warm),
            "overhead_ms": first - bl.median(warm)}


def setup(args) -> dict:
    """CUDA up (not counted), the model and batch; the record's environment fields."""
    import torch

    torch.backends.cudnn.benchmark = bool(args.cudnn_benchmark)
    env = bl.environment()
    torch.manual_seed(args.seed)
    base = bench_unet.build_unet()
    x, y = make_batch(args)
    return {"env": env, "base": base, "x": x, "y": y}


def load_normjit_timed() -> tuple[object, float]:
    """import normjit + is_available() (driver and NVRTC probing): part of a cold start, but
    paid once per process and outside the step, so reported apart."""
    t0 = time.perf_counter()
    normjit, info = bl.load_normjit()
    import_ms = 1e3 * (time.perf_counter() - t0)
    if normjit is None:
        raise RuntimeError(f"normjit is not available: {info['reason']}")
    return normjit, import_ms


def float_delta(before: dict | None, after: dict | None, key: str) -> float | None:
    if not before or not after or key not in after:
        return None
    return float(after[key]) - float(before.get(key) or 0.0)


def case_normjit(args, with_warmup: bool) -> dict:
    """cold / warm / warmup: see the module docstring."""
    import torch

    normjit, import_ms = load_normjit_timed()
    s = setup(args)
    rec = dict(s["env"], import_ms=import_ms)
    rec["torch_first_step_ms"] = warm_up_torch(s["base"], s["x"], s["y"], args.layout)
    model = place(copy.deepcopy(s["base"]), args.layout, normjit)
    rec["modules"] = bench_unet.count_modules(model, normjit)
    step = make_step(model, model.parameters(), s["x"], s["y"])
    info0 = bl.normjit_cache_info(normjit)
    if with_warmup:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        result = normjit.warmup(model, s["x"], autocast=True, dtype=torch.float16, verbose=False)
        torch.cuda.synchronize()
        rec["warmup_ms"] = 1e3 * (time.perf_counter() - t0)
        rec["warmup"] = {k: result.get(k) for k in ("kernels", "compiled", "from_disk", "failed",
                                                    "loaded", "seconds", "profile", "arch",
                                                    "mode")}
        rec["warmup"]["calls"] = len(result.get("calls") or [])
    info1 = bl.normjit_cache_info(normjit)
    first = 1e3 * bl.wall_time_s(step)
    info2 = bl.normjit_cache_info(normjit)
    warm = [1e3 * bl.wall_time_s(step) for _ in range(args.warm_steps)]
    info3 = bl.normjit_cache_info(normjit)
    rec.update(first_step_ms=first, warm_steps_ms=warm, warm_step_ms=bl.median(warm),
               overhead_ms=first - bl.median(warm))
    # Counters of the whole cold start (warmup + first step), of the first step alone, and of the
    # warm steps (which must be all hits: anything else means the warm figure is not warm).
    rec["counters"] = bl.counter_delta(info0, info2)
    rec["counters_first_step"] = bl.counter_delta(info1, info2)
    rec["counters_warm_steps"] = bl.counter_delta(info2, info3)
    rec["compiles"] = rec["counters"].get("compiles", 0)
    rec["disk_hits"] = rec["counters"].get("disk_hits", 0)
    rec["kernels_loaded"] = rec["counters"].get("kernel_misses", 0)
    rec["compile_ms_total"] = float_delta(info0, info2, "compile_ms_total")
    rec["cache_info_end"] = info3
    return rec


def case_compile(args) -> dict:
    """compile_cold / compile_warm: torch.compile of the unconverted model (the peer)."""
    import torch

    s = setup(args)
    rec = dict(s["env"], inductor_cache=os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
    rec["torch_first_step_ms"] = warm_up_torch(s["base"], s["x"], s["y"], args.layout)
    model = place(copy.deepcopy(s["base"]), args.layout)
    compiled = torch.compile(model)
    rec.update(first_and_warm(make_step(compiled, model.parameters(), s["x"], s["y"]),
                              args.warm_steps))
    return rec


# --------------------------------------------------------------------------------------------------
# Cache levels
# --------------------------------------------------------------------------------------------------


def _once_s(fn) -> float:
    """Wall seconds of one call, the device synchronized before and after."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _issue_us(fn, calls: int = 500, repeats: int = 5) -> float:
    """Host µs per call of back-to-back calls, until the last returns (median of repeats)."""
    import torch

    per_call = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append(1e6 * (time.perf_counter() - t0) / calls)
        torch.cuda.synchronize()
    return bl.median(per_call)


def case_levels(args, phase: str) -> dict:
    """levels_compile (empty disk cache) or levels_disk (fresh process, cache filled)."""
    import torch

    normjit, import_ms = load_normjit_timed()
    rec = dict(bl.environment(), import_ms=import_ms, phase=phase, shape=list(LEVELS_SHAPE),
               dtype="fp16", activations=list(LEVELS_ACTIVATIONS), counters={}, expected={})
    inorm = normjit.functional.instance_norm
    c = LEVELS_SHAPE[1]
    w = torch.ones(c, device="cuda")
    b = torch.zeros(c, device="cuda")
    x16 = torch.randn(LEVELS_SHAPE, device="cuda", dtype=torch.float16)
    x_bf16 = x16.to(torch.bfloat16)

    def call(x, act="identity"):
        return lambda: inorm(x, weight=w, bias=b, activation=act)

    def phase_of(name, fn, expect):
        """Run fn, record the counters it moved and whether they are as expected."""
        before = bl.normjit_cache_info(normjit)
        out = fn()
        delta = bl.counter_delta(before, bl.normjit_cache_info(normjit))
        rec["counters"][name] = delta
        rec["expected"][name] = all(delta.get(k, 0) == v for k, v in expect.items())
        return out

    n_acts = len(LEVELS_ACTIVATIONS)
    # The process's first call (bf16, a kernel no sample below uses): device state, NVRTC start,
    # module loading machinery. Not a sample of any level.
    first_expect = {"compiles": 1} if phase == "compile" else {"compiles": 0, "disk_hits": 1}
    rec["first_call_ms"] = 1e3 * phase_of("first_call", lambda: _once_s(call(x_bf16)),
                                          first_expect)
    info = bl.normjit_cache_info(normjit) or {}
    if phase == "compile" and info.get("compile_ms"):
        rec["first_compile_ms"] = info["compile_ms"][0][1]
    n_before = len(info.get("compile_ms") or [])

    def l1_hits():
        fn = call(x16)
        fn()  # the plan and the kernel exist after this (not timed)
        rec["l1_hit_us"] = 1e6 * bl.median([_once_s(fn) for _ in range(200)])
        rec["l1_issue_us"] = _issue_us(fn)

    def firsts(xs_acts):
        return [1e3 * _once_s(call(x, a)) - rec["l1_hit_us"] / 1e3 for x, a in xs_acts]

    if phase == "compile":
        # L3 misses: each activation's first call compiles (NVRTC), writes the cubin, loads it.
        # Measured before the L1 hits, so the identity kernel is one of them.
        rec["l3_miss_wall_ms"] = phase_of(
            "l3_miss", lambda: [1e3 * _once_s(call(x16, a)) for a in LEVELS_ACTIVATIONS],
            {"compiles": n_acts, "disk_hits": 0})
        info = bl.normjit_cache_info(normjit) or {}
        rec["nvrtc_ms"] = [ms for _, ms in (info.get("compile_ms") or [])[n_before:]]
        phase_of("l1_hit", l1_hits, {"plan_misses": 0, "compiles": 0})
        rec["l3_miss_ms"] = [t - rec["l1_hit_us"] / 1e3 for t in rec["l3_miss_wall_ms"]]
        # L1 misses that hit L2: a new N is a new plan (the key holds the exact sizes) with the
        # same kernel (the kernel depends on the instance, not on N).
        k = max(1, args.level_samples)
        xs = [torch.randn((3 + i,) + LEVELS_SHAPE[1:], device="cuda", dtype=torch.float16)
              for i in range(k)]
        rec["l1_miss_us"] = [1e3 * t for t in phase_of(
            "l1_miss", lambda: firsts([(x, "identity") for x in xs]),
            {"plan_misses": k, "compiles": 0, "kernel_misses": 0, "disk_hits": 0})]
        # L2 misses after clear_memory_caches(): plans and loaded kernels are dropped; whether the
        # cubin comes from disk or is still held in memory shows in the disk_hits counter.
        rounds = max(1, args.level_samples // n_acts)

        def cleared():
            out = []
            for _ in range(rounds):
                normjit.clear_memory_caches()
                out += firsts([(x16, a) for a in LEVELS_ACTIVATIONS])
            return out

        rec["l2_miss_cleared_ms"] = phase_of("l2_miss_cleared", cleared,
                                             {"kernel_misses": rounds * n_acts, "compiles": 0})
        rec["l2_miss_cleared_disk_hits"] = rec["counters"]["l2_miss_cleared"].get("disk_hits", 0)
    else:
        # Fresh process, filled disk cache: each kernel's first call is an L1 miss, an L2 miss
        # and an L3 hit (read, verify, cuModuleLoadData). The L1 hit baseline is taken after.
        def disk_firsts():
            return [1e3 * _once_s(call(x16, a)) for a in LEVELS_ACTIVATIONS]

        walls = phase_of("l3_hit", disk_firsts, {"compiles": 0, "disk_hits": n_acts})
        phase_of("l1_hit", l1_hits, {"plan_misses": 0, "compiles": 0})
        rec["l3_hit_ms"] = [t - rec["l1_hit_us"] / 1e3 for t in walls]
    rec["cache_info_end"] = bl.normjit_cache_info(normjit)
    return rec


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------


def measure(args) -> dict:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
    if args.case in ("cold", "warm"):
        return case_normjit(args, with_warmup=False)
    if args.case == "warmup":
        return case_normjit(args, with_warmup=True)
    if args.case in ("compile_cold", "compile_warm"):
        return case_compile(args)
    return case_levels(args, args.case.split("_", 1)[1])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rec = {"case": args.case, "layout": args.layout, "error": None,
           "normjit_cache_dir": os.environ.get("NORMJIT_CACHE_DIR")}
    t0 = time.perf_counter()
    try:
        rec.update(measure(args))
    except Exception as exc:  # noqa: BLE001 - the parent reports it; the traceback goes to the log
        traceback.print_exc()
        rec["error"] = bl.short_error(exc)
    rec["child_s"] = time.perf_counter() - t0
    bl.write_json(args.result, rec)
    if rec["error"]:
        bl.log(f"cold_start_child {args.case} {args.layout}: ERROR {rec['error']}")
    return 0 if not rec["error"] else 1


if __name__ == "__main__":
    sys.exit(main())
