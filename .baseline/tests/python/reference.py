"""Reference implementations for the tests (float64, plain torch ops)."""
import torch
import torch.nn.functional as F

ACTIVATIONS = [None, "relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"]


def activation(y, name, negative_slope=0.01):
    if name in (None, "identity"):
        return y
    if name == "relu":
        return F.relu(y)
    if name == "leaky_relu":
        return F.leaky_relu(y, negative_slope)
    if name == "gelu":
        return F.gelu(y)
    if name == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    if name == "silu":
        return F.silu(y)
    if name == "sigmoid":
        return torch.sigmoid(y)
    if name == "tanh":
        return torch.tanh(y)
    raise ValueError(name)


def instance_norm_reference(x, running_mean=None, running_var=None, weight=None, bias=None,
                            use_input_stats=True, momentum=0.1, eps=1e-5, activation_name=None,
                            negative_slope=0.01, residual=None):
    """act(IN(x) * w + b [+ residual]) in float64 on the CPU, written from the definition.

    Returns (y, new_running_mean, new_running_var) (float64; the running stats are None when
    not given). Running variance uses the unbiased estimate, as torch does.
    """
    xd = x.detach().double().cpu()
    n, c = xd.shape[:2]
    dims = tuple(range(2, xd.dim()))
    bshape = (1, c) + (1,) * (xd.dim() - 2)
    new_rm = new_rv = None
    if use_input_stats:
        mean = xd.mean(dims, keepdim=True)
        var = xd.var(dims, unbiased=False, keepdim=True)
        m = xd[0, 0].numel()
        if running_mean is not None:
            new_rm = (1 - momentum) * running_mean.detach().double().cpu() + \
                momentum * mean.reshape(n, c).mean(0)
        if running_var is not None:
            unbiased = var.reshape(n, c) * m / max(m - 1, 1)
            new_rv = (1 - momentum) * running_var.detach().double().cpu() + \
                momentum * unbiased.mean(0)
    else:
        mean = running_mean.detach().double().cpu().reshape(bshape)
        var = running_var.detach().double().cpu().reshape(bshape)
    y = (xd - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight.detach().double().cpu().reshape(bshape)
    if bias is not None:
        y = y + bias.detach().double().cpu().reshape(bshape)
    if residual is not None:
        y = y + residual.detach().double().cpu()
    return activation(y, activation_name, negative_slope), new_rm, new_rv


def torch_unfused(x, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats=True, momentum=0.1, eps=1e-5, activation_name=None,
                  negative_slope=0.01, residual=None):
    """The same computation as torch users write it today (differentiable, any device/dtype)."""
    y = F.instance_norm(x, running_mean, running_var, weight, bias, use_input_stats, momentum, eps)
    if residual is not None:
        y = y + residual
    return activation(y, activation_name, negative_slope)
