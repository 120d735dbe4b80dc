"""Layers a ported PyTorch / MindSpore script still meets (issue 30), MindSpore's names with
PyTorch's as aliases, each an exact composition of kiln's ops (their math in kiln.ops):
activations (ReLU6, Hardtanh, Softsign, SELU, CELU, GLU, Softmin, Threshold), 2-D padding
(ZeroPad2d, ConstantPad2d, ReflectionPad2d, ReplicationPad2d), 1-D pooling through the 2-D pools
on an added axis (MaxPool1d, AvgPool1d, AdaptiveAvgPool1d), BatchNorm3d, Dropout1d / Dropout3d,
CosineSimilarity, PairwiseDistance, the losses HuberLoss, BCELoss, MarginRankingLoss,
SoftMarginLoss, CosineEmbeddingLoss, and the containers ParameterList / ParameterDict with
PyTorch's ModuleList (CellList) and Sequential (SequentialCell)."""
import numpy as np

from .. import ops
from .._tensor import Tensor
from .cell import Cell, CellList, SequentialCell
from .layers import AvgPool2d, BatchNorm2d, Dropout, MaxPool2d
from .loss import LossBase
from .parameter import Parameter

# ---- activations ---------------------------------------------------------------------------------


class ReLU6(Cell):
    """min(max(x, 0), 6)."""

    def construct(self, x):
        return ops.relu6(x)


class Hardtanh(Cell):
    """x limited to [min_val, max_val]."""

    def __init__(self, min_val=-1.0, max_val=1.0):
        super().__init__()
        if min_val > max_val:
            raise ValueError(f"Hardtanh: min_val ({min_val}) must not exceed max_val ({max_val})")
        self.min_val, self.max_val = float(min_val), float(max_val)

    def construct(self, x):
        return ops.hardtanh(x, self.min_val, self.max_val)


class Softsign(Cell):
    """x / (1 + |x|)."""

    def construct(self, x):
        return ops.softsign(x)


class SELU(Cell):
    """scale * elu(x, alpha) with SELU's fixed constants."""

    def construct(self, x):
        return ops.selu(x)


class CELU(Cell):
    """x above 0, alpha (exp(x / alpha) - 1) below."""

    def __init__(self, alpha=1.0):
        super().__init__()
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha == 0:
            raise ValueError(f"CELU: alpha must be a nonzero number, got {alpha!r}")
        self.alpha = float(alpha)

    def construct(self, x):
        return ops.celu(x, self.alpha)


class GLU(Cell):
    """a * sigmoid(b) of the two halves of x along axis (PyTorch: dim)."""

    def __init__(self, axis=-1, dim=None):
        super().__init__()
        self.axis = int(axis if dim is None else dim)

    def construct(self, x):
        return ops.glu(x, self.axis)


class Softmin(Cell):
    """softmax(-x) along axis (PyTorch: dim)."""

    def __init__(self, axis=-1, dim=None):
        super().__init__()
        self.axis = int(axis if dim is None else dim)

    def construct(self, x):
        return ops.softmax(-x, self.axis)


class Threshold(Cell):
    """x where x > threshold, else value."""

    def __init__(self, threshold, value):
        super().__init__()
        self.threshold, self.value = float(threshold), float(value)

    def construct(self, x):
        return ops.where(x > self.threshold, x, self.value)


# ---- padding ---------------------------------------------------------------------------------------


class _Pad2d(Cell):
    _mode = "constant"

    def __init__(self, padding, value=0.0):
        super().__init__()
        name = type(self).__name__
        if isinstance(padding, int) and not isinstance(padding, bool):
            padding = (padding,) * 4
        if not isinstance(padding, (tuple, list)) or len(padding) != 4 or \
                not all(isinstance(p, int) and not isinstance(p, bool) for p in padding):
            raise ValueError(f"{name}: padding must be an int or 4 ints (left, right, top, bottom), got {padding!r}")
        self.padding, self.value = tuple(padding), float(value)

    def construct(self, x):
        if x.ndim not in (3, 4):
            raise ValueError(f"{type(self).__name__}: expected (N, C, H, W) or (C, H, W), got shape {list(x.shape)}")
        if self._mode == "constant":
            return ops.pad(x, self.padding, "constant", self.value)
        return ops.pad(x, self.padding, self._mode)

    def extend_repr(self):
        return f"padding={self.padding}" + (f", value={self.value}" if self._mode == "constant" else "")


