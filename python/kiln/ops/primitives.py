"""MindSpore's primitive classes (`ops.Add()(x, y)`, `ops.ReduceSum(keep_dims=True)(x, 1)`,
`ops.MatMul(transpose_b=True)(a, b)` ...): objects made once with their attributes and called with
tensors, each running the kiln.ops function of the same meaning. They are kiln's own code, so
kiln.jit records what they compute in every capture mode."""
from .. import _C
from . import array, math, nn_functional, scan_sort


class Primitive:
    """A MindSpore-style primitive: attributes at construction (add_prim_attr adds more), called
    with tensors. `name` is the class name, as MindSpore's."""

    def __init__(self, **attrs):
        self.attrs = dict(attrs)
        for k, v in attrs.items():
            setattr(self, k, v)

    @property
    def name(self):
        return type(self).__name__

    def add_prim_attr(self, name, value):
        self.attrs[name] = value
        setattr(self, name, value)
        return self

    def __repr__(self):
        inner = ", ".join(f"{k}={v!r}" for k, v in self.attrs.items())
        return f"Prim[{self.name}]" + (f"<{inner}>" if inner else "")

    def __call__(self, *args):
        raise NotImplementedError


def _function_primitive(name, fn, doc):
    """A primitive class with no attributes that calls fn with its arguments."""

    def __call__(self, *args):
        return fn(*args)

    return type(name, (Primitive,), {"__call__": __call__, "__doc__": doc, "__module__": __name__})


_ELEMENTWISE = {
    "Add": math.add, "Sub": math.sub, "Mul": math.mul, "Div": math.div, "RealDiv": math.div, "Pow": math.pow,
    "Maximum": math.maximum, "Minimum": math.minimum, "Equal": math.eq, "NotEqual": math.ne, "Greater": math.gt,
    "GreaterEqual": math.ge, "Less": math.lt, "LessEqual": math.le, "LogicalAnd": math.logical_and,
    "LogicalOr": math.logical_or, "LogicalNot": math.logical_not, "Neg": math.neg, "Abs": math.abs,
    "Exp": math.exp, "Log": math.log, "Sqrt": math.sqrt, "Rsqrt": math.rsqrt, "Square": math.square,
    "Sin": math.sin, "Cos": math.cos, "Tanh": math.tanh, "Sigmoid": math.sigmoid, "ReLU": math.relu,
    "GeLU": math.gelu, "GELU": math.gelu, "SiLU": math.silu, "Erf": math.erf, "Sign": math.sign,
    "Reciprocal": math.reciprocal, "Select": math.where, "FloorDiv": math.floor_divide, "FloorMod": math.remainder,
    "Mod": math.remainder, "ZerosLike": array.zeros_like,
    "OnesLike": array.ones_like, "Cast": math.cast, "Reshape": array.reshape, "ExpandDims": array.expand_dims,
    "Gather": array.gather, "GatherV2": array.gather, "StopGradient": nn_functional.stop_gradient,
    "Floor": math.floor, "Ceil": math.ceil, "Round": math.round, "Trunc": math.trunc, "Log1p": math.log1p,
    "Expm1": math.expm1, "IsNan": math.isnan, "IsInf": math.isinf, "IsFinite": math.isfinite,
    "Tan": math.tan, "Asin": math.asin, "ACos": math.acos, "Atan": math.atan, "Sinh": math.sinh, "Cosh": math.cosh,
    "Asinh": math.asinh, "Acosh": math.acosh, "Atanh": math.atanh, "Log2": math.log2, "Log10": math.log10,
    "Exp2": math.exp2, "Atan2": math.atan2, "Hypot": math.hypot, "LogAddExp": math.logaddexp, "Fmod": math.fmod,
    "BitwiseAnd": math.bitwise_and, "BitwiseOr": math.bitwise_or, "BitwiseXor": math.bitwise_xor,
    "Invert": math.invert, "LeftShift": math.bitwise_left_shift, "RightShift": math.bitwise_right_shift,
}
for _name, _fn in _ELEMENTWISE.items():
    globals()[_name] = _function_primitive(_name, _fn, f"MindSpore's ops.{_name}: kiln.ops.{_fn.__name__}.")


class MatMul(Primitive):
    """a @ b of two matrices, either transposed first (transpose_a, transpose_b)."""

    def __init__(self, transpose_a=False, transpose_b=False):
        super().__init__(transpose_a=transpose_a, transpose_b=transpose_b)

    def __call__(self, a, b):
        if self.transpose_a:
            a = array.swapaxes(a, -2, -1)
        if self.transpose_b:
            b = array.swapaxes(b, -2, -1)
        return nn_functional.matmul(a, b)


class BatchMatMul(MatMul):
    """MatMul over leading batch axes."""


def _reduce_primitive(name, fn):
    def __init__(self, keep_dims=False):
        Primitive.__init__(self, keep_dims=keep_dims)

    def __call__(self, x, axis=()):
        axis = None if axis == () or axis == [] else axis
        return fn(x, axis, self.keep_dims)

    return type(name, (Primitive,), {"__init__": __init__, "__call__": __call__, "__module__": __name__,
                                     "__doc__": f"MindSpore's ops.{name}(keep_dims)(x, axis=()): kiln.ops."
                                                f"{fn.__name__}; axis () reduces every axis."})


