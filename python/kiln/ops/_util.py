"""Argument helpers shared by the functional ops."""
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
