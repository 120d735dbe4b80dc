"""Argument helpers shared by the functional ops."""
import functools
import re

from .. import _C

apply = _C.apply
as_tensor = _C.shape.as_tensor  # x as a kiln tensor: itself, or Tensor(x)
normalize_axis = _C.shape.normalize_axis  # (op, axis, ndim): one axis in [0, ndim) (0-d: 0 and -1)
axes_mask = _C.shape.axes_mask  # (op, axis, ndim): bitmask of reduced axes; None means every axis


def pair(op, name, v):
    """An int or a pair of ints, as a pair."""
    if isinstance(v, int) and not isinstance(v, bool):
        return (v, v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(x, int) for x in v):
        return tuple(v)
    raise TypeError(f"{op}: {name} must be an int or a pair of ints, got {v!r}")


shape_tuple = _C.shape.shape_tuple  # (op, shape): ints, a tuple or a list, as a tuple of ints

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
