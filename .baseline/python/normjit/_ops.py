"""Loads the compiled binding ``normjit._C`` and registers the fake (meta) kernels of its ops.

If ``normjit._C`` cannot be imported (not built, built against another torch, ...), normjit stays
importable: :func:`available` is False, :func:`unavailable_reason` says why, and
``normjit.functional`` falls back to torch.
"""
from __future__ import annotations

import importlib

import torch  # must come first: normjit._C resolves its symbols against torch's libraries

_C = None
_import_error = None
try:
    # Registers the normjit::instance_norm_fwd/bwd operators.
    _C = importlib.import_module(__package__ + "._C")
except Exception as e:  # ImportError, OSError (undefined symbol: built against another torch)
    _C = None
    _import_error = f"{type(e).__name__}: {e}"

if _C is not None:
    _built_for = getattr(_C, "torch_version", None)
    _running = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if _built_for is not None and _built_for != _running:
        _import_error = (
            f"normjit._C was built against torch {_built_for} but torch {_running} is running; "
            "rebuild normjit (pip install --no-build-isolation .) in this environment"
        )
        _C = None

# Operator handles, looked up once (the per-call path uses these directly).
fwd = None
bwd = None
if _C is not None:
    fwd = torch.ops.normjit.instance_norm_fwd.default
    bwd = torch.ops.normjit.instance_norm_bwd.default

if _C is not None and hasattr(_C, "prefetch_shutdown"):
    import atexit

    # The core compiles backward kernels on background threads (src/runtime/prefetch.cpp): join
    # them (at most the compiles in progress) before the process's C++ teardown destroys NVRTC
    # under a running compile.
    atexit.register(_C.prefetch_shutdown)
    if hasattr(_C, "enable_prefetch"):
        _C.enable_prefetch()  # safe here: the atexit hook above joins the threads before teardown

_state = None  # (available, reason) once probed


def _probe():
    global _state
    if _state is None:
        if _C is None:
            _state = (False, f"normjit._C could not be imported ({_import_error})")
        else:
            try:
                ok, reason = _C.is_available()
            except Exception as e:  # pragma: no cover - defensive
                ok, reason = False, f"{type(e).__name__}: {e}"
            _state = (bool(ok), "" if ok else str(reason))
    return _state


# Probed lazily (the probe initialises the CUDA driver), and treated as a constant by dynamo so
# that torch.compile(fullgraph=True) traces through normjit.functional without a graph break.
def _available_impl() -> bool:
    return (_state if _state is not None else _probe())[0]


try:
    available = torch.compiler.assume_constant_result(_available_impl)
except AttributeError:  # older torch without torch.compiler.assume_constant_result
    available = _available_impl


def unavailable_reason() -> str:
    """Why normjit kernels cannot run here ('' when they can)."""
    return _probe()[1]


def cache_info() -> dict:
    """Cache counters of the core library and the binding's layout_copies counter.

    Keys: available, reason, plan_hits, plan_misses, kernel_hits, kernel_misses, disk_hits,
    disk_misses, disk_writes, disk_errors, compiles, compile_ms_total, compile_ms (list of
    (kernel name, ms)), autotune_searches, autotune_records_loaded, layout_copies. Without the
    compiled binding only available/reason.
    """
    ok, reason = _probe()
    info = {"available": ok, "reason": reason}
    if _C is not None:
        info.update(_C.cache_info())
    return info


def reset_cache_stats() -> None:
    if _C is not None:
        _C.reset_cache_stats()


def clear_memory_caches() -> None:
    if _C is not None:
        _C.clear_memory_caches()


def set_autotune(enabled: bool) -> None:
    if _C is not None:  # without the binding nothing runs on the GPU: nothing to tune
        _C.set_autotune(bool(enabled))


def autotune_enabled() -> bool:
    return bool(_C.autotune_enabled()) if _C is not None else False


def core_version():
    """Version of the C++ core library, or None without the compiled binding."""
    return _C.version() if _C is not None else None


# --------------------------------------------------------------------------------------------
# Fake (meta) kernels: the same output metadata as the CUDA kernels in python/csrc/ops.cpp.
# --------------------------------------------------------------------------------------------
def _served_format(x):
    """The layout the CUDA kernels produce for x (contiguous is preferred when x is both)."""
    if x.is_contiguous():
        return torch.contiguous_format
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return torch.contiguous_format  # the kernel copies x to contiguous first


if _C is not None:
    _register_fake = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract

    @_register_fake("normjit::instance_norm_fwd")
    def _instance_norm_fwd_fake(x, weight, bias, residual, running_mean, running_var,
                                use_input_stats, momentum, eps, activation, activation_param):
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=_served_format(x))
        n = x.shape[0] * x.shape[1] if use_input_stats else 0
        save_mean = x.new_empty((n,), dtype=torch.float32)
        save_rstd = x.new_empty((n,), dtype=torch.float32)
        return y, save_mean, save_rstd

    @_register_fake("normjit::instance_norm_bwd")
    def _instance_norm_bwd_fake(dy, x, weight, bias, residual, save_mean, save_rstd,
                                activation, activation_param, output_mask):
        fmt = _served_format(x)
        dx = torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=fmt)
        if output_mask[0] and weight is not None:
            dweight = x.new_empty(weight.shape, dtype=weight.dtype)
        else:
            dweight = x.new_empty((0,), dtype=weight.dtype if weight is not None else torch.float32)
        if output_mask[1] and bias is not None:
            dbias = x.new_empty(bias.shape, dtype=bias.dtype)
        else:
            dbias = x.new_empty((0,), dtype=bias.dtype if bias is not None else torch.float32)
        if output_mask[2] and residual is not None:
            dresidual = torch.empty(x.shape, dtype=residual.dtype, device=x.device,
                                    memory_format=fmt)
        else:
            dresidual = x.new_empty((0,))
        return dx, dweight, dbias, dresidual
