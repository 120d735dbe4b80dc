"""kiln.Tensor: the C TensorBase plus the Python-side methods."""
import numpy as _np

from . import _C
from . import grad_hooks as _grad_hooks
from . import ops as _ops
from ._optable import OP
from ._tensor_torch import TorchTensorMethods


_GRAD = _C.TensorBase.grad
_NUMEL = _C.TensorBase.size


class _Size(int):
    """Tensor.size: the number of elements as an int (MindSpore), callable as PyTorch's size()."""

    def __new__(cls, numel, tensor):
        n = super().__new__(cls, numel)
        n._tensor = tensor
        return n

    def __call__(self, dim=None):
        shape = self._tensor.shape
        if dim is None:
            return shape
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise TypeError(f"Tensor.size: dim must be an int, got {type(dim).__name__}")
        if not -len(shape) <= dim < len(shape):
            raise IndexError(f"Tensor.size: dim {dim} is out of range for a tensor of shape {tuple(shape)}")
        return shape[dim]

    def __reduce__(self):
        return (int, (int(self),))
# Set by kiln.jit at import: called with (tensor, value) when Python code assigns a .grad while a
# graph is recorded (kiln.jit runs such a function eagerly; kiln.trace(without_host=True) replays it).
grad_written_while_tracing = None


def _set_grad(tensor, value):
    if grad_written_while_tracing is not None and _C.is_tracing():
        grad_written_while_tracing(tensor, value)
    _GRAD.__set__(tensor, value)


# Set by kiln.jit at import: called when Tensor.backward() runs while a graph is recorded (it
# accumulates into the leaves' .grad, which a replay of the graph would not do).
backward_while_tracing = None


# Set by kiln.jit at import: called with (tensor, its .grad) when Python code reads a .grad while a
# graph is recorded (a gradient set outside the graph would be kept as this call's tensor; a None
# read decides what the code does, which a replay must find again).
grad_read_while_tracing = None


def _get_grad(tensor):
    g = _GRAD.__get__(tensor)
    if grad_read_while_tracing is not None and _C.is_tracing():
        grad_read_while_tracing(tensor, g)
    return g