ReduceSum = _reduce_primitive("ReduceSum", math.sum)
ReduceMean = _reduce_primitive("ReduceMean", math.mean)
ReduceMax = _reduce_primitive("ReduceMax", math.max)
ReduceMin = _reduce_primitive("ReduceMin", math.min)
ReduceProd = _reduce_primitive("ReduceProd", math.prod)
ReduceAll = _reduce_primitive("ReduceAll", math.all)
ReduceAny = _reduce_primitive("ReduceAny", math.any)


class Transpose(Primitive):
    def __call__(self, x, perm):
        return array.permute(x, *perm)


class Squeeze(Primitive):
    def __init__(self, axis=()):
        super().__init__(axis=axis)

    def __call__(self, x):
        return array.squeeze(x, None if self.axis == () else self.axis)


class Shape(Primitive):
    """The shape of x as a tuple of ints."""

    def __call__(self, x):
        return tuple(x.shape)


class Rank(Primitive):
    def __call__(self, x):
        return x.ndim


class Size(Primitive):
    def __call__(self, x):
        return x.size


class Concat(Primitive):
    def __init__(self, axis=0):
        super().__init__(axis=axis)

    def __call__(self, tensors):
        return array.concat(tensors, self.axis)


class Stack(Primitive):
    def __init__(self, axis=0):
        super().__init__(axis=axis)

    def __call__(self, tensors):
        return array.stack(tensors, self.axis)


class Split(Primitive):
    def __init__(self, axis=0, output_num=1):
        super().__init__(axis=axis, output_num=output_num)

    def __call__(self, x):
        size = x.shape[self.axis]
        if self.output_num < 1 or size % self.output_num:
            raise ValueError(f"Split: axis {self.axis} of size {size} does not split into {self.output_num} equal "
                             f"parts (shape {list(x.shape)})")
        return tuple(array.split(x, size // self.output_num, self.axis))


class Softmax(Primitive):
    def __init__(self, axis=-1):
        super().__init__(axis=axis)

    def __call__(self, x):
        return math.softmax(x, self.axis)


class LogSoftmax(Softmax):
    def __call__(self, x):
        return math.log_softmax(x, self.axis)


class BroadcastTo(Primitive):
    def __init__(self, shape):
        super().__init__(shape=tuple(shape))

    def __call__(self, x):
        return array.broadcast_to(x, *self.shape)


class Zeros(Primitive):
    def __call__(self, shape, dtype):
        return array.zeros(shape, dtype=dtype)


class Ones(Primitive):
    def __call__(self, shape, dtype):
        return array.ones(shape, dtype=dtype)


class Fill(Primitive):
    def __call__(self, dtype, shape, value):
        return array.full(shape, value, dtype)


class Argmax(Primitive):
    def __init__(self, axis=-1, output_type=None):
        super().__init__(axis=axis, output_type=output_type)

    def __call__(self, x):
        out = math.argmax(x, self.axis)
        return out if self.output_type is None else math.cast(out, self.output_type)


class Argmin(Argmax):
    def __call__(self, x):
        out = math.argmin(x, self.axis)
        return out if self.output_type is None else math.cast(out, self.output_type)


class ArgMaxWithValue(Primitive):
    """(index, value) of the maximum along axis."""

    def __init__(self, axis=0, keep_dims=False):
        super().__init__(axis=axis, keep_dims=keep_dims)

    def __call__(self, x):
        return math.argmax(x, self.axis, self.keep_dims), math.max(x, self.axis, self.keep_dims)


class ArgMinWithValue(ArgMaxWithValue):
    def __call__(self, x):
        return math.argmin(x, self.axis, self.keep_dims), math.min(x, self.axis, self.keep_dims)


class Assign(Primitive):
    """variable's elements set to value, in place; returns variable."""

    def __call__(self, variable, value):
        if hasattr(variable, "set_data"):
            variable.set_data(value if isinstance(value, _C.TensorBase) else array.full_like(variable, value))
        else:
            variable[...] = value
        return variable


class AssignAdd(Primitive):
    def __call__(self, variable, value):
        return Assign()(variable, variable + value)


class AssignSub(Primitive):
    def __call__(self, variable, value):
        return Assign()(variable, variable - value)


class Depend(Primitive):
    """value, once expr is computed (kiln runs ops in program order: expr already is)."""

    def __call__(self, value, expr):
        return value


class Print(Primitive):
    def __call__(self, *args):
        from .debug import print_

        return print_(*args)


class CumSum(Primitive):
    """MindSpore's ops.CumSum(exclusive=False, reverse=False)(x, axis): running sums along axis, from
    the end with reverse; exclusive leaves each element out of its own sum."""

    def __init__(self, exclusive=False, reverse=False):
        super().__init__(exclusive=exclusive, reverse=reverse)

    def __call__(self, x, axis):
        return scan_sort.scan("cumsum", x, axis, self.exclusive, self.reverse)


class CumProd(CumSum):
    """MindSpore's ops.CumProd(exclusive=False, reverse=False)(x, axis): running products."""

    def __call__(self, x, axis):
        return scan_sort.scan("cumprod", x, axis, self.exclusive, self.reverse)


class Sort(Primitive):
    """MindSpore's ops.Sort(axis=-1, descending=False)(x) -> (values, indices)."""

    def __init__(self, axis=-1, descending=False):
        super().__init__(axis=axis, descending=descending)

    def __call__(self, x):
        return scan_sort.sort(x, self.axis, self.descending)


__all__ = [n for n, v in list(globals().items()) if isinstance(v, type) and issubclass(v, Primitive)]
