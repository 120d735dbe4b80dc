"""Functional activations (MindSpore's names), compositions of kiln's elementwise ops, so fusion,
gradients, symbolic sizes and export follow; kiln.nn's activation Cells call these."""
from ._util import as_tensor, normalize_axis
from .array import narrow, reshape
from .math import abs as abs_, clamp, exp, log, maximum, minimum, sigmoid, tanh, where

# SELU's constants (Klambauer et al. 2017), as PyTorch and MindSpore write them
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _floating(op, input):
    x = as_tensor(input)
    if not x.dtype.is_floating_point:
        raise TypeError(f"{op}: input must be floating point, got {x.dtype}")
    return x


def log1p_small(e):
    """log(1 + e) for e >= 0, exact to rounding even where 1 + e rounds to 1 (Goldberg's form:
    log(u) * e / (u - 1), u = 1 + e, which cancels u's rounding error; e itself where u is 1).
    The unused side's denominator is kept at 1, so no 0 / 0 reaches a gradient."""
    u = e + 1.0
    exact = u == 1.0
    return where(exact, e, log(u) * e / where(exact, 1.0, u - 1.0))


def leaky_relu(input, alpha=0.2):
    """x where x >= 0, alpha * x below."""
    x = _floating("leaky_relu", input)
    return where(x >= 0, x, x * float(alpha))


def elu(input_x, alpha=1.0):
    """x where x > 0, alpha (exp(x) - 1) below (exp of min(x, 0): no overflow on the unused side)."""
    x = _floating("elu", input_x)
    return where(x > 0, x, (exp(minimum(x, 0.0)) - 1.0) * float(alpha))


def selu(input_x):
    """scale * elu(x, alpha) with SELU's fixed constants."""
    return elu(input_x, _SELU_ALPHA) * _SELU_SCALE


def softplus(input, beta=1, threshold=20):
    """log(1 + exp(beta x)) / beta, x itself where beta x > threshold (PyTorch's rule), computed as
    log(1 + exp(-|bx|)) + max(bx, 0) so no exp overflows (and far below 0 is exp(bx) / beta to
    full precision, not 0)."""
    x = _floating("softplus", input)
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or beta == 0:
        raise ValueError(f"softplus: beta must be a nonzero number, got {beta!r}")
    beta, threshold = float(beta), float(threshold)
    bx = x * beta
    safe = minimum(bx, threshold)
    soft = (log1p_small(exp(-abs_(safe))) + maximum(safe, 0.0)) / beta
    return where(bx > threshold, x, soft)


def hardsigmoid(input):
    """relu6(x + 3) / 6."""
    return clamp(_floating("hardsigmoid", input) + 3.0, 0.0, 6.0) / 6.0


def hardswish(x):
    """x * relu6(x + 3) / 6."""
    x = _floating("hardswish", x)
    return x * clamp(x + 3.0, 0.0, 6.0) / 6.0


def mish(input):
    """x * tanh(softplus(x))."""
    x = _floating("mish", input)
    return x * tanh(softplus(x))


def prelu(x, weight):
    """x where x >= 0, weight * x below, weight one slope (shape (1,) or ()) or one per channel
    (axis 1 of x; axis 0 when x is 1-D)."""
    x = _floating("prelu", x)
    w = as_tensor(weight)
    if w.ndim > 1:
        raise ValueError(f"prelu: weight must be 0-D or 1-D, got shape {list(w.shape)}")
    n = w.shape[0] if w.ndim else 1
    channels = x.shape[1] if x.ndim >= 2 else (x.shape[0] if x.ndim == 1 else 1)
    if n != 1 and n != channels:
        raise ValueError(f"prelu: weight of {n} slopes for input of shape {list(x.shape)} ({channels} channels); "
                         "give one slope or one per channel")
    if w.ndim and x.ndim >= 2:
        shape = [1] * x.ndim
        shape[1] = n
        w = reshape(w, *shape)
    elif w.ndim and x.ndim == 0:
        w = reshape(w, ())
    return where(x >= 0, x, x * w.astype(x.dtype))


def relu6(input):
    """min(max(x, 0), 6)."""
    return clamp(_floating("relu6", input), 0.0, 6.0)


def hardtanh(input, min_val=-1.0, max_val=1.0):
    """x limited to [min_val, max_val]."""
    x = _floating("hardtanh", input)
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val ({min_val}) must not exceed max_val ({max_val})")
    return clamp(x, float(min_val), float(max_val))


def softsign(input):
    """x / (1 + |x|)."""
    x = _floating("softsign", input)
    return x / (abs_(x) + 1.0)


def celu(input, alpha=1.0):
    """x where x > 0, alpha (exp(x / alpha) - 1) below (exp of min(x, 0): no overflow on the unused side)."""
    x = _floating("celu", input)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha == 0:
        raise ValueError(f"celu: alpha must be a nonzero number, got {alpha!r}")
    alpha = float(alpha)
    return where(x > 0, x, (exp(minimum(x, 0.0) / alpha) - 1.0) * alpha)


def glu(input, axis=-1):
    """a * sigmoid(b), a and b the two halves of input along axis (its length must be even)."""
    x = _floating("glu", input)
    if x.ndim == 0:
        raise ValueError("glu: input must have at least 1 dimension, got a 0-d tensor")
    axis = normalize_axis("glu", axis, x.ndim)
    n = x.shape[axis]
    if n % 2:
        raise ValueError(f"glu: the length of axis {axis} must be even, got shape {list(x.shape)}")
    return narrow(x, axis, 0, n // 2) * sigmoid(narrow(x, axis, n // 2, n // 2))


def logit(input, eps=None):
    """log(x / (1 - x)), x first limited to [eps, 1 - eps] when eps is given."""
    x = _floating("logit", input)
    if eps is not None:
        x = clamp(x, float(eps), 1.0 - float(eps))
    return log(x / (1.0 - x))
