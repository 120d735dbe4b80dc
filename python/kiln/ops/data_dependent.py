"""Ops whose output size depends on the input's values: nonzero and unique. They run eagerly
(NumPy on the values); a compiled graph has sizes fixed when it is captured, so under kiln.jit or
kiln.trace they raise NotImplementedError naming the op, never a result baked in from the capture.
isin, whose size is its input's, is ordinary ops and compiles."""
import builtins

import numpy as np

from .. import _C
from ._util import as_tensor
from .array import reshape
from .math import cast, eq, logical_and, logical_not, sum as sum_


def _eager_only(op, x):
    if _C.is_tracing():
        raise NotImplementedError(
            f"{op}: its output size depends on the values of its input (shape {list(x.shape)}), which a graph "
            f"captured by kiln.jit / kiln.trace cannot hold (its sizes are fixed when captured); call {op} outside "
            "the compiled function, or use a fixed-size form (a mask with ops.where, ops.topk)")
    if x.requires_grad and _C.is_grad_enabled() and x.dtype.is_floating_point:
        x = x.detach()
    return x.asnumpy()


def nonzero(input, *, as_tuple=False):
    """The indices of the nonzero elements, int64 of shape (count, ndim) in row-major order (as_tuple:
    one 1-D tensor per axis). Eager only (see the module)."""
    return _nonzero("nonzero", input, as_tuple)


def _nonzero(op, input, as_tuple):
    x = as_tensor(input)
    a = _eager_only(op, x)
    if a.ndim == 0:  # (as PyTorch) one row of no coordinates when the value is nonzero
        found = () if as_tuple else np.zeros((int(a != 0), 0), np.int64)
    else:
        found = np.nonzero(a)
    if as_tuple:
        return tuple(_tensor(i.astype(np.int64)) for i in found)
    return _tensor(found if a.ndim == 0 else np.stack(found, 1).astype(np.int64))


def _tensor(a):
    return as_tensor(np.ascontiguousarray(a))


def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):  # noqa: A002 (PyTorch's names)
    """The distinct values of the flattened input, ascending (NaNs each distinct, last, as NumPy);
    with return_inverse the int64 index of each input element in them (input's shape), with
    return_counts how often each occurs. Eager only (see the module); dim is not supported."""
    if dim is not None:
        raise NotImplementedError(f"unique: dim={dim!r} is not supported (only the flattened input)")
    x = as_tensor(input)
    a = _eager_only("unique", x)
    values, inverse, counts = np.unique(a.reshape(-1), return_inverse=True, return_counts=True, equal_nan=False)
    out = [_tensor(values.astype(a.dtype))]
    if return_inverse:
        out.append(_tensor(inverse.reshape(a.shape).astype(np.int64)))
    if return_counts:
        out.append(_tensor(counts.astype(np.int64)))
    return out[0] if len(out) == 1 else tuple(out)


def isin(elements, test_elements, *, invert=False):
    """Whether each element of `elements` equals some element of test_elements (a bool tensor of
    elements' shape; invert: whether it equals none). O(len(elements) * len(test_elements))."""
    x, t = as_tensor(elements), as_tensor(test_elements)
    if builtins.any(n == 0 for n in t.shape):  # (a symbolic size is at least 2: a guard, not a fixed size)
        hit = logical_and(eq(x, x), False)
    else:
        # a count, not any() over bools: ONNX's ReduceMax takes no bool (so isin exports)
        hit = sum_(cast(eq(reshape(x, *x.shape, 1), reshape(t, -1)), _C.float32), -1) > 0.5
    return logical_not(hit) if invert else hit


def argwhere(input):
    """The indices of the nonzero elements, int64 of shape (count, ndim) (nonzero's). Eager only."""
    return _nonzero("argwhere", input, False)


def masked_select(input, mask):
    """The elements of input where mask (broadcast together) is true, 1-D in row-major order.
    The positions are found eagerly (NumPy on the mask, eager only like nonzero); the elements are
    gathered from input, so the gradient reaches them."""
    from .array import broadcast_to, gather

    x, m = as_tensor(input), as_tensor(mask)
    if m.dtype is not _C.bool:
        raise TypeError(f"masked_select: mask must be bool, got {m.dtype.name} (shape {list(m.shape)})")
    try:
        shape = np.broadcast_shapes(tuple(x.shape), tuple(m.shape))
    except ValueError:
        raise ValueError(f"masked_select: input of shape {list(x.shape)} and mask of shape {list(m.shape)} "
                         "do not broadcast") from None
    positions = np.flatnonzero(np.broadcast_to(_eager_only("masked_select", m), shape)).astype(np.int64)
    return gather(reshape(broadcast_to(x, *shape), -1), _tensor(positions), 0)
