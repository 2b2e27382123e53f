"""normjit.warmup(model, example_input): every kernel of a model's first step, compiled beforehand.

Without it, each new kernel (a new shape class, dtype, layout or fusion) is compiled by NVRTC on
its first call, about a second each, one after another inside the first training step; and a
stream being captured into a CUDA graph cannot compile at all. warmup:

  1. runs one forward of a copy of the model on fake tensors (torch's FakeTensorMode: sizes,
     dtypes and strides, no memory, no computation) and records every call of normjit's instance
     norm: input sizes/strides/dtype, weight dtype, residual, activation, running statistics, and
     whether it trains (the module's training flag);
  2. hands the calls to the core (normjit._C.warmup_calls), which turns them into kernels with
     the runtime's own key and heuristics code, compiles the distinct ones in parallel through the
     disk cache and, on a GPU, loads them.

Why fake CUDA tensors and not the meta device: on meta, CUDA autocast does nothing and a
convolution of a channels_last_3d input returns a contiguous output, so a meta run would record
float32 NCDHW calls where the real run makes float16 NDHWC ones. Fake tensors on a CUDA device
dispatch as that device would, also on a machine without a GPU.
"""
from __future__ import annotations

import contextlib
import copy

import torch
from torch.utils._pytree import tree_leaves, tree_map_only

from . import _ops, functional
from .nn import _FusedInstanceNorm

__all__ = ["warmup"]


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


class _Recorder:
    """functional.instance_norm's recorder: one dict per call (the format of _C.warmup_calls)."""

    def __init__(self, model, backward, fake):
        self.model, self.backward, self.fake = model, backward, fake
        self.names = {id(m): n for n, m in model.named_modules()}
        self.owner = None  # the normjit module whose forward is running (set by its hooks)
        self.calls = []

    def __call__(self, x, weight, residual, running_mean, use_input_stats, act):
        if x.dtype not in functional._SERVED_DTYPES or not 3 <= x.dim() <= 5 or x.numel() == 0:
            return None  # no kernel: torch's fallback or the zero-size path, as in the real run
        # Functional calls outside a normjit module train when the model does.
        owner = self.owner if self.owner is not None else self.model
        self.calls.append({
            "module": self.names.get(id(owner), ""),
            "sizes": list(x.shape),
            "strides": list(x.stride()),
            "offset": x.storage_offset(),
            "dtype": _dtype_name(x.dtype),
            "weight_dtype": None if weight is None else _dtype_name(weight.dtype),
            "residual": residual is not None,
            "activation": act,
            "use_input_stats": bool(use_input_stats),
            "running": running_mean is not None,
            "fwd": True,
            "bwd": bool(self.backward and use_input_stats and owner.training),
        })
        if not self.fake:
            return None  # a real step: compute as usual
        # What the CUDA op returns (its layout rule), so that later layers see the real layouts.
        return torch.empty(x.shape, dtype=x.dtype, device=x.device,
                           memory_format=_ops._served_format(x))


@contextlib.contextmanager
def _recording(model, recorder):
    """Installs the recorder, and hooks telling it which normjit module is running."""
    def enter(module, args):
        recorder.owner = module

    def leave(module, args, output):
        recorder.owner = None

    handles = []
    for m in model.modules():
        if isinstance(m, _FusedInstanceNorm):
            handles += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
    functional._recorder = recorder
    try:
        yield
    finally:
        functional._recorder = None
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _cuda_autocast(dtype):
    """CUDA autocast to `dtype` (None: off). torch.autocast('cuda') turns itself off on a machine
    without CUDA, yet fake CUDA tensors follow CUDA autocast: so the state is set directly."""
    prev = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", dtype is not None)
    if dtype is not None:
        torch.set_autocast_dtype("cuda", dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", prev[0])
        torch.set_autocast_dtype("cuda", prev[1])


def _trace_fake(model, args, kwargs, device, amp, backward):
    from torch._subclasses.fake_tensor import FakeTensorMode

    # allow_non_fake_inputs: real tensors the forward meets (module attributes that are neither
    # parameters nor buffers, constants) are converted instead of rejected.
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        def fake(t):
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)

        # Copy the module tree but no parameter or buffer data (a plain deepcopy of a model on the
        # GPU would first duplicate it there): the memo maps each of them to a fake.
        memo = {id(t): fake(t) for t in (*model.parameters(), *model.buffers())}
        twin = copy.deepcopy(model, memo)
        args, kwargs = tree_map_only(torch.Tensor, fake, (args, kwargs))
    recorder = _Recorder(twin, backward, fake=True)
    with mode, torch.no_grad(), _cuda_autocast(amp), _recording(twin, recorder):
        twin(*args, **kwargs)
    return recorder.calls


