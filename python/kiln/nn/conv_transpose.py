"""Transposed 2-D convolution (MindSpore's Conv2dTranspose, PyTorch's ConvTranspose2d) and the 3-D
convolution (Conv3d), over kiln.ops.conv_transpose's exact compositions of the convolution ops."""
import math

from .. import _C
from .. import ops
from ..ops import conv_transpose as _ct
from .cell import Cell
from .init import HeUniform, Uniform
from .layers import checked_pad_mode, new_param, positive_pair


def _out_padding(layer, v, stride, dilation):
    op = (v, v) if isinstance(v, int) and not isinstance(v, bool) else v
    if not (isinstance(op, (tuple, list)) and len(op) == 2 and all(isinstance(a, int) and a >= 0 for a in op)):
        raise ValueError(f"{layer}: output_padding must be a non-negative int or pair, got {v!r}")
    for d in range(2):
        if op[d] >= max(stride[d], dilation[d]):
            raise ValueError(f"{layer}: output_padding {tuple(op)} must be below stride {stride} or dilation "
                             f"{dilation}")
    return tuple(op)


class Conv2dTranspose(Cell):
    """Transposed 2-D convolution of (N, in_channels, H, W), MindSpore's arguments and defaults
    (pad_mode='same', has_bias=False); weight (in_channels, out_channels / group, kH, kW). Output
    size per axis: 'same' H * stride; 'valid' H * stride + max(dilated kernel - stride, 0); 'pad'
    (H - 1) * stride - (top + bottom) + dilated kernel; each plus output_padding (whose rows hold
    what the transposed convolution puts there, as PyTorch's). padding an int, (h, w) or
    (top, bottom, left, right)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, pad_mode="same", padding=0,
                 output_padding=0, dilation=1, group=1, has_bias=False, weight_init=None, bias_init=None,
                 dtype=_C.float32):
        super().__init__()
        name = type(self).__name__
        for arg, v in (("in_channels", in_channels), ("out_channels", out_channels), ("group", group)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: {arg} must be a positive int, got {v!r}")
        if in_channels % group or out_channels % group:
            raise ValueError(f"{name}: group {group} must divide in_channels {in_channels} and out_channels "
                             f"{out_channels}")
        self.in_channels, self.out_channels, self.group = in_channels, out_channels, group
        self.kernel_size = positive_pair(name, "kernel_size", kernel_size)
        self.stride = positive_pair(name, "stride", stride)
        self.dilation = positive_pair(name, "dilation", dilation)
        self.pad_mode = checked_pad_mode(name, pad_mode, padding)
        self.padding = _ct._quad(name, "padding", padding)
        self.output_padding = _out_padding(name, output_padding, self.stride, self.dilation)
        self.has_bias = bool(has_bias)
        shape = (in_channels, out_channels // group) + self.kernel_size
        self.weight = new_param(HeUniform(math.sqrt(5)) if weight_init is None else weight_init, shape, dtype)
        self.bias = None
        if self.has_bias:
            fan_in = out_channels // group * self.kernel_size[0] * self.kernel_size[1]
            self.bias = new_param(Uniform(1 / math.sqrt(fan_in)) if bias_init is None else bias_init,
                               (out_channels,), dtype)

    def _geometry(self, size):
        """(pads, output size) for an input of spatial size `size`."""
        pads, out = [], []
        for d in range(2):
            s, ek = self.stride[d], (self.kernel_size[d] - 1) * self.dilation[d] + 1
            if self.pad_mode == "same":
                total = max(0, ek - s)  # conv2d 'same' over an input of size * s
                pads += [total // 2, total - total // 2]
                o = size[d] * s
            elif self.pad_mode == "valid":
                pads += [0, 0]
                o = size[d] * s + max(ek - s, 0)
            else:
                top, bottom = self.padding[2 * d], self.padding[2 * d + 1]
                pads += [top, bottom]
                o = (size[d] - 1) * s - top - bottom + ek
            out.append(o + self.output_padding[d])
        return tuple(pads), tuple(out)

    def construct(self, x):
        name = type(self).__name__
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"{name}: expected input (N, {self.in_channels}, H, W), got {list(x.shape)}")
        pads, out = self._geometry(x.shape[2:])
        return _ct.transposed_conv(name, x, self.weight, self.bias, self.stride, pads, self.dilation, self.group,
                                   out)

    def extend_repr(self):
        return (f"input_channels={self.in_channels}, output_channels={self.out_channels}, "
                f"kernel_size={self.kernel_size}, stride={self.stride}, pad_mode={self.pad_mode}, "
                f"padding={self.padding}, output_padding={self.output_padding}, dilation={self.dilation}, "
                f"group={self.group}, has_bias={self.has_bias}")


class ConvTranspose2d(Conv2dTranspose):
    """Conv2dTranspose with PyTorch's arguments and defaults (padding an int or (h, w), symmetric;
    bias=True); forward(x, output_size=None) takes an output size as PyTorch's does."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1, padding_mode="zeros", dtype=_C.float32):
        if padding_mode != "zeros":
            raise ValueError(f"ConvTranspose2d: padding_mode {padding_mode!r} is not supported (only 'zeros')")
        if isinstance(padding, (tuple, list)) and len(padding) != 2:
            raise ValueError(f"ConvTranspose2d: padding must be an int or (h, w), got {padding!r}")
        super().__init__(in_channels, out_channels, kernel_size, stride, "pad", padding, output_padding, dilation,
                         groups, bias, dtype=dtype)
        self.groups = groups

    def construct(self, x, output_size=None):
        if output_size is None:
            return super().construct(x)
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"ConvTranspose2d: expected input (N, {self.in_channels}, H, W), got {list(x.shape)}")
        want = tuple(output_size)[-2:]
        pads, least = Conv2dTranspose._geometry(self, x.shape[2:])
        least = tuple(least[d] - self.output_padding[d] for d in range(2))
        for d in range(2):
            if not least[d] <= want[d] < least[d] + max(self.stride[d], self.dilation[d]):
                high = least[d] + max(self.stride[d], self.dilation[d]) - 1
                raise ValueError(f"ConvTranspose2d: output_size {tuple(output_size)} is not reachable from input "
                                 f"{list(x.shape)}: axis {d + 2} can be {least[d]} to {high}")
        return _ct.transposed_conv("ConvTranspose2d", x, self.weight, self.bias, self.stride, pads, self.dilation,
                                   self.group, want)


