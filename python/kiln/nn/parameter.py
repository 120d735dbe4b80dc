"""Parameter: a kiln Tensor that a Cell owns and an optimizer updates."""
from .. import _C
from .._tensor import Tensor


class Parameter(Tensor):
    """Parameter(data, name=None, requires_grad=True, dtype=None).

    A real kiln Tensor (every op accepts it) holding its own copy of data, a leaf of the autograd
    graph. `name` is filled in with the attribute path when a Cell registers it and it has none.
    Ops on a Parameter return plain Tensors; optimizers update it in place. An integer or bool
    Parameter never requires grad, whatever requires_grad says."""

    def __new__(cls, data, name=None, requires_grad=True, dtype=None):
        if isinstance(data, _C.TensorBase) and data.dtype is _C.bfloat16 and dtype is None:
            dtype = _C.bfloat16
        return super().__new__(cls, data, dtype)

    def __init__(self, data, name=None, requires_grad=True, dtype=None):
        if name is not None and not isinstance(name, str):
            raise TypeError(f"Parameter: name must be a str or None, got {type(name).__name__}")
        self.name = name
        self._auto_name = name is None  # named by the Cell that registers it
        # an integer Parameter (a counter, a step) is state, not trained: it never requires grad (as MindSpore)
        self.requires_grad = bool(requires_grad) and self.dtype.is_floating_point

    def __repr__(self):
        return f"Parameter(name={self.name!r}, shape={list(self.shape)}, dtype={self.dtype.name}, " \
               f"requires_grad={self.requires_grad})"

    def clone(self, name=None):
        """A new Parameter with a copy of this one's data (and its requires_grad)."""
        return Parameter(self, name if name is not None else self.name, self.requires_grad)

    def set_data(self, data):
        """Overwrites the values in place (data broadcasts to this parameter's shape)."""
        from ..autograd import no_grad

        with no_grad():
            self[...] = data
        return self

    @property
    def data(self):
        """A Tensor sharing this parameter's memory, without autograd history."""
        return self.detach()

    @data.setter
    def data(self, value):
        self.set_data(value)

    # `param += x` (e.g. `self.step += 1` in a construct) assigns in place as MindSpore's graph
    # mode does: the Parameter keeps its identity (a Cell holds it, an optimizer updates it), its
    # dtype and its shape; the update is state, not recorded for autograd
    def _assign_op(self, other, op, sym):
        new = op(self, other)
        if tuple(new.shape) != tuple(self.shape):
            raise ValueError(f"Parameter {self.name!r}: `{sym}=` would change its shape from {list(self.shape)} "
                             f"to {list(new.shape)}; a Parameter is updated in place")
        return self.set_data(new)

    def __iadd__(self, other):
        return self._assign_op(other, lambda a, b: a + b, "+")

    def __isub__(self, other):
        return self._assign_op(other, lambda a, b: a - b, "-")

    def __imul__(self, other):
        return self._assign_op(other, lambda a, b: a * b, "*")

    def __itruediv__(self, other):
        if not self.dtype.is_floating_point:
            raise TypeError(f"Parameter {self.name!r}: `/=` on an integer Parameter would need a float result")
        return self._assign_op(other, lambda a, b: a / b, "/")

    def __deepcopy__(self, memo):
        p = Parameter(self, self.name, self.requires_grad)
        p._auto_name = self._auto_name
        memo[id(self)] = p
        return p

    def __reduce__(self):
        return (_rebuild_parameter, (self.asnumpy().copy(), self.dtype.name, self.name, self.requires_grad))


def _rebuild_parameter(array, dtype_name, name, requires_grad):
    return Parameter(array, name, requires_grad, _C.dtype_from_name(dtype_name))


class ParameterTuple(tuple):
    """A tuple of Parameters (MindSpore's ParameterTuple)."""

    def __new__(cls, params=()):
        params = tuple(params)
        for p in params:
            if not isinstance(p, Parameter):
                raise TypeError(f"ParameterTuple: expected Parameters, got {type(p).__name__}")
        return super().__new__(cls, params)

    def clone(self, prefix, init="same"):
        """Copies of the parameters named prefix + '.' + name; init='zeros' gives zeros instead."""
        from .. import ops

        out = []
        for p in self:
            data = p if init == "same" else ops.zeros_like(p) if init == "zeros" else None
            if data is None:
                raise ValueError(f"ParameterTuple.clone: init must be 'same' or 'zeros', got {init!r}")
            out.append(Parameter(data, f"{prefix}.{p.name}", p.requires_grad))
        return ParameterTuple(out)