class Tensor(_C.TensorBase, TorchTensorMethods):
    """An n-dimensional array on the CPU: Tensor(input_data, dtype=None).

    input_data is a NumPy array, a Python number, a nested list, another Tensor or an object with
    __dlpack__ such as a PyTorch or JAX tensor (always copied; kiln.from_numpy and kiln.from_dlpack
    share memory). Python floats default to float32, ints to int64."""

    __slots__ = ()
    # a NumPy scalar or array on the left of an operator (np.float32(2) * t) defers to the
    # tensor's reflected operator, giving a Tensor as PyTorch does, not a NumPy array
    __array_priority__ = 1000

    grad = property(_get_grad, _set_grad, doc=_GRAD.__doc__)

    def backward(self, gradient=None):
        """Accumulates the gradients of this tensor (gradient: its incoming gradient, implied for one
        element) into the .grad of the leaves it depends on, as PyTorch's backward() does."""
        if backward_while_tracing is not None and _C.is_tracing():
            backward_while_tracing()
        return _C.TensorBase.backward(self, gradient)

    def register_hook(self, hook):
        """hook(grad) -> a new gradient or None runs on this tensor's gradient in every backward pass
        that reaches it (MindSpore's and PyTorch's Tensor.register_hook): a leaf's (a parameter) once
        its whole gradient is summed, before it goes into .grad or to the grad call that asked for it;
        another tensor's when its gradient is complete, before it flows on. Hooks run in the order
        they were added; a new gradient one returns replaces the gradient from there on. Returns a
        handle whose remove() takes the hook away. See kiln.grad_hooks for compiled functions."""
        return _grad_hooks.register_hook(self, hook)

    # ---- conversion -------------------------------------------------------------------
    def asnumpy(self):
        """A NumPy array sharing this tensor's memory (bfloat16 is converted to float32)."""
        if self.dtype is _C.bfloat16:
            return _np.asarray(self.astype(_C.float32))
        return _np.asarray(self)

    numpy = asnumpy

    def __array__(self, dtype=None, copy=None):
        a = self.asnumpy()
        return a.astype(dtype) if dtype is not None else a

    def tolist(self):
        return self.asnumpy().tolist()

    def astype(self, dtype):
        """This tensor converted to dtype."""
        return _ops.cast(self, dtype)

    def to(self, *args, dtype=None, device=None, non_blocking=False, copy=False):
        """PyTorch's to: to(dtype), to(device), to(device, dtype), to(other) (other's dtype), with the
        keywords dtype= and device=. kiln runs on the CPU: a device other than "cpu" raises."""
        for a in args:
            if isinstance(a, _C.TensorBase):
                dtype = a.dtype
            elif isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda", "mps", "npu", "xla", "meta"):
                device = a
            elif dtype is None:
                dtype = a
            else:
                raise TypeError(f"Tensor.to: unexpected argument {a!r}")
        if device is not None and str(device) not in ("cpu", "cpu:0"):
            raise ValueError(f"Tensor.to({device!r}): kiln runs on the CPU only")
        if dtype is None:
            return _ops.cast(self, self.dtype) if copy else self
        return _ops.cast(self, dtype)

    def cpu(self):
        """PyTorch's cpu(): this tensor (kiln runs on the CPU)."""
        return self

    @property
    def data(self):
        """PyTorch's .data: a tensor sharing this one's memory, without autograd history."""
        return self.detach()

    def float(self):
        return _ops.cast(self, _C.float32)

    def double(self):
        return _ops.cast(self, _C.float64)

    def half(self):
        return _ops.cast(self, _C.float16)

    def int(self):
        return _ops.cast(self, _C.int32)

    def long(self):
        return _ops.cast(self, _C.int64)

    def bool(self):
        return _ops.cast(self, _C.bool)

    def __repr__(self):
        body = _np.array2string(self.asnumpy(), separator=", ")  # (rows under the first, as MindSpore's)
        return f"Tensor(shape={list(self.shape)}, dtype={self.dtype.name}, value=\n{body})"

    def __str__(self):
        return _np.array2string(self.asnumpy(), separator=" ")

    def __format__(self, spec):
        if self.ndim == 0:
            return format(self.item(), spec)
        return str(self)

    def __reduce__(self):
        return (Tensor, (self.asnumpy().copy(), self.dtype))

    def __deepcopy__(self, memo):
        # the constructor's copy: inside a capture the recorded (and detached) contiguous op, so a
        # deep copy does not read the value into Python
        t = Tensor(self, self.dtype)
        t.requires_grad = self.requires_grad
        memo[id(self)] = t
        return t

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    # indexing (x[key], x[key] = value) is TensorBase's, in C: src/python/indexing.c parses the
    # key, src/ops/index_lower.c lowers it to view and gather ops

    # ---- reflected operators (scalar OP tensor) ---------------------------------------
    def __rsub__(self, other):
        return _C.apply(OP.sub, (self, other)).neg() if not isinstance(other, _C.TensorBase) else other - self

    def __rtruediv__(self, other):
        return _C.apply(OP.div, (_scalar_like(other, self), self))

    def __rpow__(self, other):
        return _C.apply(OP.pow, (_scalar_like(other, self), self))

    # ---- shape ------------------------------------------------------------------------
    def reshape(self, *shape):
        return _ops.reshape(self, *shape)

    view = reshape

    def flatten(self, start_dim=0, end_dim=-1):
        return _ops.flatten(self, start_dim, end_dim)

    def permute(self, *axes):
        return _ops.permute(self, *axes)

    def transpose(self, *axes):
        return _ops.transpose(self, *axes)

    def swapaxes(self, a, b):
        return _ops.swapaxes(self, a, b)

    @property
    def T(self):
        return _ops.transpose(self)

    def squeeze(self, axis=None):
        return _ops.squeeze(self, axis)

    def unsqueeze(self, axis):
        return _ops.unsqueeze(self, axis)

    expand_dims = unsqueeze

    def expand(self, *shape):
        return _ops.broadcast_to(self, *shape)

    broadcast_to = expand

    def contiguous(self):
        return _ops.contiguous(self)

    def clone(self):
        return _C.apply(OP.contiguous, (self,))

    copy = clone

    def split(self, split_size_or_sections, axis=0):
        return _ops.split(self, split_size_or_sections, axis)

    @property
    def size(self):
        """The number of elements (MindSpore's Tensor.size, an int); called, PyTorch's size():
        x.size() is the shape, x.size(d) its axis d."""
        return _Size(_NUMEL.__get__(self), self)

    def dim(self):
        return self.ndim

    ndimension = dim

    def numel(self):
        return _NUMEL.__get__(self)

    nelement = numel

    @property
    def mT(self):
        """The last two axes swapped (a batch of matrices transposed)."""
        if self.ndim < 2:
            raise ValueError(f"Tensor.mT: needs at least 2 dimensions, the tensor has shape {list(self.shape)}")
        return _ops.swapaxes(self, -2, -1)

    def is_floating_point(self):
        return self.dtype.is_floating_point

    def element_size(self):
        """Bytes per element."""
        return self.dtype.itemsize

    def type(self, dtype=None):
        """With no argument: the dtype's name, as MindSpore's Tensor.type() ("Float32"); with a dtype
        (a kiln dtype, its name or a NumPy dtype): this tensor converted to it."""
        if dtype is None:
            name = self.dtype.name
            return name[0].upper() + name[1:]
        return _ops.cast(self, dtype)

    # ---- math -------------------------------------------------------------------------
    def sum(self, axis=None, keepdims=False, **kw):
        return _ops.sum(*_numpy_reduction("sum", self, kw), axis, keepdims, **kw)

    def mean(self, axis=None, keepdims=False, **kw):
        return _ops.mean(*_numpy_reduction("mean", self, kw), axis, keepdims, **kw)

    def prod(self, axis=None, keepdims=False, **kw):
        return _ops.prod(*_numpy_reduction("prod", self, kw), axis, keepdims, **kw)

    def max(self, axis=None, keepdims=False, **kw):
        return _ops.max(*_numpy_reduction("max", self, kw), axis, keepdims, **kw)

    def min(self, axis=None, keepdims=False, **kw):
        return _ops.min(*_numpy_reduction("min", self, kw), axis, keepdims, **kw)

    amax, amin = max, min  # (MindSpore's and PyTorch's names for the values alone)

    def var(self, axis=None, keepdims=False, **kw):
        return _ops.var(*_numpy_reduction("var", self, kw), axis, keepdims, **kw)

    def std(self, axis=None, keepdims=False, **kw):
        return _ops.std(*_numpy_reduction("std", self, kw), axis, keepdims, **kw)

    def argmax(self, axis=None, keepdims=False, **kw):
        return _ops.argmax(*_numpy_reduction("argmax", self, kw), axis, keepdims, **kw)

    def argmin(self, axis=None, keepdims=False, **kw):
        return _ops.argmin(*_numpy_reduction("argmin", self, kw), axis, keepdims, **kw)

    def all(self, axis=None, keepdims=False):
        return _ops.all(self, axis, keepdims)

    def any(self, axis=None, keepdims=False):
        return _ops.any(self, axis, keepdims)

    def softmax(self, axis=-1):
        return _ops.softmax(self, axis)

    def log_softmax(self, axis=-1):
        return _ops.log_softmax(self, axis)

    def matmul(self, other):
        return _ops.matmul(self, other)

    def exp(self):
        return _ops.exp(self)

    def log(self):
        return _ops.log(self)

    def sqrt(self):
        return _ops.sqrt(self)

    def rsqrt(self):
        return _ops.rsqrt(self)

    def sin(self):
        return _ops.sin(self)

    def cos(self):
        return _ops.cos(self)

    def tanh(self):
        return _ops.tanh(self)

    def sigmoid(self):
        return _ops.sigmoid(self)

    def relu(self):
        return _ops.relu(self)

    def abs(self):
        return _ops.abs(self)

    def neg(self):
        return _ops.neg(self)

    def pow(self, exponent):
        return _ops.pow(self, exponent)

    def clamp(self, min=None, max=None):
        return _ops.clamp(self, min, max)

    clip = clamp

    def maximum(self, other):
        return _ops.maximum(self, other)

    def minimum(self, other):
        return _ops.minimum(self, other)

    def add(self, other):
        return self + other

    def sub(self, other):
        return self - other

    def mul(self, other):
        return self * other

    def div(self, other):
        return self / other

    def square(self):
        return self * self

    def gather(self, indices, axis=0):
        return _ops.gather(self, indices, axis)

    def index_select(self, axis, index):
        return _ops.index_select(self, axis, index)

    # ---- the composites of kiln.ops.array_extra, linalg and data_dependent ----------------
    def flip(self, *dims):
        return _ops.flip(self, dims[0] if len(dims) == 1 else dims)

    def roll(self, shifts, dims=None):
        return _ops.roll(self, shifts, dims)

    def tril(self, diagonal=0):
        return _ops.tril(self, diagonal)

    def triu(self, diagonal=0):
        return _ops.triu(self, diagonal)

    def masked_fill(self, mask, value):
        return _ops.masked_fill(self, mask, value)

    def scatter(self, axis, index, src=None, *, value=None):
        """PyTorch's scatter(dim, index, src) or scatter(dim, index, value=v), as a new tensor."""
        if (src is None) == (value is None):
            raise TypeError("Tensor.scatter: give exactly one of src and value")
        return _ops.scatter(self, axis, index, src if value is None else value)

    def norm(self, ord=None, dim=None, keepdim=False):  # noqa: A002 (torch.linalg.norm's names)
        return _ops.norm(self, ord, dim, keepdim)

    def nonzero(self, *, as_tuple=False):
        return _ops.nonzero(self, as_tuple=as_tuple)

    def unique(self, sorted=True, return_inverse=False, return_counts=False, dim=None):  # noqa: A002
        return _ops.unique(self, sorted, return_inverse, return_counts, dim)

    def requires_grad_(self, requires_grad=True):
        self.requires_grad = requires_grad
        return self

    # ---- in-place assignment ------------------------------------------------------------
    def assign_value(self, value):
        """Overwrites this tensor's elements with value (broadcast), in place."""
        self[...] = value
        return self

    def fill_(self, value):
        self[...] = value
        return self

    def zero_(self):
        self[...] = 0
        return self

    # PyTorch's in-place methods: the result written into this tensor, which keeps its dtype and
    # shape (a float result into an integer tensor, or a broadcast that grows it, is refused)
    def _write_result(self, name, result):
        if result.dtype.is_floating_point and not self.dtype.is_floating_point:
            raise TypeError(f"Tensor.{name}: the result is {result.dtype.name}, which cannot be written into this "
                            f"{self.dtype.name} tensor in place")
        if tuple(result.shape) != tuple(self.shape):
            raise ValueError(f"Tensor.{name}: the result has shape {list(result.shape)}, which cannot be written "
                             f"into this tensor of shape {list(self.shape)} in place")
        self[...] = result
        return self

    def copy_(self, src):
        """src's elements (broadcast, converted to this tensor's dtype) written into this tensor."""
        self[...] = src
        return self

    def add_(self, other, alpha=1):
        return self._write_result("add_", self + (other if alpha == 1 else other * alpha))

    def sub_(self, other, alpha=1):
        return self._write_result("sub_", self - (other if alpha == 1 else other * alpha))

    def mul_(self, other):
        return self._write_result("mul_", self * other)

    def div_(self, other):
        return self._write_result("div_", self / other)

    def pow_(self, exponent):
        return self._write_result("pow_", self ** exponent)

    def tile(self, *multiples):
        return _ops.tile(self, multiples[0] if len(multiples) == 1 and isinstance(multiples[0], (tuple, list))
                         else multiples)

    def repeat(self, *sizes):
        """PyTorch's repeat: the tensor tiled `sizes` times along each axis."""
        return _ops.repeat(self, *sizes)

    def repeat_interleave(self, repeats, dim=None):
        return _ops.repeat_interleave(self, repeats, dim)

    def topk(self, k, dim=-1, largest=True, sorted=True):  # noqa: A002
        return _ops.topk(self, k, dim, largest, sorted)

    # rounding and classifying (a Tensor, as PyTorch's, also from math.floor, math.ceil, math.trunc
    # and round)
    def floor(self):
        return _ops.floor(self)

    def ceil(self):
        return _ops.ceil(self)

    def round(self, decimals=0, out=None):
        _no_out("round", out)  # (np.round(t) passes out=None)
        return _ops.round(self, decimals=decimals)

    def trunc(self):
        return _ops.trunc(self)

    fix = trunc

    def floor_(self):
        return self._write_result("floor_", _ops.floor(self))

    def ceil_(self):
        return self._write_result("ceil_", _ops.ceil(self))

    def round_(self, decimals=0):
        return self._write_result("round_", _ops.round(self, decimals=decimals))

    def trunc_(self):
        return self._write_result("trunc_", _ops.trunc(self))

    def __floor__(self):
        return _ops.floor(self)

    def __ceil__(self):
        return _ops.ceil(self)

    def __trunc__(self):
        return _ops.trunc(self)

    def __round__(self, ndigits=None):
        return _ops.round(self, decimals=ndigits or 0)

    def log1p(self):
        return _ops.log1p(self)

    def expm1(self):
        return _ops.expm1(self)

    def tan(self):
        return _ops.tan(self)

    def asin(self):
        return _ops.asin(self)

    def arcsin(self):
        return _ops.arcsin(self)

    def acos(self):
        return _ops.acos(self)

    def arccos(self):
        return _ops.arccos(self)

    def atan(self):
        return _ops.atan(self)

    def arctan(self):
        return _ops.arctan(self)

    def sinh(self):
        return _ops.sinh(self)

    def cosh(self):
        return _ops.cosh(self)

    def asinh(self):
        return _ops.asinh(self)

    def arcsinh(self):
        return _ops.arcsinh(self)

    def acosh(self):
        return _ops.acosh(self)

    def arccosh(self):
        return _ops.arccosh(self)

    def atanh(self):
        return _ops.atanh(self)

    def arctanh(self):
        return _ops.arctanh(self)

    def log2(self):
        return _ops.log2(self)

    def log10(self):
        return _ops.log10(self)

    def exp2(self):
        return _ops.exp2(self)

    def fmod(self, other):
        return _ops.fmod(self, other)

    def atan2(self, other):
        return _ops.atan2(self, other)

    def arctan2(self, other):
        return _ops.arctan2(self, other)

    def hypot(self, other):
        return _ops.hypot(self, other)

    def logaddexp(self, other):
        return _ops.logaddexp(self, other)

    # bitwise ops of integer and bool tensors (MindSpore's names, PyTorch's bitwise_not)
    def bitwise_and(self, other):
        return _ops.bitwise_and(self, other)

    def bitwise_or(self, other):
        return _ops.bitwise_or(self, other)

    def bitwise_xor(self, other):
        return _ops.bitwise_xor(self, other)

    def bitwise_left_shift(self, other):
        return _ops.bitwise_left_shift(self, other)

    def bitwise_right_shift(self, other):
        return _ops.bitwise_right_shift(self, other)

    def invert(self):
        return _ops.invert(self)

    bitwise_not = invert

    def isnan(self):
        return _ops.isnan(self)

    def isinf(self):
        return _ops.isinf(self)

    def isfinite(self):
        return _ops.isfinite(self)

    # more math, products and array methods (PyTorch's Tensor methods of kiln.ops' composites)
    def logsumexp(self, axis=None, keep_dims=False, **kw):
        return _ops.logsumexp(self, axis, keep_dims, **kw)

    def logit(self, eps=None):
        return _ops.logit(self, eps)

    def clamp_min(self, min):  # noqa: A002 (PyTorch's name)
        return _ops.clamp_min(self, min)

    def clamp_max(self, max):  # noqa: A002 (PyTorch's name)
        return _ops.clamp_max(self, max)

    def addcmul(self, tensor1, tensor2, *, value=1):
        return _ops.addcmul(self, tensor1, tensor2, value=value)

    def addcdiv(self, tensor1, tensor2, *, value=1):
        return _ops.addcdiv(self, tensor1, tensor2, value=value)

    def lerp(self, end, weight):
        return _ops.lerp(self, end, weight)

    def diff(self, n=1, axis=-1, prepend=None, append=None, **kw):
        return _ops.diff(self, n, axis, prepend, append, **kw)

    def nan_to_num(self, nan=0.0, posinf=None, neginf=None):
        return _ops.nan_to_num(self, nan, posinf, neginf)

    def count_nonzero(self, axis=None, keep_dims=False, **kw):
        return _ops.count_nonzero(self, axis, keep_dims, **kw)

    def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        return _ops.isclose(self, other, rtol, atol, equal_nan)

    def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        return _ops.allclose(self, other, rtol, atol, equal_nan)

    def logical_xor(self, other):
        return _ops.logical_xor(self, other)

    def cummax(self, axis=None, **kw):
        return _ops.cummax(self, axis, **kw)

    def cummin(self, axis=None, **kw):
        return _ops.cummin(self, axis, **kw)

    def outer(self, vec2):
        return _ops.outer(self, vec2)

    ger = outer

    def dot(self, other):
        return _ops.dot(self, other)

    def mv(self, vec):
        return _ops.mv(self, vec)

    def addmm(self, mat1, mat2, *, beta=1, alpha=1):
        return _ops.addmm(self, mat1, mat2, beta=beta, alpha=alpha)

    def baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
        return _ops.baddbmm(self, batch1, batch2, beta=beta, alpha=alpha)

    def trace(self):
        return _ops.trace(self)

    def kron(self, other):
        return _ops.kron(self, other)

    def diag(self, diagonal=0):
        return _ops.diag(self, diagonal)

    def movedim(self, source, destination):
        return _ops.movedim(self, source, destination)

    moveaxis = movedim

    def unbind(self, axis=0, **kw):
        return _ops.unbind(self, axis, **kw)

    def ravel(self):
        return _ops.ravel(self)

    def take_along_dim(self, indices, dim=None):
        return _ops.take_along_dim(self, indices, dim)

    def rot90(self, k=1, dims=(0, 1)):
        return _ops.rot90(self, k, dims)

    def expand_as(self, other):
        return _ops.broadcast_to(self, *other.shape)

    def type_as(self, other):
        return _ops.cast(self, other.dtype)

    def masked_select(self, mask):
        return _ops.masked_select(self, mask)

    def argwhere(self):
        return _ops.argwhere(self)

    def bernoulli(self, p=None):
        return _ops.bernoulli(self, p)

    def multinomial(self, num_samples, replacement=False):
        return _ops.multinomial(self, num_samples, replacement)

    # scans and sorting along an axis (MindSpore's axis, PyTorch's dim)
    def cumsum(self, axis=None, dtype=None, *, dim=None, out=None):
        _no_out("cumsum", out)
        return _ops.cumsum(self, axis, dtype, dim=dim)

    def cumprod(self, dim=None, dtype=None, *, axis=None, out=None):
        _no_out("cumprod", out)
        return _ops.cumprod(self, dim, dtype, axis=axis)

    def sort(self, axis=-1, descending=False, *, dim=None, stable=True):
        return _ops.sort(self, axis, descending, dim=dim, stable=stable)

    def argsort(self, axis=-1, descending=False, *, dim=None, stable=True):
        return _ops.argsort(self, axis, descending, dim=dim, stable=stable)

    def floor_divide(self, other):
        return _ops.floor_divide(self, other)

    def remainder(self, other):
        return _ops.remainder(self, other)

    def floor_divide_(self, other):
        return self._write_result("floor_divide_", self // other)

    def remainder_(self, other):
        return self._write_result("remainder_", self % other)

    def bitwise_and_(self, other):
        return self._write_result("bitwise_and_", _ops.bitwise_and(self, other))

    def bitwise_or_(self, other):
        return self._write_result("bitwise_or_", _ops.bitwise_or(self, other))

    def bitwise_xor_(self, other):
        return self._write_result("bitwise_xor_", _ops.bitwise_xor(self, other))

    def bitwise_left_shift_(self, other):
        return self._write_result("bitwise_left_shift_", _ops.bitwise_left_shift(self, other))

    def bitwise_right_shift_(self, other):
        return self._write_result("bitwise_right_shift_", _ops.bitwise_right_shift(self, other))

    def bitwise_not_(self):
        return self._write_result("bitwise_not_", _ops.invert(self))

    def addcmul_(self, tensor1, tensor2, value=1):
        return self._write_result("addcmul_", self + tensor1 * tensor2 * value)

    def addcdiv_(self, tensor1, tensor2, value=1):
        return self._write_result("addcdiv_", self + tensor1 / tensor2 * value)

    def neg_(self):
        return self._write_result("neg_", -self)

    def abs_(self):
        return self._write_result("abs_", abs(self))

    def clamp_(self, min=None, max=None):  # noqa: A002 (PyTorch's argument names)
        return self._write_result("clamp_", _ops.clamp(self, min, max))

    clip_ = clamp_

    def exp_(self):
        return self._write_result("exp_", _ops.exp(self))

    def sqrt_(self):
        return self._write_result("sqrt_", _ops.sqrt(self))


_C._set_tensor_class(Tensor)


def _no_out(name, out):
    """NumPy's out= (np.cumsum(t) passes out=None): only None."""
    if out is not None:
        raise TypeError(f"Tensor.{name}: out= is not supported (got {type(out).__name__}); use the result")


def _numpy_reduction(name, tensor, kw):
    """(tensor,) with NumPy's reduction arguments taken out of kw (np.sum(t) calls t.sum(axis=,
    dtype=, out=)): dtype converts the input first; out= must be None."""
    out, dtype = kw.pop("out", None), kw.pop("dtype", None)
    if out is not None:
        raise TypeError(f"Tensor.{name}: out= is not supported (the result is a new tensor)")
    return (tensor if dtype is None else _ops.cast(tensor, dtype),)


def _scalar_like(value, like):
    """A 0-d tensor of a Python scalar, typed next to `like` the NumPy-2 way."""
    if isinstance(value, _C.TensorBase):
        return value
    if isinstance(value, float) and not like.dtype.is_floating_point:
        dtype = _C.float32
    elif isinstance(value, bool) or like.dtype is not _C.bool:
        dtype = like.dtype
    else:
        dtype = _C.int64
    return Tensor(value, dtype)


def from_numpy(array):
    """A tensor sharing the memory of a NumPy array (or any buffer) — no copy.

    A read-only source (an immutable bytes, an mmap opened for reading, a NumPy array that is not
    writeable, such as a np.broadcast_to view) gives a read-only tensor, not a copy: reading it
    works as usual, but every in-place write (t[...] = v, assign_value, fill_, optimizer
    updates, compiled graphs writing it) raises ValueError("... assignment destination is
    read-only"), as NumPy does. Use kiln.Tensor(array) for a writable copy."""
    return _C.from_numpy(array)


def from_dlpack(x, /, *, device=None, copy=None):
    """A tensor sharing the memory of x through DLPack — no copy: x is a NumPy array, a PyTorch or
    JAX tensor or anything else with __dlpack__ (or a DLPack capsule), on the CPU.

    The producer's memory stays alive until this tensor and every view of it are gone. A producer
    that marks its export read-only (DLPack 1.0's flag: a NumPy array that is not writeable, ...)
    gives a read-only tensor, as kiln.from_numpy does. Strides of any sign and byte offsets are
    kept; a dtype kiln lacks raises TypeError, a device other than the CPU BufferError.
    device: None, "cpu" or (1, 0). copy=True gives a writable copy in kiln's own memory instead."""
    return _C.from_dlpack(x, device=device, copy=copy)


def tensor(data, dtype=None, *, requires_grad=False, device=None):
    """Tensor(data, dtype): a new tensor holding a copy of data. PyTorch's keywords: requires_grad=True
    makes it a leaf that requires grad; device: None or "cpu" (kiln runs on the CPU)."""
    if device is not None and str(device) not in ("cpu", "cpu:0"):
        raise ValueError(f"kiln.tensor: device={device!r}: kiln runs on the CPU only (device=None or 'cpu')")
    return requiring_grad(Tensor(data, dtype), "tensor") if requires_grad else Tensor(data, dtype)


def requiring_grad(t, name):
    """t, made by kiln.<name>(..., requires_grad=True), made a leaf that requires grad. A compiled
    function's results do not carry requires_grad, so while a graph is recorded the call is marked
    not replayable: it runs eagerly (a bytecode capture runs that part in Python)."""
    if t.dtype not in (_C.float16, _C.bfloat16, _C.float32, _C.float64):
        raise TypeError(f"kiln.{name}: only float tensors can require gradients, got {t.dtype}")
    if _C.is_tracing():
        from .jit.replay import mark_not_replayable

        mark_not_replayable(f"kiln.{name}(..., requires_grad=True) (a new leaf; compiled results do not require grad)")
    t.requires_grad = True
    return t
