"""Scans and sorting along one axis, ops of the table (src/ops/scan.c, sort.c): cumsum and cumprod
(MindSpore's ops.cumsum(x, axis), PyTorch's dim=; integers and bool accumulate in int64, as NumPy
and PyTorch), sort -> (values, indices int64), stable with NaN last ascending and first descending,
and argsort (sort's indices)."""
from collections import namedtuple

from .._optable import OP
from ._util import apply, as_tensor, normalize_axis
from .array import concat, full, narrow, reshape
from .math import cast


def _axis(op, axis, dim, default):
    """axis, or PyTorch's dim when given (both given and different: an error)."""
    if dim is not None:
        if axis is not None and axis != default:
            raise TypeError(f"{op}: give axis or dim, not both (axis={axis!r}, dim={dim!r})")
        axis = dim
    return axis


def _scan(op, name, input, axis, dtype, reverse=False):
    x = as_tensor(input)
    if dtype is not None:
        x = cast(x, dtype)
    if axis is None:  # of the flattened tensor (NumPy's, MindSpore's Tensor.cumsum)
        x, axis = reshape(x, -1), 0
    return apply(op, (x,), (normalize_axis(name, axis, x.ndim), int(bool(reverse))))


def scan(name, input, axis, exclusive=False, reverse=False):
    """cumsum or cumprod (name) along axis, from the end with reverse; exclusive: each element left
    out of its own result (the scan shifted by one, starting from 0 or 1: MindSpore's CumSum and
    CumProd attributes)."""
    op = OP.cumsum if name == "cumsum" else OP.cumprod
    y = _scan(op, name, input, axis, None, reverse)
    if not exclusive:
        return y
    axis = normalize_axis(name, axis, y.ndim)
    n = y.shape[axis] if y.ndim else 1
    if n == 0:
        return y
    start = full([1 if d == axis else s for d, s in enumerate(y.shape)], 0 if name == "cumsum" else 1, y.dtype)
    if y.ndim == 0:
        return reshape(start, ())
    kept = narrow(y, axis, 1 if reverse else 0, n - 1)
    return concat([kept, start] if reverse else [start, kept], axis)


def cumsum(input, axis=None, dtype=None, *, dim=None):
    """Running sums along `axis` (PyTorch: dim; None: of the flattened tensor); dtype converts the
    input first. Floats keep their dtype (accumulated in double), integers and bool give int64."""
    return _scan(OP.cumsum, "cumsum", input, _axis("cumsum", axis, dim, None), dtype)


def cumprod(input, dim=None, dtype=None, *, axis=None):
    """Running products along `dim` (MindSpore's and PyTorch's name; axis also taken; None: of the
    flattened tensor); dtype converts the input first. Integers and bool give int64."""
    return _scan(OP.cumprod, "cumprod", input, _axis("cumprod", dim, axis, None), dtype)


# sort's result: a tuple (MindSpore's), whose fields are PyTorch's names (x.sort().values)
SortResult = namedtuple("SortResult", "values indices")


def _sort(name, input, axis, descending):
    x = as_tensor(input)
    if not isinstance(descending, (bool, int)):
        raise TypeError(f"{name}: descending must be a bool, got {descending!r}")
    if x.ndim == 0:  # one element: itself, at index 0
        axis = normalize_axis(name, axis, 0)
        values, indices = apply(OP.sort, (reshape(x, 1),), (0, int(bool(descending))))
        return SortResult(reshape(values, ()), reshape(indices, ()))
    return SortResult(*apply(OP.sort, (x,), (normalize_axis(name, axis, x.ndim), int(bool(descending)))))


def sort(input, axis=-1, descending=False, *, dim=None, stable=True):
    """(values, indices int64) of input sorted along `axis` (PyTorch: dim), ascending or descending.
    Always stable (equal values keep their order; stable is accepted for PyTorch's spelling); NaN
    is the largest value: last ascending, first descending. Gradients reach the values' sources."""
    del stable
    return _sort("sort", input, _axis("sort", axis, dim, -1), descending)


def argsort(input, axis=-1, descending=False, *, dim=None, stable=True):
    """The int64 indices that sort input along `axis` (sort's indices: stable, NaN largest)."""
    del stable
    return _sort("argsort", input, _axis("argsort", axis, dim, -1), descending)[1]
