"""Resizing (interpolate: nearest, linear / bilinear / trilinear, PyTorch's index rules) and adaptive
max pooling, as gathers, window maxima and products by per-axis weights: exact compositions of
kiln's ops, so gradients, fusion and export follow from theirs."""
import math

import numpy as np

from .. import _C
from ._util import as_tensor
from .array import broadcast_to, concat, gather, reshape
from .nn_functional import max_pool2d

_LINEAR_RANK = {"linear": 3, "bilinear": 4, "trilinear": 5}


# The most elements a resize or adaptive pool may produce (8 GiB of float32): index arrays are
# built per axis in NumPy first, and an absurd size is refused before it takes the memory.
MAX_OUTPUT_ELEMENTS = 2 ** 31


def _check_output(op, x, sizes):
    count = 1
    for s in sizes:
        count *= s
    if count > MAX_OUTPUT_ELEMENTS or count * x.shape[0] * x.shape[1] > MAX_OUTPUT_ELEMENTS:
        raise ValueError(f"{op}: an output of spatial size {tuple(sizes)} for input {list(x.shape)} holds more than "
                         f"2**31 elements")


def _index(values):
    return as_tensor(np.asarray(values, np.int64))


def _out_sizes(op, x, size, scale_factor):
    """The output's spatial sizes and, per axis, the scale PyTorch's index rule uses (1 / scale_factor
    when one is given, else in / out)."""
    spatial = x.ndim - 2
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{op}: give exactly one of size and scale_factor")
    if size is not None:
        sizes = (size,) * spatial if isinstance(size, int) else tuple(size)
        if len(sizes) != spatial or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
            raise ValueError(f"{op}: size must be a positive int or {spatial} of them for input {list(x.shape)}, "
                             f"got {size!r}")
        return sizes, tuple(x.shape[2 + d] / sizes[d] for d in range(spatial))
    factors = (scale_factor,) * spatial if isinstance(scale_factor, (int, float)) else tuple(scale_factor)
    if len(factors) != spatial or not all(isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0
                                          for f in factors):
        raise ValueError(f"{op}: scale_factor must be a positive number or {spatial} of them for input "
                         f"{list(x.shape)}, got {scale_factor!r}")
    sizes = tuple(int(math.floor(x.shape[2 + d] * factors[d])) for d in range(spatial))
    if min(sizes) < 1:
        raise ValueError(f"{op}: scale_factor {scale_factor!r} gives an empty output for input {list(x.shape)}")
    return sizes, tuple(1.0 / f for f in factors)


def _nearest_axis(x, axis, n_in, n_out, scale):
    """Output i takes input min(floor(i * scale), n_in - 1) (PyTorch's 'nearest'); a whole multiple
    is a broadcast, anything else a gather."""
    if n_out == n_in:
        return x
    if n_out % n_in == 0 and scale == n_in / n_out:
        r = n_out // n_in
        shape = list(x.shape)
        y = broadcast_to(reshape(x, tuple(shape[:axis + 1]) + (1,) + tuple(shape[axis + 1:])),
                         tuple(shape[:axis + 1]) + (r,) + tuple(shape[axis + 1:]))
        return reshape(y, tuple(shape[:axis]) + (n_in * r,) + tuple(shape[axis + 1:]))
    src = np.minimum(np.floor(np.arange(n_out, dtype=np.float32) * np.float32(scale)).astype(np.int64), n_in - 1)
    return gather(x, _index(src), axis)