class Conv3d(Cell):
    """3-D convolution of (N, C, D, H, W), MindSpore's arguments and defaults (pad_mode='same',
    has_bias=False; padding an int, (d, h, w) or (head, tail, top, bottom, left, right)), through
    ops.conv3d (one 2-D convolution per kernel depth)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, pad_mode="same", padding=0, dilation=1,
                 group=1, has_bias=False, weight_init=None, bias_init=None, data_format="NCDHW", dtype=_C.float32):
        super().__init__()
        if data_format != "NCDHW":
            raise ValueError(f"Conv3d: only data_format='NCDHW' is supported, got {data_format!r}")
        for arg, v in (("in_channels", in_channels), ("out_channels", out_channels), ("group", group)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Conv3d: {arg} must be a positive int, got {v!r}")
        if in_channels % group or out_channels % group:
            raise ValueError(f"Conv3d: group {group} must divide in_channels {in_channels} and out_channels "
                             f"{out_channels}")
        mode = pad_mode.lower() if isinstance(pad_mode, str) else pad_mode
        if mode not in ("same", "valid", "pad"):
            raise ValueError(f"Conv3d: pad_mode must be 'same', 'valid' or 'pad', got {pad_mode!r}")
        if mode != "pad" and padding not in (0, (0, 0, 0), (0,) * 6):
            raise ValueError(f"Conv3d: padding {padding!r} needs pad_mode='pad', got pad_mode={pad_mode!r}")
        self.in_channels, self.out_channels, self.group, self.pad_mode = in_channels, out_channels, group, mode
        self.kernel_size = _ct._triple("Conv3d", "kernel_size", kernel_size, 1)
        self.stride = _ct._triple("Conv3d", "stride", stride, 1)
        self.dilation = _ct._triple("Conv3d", "dilation", dilation, 1)
        self.padding = _ct.conv3d_pads("Conv3d", "pad", padding, None, None, None, None) if mode == "pad" else 0
        self.has_bias = bool(has_bias)
        shape = (out_channels, in_channels // group) + self.kernel_size
        self.weight = new_param(HeUniform(math.sqrt(5)) if weight_init is None else weight_init, shape, dtype)
        self.bias = None
        if self.has_bias:
            fan_in = in_channels // group * self.kernel_size[0] * self.kernel_size[1] * self.kernel_size[2]
            self.bias = new_param(Uniform(1 / math.sqrt(fan_in)) if bias_init is None else bias_init,
                               (out_channels,), dtype)

    def construct(self, x):
        if x.ndim != 5 or x.shape[1] != self.in_channels:
            raise ValueError(f"Conv3d: expected input (N, {self.in_channels}, D, H, W), got {list(x.shape)}")
        return ops.conv3d(x, self.weight, self.bias, self.stride, self.pad_mode, self.padding, self.dilation,
                          self.group)


__all__ = ["Conv2dTranspose", "ConvTranspose2d", "Conv3d"]
