"""normjit.convert(model): swap torch InstanceNorm modules for normjit's, in place."""
from __future__ import annotations

import torch

from .nn import TORCH_TO_NORMJIT

__all__ = ["convert"]


def _activation_of(module):
    """(activation name, negative_slope) for a foldable activation module, else None."""
    t = type(module)
    if t is torch.nn.ReLU:
        return "relu", 0.01
    if t is torch.nn.LeakyReLU:
        return "leaky_relu", float(module.negative_slope)
    if t is torch.nn.SiLU:
        return "silu", 0.01
    if t is torch.nn.GELU:
        approximate = getattr(module, "approximate", "none")
        if approximate == "none":
            return "gelu", 0.01
        if approximate == "tanh":
            return "gelu_tanh", 0.01
        return None
    if t is torch.nn.Sigmoid:
        return "sigmoid", 0.01
    if t is torch.nn.Tanh:
        return "tanh", 0.01
    return None


def _registrations(model):
    """id(module) -> list of (parent, attribute name) under which it is registered."""
    regs = {}
    for parent in model.modules():
        for name, child in parent._modules.items():
            if child is not None:
                regs.setdefault(id(child), []).append((parent, name))
    return regs


def _new_module(old, activation, negative_slope):
    """A normjit module with old's configuration that owns old's parameters and buffers."""
    cls = TORCH_TO_NORMJIT[type(old)]
    new = cls(old.num_features, old.eps, old.momentum, old.affine, old.track_running_stats,
              device="meta", activation=activation, negative_slope=negative_slope)
    for name in list(new._parameters):
        new._parameters[name] = old._parameters.get(name)
    for name in list(new._buffers):
        new._buffers[name] = old._buffers.get(name)
    new.train(old.training)
    return new


def convert(model, fuse_activations=True, verbose=True):
    """Replace every torch.nn.InstanceNorm{1,2,3}d in ``model`` (in place) by normjit's module.

    The new modules take over the old ones' parameters and buffers (the same tensors: device,
    dtype and optimizer references are unchanged) and configuration. With ``fuse_activations``,
    a norm that is immediately followed inside an nn.Sequential by nn.ReLU, nn.LeakyReLU,
    nn.SiLU, nn.GELU, nn.Sigmoid or nn.Tanh gets that activation fused, and the activation module
    is replaced by nn.Identity wherever it is registered. Fusion is skipped when the activation
    module is also registered somewhere other than that Sequential and the module that owns the
    Sequential (the nnU-Net pattern registers ``nonlin`` on the block and in ``all_modules``).

    Only the exact torch classes are converted (subclasses and normjit modules are left alone).
    Returns ``model`` (converted in place; a bare InstanceNorm module is returned replaced).
    ``convert.last_report`` lists (qualified name, old module repr, new module repr).
    """
    if type(model) in TORCH_TO_NORMJIT:  # a bare norm module
        new = _new_module(model, None, 0.01)
        convert.last_report = [("", repr(model), repr(new))]
        if verbose:
            print("normjit.convert: replaced 1 InstanceNorm modules (0 with fused activation)")
        return new

    names = {id(m): n for n, m in model.named_modules()}
    regs = _registrations(model)

    # 1. Decide which activations fold into which norms.
    fused = {}  # id(norm) -> (activation, negative_slope, activation module)
    if fuse_activations:
        for seq in model.modules():
            if not isinstance(seq, torch.nn.Sequential):
                continue
            children = list(seq._modules.values())
            for norm, act in zip(children, children[1:]):
                if type(norm) not in TORCH_TO_NORMJIT or id(norm) in fused:
                    continue
                seq_regs = [r for r in regs.get(id(norm), [])
                            if isinstance(r[0], torch.nn.Sequential)]
                if len(seq_regs) != 1:
                    continue  # the norm sits in several Sequentials: leave it unfused
                spec = _activation_of(act)
                if spec is None:
                    continue
                owners = {id(p) for p, _ in regs.get(id(seq), [])}
                act_regs = regs.get(id(act), [])
                in_seq = [r for r in act_regs if r[0] is seq]
                elsewhere = [r for r in act_regs if r[0] is not seq and id(r[0]) not in owners]
                if len(in_seq) != 1 or elsewhere:
                    continue  # the activation module is used elsewhere too: folding is unsafe
                fused[id(norm)] = (spec[0], spec[1], act)

    # 2. Build the replacements and swap every registration.
    replacements = {}  # id(old) -> new
    report = []
    for module in list(model.modules()):
        if type(module) in TORCH_TO_NORMJIT and id(module) not in replacements:
            activation, slope, _ = fused.get(id(module), (None, 0.01, None))
            new = _new_module(module, activation, slope)
            replacements[id(module)] = new
            report.append((names.get(id(module), ""), repr(module), repr(new)))
    identity_for = {}
    for _, _, act in fused.values():
        identity_for[id(act)] = torch.nn.Identity()
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            if id(child) in replacements:
                parent._modules[name] = replacements[id(child)]
            elif id(child) in identity_for:
                parent._modules[name] = identity_for[id(child)]

    convert.last_report = report
    if verbose:
        print(f"normjit.convert: replaced {len(report)} InstanceNorm modules "
              f"({len(fused)} with fused activation)")
    return model


convert.last_report = []
