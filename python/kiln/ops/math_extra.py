"""Elementwise and reducing math a ported training script reaches for (issue 30), each an exact
composition of kiln's ops, so gradients, symbolic sizes, fusion and ONNX export follow from their
parts: logsumexp, clamp_min / clamp_max, addcmul / addcdiv, lerp, var_mean / std_mean, diff,
nan_to_num, count_nonzero, isclose / allclose, logical_xor, cummax / cummin."""
from collections import namedtuple

import numpy as np

from .. import _C
from ._util import as_tensor, normalize_axis
from .array import arange, concat, full, gather_elements, narrow, reshape
from .math import (abs as abs_, cast, clamp, exp, isfinite, isnan, log, logical_and, logical_not, logical_or, max as max_,
                   mean, ne, std, sum as sum_, var, where)
from .nn_functional import stop_gradient


def _dim(op, axis, dim):
    """axis, or PyTorch's dim when given instead."""
    if dim is not None:
        if axis is not None:
            raise TypeError(f"{op}: give axis or dim, not both (axis={axis!r}, dim={dim!r})")
        return dim
    return axis


def logsumexp(input, axis=None, keep_dims=False, *, dim=None, keepdim=None):
    """log(sum(exp(x))) over axis (None: every axis; PyTorch: dim, keepdim), shifted by the maximum
    so no exp overflows: m + log(sum(exp(x - m))); a slice of -inf gives -inf, one holding +inf +inf."""
    x = as_tensor(input)
    if not x.dtype.is_floating_point:
        x = cast(x, _C.float32)
    axis = _dim("logsumexp", axis, dim)
    keep = bool(keep_dims if keepdim is None else keepdim)
    m = stop_gradient(max_(x, axis, True))
    m = where(isfinite(m), m, 0.0)  # (an all -inf, +inf or NaN slice: no shift)
    out = log(sum_(exp(x - m), axis, True)) + m
    if keep:
        return out
    return reshape(out, *_reduced_shape(x.shape, axis))


def _reduced_shape(shape, axis):
    if axis is None:
        return ()
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    drop = {normalize_axis("logsumexp", a, len(shape)) for a in axes}
    return tuple(s for d, s in enumerate(shape) if d not in drop)


def clamp_min(input, min):  # noqa: A002 (PyTorch's name)
    """max(x, min): clamp with a lower bound only."""
    return clamp(input, min=min)


def clamp_max(input, max):  # noqa: A002 (PyTorch's name)
    """min(x, max): clamp with an upper bound only."""
    return clamp(input, max=max)


def addcmul(input, tensor1, tensor2, *, value=1):
    """input + value * tensor1 * tensor2 (broadcast together)."""
    return as_tensor(input) + as_tensor(tensor1) * as_tensor(tensor2) * value


def addcdiv(input, tensor1, tensor2, *, value=1):
    """input + value * tensor1 / tensor2 (broadcast together)."""
    return as_tensor(input) + as_tensor(tensor1) / as_tensor(tensor2) * value


def lerp(input, end, weight):
    """input + weight * (end - input): linear interpolation, weight a number or a tensor."""
    x = as_tensor(input)
    return x + (as_tensor(end) - x) * weight


_VarMean = namedtuple("var_mean", ["var", "mean"])
_StdMean = namedtuple("std_mean", ["std", "mean"])


def var_mean(input, axis=None, keepdims=False, *, ddof=0, correction=None, unbiased=None, dim=None, keepdim=None):
    """(var, mean) over axis, var with var's arguments (ddof, PyTorch's correction or unbiased)."""
    kw = dict(ddof=ddof, correction=correction, unbiased=unbiased, dim=dim, keepdim=keepdim)
    return _VarMean(var(input, axis, keepdims, **kw), mean(input, axis, keepdims, dim=dim, keepdim=keepdim))


def std_mean(input, axis=None, keepdims=False, *, ddof=0, correction=None, unbiased=None, dim=None, keepdim=None):
    """(std, mean) over axis, std with std's arguments (ddof, PyTorch's correction or unbiased)."""
    kw = dict(ddof=ddof, correction=correction, unbiased=unbiased, dim=dim, keepdim=keepdim)
    return _StdMean(std(input, axis, keepdims, **kw), mean(input, axis, keepdims, dim=dim, keepdim=keepdim))


def diff(input, n=1, axis=-1, prepend=None, append=None, *, dim=None):
    """The n-th forward difference along axis (PyTorch: dim), x[1:] - x[:-1] applied n times, after
    prepend and append are joined on; bool inputs give x[1:] != x[:-1]."""
    x = as_tensor(input)
    axis = _dim("diff", None if axis == -1 and dim is not None else axis, dim)
    if x.ndim == 0:
        raise ValueError("diff: input must have at least 1 dimension, got a 0-d tensor")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"diff: n must be a non-negative int, got {n!r}")
    axis = normalize_axis("diff", axis, x.ndim)
    parts = [as_tensor(p) for p in (prepend, x, append) if p is not None]
    if len(parts) > 1:
        x = concat(parts, axis)
    for _ in range(n):
        m = x.shape[axis]
        if m == 0:
            break
        later, earlier = narrow(x, axis, 1, m - 1), narrow(x, axis, 0, m - 1)
        x = ne(later, earlier) if x.dtype is _C.bool else later - earlier
    return x


