"""Products and norms as exact compositions of kiln's ops: bmm, einsum (permute, reshape, one
batched matmul per pair of operands, sum) and norm (vector p-norms, Frobenius and the matrix
1 / inf norms)."""
import math as _math

from ._util import as_tensor, normalize_axis
from .array import permute, reshape
from .math import abs as abs_, max as max_, min as min_, sqrt, sum as sum_, where
from .nn_functional import matmul


def bmm(input_x, mat2):
    """Batched matrix product of (B, N, M) and (B, M, P): (B, N, P)."""
    a, b = as_tensor(input_x), as_tensor(mat2)
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise ValueError(f"bmm: expected (B, N, M) and (B, M, P), got shapes {list(a.shape)} and {list(b.shape)}")
    return matmul(a, b)


# ---- einsum ------------------------------------------------------------------------------------

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _parse(equation, operands):
    """(input subscripts per operand, output subscripts), '...' replaced by letters unused by the
    equation (the ellipsis dimensions aligned to the right, as NumPy)."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum: {equation!r} has {len(terms)} operands, {len(operands)} given")
    for t in terms + [out]:
        bad = set(t.replace("...", "")) - set(_LETTERS)
        if bad or t.count("...") > 1:
            raise ValueError(f"einsum: {equation!r}: subscripts must be letters and at most one '...' per term")
    spare = [c for c in _LETTERS if c not in eq]
    ell = 0
    for t, x in zip(terms, operands):
        if "..." in t:
            ell = max(ell, x.ndim - (len(t) - 3))
    ell_letters = "".join(spare[:ell])
    subs = []
    for t, x in zip(terms, operands):
        if "..." in t:
            n = x.ndim - (len(t) - 3)
            if n < 0:
                raise ValueError(f"einsum: {t!r} has more subscripts than operand of shape {list(x.shape)}")
            t = t.replace("...", ell_letters[ell - n:])
        if len(t) != x.ndim:
            raise ValueError(f"einsum: {t!r} names {len(t)} dimensions of an operand of shape {list(x.shape)}")
        if len(set(t)) != len(t):
            raise NotImplementedError(f"einsum: {t!r} repeats a subscript within one operand (a diagonal or "
                                      "trace), which kiln's einsum does not support; multiply by ops.eye and sum instead")
        subs.append(t)
    if arrow:
        out = out.replace("...", ell_letters)  # (an output without '...' sums those dimensions)
        if len(set(out)) != len(out):
            raise ValueError(f"einsum: output {out!r} repeats a subscript")
        missing = set(out) - set("".join(subs))
        if missing:
            raise ValueError(f"einsum: output subscripts {sorted(missing)} appear in no operand")
    else:  # implicit output: the ellipsis, then the letters used once, in order
        counts = {}
        for c in "".join(subs):
            counts[c] = counts.get(c, 0) + 1
        out = ell_letters + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in ell_letters))
    return subs, out


def einsum(equation, *operands):
    """Einstein summation over the operands (NumPy's and PyTorch's equations: 'ij,jk->ik',
    'bhqd,bhkd->bhqk', '...ij,...jk', implicit output, 'ii' unsupported). Each pair of operands is
    one batched matmul; a subscript's sizes must agree across operands (no broadcasting of 1)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not isinstance(equation, str):
        raise TypeError(f"einsum: equation must be a str, got {type(equation).__name__}")
    if not operands:
        raise ValueError("einsum: at least one operand is needed")
    xs = [as_tensor(x) for x in operands]
    subs, out = _parse(equation, xs)
    sizes = {}
    for t, x in zip(subs, xs):
        for c, n in zip(t, x.shape):
            if c in sizes and sizes[c] != n:
                raise ValueError(f"einsum: {equation!r}: subscript {c!r} is {sizes[c]} in one operand and {n} in "
                                 f"another (shapes {[list(y.shape) for y in xs]})")
            sizes[c] = n
    # sum away what only one operand holds and the output does not, then contract left to right
    terms = list(zip(subs, xs))
    for i, (t, x) in enumerate(terms):
        others = set(out).union(*(set(s) for j, (s, _) in enumerate(terms) if j != i))
        terms[i] = _sum_out(t, x, others)
    t, x = terms[0]
    for i in range(1, len(terms)):
        keep = set(out).union(*(set(s) for s, _ in terms[i + 1:]))
        t, x = _contract(t, x, *terms[i], keep, sizes)
    return _arrange(t, x, out)


def _sum_out(t, x, needed):
    axes = tuple(i for i, c in enumerate(t) if c not in needed)
    if not axes:
        return t, x
    return "".join(c for c in t if c in needed), sum_(x, axes)


