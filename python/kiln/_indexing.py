"""Tensor indexing and index assignment: ints, slices, None, Ellipsis, integer and bool tensors."""
from . import _C
from ._optable import OP

_apply = _C.apply


def _is_index_array(k):
    return isinstance(k, (_C.TensorBase, list)) or (hasattr(k, "__array__") and not isinstance(k, (int, slice)))


def _as_index_tensor(k, axis_len):
    from ._tensor import Tensor

    t = k if isinstance(k, _C.TensorBase) else Tensor(k)
    if t.dtype is _C.bool:
        import numpy as np

        mask = t.asnumpy()
        if mask.ndim != 1 or mask.shape[0] != axis_len:
            raise IndexError(f"index: a boolean mask of shape {mask.shape} does not match an axis of length {axis_len}")
        return Tensor(np.nonzero(mask)[0].astype(np.int64))
    if t.dtype not in (_C.int32, _C.int64):
        raise IndexError(f"index: tensors used as indices must be integer or bool, got {t.dtype}")
    return t


def _parse(x, key):
    """Splits key into a basic slice of x plus the axes to drop, to add and to index with arrays.

    Returns (slice_attrs, out_shape_after_ints, new_axes, arrays) where `arrays` maps axes of
    the sliced-and-reshaped view to index tensors."""
    if not isinstance(key, tuple):
        key = (key,)
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis and not (
        isinstance(k, _C.TensorBase) and k.dtype is _C.bool and k.ndim > 1))
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("index: an index can only have a single ellipsis (...)")
    if n_real > x.ndim:
        raise IndexError(f"index: too many indices for a tensor of shape {x.shape}: {n_real} given")
    expanded = []
    for k in key:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (x.ndim - n_real))
        else:
            expanded.append(k)
    while sum(1 for k in expanded if k is not None) < x.ndim:
        expanded.append(slice(None))
    starts, steps, lens = [0] * 8, [1] * 8, [0] * 8
    view_shape, arrays = [], []
    dim = 0
    for k in expanded:
        if k is None:
            view_shape.append(1)
            continue
        size = x.shape[dim]
        if isinstance(k, slice):
            start, stop, step = k.indices(size)
            n = len(range(start, stop, step))
            starts[dim], steps[dim], lens[dim] = (start if n else 0), step, n
            view_shape.append(n)
        elif isinstance(k, (int,)) or (hasattr(k, "__index__") and not _is_index_array(k)):
            i = k.__index__()
            if i < -size or i >= size:
                raise IndexError(f"index {i} is out of bounds for axis {dim} with size {size}")
            starts[dim], lens[dim] = i % size, 1
        elif _is_index_array(k):
            starts[dim], lens[dim] = 0, size
            arrays.append((len(view_shape), _as_index_tensor(k, size)))
            view_shape.append(size)
        else:
            raise IndexError(f"index: unsupported index {k!r} (use ints, slices, None, ..., or integer tensors)")
        dim += 1
    return tuple(starts + steps + lens), tuple(view_shape), arrays


def _basic_view(x, attrs, view_shape):
    v = _apply(OP.slice, (x,), attrs)
    if v.shape != view_shape:
        v = _apply(OP.reshape, (v,), view_shape)
    return v


def _linear_index(v, arrays):
    """For several index arrays: moves their axes to the front, flattens them, and returns
    (view, flat index tensor, position where the result axes go)."""
    from .ops import array as A

    axes = [a for a, _ in arrays]
    adjacent = axes == list(range(axes[0], axes[0] + len(axes)))
    rest = [d for d in range(v.ndim) if d not in axes]
    moved = A.permute(v, tuple(axes + rest))
    lens = [v.shape[a] for a in axes]
    flat = A.reshape(moved, (-1,) + tuple(v.shape[d] for d in rest))
    index = None
    stride = 1
    for (a, idx), n in reversed(list(zip(arrays, lens))):
        part = idx.astype(_C.int64)
        if bool(((part < -n) | (part >= n)).any()):
            raise IndexError(f"index: an index is out of bounds for axis {a} with size {n}")
        part = _apply(OP.where, (part < 0, part + n, part))
        index = part * stride if index is None else index + part * stride
        stride *= n
    return flat, index, (axes[0] if adjacent else 0)


def getitem(x, key):
    attrs, view_shape, arrays = _parse(x, key)
    v = _basic_view(x, attrs, view_shape)
    if not arrays:
        return v
    if len(arrays) == 1:
        axis, idx = arrays[0]
        return _apply(OP.gather, (v, idx), (axis,))
    from .ops import array as A

    flat, index, pos = _linear_index(v, arrays)
    out = _apply(OP.gather, (flat, index), (0,))
    if pos:
        k = index.ndim
        order = list(range(k, k + pos)) + list(range(k)) + list(range(k + pos, out.ndim))
        out = A.permute(out, tuple(order))
    return out


def setitem(x, key, value):
    attrs, view_shape, arrays = _parse(x, key)
    if not isinstance(value, _C.TensorBase):
        from ._tensor import Tensor

        value = Tensor(value, x.dtype)
    if not arrays:
        # drop the axes the value may not have: None axes are length 1 anyway
        _apply(OP.slice_assign, (x, value), attrs)
        return
    full = all(s == 0 and st == 1 and n == x.shape[d] for d, (s, st, n) in
               enumerate(zip(attrs[:8], attrs[8:16], attrs[16:24])) if d < x.ndim) and len(view_shape) == x.ndim
    if len(arrays) != 1:
        raise IndexError("index assignment: only one integer-tensor index is supported per assignment")
    axis, idx = arrays[0]
    target = x if full else _basic_view(x, attrs, view_shape)
    _apply(OP.index_put, (target, idx, value), (axis,))