class ConstantPad2d(_Pad2d):
    """Pads the last two axes with value: padding an int or (left, right, top, bottom)."""

    def __init__(self, padding, value):
        super().__init__(padding, value)


class ZeroPad2d(_Pad2d):
    """Pads the last two axes with zeros: padding an int or (left, right, top, bottom)."""

    def __init__(self, padding):
        super().__init__(padding, 0.0)


class ReflectionPad2d(_Pad2d):
    """Pads the last two axes with their reflection (the edge not repeated)."""

    _mode = "reflect"

    def __init__(self, padding):
        super().__init__(padding)


class ReplicationPad2d(_Pad2d):
    """Pads the last two axes by repeating their edge values."""

    _mode = "replicate"

    def __init__(self, padding):
        super().__init__(padding)


# ---- 1-D pooling: the 2-D pools over (N, C, 1, L) -------------------------------------------------


def _one(layer, name, v, low=1):
    if isinstance(v, (tuple, list)) and len(v) == 1:
        v = v[0]
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ValueError(f"{layer}: {name} must be an int >= {low}, got {v!r}")
    return v


def _on_rows(layer, pool2d, x):
    """pool2d over x (N, C, L) or (C, L) seen as (N, C, 1, L)."""
    if x.ndim not in (2, 3):
        raise ValueError(f"{layer}: expected (N, C, L) or (C, L), got shape {list(x.shape)}")
    batched = x.ndim == 3
    y = ops.squeeze(pool2d(ops.unsqueeze(x if batched else ops.unsqueeze(x, 0), 2)), 2)
    return y if batched else ops.squeeze(y, 0)


class MaxPool1d(MaxPool2d):
    """Max over windows of kernel_size along L of (N, C, L) input, MaxPool2d's arguments and
    defaults for one axis (stride=1, pad_mode='valid'; 'pad' uses padding at both ends)."""

    def __init__(self, kernel_size=1, stride=1, pad_mode="valid", padding=0, dilation=1, return_indices=False,
                 ceil_mode=False):
        k, s = _one("MaxPool1d", "kernel_size", kernel_size), _one("MaxPool1d", "stride", stride)
        p, d = _one("MaxPool1d", "padding", padding, 0), _one("MaxPool1d", "dilation", dilation)
        super().__init__((1, k), (1, s), pad_mode, (0, 0, p, p) if p else 0, (1, d), return_indices, ceil_mode)

    def construct(self, x):
        return _on_rows("MaxPool1d", super().construct, x)


class AvgPool1d(AvgPool2d):
    """Average over windows of kernel_size along L of (N, C, L) input, AvgPool2d's arguments and
    defaults for one axis."""

    def __init__(self, kernel_size=1, stride=1, pad_mode="valid", padding=0, ceil_mode=False, count_include_pad=True):
        k, s = _one("AvgPool1d", "kernel_size", kernel_size), _one("AvgPool1d", "stride", stride)
        p = _one("AvgPool1d", "padding", padding, 0)
        super().__init__((1, k), (1, s), pad_mode, (0, 0, p, p) if p else 0, ceil_mode, count_include_pad)

    def construct(self, x):
        return _on_rows("AvgPool1d", super().construct, x)


class AdaptiveAvgPool1d(Cell):
    """Average pooling of (N, C, L) or (C, L) input to output_size along L, PyTorch's windows
    [floor(i L / out), ceil((i + 1) L / out)): one gather of the windows' elements (padded to the
    widest with a masked repeat) and a masked sum over each."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = _one("AdaptiveAvgPool1d", "output_size", output_size)

    def construct(self, x):
        return _on_rows("AdaptiveAvgPool1d", self._pool, x)

    def _pool(self, x):  # (N, C, 1, L)
        size, out = x.shape[-1], self.output_size
        if size == out:
            return x
        if size % out == 0:
            return ops.mean(ops.reshape(x, *x.shape[:-1], out, size // out), -1)
        try:
            i = np.arange(out, dtype=np.int64)
            start, end = (i * size) // out, -((-(i + 1) * size) // out)
            width = end - start
            at = start[:, None] + np.arange(int(width.max()), dtype=np.int64)[None, :]
            inside = at < end[:, None]
        except (MemoryError, ValueError, OverflowError) as e:
            raise ValueError(f"AdaptiveAvgPool1d: output_size {out} for length {size}: {e}") from None
        taken = ops.gather(x, Tensor(np.where(inside, at, start[:, None])), -1)  # (N, C, 1, out, widest)
        summed = ops.sum(ops.where(Tensor(inside), taken, 0.0), -1)
        return summed / Tensor(width.astype(np.float64)).astype(x.dtype)

    def extend_repr(self):
        return f"output_size={self.output_size}"


# ---- normalization and dropout ---------------------------------------------------------------------


class BatchNorm3d(BatchNorm2d):
    """BatchNorm2d's rule for (N, C, D, H, W) input."""

    _ranks = (5,)


