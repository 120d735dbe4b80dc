"""Array functions a model reaches for (issue 30), each an exact composition of kiln's ops, so
gradients, symbolic sizes, fusion and ONNX export follow from their parts: flip, roll, tril, triu,
pad, one_hot, masked_fill, gather_nd and scatter (PyTorch's Tensor.scatter as a function)."""
from .. import _C
from .._optable import OP
from ._util import apply, as_tensor, normalize_axis
from .array import arange, broadcast_to, concat, full, gather, narrow, reshape, scatter_add, unsqueeze
from .math import cast, eq, number_as, where

_TensorBase = _C.TensorBase


def _axes(op, dims, ndim):
    """dims (an int or a sequence of ints) as distinct axes in [0, ndim)."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    axes = tuple(normalize_axis(op, d, ndim) for d in dims)
    if len(set(axes)) != len(axes):
        raise ValueError(f"{op}: dims {dims!r} name an axis twice")
    return axes


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def flip(input, dims):
    """input with the order of elements reversed along each axis of dims (a view)."""
    x = as_tensor(input)
    axes = _axes("flip", dims, x.ndim)
    if x.ndim == 0:
        return x
    return x[tuple(slice(None, None, -1) if a in axes else slice(None) for a in range(x.ndim))]


def roll(input, shifts, dims=None):
    """input shifted by shifts[i] positions along dims[i], elements pushed off one end coming in at
    the other; dims=None rolls the flattened tensor and restores the shape."""
    x = as_tensor(input)
    shifts = (shifts,) if _is_int(shifts) else tuple(shifts) if isinstance(shifts, (tuple, list)) else None
    if not shifts or not all(_is_int(s) for s in shifts):
        raise TypeError(f"roll: shifts must be an int or a sequence of ints, got {shifts!r}")
    if dims is None:
        if len(shifts) != 1:
            raise ValueError(f"roll: without dims, shifts must be one int, got {shifts!r}")
        return reshape(roll(reshape(x, -1), shifts, 0), *x.shape)
    axes = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(axes) != len(shifts):
        raise ValueError(f"roll: {len(shifts)} shifts for {len(axes)} dims ({shifts!r}, {dims!r})")
    for shift, d in zip(shifts, axes):
        axis = normalize_axis("roll", d, x.ndim)
        n = x.shape[axis]
        if n == 0:
            continue
        s = shift % n
        if s:
            x = concat((narrow(x, axis, n - s, s), narrow(x, axis, 0, n - s)), axis)
    return x


def _band(op, input, diagonal, keep_lower):
    x = as_tensor(input)
    if x.ndim < 2:
        raise ValueError(f"{op}: input must have at least 2 dimensions, got shape {list(x.shape)}")
    if not _is_int(diagonal):
        raise TypeError(f"{op}: diagonal must be an int, got {diagonal!r}")
    rows, cols = x.shape[-2], x.shape[-1]
    offset = reshape(arange(cols), 1, cols) - reshape(arange(rows), rows, 1)  # column - row
    keep = offset <= diagonal if keep_lower else offset >= diagonal
    return where(keep, x, full((), 0, x.dtype))


def tril(input, diagonal=0):
    """The lower triangle of the last two axes (elements with column - row <= diagonal), zeros above."""
    return _band("tril", input, diagonal, True)


def triu(input, diagonal=0):
    """The upper triangle of the last two axes (elements with column - row >= diagonal), zeros below."""
    return _band("triu", input, diagonal, False)


_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def pad(input_x, padding, mode="constant", value=None):
    """input padded as MindSpore's ops.pad / PyTorch's F.pad: padding holds (before, after) pairs
    starting with the last axis, (left, right, top, bottom, ...); a negative entry removes elements.
    mode 'constant' fills with value (0 when None), 'reflect' mirrors without repeating the edge
    (each pad smaller than the axis), 'replicate' repeats the edge, 'circular' wraps around."""
    x = as_tensor(input_x)
    pads = tuple(padding) if isinstance(padding, (tuple, list)) else padding
    if not isinstance(pads, tuple) or len(pads) % 2 or not all(_is_int(p) for p in pads):
        raise TypeError(f"pad: padding must be a tuple of ints of even length, got {padding!r}")
    if len(pads) // 2 > x.ndim:
        raise ValueError(f"pad: padding {pads} covers {len(pads) // 2} axes of a tensor of shape {list(x.shape)}")
    if mode not in _PAD_MODES:
        raise ValueError(f"pad: mode must be one of {_PAD_MODES}, got {mode!r}")
    if value is not None and mode != "constant":
        raise ValueError(f"pad: value is for mode 'constant' only, got value={value!r} with mode {mode!r}")
    shape = list(x.shape)
    try:
        for i in range(len(pads) // 2):
            x = _pad_axis(x, x.ndim - 1 - i, pads[2 * i], pads[2 * i + 1], mode, 0 if value is None else value)
    except MemoryError as e:
        raise MemoryError(f"pad: padding {pads} of a tensor of shape {shape}: {e}") from e
    return x


def _pad_axis(x, axis, before, after, mode, value):
    n = x.shape[axis]
    if before < 0 or after < 0:  # cropping first
        start, stop = -min(before, 0), n + min(after, 0)
        if stop < start:
            raise ValueError(f"pad: negative padding ({before}, {after}) removes more than the {n} elements "
                             f"of axis {axis} (shape {list(x.shape)})")
        x = narrow(x, axis, start, stop - start)
        n, before, after = stop - start, max(before, 0), max(after, 0)
    if not before and not after:
        return x
    if mode != "constant" and n == 0:
        raise ValueError(f"pad: mode {mode!r} cannot pad axis {axis} of length 0 (shape {list(x.shape)})")
    if mode == "reflect" and (before >= n or after >= n):
        raise ValueError(f"pad: reflect padding ({before}, {after}) must be smaller than axis {axis}'s length {n} "
                         f"(shape {list(x.shape)})")
    if mode == "circular" and (before > n or after > n):
        raise ValueError(f"pad: circular padding ({before}, {after}) must be at most axis {axis}'s length {n} "
                         f"(shape {list(x.shape)})")
    parts = []
    for count, side in ((before, 0), (after, 1)):
        if not count:
            parts.append(None)
            continue
        if mode == "constant":
            shape = list(x.shape)
            shape[axis] = count
            block = broadcast_to(_scalar_tensor("pad", "value", value, x.dtype), *shape)
        elif mode == "replicate":
            edge = narrow(x, axis, 0 if side == 0 else n - 1, 1)
            shape = list(x.shape)
            shape[axis] = count
            block = broadcast_to(edge, *shape)
        elif mode == "reflect":
            block = flip(narrow(x, axis, 1 if side == 0 else n - 1 - count, count), axis)
        else:  # circular: the other end's elements
            block = narrow(x, axis, n - count if side == 0 else 0, count)
        parts.append(block)
    return concat(tuple(p for p in (parts[0], x, parts[1]) if p is not None), axis)


def one_hot(indices, depth, on_value=1, off_value=0, axis=-1):
    """A new axis (at `axis` of the result) of length depth holding on_value at each index and
    off_value elsewhere. An index outside [0, depth) gives a row of off_value (MindSpore's rule).
    The dtype is on_value's: a tensor's own, int64 for Python ints, float32 for floats."""
    idx = as_tensor(indices)
    if idx.dtype not in (_C.int32, _C.int64, _C.int8):
        raise TypeError(f"one_hot: indices must be an integer tensor, got {idx.dtype}")
    if not _is_int(depth) or depth < 0:
        raise ValueError(f"one_hot: depth must be a non-negative int, got {depth!r}")
    axis = normalize_axis("one_hot", axis, idx.ndim + 1)
    shape = [1] * (idx.ndim + 1)
    shape[axis] = depth
    hit = eq(unsqueeze(idx, axis), reshape(arange(depth, dtype=idx.dtype), *shape))
    on = _scalar_tensor("one_hot", "on_value", on_value)
    return where(hit, on, _scalar_tensor("one_hot", "off_value", off_value, on.dtype))


def _scalar_tensor(op, name, v, dtype=None):
    """v (a Python number or a one-element tensor) as a 0-d tensor: a tensor of its own dtype, a
    number bool, int64 (exact) or float32 after its Python type; with dtype, in that dtype, a
    number rounded once (not through float32) and a float refused for an integer dtype."""
    if isinstance(v, _TensorBase):
        if v.numel() != 1:
            raise ValueError(f"{op}: {name} must be a number or a one-element tensor, got shape {list(v.shape)}")
        v = reshape(v, ())
        return v if dtype is None else cast(v, dtype)
    if not isinstance(v, (int, float)):
        raise TypeError(f"{op}: {name} must be a number or a tensor, got {type(v).__name__}")
    if dtype is None:
        return as_tensor(v)
    if isinstance(v, float) and not dtype.is_floating_point:
        raise TypeError(f"{op}: a float {name} {v!r} for a tensor of dtype {dtype.name}")
    return number_as(op, v, dtype)


def masked_fill(input_x, mask, value):
    """A copy of input with value (a number or a one-element tensor) where the bool mask, broadcast
    to input's shape, is true."""
    x, m = as_tensor(input_x), as_tensor(mask)
    if m.dtype is not _C.bool:
        raise TypeError(f"masked_fill: mask must be bool, got {m.dtype}")
    try:
        m = broadcast_to(m, *x.shape)
    except (ValueError, RuntimeError) as e:
        raise ValueError(f"masked_fill: mask of shape {list(m.shape)} does not broadcast to input's shape "
                         f"{list(x.shape)}") from e
    if isinstance(value, _TensorBase) and value.dtype.is_floating_point and not x.dtype.is_floating_point:
        raise TypeError(f"masked_fill: a float value of dtype {value.dtype.name} for a tensor of dtype {x.dtype.name}")
    return where(m, _scalar_tensor("masked_fill", "value", value, x.dtype), x)


def gather_nd(input_x, indices):
    """MindSpore's GatherNd: indices (..., K) pick input_x[i0, ..., iK-1] (a slice of the remaining
    axes) for each leading position: a result of shape indices.shape[:-1] + input_x.shape[K:].
    Each coordinate is bounds-checked for its axis (IndexError, in compiled graphs too; negative
    ones count from the end), then the K coordinates become one row of input_x viewed as
    (prod(shape[:K]), shape[K:]...), gathered."""
    x, idx = as_tensor(input_x), as_tensor(indices)
    if idx.dtype not in (_C.int32, _C.int64):
        raise TypeError(f"gather_nd: indices must be int32 or int64, got {idx.dtype}")
    if idx.ndim == 0:
        raise ValueError("gather_nd: indices must have at least one dimension (the last holds the coordinates)")
    k = idx.shape[-1]
    if not _is_int(k) or not 1 <= k <= x.ndim:
        raise ValueError(f"gather_nd: the last axis of indices (shape {list(idx.shape)}) must have 1 to "
                         f"{x.ndim} coordinates for input of shape {list(x.shape)}")
    idx = cast(idx, _C.int64)
    rows = None
    for j in range(k):
        n = x.shape[j]
        c = idx[..., j]
        _check(((c < -n) | (c >= n)).any(), IndexError,
               f"gather_nd: an index in coordinate {j} is out of bounds for axis {j} of the input")
        c = where(c < 0, c + n, c)
        rows = c if rows is None else rows * n + c
    count = 1
    for n in x.shape[:k]:
        count = count * n
    return gather(reshape(x, count, *x.shape[k:]), rows, 0)


# one check per message: the exception a check op raises is registered once (process-wide)
_CHECKS = {}


def _check(cond, exc_type, message):
    """A check op: raises exc_type(message) when cond (one element) is true, eagerly and in every
    call of a compiled graph that holds it."""
    key = (exc_type, message)
    if key not in _CHECKS:
        _CHECKS[key] = _C.register_check(exc_type(message))
    apply(OP.check, (cond,), (_CHECKS[key], 1))


def scatter(input, axis, index, src):
    """PyTorch's Tensor.scatter(axis, index, src) as a function: a copy of input with
    out[..., index[i, j, ...], ...] = src[i, j, ...] along axis (src a tensor at least index's
    shape, its leading part used, or a number). A position named twice by index raises ValueError
    (PyTorch leaves which write wins unspecified), eagerly and in compiled graphs."""
    x, idx = as_tensor(input), as_tensor(index)
    if idx.dtype not in (_C.int32, _C.int64):
        raise TypeError(f"scatter: index must be int32 or int64, got {idx.dtype}")
    if idx.ndim != x.ndim:
        raise ValueError(f"scatter: index (shape {list(idx.shape)}) must have as many dimensions as input "
                         f"(shape {list(x.shape)})")
    axis = normalize_axis("scatter", axis, x.ndim)
    if isinstance(src, _TensorBase):
        s = src
        if s.ndim != idx.ndim or any(a > b for a, b in zip(idx.shape, s.shape)):
            raise ValueError(f"scatter: src (shape {list(s.shape)}) must be at least index's shape "
                             f"{list(idx.shape)} in every dimension")
        for d in range(s.ndim):
            if s.shape[d] != idx.shape[d]:
                s = narrow(s, d, 0, idx.shape[d])
        s = cast(s, x.dtype)
    else:
        s = broadcast_to(_scalar_tensor("scatter", "src", src, x.dtype), *idx.shape)
    zeros = broadcast_to(full((), 0, _C.int32), *x.shape)
    count = scatter_add(zeros, axis, idx, broadcast_to(full((), 1, _C.int32), *idx.shape))
    _check((count > 1).any(), ValueError,
           "scatter: index names one position of input more than once; which write would win is unspecified")
    written = scatter_add(broadcast_to(full((), 0, x.dtype), *x.shape), axis, idx, s)
    return where(count > 0, written, x)
