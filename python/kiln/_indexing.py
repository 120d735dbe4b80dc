"""Tensor indexing and index assignment with NumPy semantics: ints, slices, None, Ellipsis,
integer tensors and boolean masks.

A key becomes one SLICE (a view) of the tensor, a RESHAPE that drops integer-indexed axes and
inserts None axes, and, for integer-tensor indices, a GATHER (reads) or INDEX_PUT (writes) on
that view. Several index tensors are combined into one index over their merged axes.
"""
import numpy as _np

from . import _C
from ._optable import OP

_apply = _C.apply


def _is_array_index(k):
    return isinstance(k, (_C.TensorBase, list, _np.ndarray))


def _index_tensors(k, dim, shape):
    """An integer-tensor or mask index at axis `dim`, as int64 tensors, one per axis it covers."""
    from ._tensor import Tensor

    t = k if isinstance(k, _C.TensorBase) else Tensor(_np.asarray(k))
    if t.dtype is _C.bool:
        mask = t.asnumpy()
        covered = shape[dim:dim + mask.ndim]
        if mask.ndim == 0 or tuple(mask.shape) != tuple(covered):
            raise IndexError(f"index: a boolean mask of shape {mask.shape} does not match the indexed axes "
                             f"{tuple(covered)} of a tensor of shape {tuple(shape)}")
        return [Tensor(i.astype(_np.int64)) for i in _np.nonzero(mask)]
    if t.dtype not in (_C.int32, _C.int64, _C.int8):
        raise IndexError(f"index: tensors used as indices must be integer or bool, got {t.dtype}")
    return [t]


def _axes_consumed(k):
    if k is None or k is Ellipsis:
        return 0
    if isinstance(k, (_C.TensorBase, _np.ndarray)) and k.dtype in (_C.bool, _np.bool_) and k.ndim > 1:
        return k.ndim
    return 1


def _parse(x, key):
    """(slice attrs, slice shape, view shape, [(axis of the view, index tensor)])."""
    if not isinstance(key, tuple):
        key = (key,)
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("index: an index can only have a single ellipsis (...)")
    used = sum(_axes_consumed(k) for k in key)
    if used > x.ndim:
        raise IndexError(f"index: too many indices for a tensor of shape {x.shape}: {used} given")
    expanded = []
    for k in key:
        expanded.extend([slice(None)] * (x.ndim - used) if k is Ellipsis else [k])
    expanded.extend([slice(None)] * (x.ndim - sum(_axes_consumed(k) for k in expanded)))
    starts, steps, lens = [0] * 8, [1] * 8, [0] * 8
    view_shape, arrays = [], []
    dim = 0
    for k in expanded:
        if k is None:
            view_shape.append(1)
            continue
        if isinstance(k, slice):
            start, stop, step = k.indices(x.shape[dim])
            n = len(range(start, stop, step))
            starts[dim], steps[dim], lens[dim] = (start if n else 0), step, n
            view_shape.append(n)
            dim += 1
        elif _is_array_index(k):
            for t in _index_tensors(k, dim, x.shape):
                lens[dim] = x.shape[dim]
                arrays.append((len(view_shape), t))
                view_shape.append(x.shape[dim])
                dim += 1
        elif hasattr(k, "__index__"):
            i, size = k.__index__(), x.shape[dim]
            if i < -size or i >= size:
                raise IndexError(f"index {i} is out of bounds for axis {dim} with size {size}")
            starts[dim], lens[dim] = i % size, 1
            dim += 1
        else:
            raise IndexError(f"index: unsupported index {k!r} (use ints, slices, None, ..., or integer tensors)")
    return tuple(starts + steps + lens), tuple(lens[:x.ndim]), tuple(view_shape), arrays


def _view(x, attrs, slice_shape, view_shape):
    v = _apply(OP.slice, (x,), attrs)
    return v if slice_shape == view_shape else _apply(OP.reshape, (v,), view_shape)


def _merged_index(arrays, view_shape):
    """One int64 index over the merged axes of several (adjacent) index tensors."""
    index, stride = None, 1
    for axis, idx in reversed(arrays):
        n = view_shape[axis]
        part = idx.astype(_C.int64)
        if bool(((part < -n) | (part >= n)).any()):
            raise IndexError(f"index: an index is out of bounds for axis {axis} with size {n}")
        part = _apply(OP.where, (part < 0, part + n, part))
        index = part * stride if index is None else index + part * stride
        stride *= n
    return index


def _merge_axes(v, axes):
    """v with the listed adjacent axes merged into one (a view when v's layout allows)."""
    a, b = axes[0], axes[-1]
    n = 1
    for d in axes:
        n *= v.shape[d]
    return _apply(OP.reshape, (v,), v.shape[:a] + (n,) + v.shape[b + 1:])


def getitem(x, key):
    attrs, slice_shape, view_shape, arrays = _parse(x, key)
    v = _view(x, attrs, slice_shape, view_shape)
    if not arrays:
        return v
    if len(arrays) == 1:
        axis, idx = arrays[0]
        return _apply(OP.gather, (v, idx), (axis,))
    axes = [a for a, _ in arrays]
    index = _merged_index(arrays, view_shape)
    if axes == list(range(axes[0], axes[0] + len(axes))):  # adjacent: the result stays in place
        return _apply(OP.gather, (_merge_axes(v, axes), index), (axes[0],))
    # apart: NumPy puts the indexed axes first
    rest = [d for d in range(v.ndim) if d not in axes]
    moved = _apply(OP.permute, (v,), tuple(axes + rest))
    return _apply(OP.gather, (_merge_axes(moved, list(range(len(axes)))), index), (0,))


def setitem(x, key, value):
    from ._tensor import Tensor

    attrs, slice_shape, view_shape, arrays = _parse(x, key)
    if not isinstance(value, _C.TensorBase):
        value = Tensor(value, x.dtype)
    if not arrays:
        # the value broadcasts to x[key]'s shape; the slice has 1s where ints index
        if value.shape != view_shape:
            value = _apply(OP.expand, (value,), view_shape) if value.ndim <= len(view_shape) else value
        if value.shape != slice_shape and value.size == _size(slice_shape):
            value = _apply(OP.reshape, (value,), slice_shape)
        _apply(OP.slice_assign, (x, value), attrs)
        return
    whole = slice_shape == tuple(x.shape) and view_shape == tuple(x.shape) and all(
        s == 0 and st == 1 for s, st in zip(attrs[:x.ndim], attrs[8:8 + x.ndim]))
    target = x if whole else _view(x, attrs, slice_shape, view_shape)
    if len(arrays) == 1:
        axis, idx = arrays[0]
        _apply(OP.index_put, (target, idx, value), (axis,))
        return
    axes = [a for a, _ in arrays]
    if axes != list(range(axes[0], axes[0] + len(axes))):
        raise IndexError("index assignment: several index tensors must index adjacent axes")
    index = _merged_index(arrays, view_shape)
    merged = _merge_axes(target, axes)
    if merged._shares_storage(x):
        _apply(OP.index_put, (merged, index, value), (axes[0],))
        return
    # the layout does not allow merging the axes in place: write into a copy, then copy it back
    work = _apply(OP.contiguous, (target,))
    _apply(OP.index_put, (_merge_axes(work, axes), index, value), (axes[0],))
    _apply(OP.slice_assign, (x, _apply(OP.reshape, (work,), slice_shape)), attrs)


def _size(shape):
    n = 1
    for s in shape:
        n *= s
    return n
