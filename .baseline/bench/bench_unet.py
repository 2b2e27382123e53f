#!/usr/bin/env python3
"""End to end: training steps of an nnU-Net-style 3D U-Net, torch eager vs normjit vs torch.compile.

The network follows nnU-Net's PlainConvUNet for 3D full resolution: six encoder stages with
32, 64, 128, 256, 320, 320 channels and strides 1, 2, 2, 2, 2, 2; every stage is two blocks of
Conv3d(3x3x3, bias) -> InstanceNorm3d(affine=True, eps=1e-5) -> LeakyReLU(0.01, inplace=True),
each block an nn.Sequential so that normjit.convert can fold the LeakyReLU into the norm; the
decoder upsamples with ConvTranspose3d(kernel = stride), concatenates the skip and runs two blocks;
a 1x1x1 convolution gives 3 classes; no deep supervision. Weights are He-initialized (a=0.01).

One training step = fp16 autocast forward, cross-entropy on random labels, GradScaler backward,
unscale + clip_grad_norm_(12), SGD(lr 0.01, momentum 0.99, nesterov, weight decay 3e-5) step, as
nnU-Net does. cudnn.benchmark is on, as in nnU-Net.

Variants (same initial weights: deep copies of one model built with a fixed seed; same batch):
eager NCDHW, eager channels_last_3d, normjit.convert'ed NCDHW and channels_last_3d, and with
--compile torch.compile NCDHW. For each we report
- first-step wall time (includes cuDNN autotuning, normjit's NVRTC compiles or torch.compile);
- the median of the timed steps (CUDA events around each step) after the warm-up steps;
- the losses of the first steps, which must agree across variants (a wrong norm shows up here);
- for normjit, how many kernels were compiled (normjit.cache_info()) and how many modules convert
  replaced or folded.

Writes unet.json and unet.md to --out and prints the table. Exit status 1 when a variant fails or
a normjit variant's first loss differs from the eager NCDHW one by more than 1 %.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402

FEATURES = (32, 64, 128, 256, 320, 320)
STRIDES = (1, 2, 2, 2, 2, 2)
NUM_CLASSES = 3
IN_CHANNELS = 1
VARIANTS = ("eager_ncdhw", "eager_ndhwc", "normjit_ncdhw", "normjit_ndhwc", "compile_ncdhw",
            "compile_ndhwc")
LOSS_REL_TOL = 1e-2


def parse_patch(text: str) -> tuple[int, int, int]:
    """'128' -> (128,128,128); '64,96,128' -> (64,96,128). Each size must be divisible by the
    product of the strides (32), or the decoder's upsampled maps would not match the skips, and at
    least twice that, or the bottleneck has a single voxel, which instance norm rejects."""
    parts = [int(p) for p in text.replace("x", ",").split(",") if p.strip()]
    if len(parts) == 1:
        parts *= 3
    if len(parts) != 3:
        raise ValueError(f"--patch {text!r}: give one size or three (D,H,W)")
    factor = 1
    for s in STRIDES:
        factor *= s
    if any(p % factor or p < 2 * factor for p in parts):
        raise ValueError(f"--patch {text!r}: every size must be a multiple of {factor}, "
                         f"at least {2 * factor}")
    return tuple(parts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--patch", default=None, help="patch size, e.g. 128 or 80,192,160 "
                                                 "(default 128; 64 with --quick)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--warmup-steps", type=int, default=3,
                   help="untimed steps, the first included (its wall time is reported)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10; 5 --quick)")
    p.add_argument("--compile", action="store_true", help="add the torch.compile NCDHW variant")
    p.add_argument("--variants", default=None,
                   help=f"comma list from {', '.join(VARIANTS)} (default: the four eager/normjit "
                        "ones, plus compile_ncdhw with --compile)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=bl.default_out_dir())
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    args.patch = parse_patch(args.patch or ("64" if args.quick else "128"))
    if args.steps is None:
        args.steps = 5 if args.quick else 10
    if args.warmup_steps < 1:
        p.error("--warmup-steps must be at least 1 (the first step)")
    if args.variants:
        args.variants = bl.parse_choices(args.variants, VARIANTS, "variant")
    else:
        args.variants = list(VARIANTS[:4]) + (["compile_ncdhw"] if args.compile else [])
    return args


# --------------------------------------------------------------------------------------------------
# The network
# --------------------------------------------------------------------------------------------------


def build_unet():
    """nnU-Net's PlainConvUNet (3D, 6 stages, no deep supervision), He-initialized."""
    import torch
    from torch import nn

    def block(cin, cout, stride):
        return nn.Sequential(
            nn.Conv3d(cin, cout, 3, stride=stride, padding=1, bias=True),
            nn.InstanceNorm3d(cout, eps=1e-5, affine=True),
            nn.LeakyReLU(0.01, inplace=True))

    def stage(cin, cout, stride):
        return nn.Sequential(block(cin, cout, stride), block(cout, cout, 1))

    class PlainConvUNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.ModuleList()
            cin = IN_CHANNELS
            for f, s in zip(FEATURES, STRIDES):
                self.encoder.append(stage(cin, f, s))
                cin = f
            self.upsample = nn.ModuleList()
            self.decoder = nn.ModuleList()
            for i in range(len(FEATURES) - 1, 0, -1):
                self.upsample.append(nn.ConvTranspose3d(FEATURES[i], FEATURES[i - 1],
                                                        STRIDES[i], stride=STRIDES[i], bias=True))
                self.decoder.append(stage(2 * FEATURES[i - 1], FEATURES[i - 1], 1))
            self.head = nn.Conv3d(FEATURES[0], NUM_CLASSES, 1, bias=True)

        def forward(self, x):
            skips = []
            for enc in self.encoder:
                x = enc(x)
                skips.append(x)
            x = skips.pop()
            for up, dec in zip(self.upsample, self.decoder):
                x = dec(torch.cat((up(x), skips.pop()), dim=1))
            return self.head(x)

    model = PlainConvUNet()
    for m in model.modules():
        if isinstance(m, (nn.Conv3d, nn.ConvTranspose3d)):
            nn.init.kaiming_normal_(m.weight, a=0.01)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return model


