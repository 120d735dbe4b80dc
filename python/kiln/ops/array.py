"""Shapes, movement, indexing and creation."""
import builtins as _builtins

from .. import _C
from .._optable import OP
from ._util import apply, as_tensor, normalize_axis, shape_tuple

# ---- shapes -----------------------------------------------------------------------------


def _resolve_shape(op, x, shape):
    shape = list(shape_tuple(op, shape))
    unknown = [i for i, s in enumerate(shape) if s == -1]
    if len(unknown) > 1:
        raise ValueError(f"{op}: only one dimension can be -1, got {tuple(shape)}")
    if _builtins.any(s < -1 for s in shape):
        raise ValueError(f"{op}: invalid shape {tuple(shape)}")
    if unknown:
        known = 1
        for s in shape:
            if s != -1:
                known *= s
        if known == 0 or x.size % known:
            raise ValueError(f"{op}: cannot reshape a tensor of shape {x.shape} into shape {tuple(shape)}")
        shape[unknown[0]] = x.size // known
    return tuple(shape)


def reshape(input, *shape):
    """A tensor with the same elements and a new shape (a view when the layout allows)."""
    x = as_tensor(input)
    return apply(OP.reshape, (x,), _resolve_shape("reshape", x, shape))


view = reshape


def flatten(input, start_dim=0, end_dim=-1):
    """Merges axes start_dim..end_dim into one."""
    x = as_tensor(input)
    if x.ndim == 0:
        return reshape(x, (1,))
    s = normalize_axis("flatten", start_dim, x.ndim)
    e = normalize_axis("flatten", end_dim, x.ndim)
    if s > e:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    shape = x.shape
    n = 1
    for d in shape[s:e + 1]:
        n *= d
    return reshape(x, shape[:s] + (n,) + shape[e + 1:])


def permute(input, *axes):
    """Reorders the axes (a view)."""
    x = as_tensor(input)
    axes = shape_tuple("permute", axes)
    return apply(OP.permute, (x,), tuple(normalize_axis("permute", a, x.ndim) for a in axes))


def transpose(input, *axes):
    """transpose(x, perm) permutes the axes (MindSpore); transpose(x, dim0, dim1) swaps two axes
    (PyTorch); transpose(x) reverses them."""
    x = as_tensor(input)
    if not axes:
        return permute(x, tuple(range(x.ndim - 1, -1, -1)))
    if len(axes) == 2 and _builtins.all(isinstance(a, int) for a in axes):
        return swapaxes(x, *axes)
    return permute(x, *axes)


def swapaxes(input, axis0, axis1):
    """Exchanges two axes (a view)."""
    x = as_tensor(input)
    a = normalize_axis("swapaxes", axis0, x.ndim)
    b = normalize_axis("swapaxes", axis1, x.ndim)
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return apply(OP.permute, (x,), tuple(perm))


def squeeze(input, axis=None):
    """Removes axes of length 1 (all of them, or those in `axis`)."""
    x = as_tensor(input)
    if axis is None:
        return reshape(x, tuple(s for s in x.shape if s != 1))
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    axes = {normalize_axis("squeeze", a, x.ndim) for a in axes}
    for a in axes:
        if x.shape[a] != 1:
            raise ValueError(f"squeeze: axis {a} of a tensor of shape {x.shape} has length {x.shape[a]}, not 1")
    return reshape(x, tuple(s for i, s in enumerate(x.shape) if i not in axes))


def unsqueeze(input, axis, *, dim=None):
    """Inserts an axis of length 1 at `axis`."""
    x = as_tensor(input)
    if dim is not None:
        axis = dim
    a = normalize_axis("unsqueeze", axis, x.ndim + 1)
    return reshape(x, x.shape[:a] + (1,) + x.shape[a:])


expand_dims = unsqueeze


def broadcast_to(input, *shape):
    """A read-only broadcast view with the given shape."""
    x = as_tensor(input)
    shape = list(shape_tuple("broadcast_to", shape))
    lead = len(shape) - x.ndim
    for i, s in enumerate(shape):  # -1 keeps the input's length
        if s == -1:
            if i < lead:
                raise ValueError(f"broadcast_to: -1 is not allowed for a new leading axis in {tuple(shape)}")
            shape[i] = x.shape[i - lead]
    return apply(OP.expand, (x,), tuple(shape))


expand = broadcast_to


def contiguous(input):
    """input itself when row-major without gaps, else a contiguous copy."""
    x = as_tensor(input)
    return x if x.is_contiguous() else apply(OP.contiguous, (x,))