def _linear_axis(x, axis, n_in, n_out, scale, align_corners):
    """PyTorch's linear rule along one axis: source s = i * (n_in - 1) / (n_out - 1) with
    align_corners, else max((i + 0.5) * scale - 0.5, 0); out = x[i0] * (1 - l) + x[i1] * l with
    i0 = floor(s), i1 = min(i0 + 1, n_in - 1), l = s - i0 (computed in x's float type)."""
    if n_out == n_in and (align_corners or scale == 1.0):
        return x
    ft = np.float64 if x.dtype == _C.float64 else np.float32
    i = np.arange(n_out, dtype=ft)
    if align_corners:
        src = i * ft((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(n_out, ft)
    else:
        src = np.maximum((i + ft(0.5)) * ft(scale) - ft(0.5), ft(0))
    i0 = src.astype(np.int64)
    i1 = np.minimum(i0 + 1, n_in - 1)
    lam1 = (src - i0.astype(ft)).astype(ft)
    lam0 = (ft(1) - lam1).astype(ft)
    shape = [1] * x.ndim
    shape[axis] = n_out
    w0 = as_tensor(lam0.reshape(shape)).astype(x.dtype)
    w1 = as_tensor(lam1.reshape(shape)).astype(x.dtype)
    return gather(x, _index(i0), axis) * w0 + gather(x, _index(i1), axis) * w1


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None):
    """Resizes the spatial axes (all but the first two) of input to `size` or by `scale_factor`
    (floor(in * factor)), PyTorch's rules: 'nearest' (any rank from 3) takes input floor(i * scale);
    'linear' (3-D), 'bilinear' (4-D) and 'trilinear' (5-D) interpolate each axis in turn, with
    align_corners=True mapping the corner pixels onto each other, else pixel centres (default).
    scale is 1 / scale_factor when one is given (recompute_scale_factor=True: in / out)."""
    op = "interpolate"
    x = as_tensor(input)
    if mode not in ("nearest",) + tuple(_LINEAR_RANK):
        raise ValueError(f"{op}: mode must be 'nearest', 'linear', 'bilinear' or 'trilinear', got {mode!r}")
    if x.ndim < 3:
        raise ValueError(f"{op}: expected input (N, C, spatial...), got shape {list(x.shape)}")
    if mode != "nearest" and x.ndim != _LINEAR_RANK[mode]:
        raise ValueError(f"{op}: mode {mode!r} expects a {_LINEAR_RANK[mode]}-D input, got shape {list(x.shape)}")
    if mode == "nearest" and align_corners is not None:
        raise ValueError(f"{op}: align_corners is for the linear modes, not 'nearest'")
    if not x.dtype.is_floating_point and mode != "nearest":
        raise TypeError(f"{op}: mode {mode!r} expects a floating-point input, got {x.dtype.name}")
    if min(x.shape[2:]) < 1:
        raise ValueError(f"{op}: input of shape {list(x.shape)} has an empty spatial axis")
    sizes, scales = _out_sizes(op, x, size, scale_factor)
    _check_output(op, x, sizes)
    if recompute_scale_factor:
        scales = tuple(x.shape[2 + d] / sizes[d] for d in range(len(sizes)))
    y = x
    for d in reversed(range(len(sizes))):  # the last axis first, as PyTorch's kernels weigh it innermost
        n_in = x.shape[2 + d]
        if mode == "nearest":
            y = _nearest_axis(y, 2 + d, n_in, sizes[d], scales[d])
        else:
            y = _linear_axis(y, 2 + d, n_in, sizes[d], scales[d], bool(align_corners))
    return y


def _max_axis(x, axis, n_in, n_out):
    """Window maxima along one axis over PyTorch's adaptive windows [floor(i n_in / n_out),
    ceil((i + 1) n_in / n_out)): one stride-1 max pool per distinct window length, then one gather
    of each window's start from the pool of its length."""
    if n_out == n_in:
        return x
    i = np.arange(n_out, dtype=np.int64)
    starts = (i * n_in) // n_out
    lengths = -((-(i + 1) * n_in) // n_out) - starts
    if n_in % n_out == 0:  # equal windows, side by side: one pool
        k = n_in // n_out
        kernel = (k, 1) if axis == 2 else (1, k)
        return max_pool2d(x, kernel, kernel)
    pools, index, offset = [], starts.copy(), 0
    for k in np.unique(lengths).tolist():
        kernel = (k, 1) if axis == 2 else (1, k)
        index[lengths == k] += offset
        pools.append(max_pool2d(x, kernel, 1))
        offset += pools[-1].shape[axis]
    joined = pools[0] if len(pools) == 1 else concat(pools, axis)
    return gather(joined, _index(index), axis)


def adaptive_max_pool2d(input, output_size, return_indices=False):
    """Maximum over PyTorch's adaptive windows of (N, C, H, W) input: output (i, j) covers rows
    [floor(i H / h), ceil((i + 1) H / h)) and the columns likewise; output_size an int or (h, w),
    None keeping that size. The maximum is separable: rows first, then columns."""
    op = "adaptive_max_pool2d"
    x = as_tensor(input)
    if return_indices:
        raise ValueError(f"{op}: return_indices=True is not supported")
    if x.ndim != 4:
        raise ValueError(f"{op}: expected input (N, C, H, W), got shape {list(x.shape)}")
    out = (output_size, output_size) if isinstance(output_size, int) or output_size is None else tuple(output_size)
    if len(out) != 2:
        raise ValueError(f"{op}: output_size must be an int or (h, w), got {output_size!r}")
    sizes = tuple(x.shape[2 + d] if out[d] is None else out[d] for d in range(2))
    if not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
        raise ValueError(f"{op}: output_size must be positive ints, got {output_size!r}")
    if min(x.shape[2:]) < 1:
        raise ValueError(f"{op}: input of shape {list(x.shape)} has an empty spatial axis")
    _check_output(op, x, sizes)
    y = _max_axis(x, 2, x.shape[2], sizes[0])
    return _max_axis(y, 3, x.shape[3], sizes[1])

