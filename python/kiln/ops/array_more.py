"""More array functions of PyTorch and MindSpore (issue 30), exact compositions of kiln's views,
concat, where and gather, so gradients, symbolic sizes and export follow: diag, tril_indices /
triu_indices, movedim / moveaxis, unbind, hstack / vstack, ravel, take_along_dim, rot90."""
import numpy as np

from .. import _C
from ._util import as_tensor, normalize_axis
from .array import broadcast_to, concat, eye, full, gather_elements, permute, reshape
from .array_extra import flip, pad
from .math import where


def _int(op, name, v):
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{op}: {name} must be an int, got {v!r}")
    return v


def diag(input, diagonal=0):
    """1-D input: a square matrix with input on diagonal `diagonal` (above the main one when
    positive, below when negative), zeros elsewhere. 2-D input: that diagonal of it, as 1-D."""
    x = as_tensor(input)
    k = _int("diag", "diagonal", diagonal)
    if x.ndim == 1:
        m = x.shape[0]
        square = where(eye(m, dtype=_C.bool), reshape(x, 1, m), full((), 0, x.dtype))
        a = abs(k)
        return pad(square, (a, 0, 0, a) if k > 0 else (0, a, a, 0)) if k else square
    if x.ndim != 2:
        raise ValueError(f"diag: input must be 1-D or 2-D, got shape {list(x.shape)}")
    rows, cols = x.shape
    length = max(0, min(rows, cols - k) if k >= 0 else min(rows + k, cols))
    if length == 0:
        return reshape(x, -1)[0:0]
    start = k if k >= 0 else -k * cols
    flat = reshape(x, -1)
    return flat[start:start + (length - 1) * (cols + 1) + 1:cols + 1]


def _triangle_indices(op, row, col, offset, lower):
    for name, v in (("row", row), ("col", col), ("offset", offset)):
        _int(op, name, v)
    if row < 0 or col < 0:
        raise ValueError(f"{op}: row and col must be non-negative, got {row} and {col}")
    r, c = (np.tril_indices if lower else np.triu_indices)(row, offset, col)
    return as_tensor(np.stack([r, c]).astype(np.int64).reshape(2, -1))


def tril_indices(row, col, offset=0):
    """The (2, N) int64 coordinates of the lower triangle of a row x col matrix (column - row <=
    offset), row by row."""
    return _triangle_indices("tril_indices", row, col, offset, True)


def triu_indices(row, col, offset=0):
    """The (2, N) int64 coordinates of the upper triangle of a row x col matrix (column - row >=
    offset), row by row."""
    return _triangle_indices("triu_indices", row, col, offset, False)


def movedim(input, source, destination):
    """input with its axes `source` moved to positions `destination` (ints or sequences of one
    length), the other axes keeping their order (a view)."""
    x = as_tensor(input)
    src = (source,) if isinstance(source, int) else tuple(source)
    dst = (destination,) if isinstance(destination, int) else tuple(destination)
    if len(src) != len(dst):
        raise ValueError(f"movedim: source {source!r} and destination {destination!r} differ in length")
    src = [normalize_axis("movedim", a, x.ndim) for a in src]
    dst = [normalize_axis("movedim", a, x.ndim) for a in dst]
    if len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise ValueError(f"movedim: repeated axis in source {source!r} or destination {destination!r}")
    rest = iter([a for a in range(x.ndim) if a not in src])
    placed = dict(zip(dst, src))
    order = [placed[d] if d in placed else next(rest) for d in range(x.ndim)]
    return permute(x, *order) if x.ndim else x


moveaxis = movedim


def unbind(input, axis=0, *, dim=None):
    """The slices of input along axis (PyTorch: dim), as a tuple of views without that axis."""
    x = as_tensor(input)
    if dim is not None:
        axis = dim
    if x.ndim == 0:
        raise ValueError("unbind: input must have at least 1 dimension, got a 0-d tensor")
    axis = normalize_axis("unbind", axis, x.ndim)
    lead = (slice(None),) * axis
    return tuple(x[lead + (i,)] for i in range(x.shape[axis]))


def _tensors(op, tensors):
    if not isinstance(tensors, (tuple, list)) or not tensors:
        raise TypeError(f"{op}: tensors must be a non-empty sequence of tensors, got {tensors!r}")
    return [as_tensor(t) for t in tensors]


def hstack(tensors):
    """The tensors joined along axis 1, or axis 0 when they are 1-D (0-d ones count as 1-D)."""
    ts = [reshape(t, 1) if t.ndim == 0 else t for t in _tensors("hstack", tensors)]
    return concat(ts, 0 if ts[0].ndim == 1 else 1)


def vstack(tensors):
    """The tensors joined along axis 0, 0-d and 1-D ones first made rows (1, n)."""
    ts = [reshape(t, 1, -1) if t.ndim < 2 else t for t in _tensors("vstack", tensors)]
    return concat(ts, 0)


def ravel(input):
    """input flattened to 1-D (a view when the layout allows)."""
    return reshape(as_tensor(input), -1)


def take_along_dim(input, indices, dim=None):
    """torch.take_along_dim: gather_elements along dim with input and indices broadcast against each
    other on the other axes (same number of axes); dim None: of both flattened."""
    x, idx = as_tensor(input), as_tensor(indices)
    if dim is None:
        return gather_elements(reshape(x, -1), 0, reshape(idx, -1))
    if x.ndim != idx.ndim:
        raise ValueError(f"take_along_dim: input (shape {list(x.shape)}) and indices (shape {list(idx.shape)}) "
                         "must have the same number of axes")
    axis = normalize_axis("take_along_dim", dim, x.ndim)
    sizes = []
    for d, (a, b) in enumerate(zip(x.shape, idx.shape)):
        if d != axis and a != b and a != 1 and b != 1:
            raise ValueError(f"take_along_dim: input (shape {list(x.shape)}) and indices (shape "
                             f"{list(idx.shape)}) do not broadcast on axis {d}")
        sizes.append(b if a == 1 else a)
    xs = [x.shape[d] if d == axis else s for d, s in enumerate(sizes)]
    ids = [idx.shape[d] if d == axis else s for d, s in enumerate(sizes)]
    return gather_elements(broadcast_to(x, *xs), axis, broadcast_to(idx, *ids))


def rot90(input, k=1, dims=(0, 1)):
    """input rotated by 90 degrees k times in the plane of dims, from dims[0] toward dims[1] (as
    NumPy's rot90 and PyTorch's)."""
    x = as_tensor(input)
    _int("rot90", "k", k)
    if len(dims) != 2:
        raise ValueError(f"rot90: dims must name two axes, got {dims!r}")
    a, b = (normalize_axis("rot90", d, x.ndim) for d in dims)
    if a == b:
        raise ValueError(f"rot90: dims must be two different axes, got {dims!r}")
    k %= 4
    if k == 0:
        return x
    if k == 2:
        return flip(x, (a, b))
    order = list(range(x.ndim))
    order[a], order[b] = order[b], order[a]
    if k == 1:
        return permute(flip(x, b), *order)
    return flip(permute(x, *order), b)
