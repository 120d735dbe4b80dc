"""Tensor methods that scripts ported from PyTorch reach for (x.chunk, x.new_zeros, x.t(), x.eq,
mask.logical_not(), x.median(dim), ...), each the kiln.ops function of the same meaning: a mixin
of kiln.Tensor, so they trace, compile and differentiate as the ops do."""
from . import _C
from . import ops as _ops


def _dims(x, dim, what):
    """dim as an axis in [0, x.ndim), or IndexError naming the method."""
    nd = x.ndim
    if not -nd <= dim < max(nd, 1):
        raise IndexError(f"Tensor.{what}: dim {dim} is out of range for a tensor with {nd} dimensions")
    return dim % nd if nd else 0


class TorchTensorMethods:
    __slots__ = ()

    # ---- comparisons and elementwise ----------------------------------------------------
    def eq(self, other):
        return _ops.equal(self, other)

    def ne(self, other):
        return _ops.not_equal(self, other)

    def lt(self, other):
        return _ops.less(self, other)

    def le(self, other):
        return _ops.less_equal(self, other)

    def gt(self, other):
        return _ops.greater(self, other)

    def ge(self, other):
        return _ops.greater_equal(self, other)

    def logical_not(self):
        return _ops.logical_not(self)

    def sign(self):
        return _ops.sign(self)

    def reciprocal(self):
        return _ops.reciprocal(self)

    def erf(self):
        return _ops.erf(self)

    def frac(self):
        """The fractional part, with the sign of the input (x - trunc(x))."""
        return self - _ops.trunc(self)

    def where(self, condition, y):
        """PyTorch's x.where(condition, y): x where condition holds, else y."""
        return _ops.where(condition, self, y)

    # ---- products -------------------------------------------------------------------------
    def mm(self, mat2):
        if self.ndim != 2 or getattr(mat2, "ndim", 0) != 2:
            raise ValueError(f"Tensor.mm: both operands must be 2-D, got shapes {list(self.shape)} and "
                             f"{list(getattr(mat2, 'shape', ()))}")
        return _ops.matmul(self, mat2)

    def bmm(self, mat2):
        return _ops.bmm(self, mat2)

    def t(self):
        """The transpose of a tensor of at most 2 dimensions (0-d and 1-d: itself)."""
        if self.ndim > 2:
            raise ValueError(f"Tensor.t: expects at most 2 dimensions, got shape {list(self.shape)}; use "
                             "transpose(dim0, dim1) or mT")
        return self if self.ndim < 2 else _ops.transpose(self, 1, 0)

    # ---- shapes and pieces ------------------------------------------------------------------
    def view_as(self, other):
        return self.reshape(tuple(other.shape))

    def reshape_as(self, other):
        return self.reshape(tuple(other.shape))

    def chunk(self, chunks, dim=0):
        return _ops.chunk(self, chunks, dim)

    def narrow(self, dim, start, length):
        return _ops.narrow(self, dim, start, length)

    def split_with_sizes(self, split_sizes, dim=0):
        return _ops.split(self, list(split_sizes), dim)

    def tensor_split(self, indices_or_sections, dim=0):
        """NumPy's array_split: n pieces whose sizes differ by at most one (the first ones larger),
        or the pieces between the given indices."""
        a = _dims(self, dim, "tensor_split")
        n = self.shape[a]
        if isinstance(indices_or_sections, int):
            k = indices_or_sections
            if k <= 0:
                raise ValueError(f"Tensor.tensor_split: sections must be positive, got {k}")
            bounds = [i * (n // k) + min(i, n % k) for i in range(k + 1)]
        else:
            bounds = [0] + [min(max(int(i) + (n if int(i) < 0 else 0), 0), n) for i in indices_or_sections] + [n]
        return tuple(_ops.narrow(self, a, lo, max(hi, lo) - lo) for lo, hi in zip(bounds, bounds[1:]))

    def hsplit(self, sections):
        return self.tensor_split(sections, 1 if self.ndim > 1 else 0)

    def vsplit(self, sections):
        if self.ndim < 2:
            raise ValueError(f"Tensor.vsplit: needs at least 2 dimensions, got shape {list(self.shape)}")
        return self.tensor_split(sections, 0)

    def select(self, dim, index):
        a = _dims(self, dim, "select")
        return self[(slice(None),) * a + (index,)]

    def fliplr(self):
        if self.ndim < 2:
            raise ValueError(f"Tensor.fliplr: needs at least 2 dimensions, got shape {list(self.shape)}")
        return _ops.flip(self, (1,))

    def flipud(self):
        if self.ndim < 1:
            raise ValueError("Tensor.flipud: needs at least 1 dimension")
        return _ops.flip(self, (0,))

    def diagonal(self, offset=0, dim1=0, dim2=1):
        """The diagonal of the (dim1, dim2) planes, offset above (> 0) or below (< 0) the main one, as
        the last axis (NumPy's and PyTorch's)."""
        if self.ndim < 2:
            raise ValueError(f"Tensor.diagonal: needs at least 2 dimensions, got shape {list(self.shape)}")
        a, b = _dims(self, dim1, "diagonal"), _dims(self, dim2, "diagonal")
        if a == b:
            raise ValueError(f"Tensor.diagonal: dim1 and dim2 must differ, got {dim1} and {dim2}")
        rest = [d for d in range(self.ndim) if d not in (a, b)]
        x = _ops.permute(self, tuple(rest) + (a, b))
        rows, cols = self.shape[a], self.shape[b]
        start_r, start_c = max(-offset, 0), max(offset, 0)
        n = max(min(rows - start_r, cols - start_c), 0)
        lead = tuple(x.shape[:-2])
        flat = x.reshape(lead + (rows * cols,))
        index = _ops.arange(n) * (cols + 1) + (start_r * cols + start_c)
        return _ops.gather(flat, index, len(lead))

    def take(self, index):
        """The elements at index of the flattened tensor, in index's shape."""
        idx = _ops.cast(_C.shape.as_tensor(index), _C.int64)
        n = self.numel() if callable(getattr(self, "numel", None)) else self.size
        idx = _ops.where(idx < 0, idx + n, idx)
        return _ops.gather(self.reshape(-1), idx.reshape(-1), 0).reshape(tuple(idx.shape))

    # ---- order statistics -------------------------------------------------------------------
    def kthvalue(self, k, dim=-1, keepdim=False):
        """(values, indices) of the k-th smallest element (k from 1) along dim."""
        a = _dims(self, dim, "kthvalue")
        n = self.shape[a] if self.ndim else 1
        if not 1 <= k <= n:
            raise ValueError(f"Tensor.kthvalue: k must be in [1, {n}], got {k}")
        values, indices = _ops.sort(self, a)
        pick = (slice(None),) * a + (slice(k - 1, k),)
        v, i = values[pick], indices[pick]
        return (v, i) if keepdim else (_ops.squeeze(v, a), _ops.squeeze(i, a))

    def median(self, dim=None, keepdim=False):
        """The lower median: of every element (a 0-d tensor) or, with dim, (values, indices) along it."""
        if dim is None:
            flat = self.reshape(-1)
            return _ops.sort(flat, 0)[0][(flat.shape[0] - 1) // 2]
        a = _dims(self, dim, "median")
        return self.kthvalue((self.shape[a] - 1) // 2 + 1, a, keepdim)

    # ---- new tensors like this one ------------------------------------------------------------
    def new_zeros(self, *size, dtype=None):
        return _ops.zeros(*size, dtype=self.dtype if dtype is None else dtype)

    def new_ones(self, *size, dtype=None):
        return _ops.ones(*size, dtype=self.dtype if dtype is None else dtype)

    def new_empty(self, *size, dtype=None):
        return _ops.zeros(*size, dtype=self.dtype if dtype is None else dtype)

    def new_full(self, size, fill_value, dtype=None):
        return _ops.full(size, fill_value, self.dtype if dtype is None else dtype)

    def new_tensor(self, data, dtype=None):
        return _C.shape.as_tensor(data).astype(self.dtype if dtype is None else dtype).clone()

    # ---- in place -----------------------------------------------------------------------------
    def masked_fill_(self, mask, value):
        return self._write_result("masked_fill_", _ops.masked_fill(self, mask, value))

    def index_add_(self, dim, index, source, *, alpha=1):
        return self._write_result("index_add_", _ops.index_add(self, dim, index, source if alpha == 1 else
                                                               source * alpha))

    def scatter_add_(self, dim, index, src):
        return self._write_result("scatter_add_", _ops.scatter_add(self, dim, index, src))

    def scatter_(self, dim, index, src=None, *, value=None):
        return self._write_result("scatter_", self.scatter(dim, index, src, value=value))

    def uniform_(self, a=0.0, b=1.0):
        return self._write_result("uniform_", _ops.uniform(tuple(self.shape), a, b, self.dtype))

    def normal_(self, mean=0.0, std=1.0):
        return self._write_result("normal_", _ops.normal(tuple(self.shape), mean, std, self.dtype))

    # ---- facts ---------------------------------------------------------------------------------
    @property
    def device(self):
        """Where the tensor lives: always "cpu" (kiln has one device)."""
        return "cpu"

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def nbytes(self):
        n = 1
        for s in self.shape:
            n *= s
        return n * self.itemsize
