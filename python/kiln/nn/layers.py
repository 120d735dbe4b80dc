"""Layers, MindSpore's names and defaults: Dense, Conv2d, BatchNorm, LayerNorm, RMSNorm,
Embedding, pooling, activations, Flatten, Dropout, Identity."""
import math

from .. import _C
from .. import ops
from .cell import Cell
from .init import HeUniform, Uniform, initializer
from .parameter import Parameter


def new_param(init, shape, dtype, requires_grad=True):
    return Parameter(initializer(init, shape, dtype), requires_grad=requires_grad)


def positive_pair(layer, name, v):
    if isinstance(v, int) and not isinstance(v, bool) and v > 0:
        return (v, v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(x, int) and x > 0 for x in v):
        return tuple(v)
    raise ValueError(f"{layer}: {name} must be a positive int or a pair of positive ints, got {v!r}")


def checked_pad_mode(layer, pad_mode, padding):
    mode = pad_mode.lower() if isinstance(pad_mode, str) else pad_mode
    if mode not in ("same", "valid", "pad"):
        raise ValueError(f"{layer}: pad_mode must be 'same', 'valid' or 'pad', got {pad_mode!r}")
    if mode != "pad" and padding not in (0, (0, 0), (0, 0, 0, 0)):
        bias = ", has_bias=True" if layer.startswith("Conv") else ""
        raise ValueError(f"{layer}: padding {padding!r} needs pad_mode='pad', got pad_mode={pad_mode!r} (kiln takes "
                         f"MindSpore's defaults; PyTorch's {layer}(..., padding={padding!r}) is "
                         f"{layer}(..., pad_mode='pad', padding={padding!r}{bias}))")
    return mode


