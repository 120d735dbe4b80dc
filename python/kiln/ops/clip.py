"""Gradient clipping (MindSpore's ops.clip_by_global_norm and ops.clip_by_norm): rescaling by a norm,
computed with kiln ops, so it runs inside compiled training steps."""
from .. import _C
from ._util import as_tensor
from .math import maximum, sqrt, sum as sum_


def _global_norm(tensors):
    total = None
    for t in tensors:
        s = sum_(as_tensor(t).astype(_C.float32) ** 2)
        total = s if total is None else total + s
    return sqrt(total)


def clip_by_global_norm(x, clip_norm=1.0, use_norm=None):
    """The tensors of x scaled by clip_norm / max(global_norm, clip_norm), global_norm the L2 norm
    of all of them together (use_norm: that norm given); a tuple like x."""
    if not isinstance(x, (tuple, list)) or not x:
        raise TypeError(f"clip_by_global_norm: x must be a non-empty tuple or list of tensors, got {type(x).__name__}")
    if not clip_norm > 0:
        raise ValueError(f"clip_by_global_norm: clip_norm must be > 0, got {clip_norm!r}")
    norm = _global_norm(x) if use_norm is None else as_tensor(use_norm)
    scale = clip_norm / maximum(norm, float(clip_norm))
    return tuple(as_tensor(t) * scale.astype(as_tensor(t).dtype) for t in x)


def clip_by_norm(x, max_norm, norm_type=2.0, error_if_nonfinite=False):
    """x (a tensor, or a tuple of them clipped together) scaled so its L2 norm is at most max_norm."""
    if norm_type != 2.0:
        raise ValueError(f"clip_by_norm: only norm_type=2.0 is supported, got {norm_type!r}")
    single = isinstance(x, _C.TensorBase)
    tensors = (x,) if single else tuple(x)
    norm = _global_norm(tensors)
    if error_if_nonfinite and not bool((norm == norm).item() and norm.item() != float("inf")):
        raise RuntimeError(f"clip_by_norm: the total norm is {norm.item()}, not finite")
    out = clip_by_global_norm(tensors, max_norm, norm)
    return out[0] if single else out


def clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    """PyTorch's torch.nn.utils.clip_grad_norm_: each parameter's .grad scaled in place so their total
    L2 norm is at most max_norm; returns that norm before clipping."""
    if norm_type != 2.0:
        raise ValueError(f"clip_grad_norm_: only norm_type=2.0 is supported, got {norm_type!r}")
    params = [parameters] if isinstance(parameters, _C.TensorBase) else list(parameters)
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return as_tensor(0.0)
    norm = _global_norm(grads)
    for g, c in zip(grads, clip_by_global_norm(grads, max_norm, norm)):
        g[...] = c
    return norm
