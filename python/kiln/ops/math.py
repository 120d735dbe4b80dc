"""Elementwise math and reductions."""
import builtins as _builtins
import math as _math

from .. import _C
from .._optable import OP
from ._util import apply, as_tensor, normalize_axis


def _unary(op, name):
    """Elementwise name of one tensor (or value converted to one), in C (kiln._C.Elementwise)."""
    return _C.Elementwise(op, name, 1, f"{name}(input): elementwise {name}.")


neg = _unary(OP.neg, "neg")
abs = _unary(OP.abs, "abs")
sign = _unary(OP.sign, "sign")
exp = _unary(OP.exp, "exp")
log = _unary(OP.log, "log")
sqrt = _unary(OP.sqrt, "sqrt")
rsqrt = _unary(OP.rsqrt, "rsqrt")
sin = _unary(OP.sin, "sin")
cos = _unary(OP.cos, "cos")
tanh = _unary(OP.tanh, "tanh")
sigmoid = _unary(OP.sigmoid, "sigmoid")
relu = _unary(OP.relu, "relu")
silu = _unary(OP.silu, "silu")
erf = _unary(OP.erf, "erf")
logical_not = _unary(OP.logical_not, "logical_not")
floor = _unary(OP.floor, "floor")
ceil = _unary(OP.ceil, "ceil")
trunc = _unary(OP.trunc, "trunc")
fix = trunc  # (PyTorch's name)
log1p = _unary(OP.log1p, "log1p")
expm1 = _unary(OP.expm1, "expm1")
isnan = _unary(OP.isnan, "isnan")
isinf = _unary(OP.isinf, "isinf")
isfinite = _unary(OP.isfinite, "isfinite")
# trigonometric and hyperbolic functions, their inverses (NumPy's arc* names as aliases), logarithms
# base 2 and 10, 2^x: libm in C, integers giving float32
tan = _unary(OP.tan, "tan")
asin = arcsin = _unary(OP.asin, "asin")
acos = arccos = _unary(OP.acos, "acos")
atan = arctan = _unary(OP.atan, "atan")
sinh = _unary(OP.sinh, "sinh")
cosh = _unary(OP.cosh, "cosh")
asinh = arcsinh = _unary(OP.asinh, "asinh")
acosh = arccosh = _unary(OP.acosh, "acosh")
atanh = arctanh = _unary(OP.atanh, "atanh")
log2 = _unary(OP.log2, "log2")
log10 = _unary(OP.log10, "log10")
exp2 = _unary(OP.exp2, "exp2")


def round(input, *, decimals=0):  # noqa: A001 (MindSpore's and PyTorch's name)
    """input rounded to the nearest integer, halves to the even one (NumPy's and PyTorch's rule);
    with `decimals`, to that many decimal places (negative: tens, hundreds, ...) as PyTorch:
    round(x * 10**decimals) / 10**decimals. Integers are unchanged (decimals must then be 0)."""
    x = as_tensor(input)
    if not isinstance(decimals, int) or isinstance(decimals, _builtins.bool):
        raise TypeError(f"round: decimals must be an int, got {decimals!r}")
    if decimals == 0:
        return apply(OP.round, (x,))
    if not x.dtype.is_floating_point:
        raise TypeError(f"round: decimals={decimals} needs a floating-point tensor, got {x.dtype.name} "
                        f"(shape {list(x.shape)})")
    if decimals > 0:
        scale = 10.0 ** decimals
        return apply(OP.round, (x * scale,)) / scale
    scale = 10.0 ** -decimals
    return apply(OP.round, (x / scale,)) * scale


def gelu(input, approximate="none"):
    """GELU, exact (erf) form; approximate='tanh' uses the tanh formula."""
    x = as_tensor(input)
    if approximate == "none":
        return apply(OP.gelu, (x,))
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * _math.sqrt(2.0 / _math.pi)
        return x * 0.5 * (tanh(inner) + 1.0)
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def _binary(op, name):
    """Elementwise name of two tensors or values, in C (kiln._C.Elementwise): NumPy broadcasting
    and type promotion, a Python scalar taking the tensor's dtype on either side."""
    return _C.Elementwise(op, name, 2, f"{name}(input, other): elementwise {name} with NumPy broadcasting and "
                                       "type promotion.")


_TensorBase = _C.TensorBase

