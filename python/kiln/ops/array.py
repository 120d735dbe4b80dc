"""Shapes, movement, indexing and creation."""
import builtins as _builtins

from .. import _C
from .._optable import OP
from ._util import apply, as_tensor, normalize_axis, shape_tuple

# ---- shapes -----------------------------------------------------------------------------

# The shape functions work out their arguments in C (src/python/shape_args.c): reshape's -1,
# flatten's merged axes, squeeze's axes of length 1, broadcast_to's -1 for a kept length.
reshape = _C.shape.reshape  # (input, *shape): same elements, new shape (a view when the layout allows)
view = reshape
flatten = _C.shape.flatten  # (input, start_dim=0, end_dim=-1): merges axes start_dim..end_dim
permute = _C.shape.permute  # (input, *axes): reorders the axes (a view)
transpose = _C.shape.transpose  # (input, *axes): a permutation (MindSpore), two axes (PyTorch) or none
swapaxes = _C.shape.swapaxes  # (input, axis0, axis1): exchanges two axes (a view)
squeeze = _C.shape.squeeze  # (input, axis=None): removes axes of length 1
unsqueeze = _C.shape.unsqueeze  # (input, axis, *, dim=None): inserts an axis of length 1
expand_dims = unsqueeze
broadcast_to = _C.shape.broadcast_to  # (input, *shape): a read-only broadcast view
expand = broadcast_to


def contiguous(input):
    """input itself when row-major without gaps, else a contiguous copy."""
    x = as_tensor(input)
    return x if x.is_contiguous() else apply(OP.contiguous, (x,))


# Joining and splitting along an axis, in C beside the shape functions
concat = cat = _C.shape.concat  # (tensors, axis=0, *, dim=None): joins tensors along an existing axis
stack = _C.shape.stack  # (tensors, axis=0, *, dim=None): joins tensors of one shape along a new axis
narrow = _C.shape.narrow  # (input, axis, start, length): `length` elements from `start` along axis (a view)
split = _C.shape.split  # (tensor, split_size_or_sections, axis=0, *, dim=None): views of consecutive pieces
chunk = _C.shape.chunk  # (input, chunks, axis=0): splits into `chunks` nearly equal pieces


# ---- indexing ---------------------------------------------------------------------------


def _index_tensor(op, index):
    idx = as_tensor(index)
    if idx.dtype not in (_C.int32, _C.int64):
        raise TypeError(f"{op}: indices must be int32 or int64, got {idx.dtype}")
    return idx


def gather(input_params, input_indices, axis=0):
    """MindSpore's gather (numpy.take): the slices of input_params at input_indices along axis."""
    x = as_tensor(input_params)
    return apply(OP.gather, (x, _index_tensor("gather", input_indices)), (normalize_axis("gather", axis, x.ndim),))


def index_select(input, axis, index):
    """The slices of input at the 1-D index along axis."""
    idx = _index_tensor("index_select", index)
    if idx.ndim != 1:
        raise ValueError(f"index_select: index must be 1-D, got shape {idx.shape}")
    return gather(input, idx, axis)


def gather_elements(input, axis, index):
    """torch.gather / numpy.take_along_axis."""
    x = as_tensor(input)
    return apply(OP.gather_elements, (x, _index_tensor("gather_elements", index)),
                 (normalize_axis("gather_elements", axis, x.ndim),))


def index_add(input, axis, index, source):
    """A copy of input with source's slices added at index along axis."""
    x = as_tensor(input)
    return apply(OP.index_add, (x, _index_tensor("index_add", index), as_tensor(source)),
                 (normalize_axis("index_add", axis, x.ndim),))


def scatter_add(input, axis, index, src):
    """A copy of input plus src scattered at index along axis (inverse of gather_elements)."""
    x = as_tensor(input)
    return apply(OP.scatter_add_elements, (x, _index_tensor("scatter_add", index), as_tensor(src)),
                 (normalize_axis("scatter_add", axis, x.ndim),))


def embedding(input, weight):
    """Rows of weight at the integer ids in input."""
    return gather(weight, input, 0)


# ---- creation ---------------------------------------------------------------------------


def _dtype_or(dtype, default):
    """dtype (a kiln dtype, its name or a NumPy dtype), or default when it is None."""
    if dtype is None:
        return default
    if isinstance(dtype, _C.dtype):
        return dtype
    return _C.dtype_from_name(dtype)


def _sized(op, name, ints, floats, size_at):
    """apply(op, (), ints, floats) for a creation op whose ints from size_at on are its sizes. While
    a dynamic capture records (kiln.jit.dynamic), sizes given as symbolic sizes (x.shape[0]) stay
    symbolic in the graph instead of fixing the size: the capture's call hook records the node."""
    made = _C.sym_call("sized", (op, name, ints, floats))
    if made is not None:
        return made
    return apply(op, (), ints[:size_at] + shape_tuple(name, ints[size_at:]), floats)


