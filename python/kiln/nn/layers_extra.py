"""More layers a practitioner reaches for (issue 30), MindSpore's names with PyTorch's as aliases,
each an exact composition of kiln's ops (so gradients, symbolic sizes, fusion and export follow):
activations (their math in kiln.ops.activations) (LeakyReLU, PReLU, ELU, Softplus, HSwish/Hardswish, HSigmoid/Hardsigmoid, Mish),
Conv1d (a convolution over a height of 1), GroupNorm, InstanceNorm2d, AdaptiveAvgPool2d,
Upsample (ops.interpolate), PixelShuffle / PixelUnshuffle, Dropout2d, Unflatten, CellDict / ModuleDict,
and Linear (Dense with PyTorch's argument names)."""
import os

import numpy as np

from .. import _C
from .. import ops
from .cell import Cell
from .._tensor import Tensor
from .layers import Conv2d, Dense, Dropout
from .parameter import Parameter

try:
    _PHYSICAL_MEMORY = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
except (ValueError, OSError, AttributeError):  # not POSIX: no bound beyond the allocator's
    _PHYSICAL_MEMORY = float("inf")


# ---- activations ------------------------------------------------------------------------------

class LeakyReLU(Cell):
    """x where x >= 0, alpha * x below (MindSpore's alpha; PyTorch's negative_slope)."""

    def __init__(self, alpha=0.2, negative_slope=None):
        super().__init__()
        self.alpha = float(alpha if negative_slope is None else negative_slope)

    def construct(self, x):
        return ops.leaky_relu(x, self.alpha)


class PReLU(Cell):
    """LeakyReLU with a learned slope per channel (axis 1), MindSpore's channel / w (PyTorch's
    num_parameters / init)."""

    def __init__(self, channel=1, w=0.25, num_parameters=None, init=None):
        super().__init__()
        n = int(channel if num_parameters is None else num_parameters)
        value = float(w if init is None else init)
        self.w = Parameter(ops.full((n,), value), name="w")

    def construct(self, x):
        return ops.prelu(x, self.w)


class ELU(Cell):
    """x above 0, alpha (exp(x) - 1) below."""

    def __init__(self, alpha=1.0):
        super().__init__()
        self.alpha = float(alpha)

    def construct(self, x):
        return ops.elu(x, self.alpha)


class Softplus(Cell):
    """log(1 + exp(beta x)) / beta, x itself where beta x > threshold (PyTorch's numerics)."""

    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        self.beta, self.threshold = float(beta), float(threshold)

    def construct(self, x):
        return ops.softplus(x, self.beta, self.threshold)


class HSigmoid(Cell):
    """relu6(x + 3) / 6."""

    def construct(self, x):
        return ops.hardsigmoid(x)


class HSwish(Cell):
    """x * relu6(x + 3) / 6."""

    def construct(self, x):
        return ops.hardswish(x)


class Mish(Cell):
    """x * tanh(softplus(x))."""

    def construct(self, x):
        return ops.mish(x)


Hardswish, Hardsigmoid = HSwish, HSigmoid


# ---- convolution, normalization, pooling, resizing --------------------------------------------

class Conv1d(Cell):
    """1-D convolution over (N, C, L), MindSpore's arguments (pad_mode 'same' | 'valid' | 'pad',
    padding an int or (left, right)): Conv2d over a height of 1."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, pad_mode="same", padding=0, dilation=1,
                 group=1, has_bias=False, weight_init=None, bias_init=None, dtype=_C.float32):
        super().__init__()
        if not isinstance(kernel_size, int) or not isinstance(stride, int) or not isinstance(dilation, int):
            raise TypeError("Conv1d: kernel_size, stride and dilation must be ints")
        pads = (0, 0, padding, padding) if isinstance(padding, int) else (0, 0) + tuple(padding)
        self.conv = Conv2d(in_channels, out_channels, (1, kernel_size), (1, stride), pad_mode, pads, (1, dilation),
                           group, has_bias, weight_init, bias_init, dtype=dtype)

    def construct(self, x):
        if x.ndim != 3:
            raise ValueError(f"Conv1d: expected input of shape (N, C, L), got {list(x.shape)}")
        y = self.conv(ops.unsqueeze(x, 2))
        return ops.squeeze(y, 2)


class GroupNorm(Cell):
    """Normalizes each group of num_channels / num_groups channels over them and the spatial axes."""

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True):
        super().__init__()
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_groups {num_groups} must divide num_channels {num_channels}")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, float(eps), affine
        if affine:
            self.gamma = Parameter(ops.ones(num_channels), name="gamma")
            self.beta = Parameter(ops.zeros(num_channels), name="beta")

    def construct(self, x):
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ValueError(f"GroupNorm: expected (N, {self.num_channels}, ...), got {list(x.shape)}")
        n = x.shape[0]
        g = ops.reshape(x, n, self.num_groups, -1)
        mean = g.mean(-1, keepdims=True)
        var = ((g - mean) ** 2).mean(-1, keepdims=True)
        y = ops.reshape((g - mean) * ops.rsqrt(var + self.eps), *x.shape)
        if self.affine:
            shape = [1, self.num_channels] + [1] * (x.ndim - 2)
            y = y * ops.reshape(self.gamma, *shape) + ops.reshape(self.beta, *shape)
        return y


class InstanceNorm2d(GroupNorm):
    """Each channel of each sample normalized over its spatial axes (GroupNorm, one channel a group);
    affine as MindSpore's default (True)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, **kwargs):
        super().__init__(num_features, num_features, eps, affine)


