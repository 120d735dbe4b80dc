"""Repeating and selecting, as exact compositions of kiln's ops (so gradients, symbolic sizes,
fusion and ONNX export follow from their parts): tile (Tensor.repeat in PyTorch's meaning),
repeat_interleave, and topk (k passes of argmax over a copy whose chosen entries are masked, so
ties go to the lower index and NaN counts as the largest, as in PyTorch; O(k n), meant for small k)."""
import numpy as np

from .. import _C
from ._util import as_tensor, normalize_axis
from .array import arange, broadcast_to, gather_elements, reshape, unsqueeze
from .math import argmax, cast, eq, where


def _ints(op, name, values):
    values = tuple(values[0]) if len(values) == 1 and isinstance(values[0], (tuple, list)) else tuple(values)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise TypeError(f"{op}: {name} must be non-negative ints, got {values!r}")
    return values


def tile(input, multiples):
    """input repeated multiples[d] times along each axis d (NumPy's tile; leading 1s are added to
    whichever of input's shape and multiples is shorter)."""
    x = as_tensor(input)
    reps = _ints("tile", "multiples", (multiples,))
    ndim = max(x.ndim, len(reps))
    reps = (1,) * (ndim - len(reps)) + reps
    shape = (1,) * (ndim - x.ndim) + tuple(x.shape)
    spread = []  # (1, s0, 1, s1, ...) broadcast to (r0, s0, r1, s1, ...), then merged pairwise
    for s in shape:
        spread += [1, s]
    y = broadcast_to(reshape(x, *spread), *[v for r, s in zip(reps, shape) for v in (r, s)])
    return reshape(y, *[r * s for r, s in zip(reps, shape)])


def repeat(input, *sizes):
    """PyTorch's Tensor.repeat: tile with `sizes` (at least input's number of axes)."""
    x = as_tensor(input)
    reps = _ints("repeat", "sizes", sizes)
    if len(reps) < x.ndim:
        raise ValueError(f"repeat: {len(reps)} sizes for a tensor of {x.ndim} dimensions (shape {list(x.shape)}); "
                         "give at least one per dimension")
    return tile(x, reps)


def repeat_elements(x, rep, axis=0):
    """MindSpore's repeat_elements: each element repeated rep times along axis."""
    return repeat_interleave(x, rep, axis)


def repeat_interleave(input, repeats, axis=None):
    """Each element repeated `repeats` (an int) times along axis (None: of the flattened tensor)."""
    x = as_tensor(input)
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 0:
        raise TypeError(f"repeat_interleave: repeats must be a non-negative int, got {repeats!r}")
    if axis is None:
        x, axis = reshape(x, -1), 0
    axis = normalize_axis("repeat_interleave", axis, x.ndim)
    shape = list(x.shape)
    y = broadcast_to(unsqueeze(x, axis + 1), *(shape[:axis + 1] + [repeats] + shape[axis + 1:]))
    return reshape(y, *(shape[:axis] + [shape[axis] * repeats] + shape[axis + 1:]))


def topk(input, k, dim=-1, largest=True, sorted=True):  # noqa: A002 (PyTorch's argument names)
    """(values, indices int64) of the k largest (largest=False: smallest) elements along dim, in
    order, ties to the lower index, NaN the largest (as PyTorch); sorted is accepted (always sorted).
    Gradients flow to the chosen elements."""
    from .array import concat, zeros
    from .math import any as any_, logical_and, logical_not, max as max_, min as min_

    x = as_tensor(input)
    if x.ndim == 0:
        x = reshape(x, 1)
    dim = normalize_axis("topk", dim, x.ndim)
    n = x.shape[dim]
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= n:
        raise ValueError(f"topk: k must be an int in [0, {n}] for dimension {dim} of shape {list(x.shape)}, got {k!r}")
    if k == 0:
        shape = list(x.shape)
        shape[dim] = 0
        return zeros(*shape, dtype=x.dtype), zeros(*shape, dtype=_C.int64)
    v = x.detach()
    floating = v.dtype.is_floating_point
    if floating:
        worst = float("-inf") if largest else float("inf")
        nan = v != v
    else:
        info = np.iinfo(v.dtype.name) if v.dtype.name != "bool" else None
        worst = (info.min if largest else info.max) if info is not None else (not largest)
        nan = None
    best = max_ if largest else min_
    shape = [1] * v.ndim
    shape[dim] = n
    taken = eq(reshape(arange(n), *shape), -1)  # (all False, of the positions' shape)
    chosen = []
    for _ in range(k):
        free = logical_not(taken)
        plain = free if nan is None else logical_and(free, logical_not(nan))
        key = where(plain, v, worst)
        m = best(key, dim, keepdims=True)
        candidates = logical_and(plain, eq(key, m))
        if nan is not None:  # a NaN first when largest, last when smallest
            free_nan = logical_and(free, nan)
            if largest:
                candidates = where(any_(free_nan, dim, keepdims=True), free_nan, candidates)
            else:
                candidates = where(any_(plain, dim, keepdims=True), candidates, free_nan)
        idx = argmax(cast(candidates, _C.int32), dim, keepdims=True)  # the first candidate
        chosen.append(idx)
        taken = taken | eq(reshape(arange(n), *shape), idx)
    indices = concat(chosen, dim) if len(chosen) > 1 else chosen[0]
    return gather_elements(x, dim, indices), indices
