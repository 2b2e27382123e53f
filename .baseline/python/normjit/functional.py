"""normjit.functional.instance_norm: torch.nn.functional.instance_norm with a fused epilogue.

    y = act(instance_norm(x) * weight + bias [+ residual])

CUDA tensors in float32/float16/bfloat16 with 1 to 3 spatial dims run normjit's kernels; anything
else (CPU tensors, float64, other ranks, normjit unavailable) falls back to torch, warned once per
reason. The CUDA path is kept short on purpose: it counts toward the per-call host time.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from . import _ops

__all__ = ["instance_norm", "ACTIVATIONS"]

# Activation names -> codes of normjit::Activation (and of the op's `activation` argument).
ACTIVATIONS = {
    None: 0,
    "identity": 0,
    "relu": 1,
    "leaky_relu": 2,
    "gelu": 3,  # erf form, as torch.nn.GELU(approximate='none')
    "gelu_tanh": 4,  # torch.nn.GELU(approximate='tanh')
    "silu": 5,
    "sigmoid": 6,
    "tanh": 7,
}
_SERVED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Set by normjit.warmup only while it records a model's calls: called with each call's arguments,
# it returns the output to use (during a fake-tensor trace) or None to go on as usual. None
# otherwise, so that the per-call path pays one `is None` check.
_recorder = None


def instance_norm(
    input,
    running_mean=None,
    running_var=None,
    weight=None,
    bias=None,
    use_input_stats=True,
    momentum=0.1,
    eps=1e-5,
    *,
    activation=None,
    negative_slope=0.01,
    residual=None,
):
    """Instance normalization with an optional fused residual add and activation.

    Same arguments and semantics as :func:`torch.nn.functional.instance_norm`, plus:

    activation: None/'identity', 'relu', 'leaky_relu', 'gelu' (erf), 'gelu_tanh', 'silu',
        'sigmoid' or 'tanh', applied after the affine transform and the residual add.
    negative_slope: slope of 'leaky_relu' for negative inputs.
    residual: a tensor with input's shape, added before the activation.
    """
    act = ACTIVATIONS.get(activation, -1)
    if act < 0:
        raise ValueError(
            f"normjit: unknown activation {activation!r}; expected one of "
            f"{[k for k in ACTIVATIONS if k is not None]} or None"
        )
    if _recorder is not None:
        y = _recorder(input, weight, residual, running_mean, use_input_stats, act)
        if y is not None:
            return y
    if input.is_cuda and input.dtype in _SERVED_DTYPES and 3 <= input.dim() <= 5 and _ops.available():
        shape = input.shape
        if use_input_stats and shape[2:].numel() == 1:
            raise ValueError(
                f"Expected more than 1 spatial element when training, got input size {shape}"
            )
        if input.numel() == 0:
            return _empty_result(input, weight, bias, residual, act, negative_slope)
        return _ops.fwd(input, weight, bias, residual, running_mean, running_var,
                        use_input_stats, momentum, eps, act, negative_slope)[0]
    return _fallback(input, running_mean, running_var, weight, bias, use_input_stats, momentum,
                     eps, act, negative_slope, residual)


# ------------------------------------------------------------------------------------------------
# Fallback to torch
# ------------------------------------------------------------------------------------------------
_warned = set()


def _fallback_reason(input):
    if not input.is_cuda:
        return f"input is on {input.device.type} (normjit runs on CUDA tensors)"
    if input.dtype not in _SERVED_DTYPES:
        return f"dtype {input.dtype} is not served (float32, float16 and bfloat16 are)"
    if not 3 <= input.dim() <= 5:
        return (f"{input.dim()}-d input is not served (3 to 5 dims: N, C and 1 to 3 "
                "spatial dims)")
    return f"normjit is not available: {_ops.unavailable_reason()}"


def _fallback(input, running_mean, running_var, weight, bias, use_input_stats, momentum, eps,
              act, negative_slope, residual):
    reason = _fallback_reason(input)
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"normjit: falling back to torch.nn.functional.instance_norm: {reason}",
                      stacklevel=3)
    y = F.instance_norm(input, running_mean, running_var, weight, bias, use_input_stats,
                        momentum, eps)
    if residual is not None:
        y = y + residual
    return apply_activation(y, act, negative_slope)


def apply_activation(y, act, negative_slope=0.01):
    """The epilogue activation (by code) with torch ops: the reference for normjit's fusion."""
    if act == 0:
        return y
    if act == 1:
        return F.relu(y)
    if act == 2:
        return F.leaky_relu(y, negative_slope)
    if act == 3:
        return F.gelu(y)
    if act == 4:
        return F.gelu(y, approximate="tanh")
    if act == 5:
        return F.silu(y)
    if act == 6:
        return torch.sigmoid(y)
    if act == 7:
        return torch.tanh(y)
    raise ValueError(f"normjit: unknown activation code {act}")


def _empty_result(input, weight, bias, residual, act, negative_slope):
    """Zero-size input: an empty result, still connected to the inputs for autograd."""
    shape = (1, input.shape[1]) + (1,) * (input.dim() - 2)
    dims = tuple(range(2, input.dim()))
    y = input - input.mean(dims, keepdim=True)
    if weight is not None:
        y = y * weight.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    if residual is not None:
        y = y + residual
    return apply_activation(y, act, negative_slope).to(input.dtype)