class _ChannelDropout(Dropout):
    _spatial = 1

    def construct(self, x):
        name, k = type(self).__name__, self._spatial
        if x.ndim not in (k + 1, k + 2):
            raise ValueError(f"{name}: expected a {k + 2}-D (batched) or {k + 1}-D input, got shape {list(x.shape)}")
        if not self.training or self.p == 0.0:
            return x
        channels = x.shape[:x.ndim - k]
        keep = (ops.rand(*channels, *([1] * k)) >= self.p).astype(x.dtype)
        return x * keep * (1.0 / (1.0 - self.p))


class Dropout1d(_ChannelDropout):
    """Zeroes whole channels of (N, C, L) or (C, L) input with probability p in training (the rest
    scaled by 1 / (1 - p)); the identity in eval mode."""

    _spatial = 1


class Dropout3d(_ChannelDropout):
    """Zeroes whole channels of (N, C, D, H, W) or (C, D, H, W) input with probability p in training
    (the rest scaled by 1 / (1 - p)); the identity in eval mode."""

    _spatial = 3


# ---- distances -----------------------------------------------------------------------------------


class CosineSimilarity(Cell):
    """ops.cosine_similarity(x1, x2, dim, eps)."""

    def __init__(self, dim=1, eps=1e-8):
        super().__init__()
        self.dim, self.eps = int(dim), float(eps)

    def construct(self, x1, x2):
        return ops.cosine_similarity(x1, x2, self.dim, self.eps)


class PairwiseDistance(Cell):
    """ops.pairwise_distance(x1, x2, p, eps, keepdim)."""

    def __init__(self, p=2.0, eps=1e-6, keepdim=False):
        super().__init__()
        self.p, self.eps, self.keepdim = float(p), float(eps), bool(keepdim)

    def construct(self, x1, x2):
        return ops.pairwise_distance(x1, x2, self.p, self.eps, self.keepdim)


# ---- losses --------------------------------------------------------------------------------------


class HuberLoss(LossBase):
    """ops.huber_loss: quadratic within delta, linear beyond."""

    def __init__(self, reduction="mean", delta=1.0):
        super().__init__(reduction)
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or delta <= 0:
            raise ValueError(f"HuberLoss: delta must be a positive number, got {delta!r}")
        self.delta = float(delta)

    def construct(self, logits, labels):
        return ops.huber_loss(logits, labels, self.reduction, self.delta)


class BCELoss(LossBase):
    """ops.binary_cross_entropy of probabilities, weight (optional) per element."""

    def __init__(self, weight=None, reduction="mean"):
        super().__init__(reduction)
        self.weight = weight

    def construct(self, logits, labels):
        return ops.binary_cross_entropy(logits, labels, self.weight, self.reduction)


class MarginRankingLoss(LossBase):
    """ops.margin_ranking_loss: max(0, -y (x1 - x2) + margin)."""

    def __init__(self, margin=0.0, reduction="mean"):
        super().__init__(reduction)
        self.margin = float(margin)

    def construct(self, input1, input2, target):
        return ops.margin_ranking_loss(input1, input2, target, self.margin, self.reduction)


class SoftMarginLoss(LossBase):
    """ops.soft_margin_loss: log(1 + exp(-y x))."""

    def construct(self, logits, labels):
        return ops.soft_margin_loss(logits, labels, self.reduction)


class CosineEmbeddingLoss(LossBase):
    """ops.cosine_embedding_loss: 1 - cos where y is 1, max(0, cos - margin) where y is -1."""

    def __init__(self, margin=0.0, reduction="mean"):
        super().__init__(reduction)
        self.margin = float(margin)

    def construct(self, input1, input2, target):
        return ops.cosine_embedding_loss(input1, input2, target, self.margin, self.reduction)


