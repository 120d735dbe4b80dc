"""Argument helpers shared by the functional ops."""
import functools
import re

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


# ---- errors name the function that was called ------------------------------------------------------

_NAMED = re.compile(r"^([A-Za-z_][\w./]*): ")
# what a bad argument may raise deep inside a function: the same class, or, for the two that say "a
# wrong type" or "a value that does not fit" in other words, TypeError and ValueError
_RENAMED = {TypeError: TypeError, ValueError: ValueError, IndexError: IndexError, KeyError: KeyError,
            AttributeError: TypeError, OverflowError: ValueError, ZeroDivisionError: ValueError}


def names_an_op(message, known):
    """Whether an error message says which op or function it is about: it starts with 'name: ' for
    a name in `known` (op-table names, kiln.ops functions, kiln.nn classes)."""
    m = _NAMED.match(message)
    return bool(m) and m.group(1) in known


def naming_errors(f, name, known):
    """f, whose exceptions from bad arguments (the builtin classes of _RENAMED, not subclasses:
    kiln's own errors and the user's pass through) name `name` when they name no op yet: a
    numpy or int() error deep inside becomes "name: ...". AttributeError and OverflowError become
    TypeError and ValueError (chained)."""

    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except tuple(_RENAMED) as e:
            cls = type(e)
            if cls not in _RENAMED:
                raise
            message = str(e.args[0]) if len(e.args) == 1 else str(e)
            if _RENAMED[cls] is cls:
                if not names_an_op(message, known):
                    e.args = (f"{name}: {message}",)
                raise
            raise _RENAMED[cls](f"{name}: {message}") from e

    return wrapper