add = _binary(OP.add, "add")
sub = _binary(OP.sub, "sub")
mul = _binary(OP.mul, "mul")
div = _binary(OP.div, "div")
pow = _binary(OP.pow, "pow")
maximum = _binary(OP.maximum, "maximum")
minimum = _binary(OP.minimum, "minimum")
equal = eq = _binary(OP.eq, "equal")
not_equal = ne = _binary(OP.ne, "not_equal")
less = lt = _binary(OP.lt, "less")
less_equal = le = _binary(OP.le, "less_equal")
greater = gt = _binary(OP.gt, "greater")
greater_equal = ge = _binary(OP.ge, "greater_equal")
logical_and = _binary(OP.logical_and, "logical_and")
logical_or = _binary(OP.logical_or, "logical_or")
subtract, multiply, divide, true_divide = sub, mul, div, div
# Python's // and % (the quotient rounded toward -inf, the remainder with the divisor's sign)
floor_divide = _binary(OP.floor_divide, "floor_divide")
remainder = _binary(OP.remainder, "remainder")
floor_div, floor_mod, mod = floor_divide, remainder, remainder  # (MindSpore's names)
# C's fmod (the remainder with the dividend's sign), atan2 (the angle of (other, input)), hypot,
# logaddexp (log(exp(input) + exp(other)) without overflow)
fmod = _binary(OP.fmod, "fmod")
atan2 = arctan2 = _binary(OP.atan2, "atan2")
hypot = _binary(OP.hypot, "hypot")
logaddexp = _binary(OP.logaddexp, "logaddexp")
# bitwise ops of integer and bool tensors (Python's & | ^ ~ << >>; floats are a TypeError): of bools,
# and, or, xor and invert are the logical ops; a shift count that is negative or at least the bit
# width gives 0 (left) or the sign (right: arithmetic), as NumPy's
bitwise_and = _binary(OP.bitwise_and, "bitwise_and")
bitwise_or = _binary(OP.bitwise_or, "bitwise_or")
bitwise_xor = _binary(OP.bitwise_xor, "bitwise_xor")
bitwise_left_shift = left_shift = _binary(OP.left_shift, "bitwise_left_shift")  # (PyTorch's and NumPy's names)
bitwise_right_shift = right_shift = _binary(OP.right_shift, "bitwise_right_shift")
invert = bitwise_not = _unary(OP.bitwise_not, "invert")


def where(condition, x, y):
    """Elements of x where condition is true, else of y (broadcast together). A Python number on
    either side is weak (NumPy 2, PyTorch): it takes the tensor's dtype unless it is of a higher kind
    (a float beside an integer or bool tensor gives float32, an int beside a bool tensor int64)."""
    condition = as_tensor(condition)
    xw, yw = type(x) in (bool, int, float), type(y) in (bool, int, float)  # weak: Python's own numbers
    if xw == yw:
        return apply(OP.where, (condition, as_tensor(x), as_tensor(y)))
    tensor, number = (as_tensor(y), x) if xw else (as_tensor(x), y)
    kind = 0 if isinstance(number, bool) else 1 if isinstance(number, int) else 2
    if kind > _kind(tensor.dtype):
        tensor = cast(tensor, _C.int64 if kind == 1 else _C.float32)
    number = number_as("where", number, tensor.dtype)
    return apply(OP.where, (condition, number, tensor) if xw else (condition, tensor, number))


def _kind(dtype):
    return 0 if dtype.name == "bool" else 2 if dtype.is_floating_point else 1


def number_as(op, v, dtype):
    """The Python number v as a 0-d tensor of dtype, rounded once (a float through a double, an
    int exactly); an int outside an integer dtype's range raises ValueError."""
    if dtype.is_floating_point:
        return apply(OP.full, (), (dtype.id, 0), (float(v),))
    if dtype is not _C.bool and not isinstance(v, bool):
        import numpy as np

        info = np.iinfo(dtype.name)
        if not info.min <= v <= info.max:
            raise ValueError(f"{op}: the number {v} is out of range for the tensor's dtype {dtype.name}")
    return cast(as_tensor(v), dtype)


