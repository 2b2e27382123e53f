"""Drop-in replacements for torch.nn.InstanceNorm1d/2d/3d with an optional fused activation.

They subclass torch's modules: same constructor arguments, parameters, buffers and state_dict keys
(torch checkpoints load as they are), same train/eval behaviour (running statistics are used in
eval when track_running_stats=True; like torch, num_batches_tracked is not incremented by instance
norm). Extra keyword-only arguments: activation (see normjit.functional.ACTIVATIONS) and
negative_slope. forward also takes an optional residual added before the activation.
"""
from __future__ import annotations

import warnings

import torch

from .functional import ACTIVATIONS, instance_norm

__all__ = ["InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"]


def _check_activation(activation):
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"normjit: unknown activation {activation!r}; expected one of "
            f"{[k for k in ACTIVATIONS if k is not None]} or None"
        )


class _FusedInstanceNorm:
    """forward/extra_repr shared by the three classes (placed before torch's class in the MRO)."""

    _batched_dims: int  # number of dims of a batched input: 3, 4 or 5

    def _set_activation(self, activation, negative_slope):
        _check_activation(activation)
        self.activation = activation
        self.negative_slope = float(negative_slope)

    def forward(self, input, residual=None):
        nd = input.dim()
        if nd == self._batched_dims:
            feature_dim = 1
        elif nd == self._batched_dims - 1:  # unbatched (C, *spatial), as torch accepts
            feature_dim = 0
        else:
            self._check_input_dim(input)  # raises torch's error
            raise ValueError(f"expected {self._batched_dims - 1}D or {self._batched_dims}D input "
                             f"(got {nd}D input)")
        if input.shape[feature_dim] != self.num_features:
            if self.affine:
                raise ValueError(
                    f"expected input's size at dim={feature_dim} to match num_features"
                    f" ({self.num_features}), but got: {input.shape[feature_dim]}."
                )
            warnings.warn(
                f"input's size at dim={feature_dim} does not match num_features. "
                "You can silence this warning by not passing in num_features, "
                "which is not used because affine=False",
                stacklevel=2,
            )
        if feature_dim == 0:
            input = input.unsqueeze(0)
            if residual is not None:
                residual = residual.unsqueeze(0)
        y = instance_norm(
            input,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            self.training or not self.track_running_stats,
            self.momentum if self.momentum is not None else 0.0,
            self.eps,
            activation=self.activation,
            negative_slope=self.negative_slope,
            residual=residual,
        )
        return y.squeeze(0) if feature_dim == 0 else y

    def extra_repr(self):
        s = super().extra_repr()
        if self.activation not in (None, "identity"):
            if self.activation == "leaky_relu":
                s += f", activation=leaky_relu(negative_slope={self.negative_slope})"
            else:
                s += f", activation={self.activation}"
        return s


class InstanceNorm1d(_FusedInstanceNorm, torch.nn.InstanceNorm1d):
    """torch.nn.InstanceNorm1d on normjit kernels, with an optional fused activation."""

    _batched_dims = 3

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False,
                 track_running_stats=False, device=None, dtype=None, *, activation=None,
                 negative_slope=0.01, **kwargs):
        torch.nn.InstanceNorm1d.__init__(self, num_features, eps, momentum, affine,
                                         track_running_stats, device, dtype, **kwargs)
        self._set_activation(activation, negative_slope)


class InstanceNorm2d(_FusedInstanceNorm, torch.nn.InstanceNorm2d):
    """torch.nn.InstanceNorm2d on normjit kernels, with an optional fused activation."""

    _batched_dims = 4

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False,
                 track_running_stats=False, device=None, dtype=None, *, activation=None,
                 negative_slope=0.01, **kwargs):
        torch.nn.InstanceNorm2d.__init__(self, num_features, eps, momentum, affine,
                                         track_running_stats, device, dtype, **kwargs)
        self._set_activation(activation, negative_slope)


class InstanceNorm3d(_FusedInstanceNorm, torch.nn.InstanceNorm3d):
    """torch.nn.InstanceNorm3d on normjit kernels, with an optional fused activation."""

    _batched_dims = 5

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False,
                 track_running_stats=False, device=None, dtype=None, *, activation=None,
                 negative_slope=0.01, **kwargs):
        torch.nn.InstanceNorm3d.__init__(self, num_features, eps, momentum, affine,
                                         track_running_stats, device, dtype, **kwargs)
        self._set_activation(activation, negative_slope)


# torch class -> normjit class, for normjit.convert
TORCH_TO_NORMJIT = {
    torch.nn.InstanceNorm1d: InstanceNorm1d,
    torch.nn.InstanceNorm2d: InstanceNorm2d,
    torch.nn.InstanceNorm3d: InstanceNorm3d,
}
