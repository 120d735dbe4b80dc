"""Weight initializers (MindSpore's mindspore.common.initializer), drawn from kiln's generator
so kiln.manual_seed makes them reproducible."""
import math

import numpy as _np

from .. import _C
from .. import ops


def _fans(shape):
    """(fan_in, fan_out) of a weight: (out, in, *kernel) for conv, (out, in) for dense."""
    if len(shape) < 2:
        raise ValueError(f"initializer: fan in and fan out need at least 2 dimensions, got shape {tuple(shape)}")
    receptive = 1
    for s in shape[2:]:
        receptive *= s
    return shape[1] * receptive, shape[0] * receptive


def _gain(nonlinearity, param=None):
    if nonlinearity in ("linear", "conv1d", "conv2d", "conv3d", "sigmoid"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope * slope))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"initializer: unsupported nonlinearity {nonlinearity!r}")


class Initializer:
    """Base class: an initializer called with (shape, dtype) returns a new Tensor."""

    def __call__(self, shape, dtype=_C.float32):
        return self.sample(tuple(shape), dtype)

    def sample(self, shape, dtype):
        raise NotImplementedError

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class Constant(Initializer):
    def __init__(self, value):
        self.value = value

    def sample(self, shape, dtype):
        return ops.full(shape, float(self.value), dtype)


class Zero(Constant):
    def __init__(self):
        super().__init__(0.0)


class One(Constant):
    def __init__(self):
        super().__init__(1.0)


class Uniform(Initializer):
    """U(-scale, scale)."""

    def __init__(self, scale=0.07):
        self.scale = scale

    def sample(self, shape, dtype):
        return ops.uniform(shape, -self.scale, self.scale, dtype)


class Normal(Initializer):
    """N(mean, sigma^2)."""

    def __init__(self, sigma=0.01, mean=0.0):
        self.sigma = sigma
        self.mean = mean

    def sample(self, shape, dtype):
        return ops.normal(shape, self.mean, self.sigma, dtype)


class HeUniform(Initializer):
    """Kaiming uniform: U(-b, b) with b = gain * sqrt(3 / fan). The Dense and Conv2d weight
    default is HeUniform(negative_slope=math.sqrt(5)), i.e. b = 1 / sqrt(fan_in) (PyTorch's)."""

    def __init__(self, negative_slope=0, mode="fan_in", nonlinearity="leaky_relu"):
        if mode not in ("fan_in", "fan_out"):
            raise ValueError(f"HeUniform: mode must be 'fan_in' or 'fan_out', got {mode!r}")
        self.negative_slope = negative_slope
        self.mode = mode
        self.nonlinearity = nonlinearity

    def sample(self, shape, dtype):
        fan_in, fan_out = _fans(shape)
        fan = fan_in if self.mode == "fan_in" else fan_out
        bound = _gain(self.nonlinearity, self.negative_slope) * math.sqrt(3.0 / fan) if fan else 0.0
        return ops.uniform(shape, -bound, bound, dtype)


class HeNormal(HeUniform):
    """Kaiming normal: N(0, (gain / sqrt(fan))^2)."""

    def sample(self, shape, dtype):
        fan_in, fan_out = _fans(shape)
        fan = fan_in if self.mode == "fan_in" else fan_out
        std = _gain(self.nonlinearity, self.negative_slope) / math.sqrt(fan) if fan else 0.0
        return ops.normal(shape, 0.0, std, dtype)


class XavierUniform(Initializer):
    """Glorot uniform: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out))."""

    def __init__(self, gain=1):
        self.gain = gain

    def sample(self, shape, dtype):
        fan_in, fan_out = _fans(shape)
        bound = self.gain * math.sqrt(6.0 / (fan_in + fan_out)) if fan_in + fan_out else 0.0
        return ops.uniform(shape, -bound, bound, dtype)


class XavierNormal(XavierUniform):
    """Glorot normal: N(0, gain^2 * 2 / (fan_in + fan_out))."""

    def sample(self, shape, dtype):
        fan_in, fan_out = _fans(shape)
        std = self.gain * math.sqrt(2.0 / (fan_in + fan_out)) if fan_in + fan_out else 0.0
        return ops.normal(shape, 0.0, std, dtype)


_BY_NAME = {
    "zeros": Zero, "zero": Zero, "ones": One, "one": One,
    "normal": Normal, "uniform": Uniform,
    "he_uniform": HeUniform, "heuniform": HeUniform, "he_normal": HeNormal, "henormal": HeNormal,
    "xavier_uniform": XavierUniform, "xavieruniform": XavierUniform,
    "xavier_normal": XavierNormal, "xaviernormal": XavierNormal,
}


def initializer(init, shape, dtype=_C.float32):
    """A new Tensor of shape and dtype from init: an Initializer, its name ('zeros', 'ones',
    'normal', 'uniform', 'he_uniform', 'he_normal', 'xavier_uniform', 'xavier_normal'), a
    number (constant), or a Tensor / array of exactly that shape (copied)."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if isinstance(init, str):
        cls = _BY_NAME.get(init.lower())
        if cls is None:
            raise ValueError(f"initializer: unknown initializer {init!r}; expected one of {sorted(set(_BY_NAME))}")
        init = cls()
    if isinstance(init, Initializer):
        return init(shape, dtype)
    if isinstance(init, bool) or not isinstance(init, (int, float, _C.TensorBase, _np.ndarray)):
        raise TypeError(f"initializer: init must be an Initializer, a name, a number or a Tensor, got "
                        f"{type(init).__name__}")
    if isinstance(init, (int, float)):
        return ops.full(shape, float(init), dtype)
    if tuple(init.shape) != shape:
        raise ValueError(f"initializer: the given tensor has shape {tuple(init.shape)}, expected {shape}")
    from .._tensor import Tensor

    return Tensor(init, dtype)


# ---- PyTorch's torch.nn.init: in-place functions over a parameter (the same draws as the classes) --

def _fill(tensor, values):
    """tensor's values replaced in place by values, without gradient history; returns tensor."""
    from ..grad_mode import no_grad

    with no_grad():
        tensor[...] = values
    return tensor


def calculate_gain(nonlinearity, param=None):
    return _gain(nonlinearity, param)


def uniform_(tensor, a=0.0, b=1.0):
    return _fill(tensor, ops.uniform(tuple(tensor.shape), float(a), float(b), tensor.dtype))


def normal_(tensor, mean=0.0, std=1.0):
    return _fill(tensor, Normal(std, mean)(tensor.shape, tensor.dtype))


def constant_(tensor, val):
    return _fill(tensor, Constant(val)(tensor.shape, tensor.dtype))


def zeros_(tensor):
    return constant_(tensor, 0.0)


def ones_(tensor):
    return constant_(tensor, 1.0)


def xavier_uniform_(tensor, gain=1.0):
    return _fill(tensor, XavierUniform(gain)(tensor.shape, tensor.dtype))


def xavier_normal_(tensor, gain=1.0):
    return _fill(tensor, XavierNormal(gain)(tensor.shape, tensor.dtype))


def kaiming_uniform_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu"):
    return _fill(tensor, HeUniform(a, mode, nonlinearity)(tensor.shape, tensor.dtype))


def kaiming_normal_(tensor, a=0, mode="fan_in", nonlinearity="leaky_relu"):
    return _fill(tensor, HeNormal(a, mode, nonlinearity)(tensor.shape, tensor.dtype))