def _shape_items(shape):
    """A shape given as ints or as one tuple or list of them: its items, not yet made ints."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


def _full(op, shape, fill_value, dtype):
    if dtype is None:
        dtype = _C.bool if isinstance(fill_value, bool) else (
            _C.int64 if isinstance(fill_value, int) else _C.float32)
    dtype = _dtype_or(dtype, None)
    return _sized(OP.full, op, (dtype.id, len(shape)) + shape, (float(fill_value),), 2)


def full(shape, fill_value, dtype=None):
    """A tensor of `shape` filled with fill_value: full((2, 4), 3.0, kiln.float32); without dtype
    bool, int64 or float32 after fill_value's Python type."""
    if not isinstance(shape, (tuple, list)) and hasattr(shape, "__len__"):  # (a NumPy array of sizes)
        try:
            shape = tuple(shape)
        except TypeError:
            pass
    return _full("full", _shape_items((shape,)), fill_value, dtype)


def _shape_and_dtype(op, shape, dtype):
    """A creation op's shape items, and its dtype given positionally after the shape as MindSpore
    writes it (zeros((2, 4), kiln.float32), zeros(3, kiln.int32)) or by keyword."""
    if len(shape) >= 2 and isinstance(shape[-1], _C.dtype):
        if dtype is not None:
            raise TypeError(f"{op}: dtype given twice, positionally ({shape[-1].name}) and as dtype={dtype!r}")
        shape, dtype = shape[:-1], shape[-1]
    return _shape_items(shape), _dtype_or(dtype, _C.float32)


def zeros(*shape, dtype=None):
    """A tensor of zeros (float32 unless dtype says otherwise): zeros(2, 4), zeros((2, 4)),
    zeros((2, 4), kiln.int32) (MindSpore's form) or zeros(2, 4, dtype=kiln.int32)."""
    shape, dtype = _shape_and_dtype("zeros", shape, dtype)
    return _full("zeros", shape, 0.0, dtype)


def ones(*shape, dtype=None):
    """A tensor of ones (float32 unless dtype says otherwise), called like zeros."""
    shape, dtype = _shape_and_dtype("ones", shape, dtype)
    return _full("ones", shape, 1.0, dtype)


def empty(*shape, dtype=None):
    """PyTorch's empty, called like zeros. The tensor holds zeros: uninitialized memory would make
    a result depend on what the allocator left there, which eager and compiled runs do not share."""
    shape, dtype = _shape_and_dtype("empty", shape, dtype)
    return _full("empty", shape, 0.0, dtype)


def empty_like(input, dtype=None):
    """PyTorch's empty_like: zeros with input's shape (and dtype), as empty."""
    return full(input.shape, 0.0, _dtype_or(dtype, input.dtype))


def zeros_like(input, dtype=None):
    """Zeros with input's shape (and dtype)."""
    return full(input.shape, 0.0, _dtype_or(dtype, input.dtype))


def ones_like(input, dtype=None):
    """Ones with input's shape (and dtype)."""
    return full(input.shape, 1.0, _dtype_or(dtype, input.dtype))


def full_like(input, fill_value, dtype=None):
    """fill_value with input's shape (and dtype)."""
    return full(input.shape, fill_value, _dtype_or(dtype, input.dtype))


def arange(start=0, end=None, step=1, dtype=None):
    """Evenly spaced values in [start, end) (int64 for int arguments, else float32)."""
    if end is None:
        start, end = 0, start
    if step == 0:
        raise ValueError("arange: step must not be zero")
    import math

    integral = _builtins.all(isinstance(v, int) for v in (start, end, step))
    # ceil((end - start) / step) in integers when they are (a symbolic size stays one)
    count = _builtins.max(0, -((start - end) // step) if integral else math.ceil((end - start) / step))
    if dtype is None:
        dtype = _C.int64 if integral else _C.float32
    dtype = _dtype_or(dtype, None)
    return _sized(OP.arange, "arange", (dtype.id, count), (float(start), float(step)), 1)


def linspace(start, end, steps, dtype=None):
    """`steps` evenly spaced values from start to end inclusive."""
    if steps < 0:
        raise ValueError(f"linspace: steps must be non-negative, got {steps}")
    return apply(OP.linspace, (), (_dtype_or(dtype, _C.float32).id, steps), (float(start), float(end)))


def eye(n, m=None, dtype=None):
    """An n x m matrix with ones on the diagonal."""
    return apply(OP.eye, (), (_dtype_or(dtype, _C.float32).id, n, n if m is None else m))


def rand(*shape, dtype=None):
    """Uniform samples in [0, 1) from the generator seeded by kiln.manual_seed."""
    shape = _shape_items(shape)
    return _sized(OP.rand, "rand", (_dtype_or(dtype, _C.float32).id, len(shape)) + shape, (0.0, 1.0), 2)


def randn(*shape, dtype=None):
    """Standard normal samples from the generator seeded by kiln.manual_seed."""
    shape = _shape_items(shape)
    return _sized(OP.randn, "randn", (_dtype_or(dtype, _C.float32).id, len(shape)) + shape, (0.0, 1.0), 2)


def uniform(shape, low=0.0, high=1.0, dtype=None):
    """Uniform samples in [low, high)."""
    shape = _shape_items((shape,))
    return _sized(OP.rand, "uniform", (_dtype_or(dtype, _C.float32).id, len(shape)) + shape, (float(low), float(high)), 2)


def normal(shape, mean=0.0, stddev=1.0, dtype=None):
    """Normal samples with the given mean and standard deviation."""
    shape = _shape_items((shape,))
    return _sized(OP.randn, "normal", (_dtype_or(dtype, _C.float32).id, len(shape)) + shape,
                  (float(mean), float(stddev)), 2)
