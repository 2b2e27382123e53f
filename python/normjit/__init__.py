"""normjit: fast InstanceNorm for PyTorch through run-time generated CUDA kernels.

    import normjit
    model = normjit.convert(model)              # torch InstanceNorm{1,2,3}d -> normjit, in place
    y = normjit.functional.instance_norm(x, weight=w, bias=b, activation="leaky_relu")
    norm = normjit.nn.InstanceNorm3d(32, affine=True, activation="relu")
    normjit.warmup(model, example_batch)        # compile/load every kernel before the first step

Inputs normjit does not serve (CPU tensors, float64, ...) fall back to torch with a warning.
"""
from . import _ops
from . import functional, nn
from .convert import convert
from .warmup import warmup

__version__ = "0.1.0"

__all__ = [
    "__version__",
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