def count_modules(model, normjit) -> dict:
    """How many norms are torch's and how many normjit's, and how many LeakyReLUs are left."""
    from torch import nn

    counts = {"torch_instance_norm": 0, "normjit_modules": 0, "leaky_relu": 0}
    for m in model.modules():
        if type(m).__module__.startswith("normjit"):
            counts["normjit_modules"] += 1
        elif isinstance(m, nn.modules.instancenorm._InstanceNorm):
            counts["torch_instance_norm"] += 1
        if isinstance(m, nn.LeakyReLU):
            counts["leaky_relu"] += 1
    return counts


# --------------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------------


def make_train_step(model, params):
    """One nnU-Net training step on (x, y); returns the detached loss (no host sync)."""
    import torch

    opt = torch.optim.SGD(params, lr=0.01, momentum=0.99, nesterov=True, weight_decay=3e-5)
    scaler = torch.amp.GradScaler("cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 12.0)
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    return step


def run_variant(name: str, base, x, y, normjit, args) -> dict:
    """Train one variant from base's weights; time the first step and the timed steps."""
    import torch

    kind, layout = name.split("_")
    rec = {"name": name, "kind": kind, "layout": layout, "error": None}
    if kind == "normjit" and normjit is None:
        rec["error"] = "normjit not available"
        return rec
    torch.manual_seed(args.seed)
    model = copy.deepcopy(base).cuda()
    info_before = bl.normjit_cache_info(normjit) if kind == "normjit" else None
    if kind == "normjit":
        converted = normjit.convert(model)
        model = converted if converted is not None else model
        rec["converted"] = count_modules(model, normjit)
    if layout == "ndhwc":
        model = model.to(memory_format=torch.channels_last_3d)
        x = x.contiguous(memory_format=torch.channels_last_3d)
    params = [p for p in model.parameters() if p.requires_grad]
    runner = torch.compile(model) if kind == "compile" else model
    step = make_train_step(runner, params)

    torch.cuda.reset_peak_memory_stats()
    losses = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    losses.append(step(x, y))
    torch.cuda.synchronize()
    rec["first_step_s"] = time.perf_counter() - t0
    for _ in range(args.warmup_steps - 1):
        losses.append(step(x, y))
    torch.cuda.synchronize()

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps)]
    wall0 = time.perf_counter()
    for i in range(args.steps):
        starts[i].record()
        losses.append(step(x, y))
        ends[i].record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - wall0
    step_ms = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    rec.update(
        step_ms=step_ms,
        median_ms=bl.median(step_ms),
        min_ms=min(step_ms),
        wall_ms_per_step=1e3 * wall / args.steps,
        losses=[bl.finite_or_none(v.item()) for v in losses],
        peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30,
    )
    if kind == "normjit":
        info_after = bl.normjit_cache_info(normjit)
        rec["cache_info"] = info_after
        rec["normjit_counters"] = bl.counter_delta(info_before, info_after)
        before, after = bl.compile_count(info_before), bl.compile_count(info_after)
        rec["normjit_compiles"] = None if after is None else after - (before or 0)
    return rec


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "unet.json")
    md_path = os.path.join(args.out, "unet.md")

    import torch
    import torch._dynamo

    if not torch.cuda.is_available():
        bl.log("bench_unet: no CUDA device")
        return 2
    torch.backends.cudnn.benchmark = True
    normjit = None
    nj_info = {"available": False, "reason": "not requested"}
    if any(v.startswith("normjit") for v in args.variants):
        normjit, nj_info = bl.load_normjit()
        if normjit is None:
            bl.log(f"!! normjit is NOT available ({nj_info['reason']}); running the others")

    torch.manual_seed(args.seed)
    base = build_unet()
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    x = torch.randn((args.batch, IN_CHANNELS, *args.patch), device="cuda", generator=gen)
    y = torch.randint(0, NUM_CLASSES, (args.batch, *args.patch), device="cuda", generator=gen)
    doc = dict(bl.environment(), benchmark="unet", patch=list(args.patch), batch=args.batch,
               warmup_steps=args.warmup_steps, steps=args.steps, cudnn_benchmark=True,
               parameters=sum(p.numel() for p in base.parameters()),
               normjit=nj_info, variants=[], started=bl.now_iso())
    bl.log(f"U-Net: {doc['parameters'] / 1e6:.1f} M parameters, batch {args.batch}, patch "
           f"{'x'.join(map(str, args.patch))}, variants {', '.join(args.variants)}")

    failures = 0
    for name in args.variants:
        bl.log(f"-- {name} ...")
        try:
            rec = run_variant(name, base, x, y, normjit, args)
        except Exception as exc:  # noqa: BLE001 - one failure must not lose the run
            rec = {"name": name, "error": bl.short_error(exc)}
        finally:
            torch._dynamo.reset()
            bl.free_gpu_memory()
        doc["variants"].append(rec)
        if rec.get("error"):
            failures += 1
            bl.log(f"   {name}: ERROR {rec['error']}")
        else:
            bl.log(f"   {name}: first step {rec['first_step_s']:.2f} s, median "
                   f"{rec['median_ms']:.1f} ms/step, losses "
                   f"{', '.join(bl.fmt_float(v, 4) for v in rec['losses'][:3])}, peak "
                   f"{rec['peak_mem_gib']:.1f} GiB"
                   + (f", normjit counters {rec.get('normjit_counters')}, modules "
                      f"{rec.get('converted')}" if rec.get("kind") == "normjit" else ""))
        bl.write_json(json_path, doc)

    ref = next((v for v in doc["variants"] if v.get("losses") and not v.get("error")), None)
    for v in doc["variants"]:
        if v is ref or not v.get("losses") or not ref:
            continue
        l1, r1 = v["losses"][0], ref["losses"][0]
        if l1 is None or r1 is None or abs(l1 - r1) > LOSS_REL_TOL * abs(r1):
            v["note"] = f"first loss differs from {ref['name']} by more than {LOSS_REL_TOL:.0%}"
            if v.get("kind") == "normjit":
                failures += 1
    doc["finished"] = bl.now_iso()
    doc["failures"] = failures
    bl.write_json(json_path, doc)
    markdown = "\n".join([
        "# nnU-Net-style 3D U-Net training step",
        "",
        f"device: {doc['device']} | torch {doc['torch']} | batch {args.batch}, patch "
        f"{'x'.join(map(str, args.patch))}, fp16 autocast + GradScaler, SGD momentum 0.99; "
        f"median of {args.steps} steps after {args.warmup_steps} warm-up steps (the first "
        "included); losses of steps 1 and 3 from identical weights and data; "
        "normjit: " + ("available" if normjit else f"NOT AVAILABLE ({nj_info['reason']})"),
        "",
        bl.unet_table(doc),
        "",
    ])
    bl.write_text(md_path, markdown)
    bl.log("")
    bl.log(markdown)
    bl.log(f"bench_unet failures: {failures} (of {len(args.variants)} variants)")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
