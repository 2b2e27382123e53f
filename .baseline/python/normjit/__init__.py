"""normjit: fast InstanceNorm for PyTorch through run-time generated CUDA kernels.

    import normjit
    model = normjit.convert(model)              # torch InstanceNorm{1,2,3}d -> normjit, in place
    y = normjit.functional.instance_norm(x, weight=w, bias=b, activation="leaky_relu")
    norm = normjit.nn.InstanceNorm3d(32, affine=True, activation="relu")
    normjit.warmup(model, example_batch)        # compile/load every kernel before the first step
    normjit.autotune(True)                      # time launch configs on each shape's first call

Inputs normjit does not serve (CPU tensors, float64, ...) fall back to torch with a warning.
"""
from . import _ops
from . import functional, nn
from .convert import convert
from .warmup import warmup

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "autotune",
    "autotune_enabled",
    "cache_info",
    "clear_memory_caches",
    "convert",
    "core_version",
    "functional",
    "is_available",
    "nn",
    "reset_cache_stats",
    "unavailable_reason",
    "warmup",
]


def is_available() -> bool:
    """Whether normjit's kernels can run here (compiled binding, CUDA driver, NVRTC, a GPU)."""
    return _ops.available()


unavailable_reason = _ops.unavailable_reason
cache_info = _ops.cache_info
reset_cache_stats = _ops.reset_cache_stats
clear_memory_caches = _ops.clear_memory_caches
core_version = _ops.core_version


def autotune(enabled: bool = True) -> None:
    """Turn autotune on (or off), like ``torch.backends.cudnn.benchmark``.

    With it on, the first call of each shape class (fusion, dtype, layout, sizes, strides,
    alignment) times a few valid launch configurations of its kernel on the GPU, on the call's own
    stream and tensors, and keeps the fastest; later calls of that shape cost nothing extra. The
    choice is stored in normjit's disk cache (``NORMJIT_CACHE_DIR``, else ~/.cache/normjit), so
    the next process loads it instead of searching. That first call synchronises its stream. The
    outputs and running statistics are written exactly once; in-place calls and calls during CUDA
    graph capture are not timed. ``NORMJIT_AUTOTUNE=1`` turns it on at start. Off by default.
    ``cache_info()`` counts ``autotune_searches`` and ``autotune_records_loaded``.
    """
    _ops.set_autotune(enabled)


def autotune_enabled() -> bool:
    """Whether autotune is on (False without the compiled binding)."""
    return _ops.autotune_enabled()