def concat(tensors, axis=0, *, dim=None):
    """Joins tensors along an existing axis."""
    if dim is not None:
        axis = dim
    tensors = [as_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("concat: needs at least one tensor")
    return apply(OP.concat, tensors, (normalize_axis("concat", axis, tensors[0].ndim),))


cat = concat


def stack(tensors, axis=0, *, dim=None):
    """Joins tensors along a new axis."""
    if dim is not None:
        axis = dim
    tensors = [as_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("stack: needs at least one tensor")
    shape = tensors[0].shape
    for t in tensors:
        if t.shape != shape:
            raise ValueError(f"stack: all tensors must have one shape, got {[t.shape for t in tensors]}")
    a = normalize_axis("stack", axis, len(shape) + 1)
    return concat([unsqueeze(t, a) for t in tensors], a)


def _slice_attrs(x, axis, start, length):
    starts, steps, lens = [0] * 8, [1] * 8, [0] * 8
    for d in range(x.ndim):
        lens[d] = x.shape[d]
    starts[axis], lens[axis] = start, length
    return tuple(starts + steps + lens)


def narrow(input, axis, start, length):
    """The `length` elements from `start` along `axis` (a view)."""
    x = as_tensor(input)
    a = normalize_axis("narrow", axis, x.ndim)
    return apply(OP.slice, (x,), _slice_attrs(x, a, start, length))


def split(tensor, split_size_or_sections, axis=0, *, dim=None):
    """Views of consecutive pieces along `axis`: of a given size, or of the listed sizes."""
    if dim is not None:
        axis = dim
    x = as_tensor(tensor)
    a = normalize_axis("split", axis, x.ndim)
    n = x.shape[a]
    if isinstance(split_size_or_sections, int):
        size = split_size_or_sections
        if size <= 0:
            raise ValueError(f"split: the split size must be positive, got {size}")
        sizes = [size] * (n // size) + ([n % size] if n % size else [])
    else:
        sizes = list(split_size_or_sections)
        if _builtins.sum(sizes) != n:
            raise ValueError(f"split: sections {sizes} do not add up to {n}, the length of axis {a}")
    out, start = [], 0
    for s in sizes:
        out.append(narrow(x, a, start, s))
        start += s
    return tuple(out)


def chunk(input, chunks, axis=0):
    """Splits into `chunks` nearly equal pieces."""
    x = as_tensor(input)
    n = x.shape[normalize_axis("chunk", axis, x.ndim)]
    if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
        raise ValueError(f"chunk: chunks must be a positive int, got {chunks!r}")
    return split(x, -(-n // chunks), axis)


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
    """dtype (a kiln dtype or its name), or default when it is None."""
    if dtype is None:
        return default
    if isinstance(dtype, _C.dtype):
        return dtype
    if isinstance(dtype, str):
        return _C.dtype_from_name(dtype)
    raise TypeError(f"dtype must be a kiln dtype (kiln.float32, ...) or its name, got {dtype!r}")


def full(shape, fill_value, dtype=None):
    """A tensor of `shape` filled with fill_value: full((2, 4), 3.0, kiln.float32); without dtype
    bool, int64 or float32 after fill_value's Python type."""
    shape = shape_tuple("full", (shape,) if isinstance(shape, int) else shape)
    if dtype is None:
        dtype = _C.bool if isinstance(fill_value, bool) else (
            _C.int64 if isinstance(fill_value, int) else _C.float32)
    dtype = _dtype_or(dtype, None)
    return apply(OP.full, (), (dtype.id, len(shape)) + shape, (float(fill_value),))


def _shape_and_dtype(op, shape, dtype):
    """A creation op's shape, and its dtype given positionally after the shape as MindSpore
    writes it (zeros((2, 4), kiln.float32), zeros(3, kiln.int32)) or by keyword."""
    if len(shape) >= 2 and isinstance(shape[-1], _C.dtype):
        if dtype is not None:
            raise TypeError(f"{op}: dtype given twice, positionally ({shape[-1].name}) and as dtype={dtype!r}")
        shape, dtype = shape[:-1], shape[-1]
    return shape_tuple(op, shape), _dtype_or(dtype, _C.float32)


def zeros(*shape, dtype=None):
    """A tensor of zeros (float32 unless dtype says otherwise): zeros(2, 4), zeros((2, 4)),
    zeros((2, 4), kiln.int32) (MindSpore's form) or zeros(2, 4, dtype=kiln.int32)."""
    shape, dtype = _shape_and_dtype("zeros", shape, dtype)
    return full(shape, 0.0, dtype)


def ones(*shape, dtype=None):
    """A tensor of ones (float32 unless dtype says otherwise), called like zeros."""
    shape, dtype = _shape_and_dtype("ones", shape, dtype)
    return full(shape, 1.0, dtype)


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

    count = _builtins.max(0, math.ceil((end - start) / step))
    if dtype is None:
        dtype = _C.int64 if _builtins.all(isinstance(v, int) for v in (start, end, step)) else _C.float32
    dtype = _dtype_or(dtype, None)
    return apply(OP.arange, (), (dtype.id, count), (float(start), float(step)))


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
    shape = shape_tuple("rand", shape)
    return apply(OP.rand, (), (_dtype_or(dtype, _C.float32).id, len(shape)) + shape, (0.0, 1.0))


def randn(*shape, dtype=None):
    """Standard normal samples from the generator seeded by kiln.manual_seed."""
    shape = shape_tuple("randn", shape)
    return apply(OP.randn, (), (_dtype_or(dtype, _C.float32).id, len(shape)) + shape, (0.0, 1.0))


def uniform(shape, low=0.0, high=1.0, dtype=None):
    """Uniform samples in [low, high)."""
    shape = shape_tuple("uniform", (shape,) if isinstance(shape, int) else shape)
    return apply(OP.rand, (), (_dtype_or(dtype, _C.float32).id, len(shape)) + shape, (float(low), float(high)))


def normal(shape, mean=0.0, stddev=1.0, dtype=None):
    """Normal samples with the given mean and standard deviation."""
    shape = shape_tuple("normal", (shape,) if isinstance(shape, int) else shape)
    return apply(OP.randn, (), (_dtype_or(dtype, _C.float32).id, len(shape)) + shape, (float(mean), float(stddev)))