# ---- containers ----------------------------------------------------------------------------------


def _parameter(container, value):
    if isinstance(value, Parameter):
        return value
    if isinstance(value, Tensor):
        return Parameter(value)
    raise TypeError(f"{container}: expected a Parameter or a Tensor, got {type(value).__name__}")


class ParameterList(Cell):
    """Parameters in a list, registered on the cell as '0', '1', ... (a Tensor is made a
    Parameter), so a Cell holding it trains them."""

    def __init__(self, values=None):
        super().__init__()
        self._count = 0
        for v in values or ():
            self.append(v)

    def append(self, value):
        """Adds value at the end; returns self."""
        setattr(self, str(self._count), _parameter("ParameterList", value))
        self._count += 1
        return self

    def extend(self, values):
        """Adds each of values at the end; returns self."""
        for v in values:
            self.append(v)
        return self

    def __len__(self):
        return self._count

    def __getitem__(self, index):
        if isinstance(index, slice):
            return ParameterList([self._params[str(i)] for i in range(self._count)][index])
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"ParameterList indices must be ints or slices, got {type(index).__name__}")
        if not -self._count <= index < self._count:
            raise IndexError(f"ParameterList index {index} out of range for {self._count} parameters")
        return self._params[str(index % self._count)]

    def __setitem__(self, index, value):
        self.__getitem__(index)  # (checks the index)
        setattr(self, str(index % self._count), _parameter("ParameterList", value))

    def __iter__(self):
        return iter([self._params[str(i)] for i in range(self._count)])

    def construct(self, *inputs):
        raise TypeError("ParameterList is a container: use its parameters")


class ParameterDict(Cell):
    """Parameters by name, registered on the cell under their keys (a Tensor is made a Parameter)."""

    def __init__(self, parameters=None):
        super().__init__()
        self._keys = []
        self.update(parameters or {})

    def __setitem__(self, key, value):
        if not isinstance(key, str):
            raise TypeError(f"ParameterDict: keys are str, got {type(key).__name__}")
        if not key or "." in key:
            raise ValueError(f"ParameterDict: a key must be a non-empty str without '.', got {key!r}")
        setattr(self, key, _parameter("ParameterDict", value))
        if key not in self._keys:
            self._keys.append(key)

    def __getitem__(self, key):
        if key not in self._keys:
            raise KeyError(key)
        return self._params[key]

    def __delitem__(self, key):
        if key not in self._keys:
            raise KeyError(key)
        self._keys.remove(key)
        delattr(self, key)

    def __contains__(self, key):
        return key in self._keys

    def __len__(self):
        return len(self._keys)

    def __iter__(self):
        return iter(list(self._keys))

    def keys(self):
        return list(self._keys)

    def values(self):
        return [self._params[k] for k in self._keys]

    def items(self):
        return [(k, self._params[k]) for k in self._keys]

    def update(self, parameters):
        """Sets each (key, parameter) of a dict or of a sequence of pairs."""
        items = parameters.items() if isinstance(parameters, dict) else parameters
        if not isinstance(parameters, dict) and not isinstance(parameters, (list, tuple)):
            raise TypeError(f"ParameterDict: expected a dict or (key, parameter) pairs, got {type(parameters).__name__}")
        for item in items:
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise TypeError(f"ParameterDict: expected (key, parameter) pairs, got {type(item).__name__}")
            self[item[0]] = item[1]

    def construct(self, *inputs):
        raise TypeError("ParameterDict is a container: use its parameters")


# PyTorch's names of MindSpore's containers
ModuleList = CellList
Sequential = SequentialCell

__all__ = ["ReLU6", "Hardtanh", "Softsign", "SELU", "CELU", "GLU", "Softmin", "Threshold", "ZeroPad2d", "ConstantPad2d",
           "ReflectionPad2d", "ReplicationPad2d", "MaxPool1d", "AvgPool1d", "AdaptiveAvgPool1d", "BatchNorm3d",
           "Dropout1d", "Dropout3d", "CosineSimilarity", "PairwiseDistance", "HuberLoss", "BCELoss",
           "MarginRankingLoss", "SoftMarginLoss", "CosineEmbeddingLoss", "ParameterList", "ParameterDict",
           "ModuleList", "Sequential"]
