"""Random sampling beyond rand and randn (issue 30): rand_like, randn_like, randint, randperm,
bernoulli, multinomial. Each is drawn from kiln's rand / randn ops (the generator kiln.manual_seed
seeds), so a compiled function draws what eager draws under the same seed."""

from .. import _C
from ._util import as_tensor, shape_tuple
from .array import rand, randn, reshape
from .math import cast, clamp, floor, log, sum as sum_
from .repeat_topk import topk
from .scan_sort import argsort, cumsum


def rand_like(input, *, dtype=None):
    """Uniform samples in [0, 1) of input's shape (and float dtype unless dtype is given)."""
    x = as_tensor(input)
    return rand(*x.shape, dtype=_float_dtype("rand_like", _dtype_or(dtype, x.dtype)))


def randn_like(input, *, dtype=None):
    """Standard normal samples of input's shape (and float dtype unless dtype is given)."""
    x = as_tensor(input)
    return randn(*x.shape, dtype=_float_dtype("randn_like", _dtype_or(dtype, x.dtype)))


def _dtype_or(dtype, default):
    """dtype (a kiln dtype or its name), or default when it is None."""
    if dtype is None:
        return default
    return dtype if isinstance(dtype, _C.dtype) else _C.dtype_from_name(dtype)


def _float_dtype(op, dtype):
    if not dtype.is_floating_point:
        raise TypeError(f"{op}: samples are floating point; got dtype {dtype.name}")
    return dtype


def randint(low, high=None, size=None, *, dtype=None):
    """Integers drawn uniformly from [low, high) (randint(high, size) starts at 0), int64 unless
    dtype says otherwise: floor(u * (high - low)) + low for uniform float64 u."""
    if size is None:
        raise TypeError("randint: size is required, e.g. randint(0, 10, (2, 3))")
    if high is None:
        low, high = 0, low
    for name, v in (("low", low), ("high", high)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"randint: {name} must be an int, got {v!r}")
    if high <= low:
        raise ValueError(f"randint: high ({high}) must be greater than low ({low})")
    shape = shape_tuple("randint", (size,) if isinstance(size, int) else size)
    n = high - low
    u = floor(rand(*shape, dtype=_C.float64) * float(n))
    k = clamp(u, max=float(n - 1)) + float(low)  # (u * n rounds to n at most)
    return cast(k, _dtype_or(dtype, _C.int64))


def randperm(n, *, dtype=None):
    """A random permutation of 0 .. n - 1 (int64 unless dtype says otherwise): the order that sorts
    n uniform float64 samples."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"randperm: n must be a non-negative int, got {n!r}")
    perm = argsort(rand(n, dtype=_C.float64))
    return perm if dtype is None else cast(perm, _dtype_or(dtype, _C.int64))


def bernoulli(input, p=None):
    """1 with probability p (input's values, or the number p when given), else 0, in input's dtype."""
    x = as_tensor(input)
    if not x.dtype.is_floating_point:
        raise TypeError(f"bernoulli: input must be floating point, got {x.dtype.name} (shape {list(x.shape)})")
    prob = x if p is None else float(p)
    return cast(rand(*x.shape, dtype=_C.float64) < prob, x.dtype)


def multinomial(input, num_samples, replacement=False):
    """int64 indices of categories drawn with probability proportional to input's rows (1-D: one
    distribution; 2-D: one per row), num_samples of them per row. With replacement: the inverse of
    the running sum; without: the num_samples largest of log(p) + Gumbel noise (sequential draws
    without replacement)."""
    w = as_tensor(input)
    if w.ndim not in (1, 2):
        raise ValueError(f"multinomial: input must be 1-D or 2-D, got shape {list(w.shape)}")
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
        raise ValueError(f"multinomial: num_samples must be a positive int, got {num_samples!r}")
    n = w.shape[-1]
    if not replacement and num_samples > n:
        raise ValueError(f"multinomial: cannot draw {num_samples} samples without replacement from {n} categories")
    w2 = reshape(cast(w, _C.float64), -1, n)
    rows = w2.shape[0]
    if replacement:
        cdf = cumsum(w2, 1)
        cdf = cdf / cdf[:, n - 1:n]
        u = rand(rows, num_samples, 1, dtype=_C.float64)
        idx = cast(sum_(cast(reshape(cdf, rows, 1, n) <= u, _C.int64), -1), _C.int64)
        idx = cast(clamp(idx, max=n - 1), _C.int64)
    else:
        g = -log(-log(rand(rows, n, dtype=_C.float64)))
        idx = topk(log(w2) + g, num_samples, -1)[1]
    return reshape(idx, num_samples) if w.ndim == 1 else idx