class AdaptiveAvgPool2d(Cell):
    """Average pooling to output_size (an int or (h, w); None keeps that size): PyTorch's windows,
    [floor(i * H / h), ceil((i + 1) * H / h)), each the mean of its elements (an inf or NaN stays
    in its own windows)."""

    def __init__(self, output_size):
        super().__init__()
        sizes = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
        if len(sizes) != 2 or not all(v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0)
                                      for v in sizes):
            raise ValueError(f"AdaptiveAvgPool2d: output_size must be a positive int or a pair of them (or None), "
                             f"got {output_size!r}")
        self.output_size = sizes

    @staticmethod
    def _pool_axis(x, axis, out):
        """x pooled along axis to out windows: one gather of the windows' elements (padded to the
        widest by repeating its first, masked out of the sum), so the work is one op, not a loop
        over windows."""
        size = x.shape[axis]
        if size == out:
            return x
        if size % out == 0:  # equal windows: one reshape and one mean
            shape = list(x.shape)
            return x.reshape(tuple(shape[:axis]) + (out, size // out) + tuple(shape[axis + 1:])).mean(axis + 1)
        i = np.arange(out, dtype=np.int64)
        start, end = (i * size) // out, -((-(i + 1) * size) // out)
        width = end - start
        at = start[:, None] + np.arange(int(width.max()), dtype=np.int64)[None, :]
        inside = at < end[:, None]
        moved = ops.swapaxes(x, axis, -1)  # (..., size)
        taken = ops.gather(moved, Tensor(np.where(inside, at, start[:, None])), -1)  # (..., out, widest)
        mean = ops.sum(ops.where(Tensor(inside), taken, 0.0), -1) / Tensor(width.astype(np.float64)).astype(x.dtype)
        return ops.swapaxes(mean, axis, -1)

    def construct(self, x):
        if x.ndim != 4:
            raise ValueError(f"AdaptiveAvgPool2d: expected (N, C, H, W), got {list(x.shape)}")
        h, w = x.shape[2], x.shape[3]
        oh = h if self.output_size[0] is None else self.output_size[0]
        ow = w if self.output_size[1] is None else self.output_size[1]
        need = x.shape[0] * x.shape[1] * (oh * max(h // oh + 2, 1) + oh * ow * max(w // ow + 2, 1)) * x.dtype.itemsize
        if need > _PHYSICAL_MEMORY:
            raise MemoryError(f"AdaptiveAvgPool2d: output_size ({oh}, {ow}) for input of shape {list(x.shape)} needs "
                              f"about {need} bytes, more than this machine's memory")
        if oh == 1 and ow == 1:
            return x.mean((2, 3), keepdims=True)
        return self._pool_axis(self._pool_axis(x, 2, oh), 3, ow)


class Upsample(Cell):
    """Resizes (N, C, ...) by scale_factor or to size through ops.interpolate: mode 'nearest'
    (default), 'linear', 'bilinear' or 'trilinear' (align_corners as PyTorch's)."""

    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None, recompute_scale_factor=None):
        super().__init__()
        if mode not in ("nearest", "linear", "bilinear", "trilinear"):
            raise ValueError(f"Upsample: mode must be 'nearest', 'linear', 'bilinear' or 'trilinear', got {mode!r}")
        if (size is None) == (scale_factor is None):
            raise ValueError("Upsample: give exactly one of size and scale_factor")
        if mode == "nearest" and align_corners is not None:
            raise ValueError("Upsample: align_corners is for the linear modes, not 'nearest'")
        self.size, self.scale_factor, self.mode = size, scale_factor, mode
        self.align_corners, self.recompute_scale_factor = align_corners, recompute_scale_factor

    def construct(self, x):
        if x.ndim not in (3, 4, 5):
            raise ValueError(f"Upsample: expected (N, C, spatial...) with 1 to 3 spatial axes, got {list(x.shape)}")
        return ops.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners,
                               self.recompute_scale_factor)


class PixelShuffle(Cell):
    """(N, C r^2, H, W) -> (N, C, H r, W r)."""

    def __init__(self, upscale_factor):
        super().__init__()
        self.r = int(upscale_factor)

    def construct(self, x):
        n, c, h, w = x.shape
        r = self.r
        if c % (r * r):
            raise ValueError(f"PixelShuffle: channels {c} must be a multiple of {r * r}")
        y = ops.reshape(x, n, c // (r * r), r, r, h, w).transpose(0, 1, 4, 2, 5, 3)
        return ops.reshape(y, n, c // (r * r), h * r, w * r)


class PixelUnshuffle(Cell):
    """(N, C, H r, W r) -> (N, C r^2, H, W)."""

    def __init__(self, downscale_factor):
        super().__init__()
        self.r = int(downscale_factor)

    def construct(self, x):
        n, c, hr, wr = x.shape
        r = self.r
        if hr % r or wr % r:
            raise ValueError(f"PixelUnshuffle: height and width {hr, wr} must be multiples of {r}")
        y = ops.reshape(x, n, c, hr // r, r, wr // r, r).transpose(0, 1, 3, 5, 2, 4)
        return ops.reshape(y, n, c * r * r, hr // r, wr // r)


class Dropout2d(Dropout):
    """Zeroes whole channels with probability p in training (the rest scaled by 1 / (1 - p));
    the identity in eval mode (Dropout's arguments)."""

    def construct(self, x):
        if not self.training or self.p == 0.0:
            return x
        keep = (ops.rand(x.shape[0], x.shape[1], *([1] * (x.ndim - 2))) >= self.p).astype(x.dtype)
        return x * keep * (1.0 / (1.0 - self.p))


class Unflatten(Cell):
    """Axis `axis` unflattened into unflattened_size."""

    def __init__(self, axis, unflattened_size):
        super().__init__()
        self.axis, self.sizes = int(axis), tuple(unflattened_size)

    def construct(self, x):
        axis = self.axis % x.ndim
        shape = list(x.shape)
        return ops.reshape(x, *(shape[:axis] + list(self.sizes) + shape[axis + 1:]))


class CellDict(Cell):
    """Cells by name, registered as sub-cells (their parameters named '<key>.<param>')."""

    def __init__(self, cells=None):
        super().__init__()
        self._keys = []
        for k, v in (cells.items() if isinstance(cells, dict) else (cells or [])):
            self[k] = v

    def __setitem__(self, key, cell):
        if not isinstance(key, str) or not isinstance(cell, Cell):
            raise TypeError("CellDict: keys are str and values Cells")
        if key not in self._keys:
            self._keys.append(key)
        self.insert_child_to_cell(key, cell)

    def __getitem__(self, key):
        if key not in self._keys:
            raise KeyError(key)
        return self._cells[key]

    def __delitem__(self, key):
        self._keys.remove(key)
        del self._cells[key]

    def __contains__(self, key):
        return key in self._keys

    def __len__(self):
        return len(self._keys)

    def __iter__(self):
        return iter(list(self._keys))

    def keys(self):
        return list(self._keys)

    def values(self):
        return [self._cells[k] for k in self._keys]

    def items(self):
        return [(k, self._cells[k]) for k in self._keys]

    def construct(self, *inputs):
        raise TypeError("CellDict is a container: call its cells")


ModuleDict = CellDict


class Linear(Dense):
    """nn.Dense with PyTorch's argument names (bias=True by default, as torch.nn.Linear)."""

    def __init__(self, in_features, out_features, bias=True, dtype=_C.float32):
        super().__init__(in_features, out_features, has_bias=bias, dtype=dtype)


__all__ = ["LeakyReLU", "PReLU", "ELU", "Softplus", "HSigmoid", "HSwish", "Hardsigmoid", "Hardswish", "Mish",
           "Conv1d", "GroupNorm", "InstanceNorm2d", "AdaptiveAvgPool2d", "Upsample", "PixelShuffle", "PixelUnshuffle",
           "Dropout2d", "Unflatten", "CellDict", "ModuleDict", "Linear"]