# the largest finite value of each float dtype
_LARGEST = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": float(np.finfo(np.float32).max),
            "float64": float(np.finfo(np.float64).max)}


def nan_to_num(input, nan=0.0, posinf=None, neginf=None):
    """NaN replaced by nan, +inf by posinf and -inf by neginf (None: the dtype's largest and
    lowest finite values); integers and bool are returned unchanged."""
    x = as_tensor(input)
    if not x.dtype.is_floating_point:
        return x
    big = _LARGEST[x.dtype.name]
    hi = big if posinf is None else float(posinf)
    lo = -big if neginf is None else float(neginf)
    y = where(x == float("inf"), full((), hi, x.dtype), x)
    y = where(x == float("-inf"), full((), lo, x.dtype), y)
    return where(isnan(x), full((), float(nan), x.dtype), y)


def count_nonzero(input, axis=None, keep_dims=False, *, dim=None):
    """The number of nonzero elements over axis (None: all; PyTorch: dim), as int64."""
    x = as_tensor(input)
    axis = _dim("count_nonzero", axis, dim)
    if isinstance(axis, (tuple, list)) and len(axis) == 0:
        axis = None
    return sum_(ne(x, 0), axis, keep_dims)


def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """Whether |input - other| <= atol + rtol * |other| elementwise (broadcast; equal infinities are
    close, NaN only with equal_nan), as a bool tensor."""
    a, b = as_tensor(input), as_tensor(other)
    if rtol < 0 or atol < 0:
        raise ValueError(f"isclose: rtol and atol must be non-negative, got rtol={rtol}, atol={atol}")
    if not a.dtype.is_floating_point or not b.dtype.is_floating_point:
        a, b = cast(a, _C.float64), cast(b, _C.float64)
    near = logical_and(logical_and(isfinite(a), isfinite(b)), abs_(a - b) <= abs_(b) * float(rtol) + float(atol))
    close = logical_or(a == b, near)  # (infinities: only equal ones)
    if equal_nan:
        close = logical_or(close, logical_and(isnan(a), isnan(b)))
    return close


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """Whether every element of isclose(input, other, ...) is true, as a Python bool."""
    from .math import all as all_

    return bool(all_(isclose(input, other, rtol, atol, equal_nan)))


def logical_xor(input, other):
    """Whether exactly one of input and other is nonzero (bool, broadcast)."""
    return ne(ne(as_tensor(input), 0), ne(as_tensor(other), 0))


_Cummax = namedtuple("cummax", ["values", "indices"])
_Cummin = namedtuple("cummin", ["values", "indices"])


def _shifted(x, axis, s, fill):
    """x moved s places later along axis, the first s places holding fill."""
    n = x.shape[axis]
    head = full([s if d == axis else size for d, size in enumerate(x.shape)], fill, x.dtype)
    return concat((head, narrow(x, axis, 0, n - s)), axis)


def _cum_extreme(op, input, axis, dim, larger):
    """(values, indices int64) of the running maximum (larger) or minimum along axis: a log-step
    scan over (value, index) pairs where an earlier window wins only when strictly better, so ties
    go to the latest index and a NaN, once seen, stays (its latest index), as PyTorch; the values are
    gathered from x by the indices, so the gradient reaches the chosen elements."""
    x = as_tensor(input)
    axis = _dim(op, axis, dim)
    if axis is None:
        raise TypeError(f"{op}: axis (PyTorch: dim) is required")
    if x.ndim == 0:
        x0 = reshape(x, 1)
        v, i = _cum_extreme(op, x0, 0, None, larger)
        return (_Cummax if larger else _Cummin)(reshape(v, ()), reshape(i, ()))
    axis = normalize_axis(op, axis, x.ndim)
    n = x.shape[axis]
    idx_shape = [n if d == axis else 1 for d in range(x.ndim)]
    best = stop_gradient(x)
    at = reshape(arange(n), *idx_shape) + full(x.shape, 0, _C.int64)
    fill = float("-inf") if larger else float("inf")
    if not x.dtype.is_floating_point:
        info = np.iinfo(x.dtype.name) if x.dtype is not _C.bool else None
        fill = (info.min if larger else info.max) if info else (0 if larger else 1)
    s = 1
    while s < n:
        earlier, earlier_at = _shifted(best, axis, s, fill), _shifted(at, axis, s, 0)
        better = earlier > best if larger else earlier < best
        if x.dtype.is_floating_point:  # NaN is the extreme of both
            better = logical_or(logical_and(isnan(earlier), logical_not(isnan(best))),
                                logical_and(better, logical_not(isnan(best))))
        best, at = where(better, earlier, best), where(better, earlier_at, at)
        s *= 2
    return (_Cummax if larger else _Cummin)(gather_elements(x, axis, at), at)


def cummax(input, axis=None, *, dim=None):
    """(values, indices int64): the running maximum along axis (PyTorch: dim) and where it was
    (ties: the latest; NaN propagates). Gradients reach the chosen elements."""
    return _cum_extreme("cummax", input, axis, dim, True)


def cummin(input, axis=None, *, dim=None):
    """(values, indices int64): the running minimum along axis (PyTorch: dim) and where it was
    (ties: the latest; NaN propagates). Gradients reach the chosen elements."""
    return _cum_extreme("cummin", input, axis, dim, False)