def _run_real(model, args, kwargs, amp, backward):
    """One real forward (+backward) step; the model's gradients and buffers are left as they were."""
    grads = {p: p.grad for p in model.parameters()}
    buffers = [(b, b.detach().clone()) for b in model.buffers()]  # running statistics move
    recorder = _Recorder(model, backward, fake=False)
    try:
        for p in grads:
            p.grad = None
        with _cuda_autocast(amp), _recording(model, recorder):
            out = model(*args, **kwargs)
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        if outs and any(c["bwd"] for c in recorder.calls):
            torch.autograd.backward([t.float().sum() for t in outs])
    finally:
        for p, g in grads.items():
            p.grad = g
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
    return recorder.calls


def warmup(model, example_input, *, backward=True, autocast=None, dtype=None, jobs=None,
           profile=None, verbose=True):
    """Compile (and on a GPU, load) every kernel that ``model(example_input)`` will need.

    model: a module whose instance norms are normjit's (normjit.nn modules, e.g. after
        normjit.convert, or normjit.functional.instance_norm calls in its forward).
    example_input: what the model is called with: a tensor, a tuple of positional arguments or a
        dict of keyword arguments. Only sizes, dtypes, memory formats and the device matter.
        On a CUDA device the kernels are chosen for that GPU and loaded into it; on the CPU they
        are chosen for the built-in profile ``profile`` (default 'H200'; 'H100', 'A100', 'L4')
        and only compiled into the disk cache (to fill it ahead of time, e.g. on a build host).
    backward: also the backward kernels of the calls that train (of a normjit module in
        training mode; a functional call outside one trains when the model does).
    autocast: None: as the enclosing torch.autocast('cuda') context, if any; True: as under
        torch.autocast('cuda', dtype) (dtype float16 unless given); False: off. Giving dtype
        implies True.
    jobs: parallel NVRTC compiles (default: one per CPU).

    The calls are recorded from a forward on fake tensors. If that fails (an op without fake
    support, a data-dependent branch), one real forward and backward step runs instead; the
    model's gradients and buffers are restored afterwards, and the summary says so.

    Returns the dict of normjit._C.warmup_calls (kernels, compiled, from_disk, failed, errors,
    loaded, seconds, profile, arch, names) plus 'calls' (the recorded calls) and 'mode' ('fake',
    or 'real step: <why the fake trace failed>'). Raises RuntimeError when a kernel does not
    compile or load (the first real call would fail the same way).
    """
    if _ops._C is None:
        raise RuntimeError(f"normjit.warmup: {_ops.unavailable_reason()}")
    if isinstance(example_input, dict):
        args, kwargs = (), example_input
    elif isinstance(example_input, tuple):
        args, kwargs = example_input, {}
    else:
        args, kwargs = (example_input,), {}
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if not tensors:
        raise ValueError("normjit.warmup: example_input holds no tensor")
    device = tensors[0].device
    gpu = device.type == "cuda" and _ops.available()
    if gpu and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if dtype is not None and autocast is None:
        autocast = True
    if autocast is None:
        amp = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
    else:
        amp = (dtype or torch.float16) if autocast else None

    try:
        fake_device = device if device.type == "cuda" else torch.device("cuda", 0)
        calls = _trace_fake(model, args, kwargs, fake_device, amp, backward)
        mode = "fake"
    except Exception as e:  # noqa: BLE001 - any failure of the trace: fall back to a real step
        mode = f"real step: the fake-tensor trace failed ({type(e).__name__}: {e})"
        calls = _run_real(model, args, kwargs, amp, backward)

    result = _ops._C.warmup_calls(calls, device.index if gpu else None, jobs or 0, profile)
    result["calls"] = calls
    result["mode"] = mode
    if result["failed"]:
        name, error = result["errors"][0]
        raise RuntimeError(f"normjit.warmup: {result['failed']} of {result['kernels']} kernels "
                           f"failed; the first, {name}:\n{error}")
    if verbose:
        print(_summary(result, device if gpu else None))
    return result


def _summary(r, device):
    if not r["calls"]:
        return ("normjit.warmup: no normjit instance-norm call recorded (is the model converted "
                "with normjit.convert?)")
    where = f"loaded on {device}" if device is not None else "compiled only (no GPU)"
    line = (f"normjit.warmup: {len(r['calls'])} calls -> {r['kernels']} kernels "
            f"({r['compiled']} compiled, {r['from_disk']} from disk) for {r['profile']} "
            f"(sm_{r['arch']}), {where}, in {r['seconds']:.1f} s")
    if r["mode"] != "fake":
        line += f"; recorded by one {r['mode']}"
    return line