def _same_pads(size, kernel, stride, dilation=(1, 1)):
    """(top, bottom, left, right) giving ceil(size / stride) outputs, the extra on the end."""
    pads = []
    for d in range(2):
        k = (kernel[d] - 1) * dilation[d] + 1
        out = -(-size[d] // stride[d])
        total = max(0, (out - 1) * stride[d] + k - size[d])
        pads += [total // 2, total - total // 2]
    return tuple(pads)


# ---- activations ----------------------------------------------------------------------------


class ReLU(Cell):
    """max(x, 0)."""

    def construct(self, x):
        return ops.relu(x)


class GELU(Cell):
    """GELU; approximate=True (MindSpore's default) uses the tanh formula, False the exact erf one."""

    def __init__(self, approximate=True):
        super().__init__()
        self.approximate = "tanh" if approximate else "none"

    def construct(self, x):
        return ops.gelu(x, self.approximate)

    def extend_repr(self):
        return f"approximate={self.approximate == 'tanh'}"


class SiLU(Cell):
    """x * sigmoid(x)."""

    def construct(self, x):
        return ops.silu(x)


class Sigmoid(Cell):
    def construct(self, x):
        return ops.sigmoid(x)


class Tanh(Cell):
    def construct(self, x):
        return ops.tanh(x)


class Softmax(Cell):
    def __init__(self, axis=-1):
        super().__init__()
        self.axis = axis

    def construct(self, x):
        return ops.softmax(x, self.axis)


class LogSoftmax(Cell):
    def __init__(self, axis=-1):
        super().__init__()
        self.axis = axis

    def construct(self, x):
        return ops.log_softmax(x, self.axis)


class Identity(Cell):
    """Returns its input."""

    def construct(self, x):
        return x


_ACTIVATIONS = {"relu": ReLU, "gelu": GELU, "silu": SiLU, "swish": SiLU, "sigmoid": Sigmoid, "tanh": Tanh,
                "softmax": Softmax, "log_softmax": LogSoftmax, "identity": Identity}


def get_activation(name):
    """The activation Cell of that name ('relu', 'gelu', 'silu', 'sigmoid', 'tanh', 'softmax', ...)."""
    cls = _ACTIVATIONS.get(name.lower()) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"get_activation: unknown activation {name!r}; expected one of {sorted(_ACTIVATIONS)}")
    return cls()


def _activation(layer, activation):
    if activation is None or isinstance(activation, Cell):
        return activation
    if isinstance(activation, str):
        return get_activation(activation)
    if callable(activation):
        return activation
    raise TypeError(f"{layer}: activation must be a name, a Cell or a callable, got {type(activation).__name__}")


# ---- linear and convolution -------------------------------------------------------------------


class Dense(Cell):
    """y = activation(x @ weight.T + bias), weight of shape (out_channels, in_channels).
    Default init (weight_init/bias_init None): U(-1/sqrt(in), 1/sqrt(in)) for both."""

    def __init__(self, in_channels, out_channels, weight_init=None, bias_init=None, has_bias=True,
                 activation=None, dtype=_C.float32):
        super().__init__()
        if not all(isinstance(c, int) and c > 0 for c in (in_channels, out_channels)):
            raise ValueError(f"Dense: in_channels and out_channels must be positive ints, got {in_channels!r} and "
                             f"{out_channels!r}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.has_bias = bool(has_bias)
        self.weight = new_param(HeUniform(math.sqrt(5)) if weight_init is None else weight_init,
                             (out_channels, in_channels), dtype)
        self.bias = None
        if self.has_bias:
            bound = 1 / math.sqrt(in_channels)
            self.bias = new_param(Uniform(bound) if bias_init is None else bias_init, (out_channels,), dtype)
        self.activation = _activation("Dense", activation)

    def construct(self, x):
        y = ops.dense(x, self.weight, self.bias)
        return y if self.activation is None else self.activation(y)

    def extend_repr(self):
        return f"input_channels={self.in_channels}, output_channels={self.out_channels}, has_bias={self.has_bias}"


class Conv2d(Cell):
    """2-D convolution over NCHW input, MindSpore's defaults: pad_mode='same', has_bias=False.
    padding (pad_mode='pad') is an int, (h, w) or (top, bottom, left, right). PyTorch's keywords
    bias= and groups= are aliases of has_bias and group (PyTorch's defaults are not: its
    Conv2d(c, d, 3, padding=1) is Conv2d(c, d, 3, pad_mode='pad', padding=1, has_bias=True))."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, pad_mode="same", padding=0, dilation=1,
                 group=1, has_bias=False, weight_init=None, bias_init=None, data_format="NCHW", dtype=_C.float32, *,
                 bias=None, groups=None):
        super().__init__()
        has_bias = has_bias if bias is None else bias
        group = group if groups is None else groups
        if data_format != "NCHW":
            raise ValueError(f"Conv2d: only data_format='NCHW' is supported, got {data_format!r}")
        if not isinstance(group, int) or group <= 0 or in_channels % group or out_channels % group:
            raise ValueError(f"Conv2d: group {group!r} must divide in_channels {in_channels} and "
                             f"out_channels {out_channels}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = positive_pair("Conv2d", "kernel_size", kernel_size)
        self.stride = positive_pair("Conv2d", "stride", stride)
        self.dilation = positive_pair("Conv2d", "dilation", dilation)
        self.pad_mode = checked_pad_mode("Conv2d", pad_mode, padding)
        self.padding = padding
        self.group = group
        self.has_bias = bool(has_bias)
        shape = (out_channels, in_channels // group) + self.kernel_size
        self.weight = new_param(HeUniform(math.sqrt(5)) if weight_init is None else weight_init, shape, dtype)
        self.bias = None
        if self.has_bias:
            fan_in = in_channels // group * self.kernel_size[0] * self.kernel_size[1]
            self.bias = new_param(Uniform(1 / math.sqrt(fan_in)) if bias_init is None else bias_init,
                               (out_channels,), dtype)

    def construct(self, x):
        return ops.conv2d(x, self.weight, self.bias, self.stride, self.pad_mode, self.padding, self.dilation,
                          self.group)

    def extend_repr(self):
        return (f"input_channels={self.in_channels}, output_channels={self.out_channels}, "
                f"kernel_size={self.kernel_size}, stride={self.stride}, pad_mode={self.pad_mode}, "
                f"padding={self.padding}, dilation={self.dilation}, group={self.group}, has_bias={self.has_bias}")


# ---- normalization -----------------------------------------------------------------------------


class _BatchNorm(Cell):
    _ranks = ()

    def __init__(self, num_features, eps=1e-5, momentum=0.9, affine=True, gamma_init="ones", beta_init="zeros",
                 moving_mean_init="zeros", moving_var_init="ones", use_batch_statistics=None, data_format="NCHW",
                 dtype=_C.float32):
        super().__init__()
        name = type(self).__name__
        if not isinstance(num_features, int) or num_features <= 0:
            raise ValueError(f"{name}: num_features must be a positive int, got {num_features!r}")
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"{name}: momentum must be in [0, 1], got {momentum}")
        if data_format != "NCHW":
            raise ValueError(f"{name}: only data_format='NCHW' is supported, got {data_format!r}")
        if use_batch_statistics not in (None, True, False):
            raise ValueError(f"{name}: use_batch_statistics must be None, True or False")
        self.num_features = num_features
        self.eps = float(eps)
        self.momentum = float(momentum)
        self.affine = bool(affine)
        self.use_batch_statistics = use_batch_statistics
        self.moving_mean = new_param(moving_mean_init, (num_features,), dtype, requires_grad=False)
        self.moving_variance = new_param(moving_var_init, (num_features,), dtype, requires_grad=False)
        self.gamma = new_param(gamma_init, (num_features,), dtype, requires_grad=self.affine)
        self.beta = new_param(beta_init, (num_features,), dtype, requires_grad=self.affine)

    # PyTorch's names for the same parameters
    running_mean = property(lambda self: self.moving_mean)
    running_var = property(lambda self: self.moving_variance)
    weight = property(lambda self: self.gamma)
    bias = property(lambda self: self.beta)

    def construct(self, x):
        if x.ndim not in self._ranks:
            raise ValueError(f"{type(self).__name__}: expected a {' or '.join(map(str, self._ranks))}-D input, "
                             f"got shape {x.shape}")
        batch_stats = self.training if self.use_batch_statistics is None else self.use_batch_statistics
        return ops.batch_norm(x, self.moving_mean, self.moving_variance, self.gamma, self.beta, batch_stats,
                              1.0 - self.momentum, self.eps)

    def extend_repr(self):
        return f"num_features={self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}"


class BatchNorm2d(_BatchNorm):
    """Batch normalization of NCHW input over N, H, W. In training (or use_batch_statistics=True)
    it normalizes with the batch statistics and updates moving_mean / moving_variance in place:
    moving = momentum * moving + (1 - momentum) * batch (unbiased variance); otherwise it
    normalizes with the moving statistics."""

    _ranks = (4,)


class BatchNorm1d(_BatchNorm):
    """BatchNorm2d's rule for (N, C) or (N, C, L) input."""

    _ranks = (2, 3)


class LayerNorm(Cell):
    """Normalizes over the trailing normalized_shape axes: (x - mean) / sqrt(var + epsilon) * gamma + beta.
    begin_norm_axis / begin_params_axis (MindSpore), when given, must name the first of those axes."""

    def __init__(self, normalized_shape, begin_norm_axis=None, begin_params_axis=None, gamma_init="ones",
                 beta_init="zeros", epsilon=1e-5, dtype=_C.float32, *, eps=None, elementwise_affine=True):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if not shape or not all(isinstance(s, int) and s > 0 for s in shape):
            raise ValueError(f"LayerNorm: normalized_shape must be positive ints, got {normalized_shape!r}")
        self.normalized_shape = shape
        self.begin_norm_axis = begin_norm_axis
        self.begin_params_axis = begin_params_axis
        self.epsilon = float(epsilon if eps is None else eps)
        self.gamma = new_param(gamma_init, shape, dtype, requires_grad=bool(elementwise_affine))
        self.beta = new_param(beta_init, shape, dtype, requires_grad=bool(elementwise_affine))

    weight = property(lambda self: self.gamma)
    bias = property(lambda self: self.beta)

    def construct(self, x):
        if self.begin_norm_axis is not None or self.begin_params_axis is not None:
            self._check_axes(x)
        return ops.layer_norm(x, self.normalized_shape, self.gamma, self.beta, self.epsilon)

    def _check_axes(self, x):
        first = x.ndim - len(self.normalized_shape)
        for name in ("begin_norm_axis", "begin_params_axis"):
            axis = getattr(self, name)
            if axis is not None and (axis % x.ndim if x.ndim else axis) != first:
                raise ValueError(f"LayerNorm: {name}={axis} does not match normalized_shape {self.normalized_shape} "
                                 f"for input shape {x.shape} (the normalized axes start at {first})")

    def extend_repr(self):
        return f"normalized_shape={self.normalized_shape}, epsilon={self.epsilon}"


class RMSNorm(Cell):
    """x / sqrt(mean(x^2) + eps) * weight over the trailing normalized_shape axes (an int is the
    hidden size)."""

    def __init__(self, normalized_shape, eps=1e-6, weight_init="ones", dtype=_C.float32):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if not shape or not all(isinstance(s, int) and s > 0 for s in shape):
            raise ValueError(f"RMSNorm: normalized_shape must be positive ints, got {normalized_shape!r}")
        self.normalized_shape = shape
        self.eps = float(eps)
        self.weight = new_param(weight_init, shape, dtype)

    def construct(self, x):
        return ops.rms_norm(x, self.weight, self.eps)

    def extend_repr(self):
        return f"normalized_shape={self.normalized_shape}, eps={self.eps}"


# ---- embedding -----------------------------------------------------------------------------------


class Embedding(Cell):
    """Rows of embedding_table (vocab_size, embedding_size) at integer ids. The table starts
    N(0, 1) (embedding_table='normal' gives MindSpore's N(0, 0.01^2)); row padding_idx starts at zero.
    dtype is the table's; an integer dtype (MindSpore's dtype of the ids) leaves it float32."""

    def __init__(self, vocab_size, embedding_size, use_one_hot=False, embedding_table=None, dtype=_C.float32,
                 padding_idx=None):
        super().__init__()
        if use_one_hot:
            raise ValueError("Embedding: use_one_hot=True is not supported")
        if not isinstance(vocab_size, int) or vocab_size <= 0 or not isinstance(embedding_size, int) \
                or embedding_size <= 0:
            raise ValueError(f"Embedding: vocab_size and embedding_size must be positive ints, got {vocab_size!r} "
                             f"and {embedding_size!r}")
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size
        if not dtype.is_floating_point:
            dtype = _C.float32
        if padding_idx is not None:
            if not -vocab_size <= padding_idx < vocab_size:
                raise ValueError(f"Embedding: padding_idx {padding_idx} is out of range for vocab_size {vocab_size}")
            padding_idx %= vocab_size
        self.padding_idx = padding_idx
        table = initializer(embedding_table, (vocab_size, embedding_size), dtype) if embedding_table is not None \
            else ops.normal((vocab_size, embedding_size), 0.0, 1.0, dtype)
        if padding_idx is not None:
            table[padding_idx] = 0.0
        self.embedding_table = Parameter(table)

    weight = property(lambda self: self.embedding_table)

    def construct(self, ids):
        return ops.gather(self.embedding_table, ids, 0)

    def extend_repr(self):
        return f"vocab_size={self.vocab_size}, embedding_size={self.embedding_size}, padding_idx={self.padding_idx}"


# ---- pooling ---------------------------------------------------------------------------------------


class _Pool2d(Cell):
    def __init__(self, kernel_size, stride, pad_mode, padding, ceil_mode):
        super().__init__()
        name = type(self).__name__
        self.kernel_size = positive_pair(name, "kernel_size", kernel_size)
        self.stride = positive_pair(name, "stride", stride)
        self.pad_mode = checked_pad_mode(name, pad_mode, padding)
        self.padding = padding
        self.ceil_mode = bool(ceil_mode)

    def _pads(self, x):
        if x.ndim != 4:
            raise ValueError(f"{type(self).__name__}: expected a 4-D NCHW input, got shape {x.shape}")
        if self.pad_mode == "same":
            return _same_pads(x.shape[2:], self.kernel_size, self.stride)
        return 0 if self.pad_mode == "valid" else self.padding

    def extend_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, pad_mode={self.pad_mode}, padding={self.padding}"


class MaxPool2d(_Pool2d):
    """Max over kernel_size windows of NCHW input. MindSpore's defaults: stride=1, pad_mode='valid'
    ('same' gives ceil(H / stride) outputs; 'pad' uses padding)."""

    def __init__(self, kernel_size=1, stride=1, pad_mode="valid", padding=0, dilation=1, return_indices=False,
                 ceil_mode=False, data_format="NCHW"):
        super().__init__(kernel_size, stride, pad_mode, padding, ceil_mode)
        if return_indices:
            raise ValueError("MaxPool2d: return_indices=True is not supported")
        if data_format != "NCHW":
            raise ValueError(f"MaxPool2d: only data_format='NCHW' is supported, got {data_format!r}")
        self.dilation = positive_pair("MaxPool2d", "dilation", dilation)

    def construct(self, x):
        return ops.max_pool2d(x, self.kernel_size, self.stride, self._pads(x), self.dilation, self.ceil_mode)


class AvgPool2d(_Pool2d):
    """Average over kernel_size windows of NCHW input, MindSpore's defaults (stride=1,
    pad_mode='valid'). With pad_mode='same' the padding is not counted in the average."""

    def __init__(self, kernel_size=1, stride=1, pad_mode="valid", padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None, data_format="NCHW"):
        super().__init__(kernel_size, stride, pad_mode, padding, ceil_mode)
        if divisor_override is not None:
            raise ValueError("AvgPool2d: divisor_override is not supported")
        if data_format != "NCHW":
            raise ValueError(f"AvgPool2d: only data_format='NCHW' is supported, got {data_format!r}")
        self.count_include_pad = bool(count_include_pad) and self.pad_mode != "same"

    def construct(self, x):
        return ops.avg_pool2d(x, self.kernel_size, self.stride, self._pads(x), self.ceil_mode,
                              self.count_include_pad)


# ---- shape and regularization ------------------------------------------------------------------


class Flatten(Cell):
    """Merges axes start_dim..end_dim (by default all but the batch axis)."""

    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def construct(self, x):
        return ops.flatten(x, self.start_dim, self.end_dim)


class Dropout(Cell):
    """In training, zeroes each element with probability p and scales the others by 1 / (1 - p);
    otherwise returns its input. keep_prob (MindSpore 1.x) means 1 - p."""

    def __init__(self, p=0.5, keep_prob=None):
        super().__init__()
        if keep_prob is not None:
            p = 1.0 - keep_prob
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1), got {p}")
        self.p = float(p)

    def construct(self, x):
        if not self.training or self.p == 0.0:
            return x
        return ops.dropout(x, self.p, True)

    def extend_repr(self):
        return f"p={self.p}"