def _arrange(t, x, out):
    """x (subscripts t) summed over what out lacks and permuted to out's order."""
    t, x = _sum_out(t, x, set(out))
    if t != out:
        x = permute(x, *[t.index(c) for c in out])
    return x


def _prod(sizes, letters):
    p = 1
    for c in letters:
        p = p * sizes[c]
    return p


def _contract(ta, a, tb, b, keep, sizes):
    """a (ta) times b (tb), summing the shared subscripts not in keep: (batch, left, right)."""
    batch = [c for c in ta if c in tb and c in keep]
    summed = [c for c in ta if c in tb and c not in keep]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    a = permute(a, *[ta.index(c) for c in batch + left + summed])
    b = permute(b, *[tb.index(c) for c in batch + summed + right])
    nb, nl, ns, nr = (_prod(sizes, g) for g in (batch, left, summed, right))
    y = matmul(reshape(a, nb, nl, ns), reshape(b, nb, ns, nr))
    y = reshape(y, *[sizes[c] for c in batch + left + right])
    return "".join(batch + left + right), y


# ---- norm --------------------------------------------------------------------------------------


def _safe_sqrt(s):
    """sqrt(s) with gradient 0 where s is 0 (as PyTorch's norm), not the NaN of 0 * inf."""
    positive = s > 0
    return where(positive, sqrt(where(positive, s, 1.0)), 0.0)


def norm(A, ord=None, dim=None, keepdim=False, *, dtype=None):
    """MindSpore's ops.norm / torch.linalg.norm. With dim None or one axis, a vector norm
    (sum |x|^p)^(1/p): ord None or 2, 1, inf, -inf, 0 (the count of nonzeros) or any other number
    (dim None: over all elements, ord None/'fro' only past 1-D, as PyTorch). With two axes, a
    matrix norm: 'fro' (or None), 1 / -1 (max / min column sum of |x|), inf / -inf (rows).
    The gradient at a zero vector is 0."""
    x = as_tensor(A)
    if dtype is not None:
        x = x.astype(dtype)
    if not x.dtype.is_floating_point:
        raise TypeError(f"norm: input must be floating point, got {x.dtype}")
    if dim is None:
        if ord is not None and ord != "fro" and x.ndim > 1 and x.ndim != 2:
            raise ValueError(f"norm: ord={ord!r} with dim=None needs a 1-D or 2-D input, got shape {list(x.shape)}")
        axes = tuple(range(x.ndim)) if x.ndim != 2 or ord in (None, "fro") else (0, 1)
    else:
        axes = (dim,) if isinstance(dim, int) else tuple(dim)
        axes = tuple(normalize_axis("norm", a, x.ndim) for a in axes)
        if len(set(axes)) != len(axes):
            raise ValueError(f"norm: dim {dim!r} names an axis twice")
    if len(axes) == 2 and ord not in (None, "fro"):
        return _matrix_norm(x, ord, axes, keepdim)
    if ord == "fro":
        if dim is not None and len(axes) != 2:
            raise ValueError(f"norm: ord='fro' needs two axes, got dim={dim!r}")
        ord = 2
    if ord is None:
        ord = 2
    if isinstance(ord, str) or isinstance(ord, bool) or not isinstance(ord, (int, float)):
        raise ValueError(f"norm: unsupported ord {ord!r} for a vector norm (a number, inf or -inf)")
    if ord == 2:
        return _safe_sqrt(sum_(x * x, axes, keepdim))
    if ord == _math.inf:
        return max_(abs_(x), axes, keepdim)
    if ord == -_math.inf:
        return min_(abs_(x), axes, keepdim)
    if ord == 0:
        return sum_((x != 0).astype(x.dtype), axes, keepdim)
    if ord == 1:
        return sum_(abs_(x), axes, keepdim)
    s = sum_(abs_(x) ** float(ord), axes, keepdim)
    if ord > 0:
        positive = s > 0  # gradient 0 at a zero vector
        return where(positive, where(positive, s, 1.0) ** (1.0 / ord), 0.0)
    return s ** (1.0 / ord)


def _matrix_norm(x, ord, axes, keepdim):
    rows, cols = axes
    if ord in (1, -1):
        inner, outer = rows, cols  # column sums, then over columns
    elif ord in (_math.inf, -_math.inf):
        inner, outer = cols, rows
    else:
        raise NotImplementedError(f"norm: matrix ord={ord!r} needs singular values, which kiln does not compute "
                                  "('fro', 1, -1, inf and -inf are supported)")
    s = sum_(abs_(x), inner, True)
    best = max_ if ord > 0 else min_
    y = best(s, outer, True)
    if not keepdim:
        y = reshape(y, *[n for i, n in enumerate(y.shape) if i not in axes])
    return y