def clamp(input, min=None, max=None):
    """Limits values to [min, max]; either bound may be None or a tensor. Float bounds on an
    integer tensor give a float32 result (NumPy-2 weak scalars)."""
    x = as_tensor(input)
    if isinstance(min, _TensorBase) or isinstance(max, _TensorBase):
        if min is not None:
            x = maximum(x, min)
        if max is not None:
            x = minimum(x, max)
        return x
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given")
    if not x.dtype.is_floating_point and _builtins.any(isinstance(v, float) for v in (min, max)):
        x = cast(x, _C.float32)
    lo = float(min) if min is not None else -_math.inf
    hi = float(max) if max is not None else _math.inf
    if not x.dtype.is_floating_point:  # integer bounds outside the dtype's range change nothing
        info = _INT_RANGE[x.dtype.name]
        lo = _builtins.min(_builtins.max(lo, info[0]), info[1])
        hi = _builtins.min(_builtins.max(hi, info[0]), info[1])
    return apply(OP.clamp, (x,), (), (lo, hi))


_INT_RANGE = {"int8": (-128, 127), "int32": (-2**31, 2**31 - 1), "int64": (-2**62, 2**62),
              "bool": (0, 1)}


clip = clamp


def cast(input, dtype):
    """input converted to dtype (a kiln dtype or its name)."""
    x = as_tensor(input)
    if not isinstance(dtype, _C.dtype):
        dtype = _C.dtype_from_name(dtype)
    if x.dtype is dtype:
        return x
    return apply(OP.cast, (x,), (dtype.id,))


# ---- reductions -------------------------------------------------------------------------


# The reductions work out their arguments in C (kiln._C.Reduction, src/python/reductions.c):
# axis (None: all axes; an int or a tuple of ints) or PyTorch's dim, keepdims or keepdim, and for
# the moments ddof (NumPy's default 0), correction or unbiased.
_AXIS_DOC = "(input, axis=None, keepdims=False, *, dim=None, keepdim=None): {} over `axis` (None: all axes; an int " \
            "or a tuple of ints)."
sum = _C.Reduction(OP.sum, "sum", "reduce", _AXIS_DOC.format("Sum"))
mean = _C.Reduction(OP.mean, "mean", "reduce", _AXIS_DOC.format("Mean"))
prod = _C.Reduction(OP.prod, "prod", "reduce", _AXIS_DOC.format("Product"))
amax = max = _C.Reduction(OP.max, "max", "reduce", _AXIS_DOC.format("Maximum"))
amin = min = _C.Reduction(OP.min, "min", "reduce", _AXIS_DOC.format("Minimum"))
_MOMENT_DOC = "(input, axis=None, keepdims=False, *, ddof=0, correction=None, unbiased=None, dim=None, keepdim=None): " \
              "{} over `axis` with `ddof` (NumPy's default 0)."
var = _C.Reduction(OP.var, "var", "moment", _MOMENT_DOC.format("Variance"))
std = _C.Reduction(OP.std, "std", "moment", _MOMENT_DOC.format("Standard deviation"))
_ARG_DOC = "(input, axis=None, keepdims=False, *, dim=None, keepdim=None): index of the {} along `axis` (None: of " \
           "the flattened tensor), as int64."
argmax = _C.Reduction(OP.argmax, "argmax", "arg", _ARG_DOC.format("maximum"))
argmin = _C.Reduction(OP.argmin, "argmin", "arg", _ARG_DOC.format("minimum"))


def all(input, axis=None, keepdims=False):
    """Whether every element (along axis) is true."""
    x = as_tensor(input)
    return amin(cast(x, _bool()), axis, keepdims)


def any(input, axis=None, keepdims=False):
    """Whether any element (along axis) is true."""
    x = as_tensor(input)
    return amax(cast(x, _bool()), axis, keepdims)


def _bool():
    from .. import _C as C

    return C.bool


def softmax(input, axis=-1, *, dim=None):
    """Softmax along `axis`."""
    x = as_tensor(input)
    return apply(OP.softmax, (x,), (normalize_axis("softmax", dim if dim is not None else axis, x.ndim),))


def log_softmax(input, axis=-1, *, dim=None):
    """Log of softmax along `axis`, computed stably."""
    x = as_tensor(input)
    return apply(OP.log_softmax, (x,), (normalize_axis("log_softmax", dim if dim is not None else axis, x.ndim),))


def square(input):
    """input * input."""
    x = as_tensor(input)
    return x * x


def reciprocal(input):
    """1 / input."""
    return 1.0 / as_tensor(input)
