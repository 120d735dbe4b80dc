"""Argument helpers shared by the functional ops."""
from .. import _C

apply = _C.apply


def as_tensor(x):
    """x as a kiln tensor. (Scalars mixed with tensors in one op are better passed to `apply`
    as they are: it gives them the tensor's dtype the NumPy-2 way.)"""
    if isinstance(x, _C.TensorBase):
        return x
    from .._tensor import Tensor

    return Tensor(x)


def normalize_axis(op, axis, ndim):
    """One axis in [0, ndim) (a 0-d tensor accepts 0 and -1)."""
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise TypeError(f"{op}: axis must be an int, got {type(axis).__name__}")
    n = max(ndim, 1)
    if axis < -n or axis >= n:
        raise IndexError(f"{op}: axis {axis} is out of range for a tensor with {ndim} dimensions")
    return axis + n if axis < 0 else axis


def axes_mask(op, axis, ndim):
    """Bitmask of reduced axes; None means every axis."""
    if axis is None:
        return (1 << ndim) - 1
    if isinstance(axis, (list, tuple)):
        mask = 0
        for a in axis:
            bit = 1 << normalize_axis(op, a, ndim)
            if mask & bit:
                raise ValueError(f"{op}: axis {a} appears twice in {tuple(axis)}")
            mask |= bit
        return mask
    return 1 << normalize_axis(op, axis, ndim) if ndim else 0


def pair(op, name, v):
    """An int or a pair of ints, as a pair."""
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(x, int) for x in v):
        return tuple(v)
    raise TypeError(f"{op}: {name} must be an int or a pair of ints, got {v!r}")


def shape_tuple(op, shape):
    """A shape given as ints, a tuple or a list, as a tuple of ints."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    out = []
    for s in shape:
        if hasattr(s, "__index__"):
            out.append(s.__index__())
        else:
            raise TypeError(f"{op}: shape entries must be ints, got {s!r}")
    return tuple(out)
