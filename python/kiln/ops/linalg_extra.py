"""Products and distances of PyTorch and MindSpore (issue 30), exact compositions of matmul and
elementwise ops, so gradients, symbolic sizes and export follow: outer (ger), dot, mv, addmm,
baddbmm, trace, kron, cosine_similarity, pairwise_distance, cdist."""
import math as _math

from ._util import as_tensor, normalize_axis
from .array import reshape, swapaxes, unsqueeze
from .array_more import diag
from .linalg import bmm, norm
from .math import abs as abs_, clamp, max as max_, sqrt, sum as sum_, where
from .nn_functional import matmul


def _shapes(*ts):
    return " and ".join(str(list(t.shape)) for t in ts)


def outer(input, vec2):
    """The outer product of two 1-D tensors: (n,) and (m,) give (n, m)."""
    a, b = as_tensor(input), as_tensor(vec2)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError(f"outer: expected two 1-D tensors, got shapes {_shapes(a, b)}")
    return reshape(a, -1, 1) * reshape(b, 1, -1)


ger = outer


def dot(input, other):
    """The inner product of two 1-D tensors of one length, a 0-d tensor."""
    a, b = as_tensor(input), as_tensor(other)
    if a.ndim != 1 or b.ndim != 1 or a.shape[0] != b.shape[0]:
        raise ValueError(f"dot: expected two 1-D tensors of one length, got shapes {_shapes(a, b)}")
    return matmul(a, b)


def mv(input, vec):
    """The product of a matrix (n, m) and a vector (m,): (n,)."""
    a, b = as_tensor(input), as_tensor(vec)
    if a.ndim != 2 or b.ndim != 1 or a.shape[1] != b.shape[0]:
        raise ValueError(f"mv: expected a matrix (n, m) and a vector (m,), got shapes {_shapes(a, b)}")
    return matmul(a, b)


def _scaled_sum(op, input, product, beta, alpha):
    """beta * input + alpha * product; beta 0 ignores input (NaN there does not propagate)."""
    out = _broadcast_like(op, input, product if alpha == 1 else product * alpha)
    if beta == 0:
        return out
    x = as_tensor(input)
    return (x if beta == 1 else x * beta) + out


def _broadcast_like(op, input, out):
    """out, checked to take input's broadcast (beta == 0 drops input's values, not its shape check)."""
    x = as_tensor(input)
    lead = x.ndim - out.ndim
    if lead > 0 or any(s not in (1, n) for s, n in zip(x.shape, out.shape[-x.ndim:] if x.ndim else ())):
        raise ValueError(f"{op}: input of shape {list(x.shape)} does not broadcast to the product's {list(out.shape)}")
    return out


def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """beta * input + alpha * (mat1 @ mat2), mat1 (n, m) and mat2 (m, p), input broadcast to (n, p)."""
    a, b = as_tensor(mat1), as_tensor(mat2)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"addmm: expected matrices (n, m) and (m, p), got shapes {_shapes(a, b)}")
    return _scaled_sum("addmm", input, matmul(a, b), beta, alpha)


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """beta * input + alpha * bmm(batch1, batch2), input broadcast to (B, n, p)."""
    return _scaled_sum("baddbmm", input, bmm(batch1, batch2), beta, alpha)


def trace(input):
    """The sum of the main diagonal of a matrix (0-d)."""
    x = as_tensor(input)
    if x.ndim != 2:
        raise ValueError(f"trace: expected a matrix, got shape {list(x.shape)}")
    return sum_(diag(x))


def kron(input, other):
    """The Kronecker product: a block matrix of input's elements times other (the fewer axes
    padded with leading 1s), shape the product of the two shapes axis by axis."""
    a, b = as_tensor(input), as_tensor(other)
    nd = max(a.ndim, b.ndim)
    sa, sb = (1,) * (nd - a.ndim) + tuple(a.shape), (1,) * (nd - b.ndim) + tuple(b.shape)
    inter_a = [v for s in sa for v in (s, 1)]
    inter_b = [v for s in sb for v in (1, s)]
    y = reshape(a, *inter_a) * reshape(b, *inter_b)
    return reshape(y, *[p * q for p, q in zip(sa, sb)])


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """sum(x1 * x2) / (max(|x1|, eps) * max(|x2|, eps)) along dim (x1 and x2 broadcast), as PyTorch:
    each divided by its clamped norm first."""
    a, b = as_tensor(x1), as_tensor(x2)
    nd = max(a.ndim, b.ndim)
    axis = normalize_axis("cosine_similarity", dim, nd)
    na = clamp(norm(a, 2, axis - (nd - a.ndim), True), min=float(eps))
    nb = clamp(norm(b, 2, axis - (nd - b.ndim), True), min=float(eps))
    return sum_((a / na) * (b / nb), axis)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """The p-norm of x1 - x2 + eps along the last axis (x1 and x2 broadcast)."""
    d = as_tensor(x1) - as_tensor(x2) + float(eps)
    return norm(d, float(p), -1 if d.ndim else None, keepdim)


def cdist(x1, x2, p=2.0):
    """The p-norm distances between the rows of x1 (..., P, M) and of x2 (..., R, M): (..., P, R).
    p=2 through one matrix product (|a|^2 + |b|^2 - 2 a.b, clamped at 0); other p by broadcasting."""
    a, b = as_tensor(x1), as_tensor(x2)
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-1]:
        raise ValueError(f"cdist: expected (..., P, M) and (..., R, M), got shapes {_shapes(a, b)}")
    if p < 0:
        raise ValueError(f"cdist: p must be non-negative, got {p}")
    if p == 2:
        aa = sum_(a * a, -1, True)
        bb = swapaxes(sum_(b * b, -1, True), -1, -2)
        d2 = clamp(aa + bb - matmul(a, swapaxes(b, -1, -2)) * 2.0, min=0.0)
        positive = d2 > 0  # (a zero distance's gradient is 0, not the NaN of 0 * inf)
        return where(positive, sqrt(where(positive, d2, 1.0)), 0.0)
    diff = abs_(unsqueeze(a, -2) - unsqueeze(b, -3))
    if p == 1:
        return sum_(diff, -1)
    if p == _math.inf:
        return max_(diff, -1)
    return norm(diff, float(p), -1)
