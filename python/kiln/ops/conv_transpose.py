"""Transposed 2-D convolution (the gradient of conv2d with respect to its input, as a forward op)
and the 3-D convolution, both exact compositions of kiln's convolution ops."""
from .._optable import OP
from ._util import apply, as_tensor, pair
from .array import concat, narrow, permute, reshape, zeros
from .nn_functional import conv2d


def _quad(op, name, v):
    """An int, (h, w) or (top, bottom, left, right) as (top, bottom, left, right), none negative."""
    if isinstance(v, int) and not isinstance(v, bool):
        v = (v,) * 4
    elif isinstance(v, (tuple, list)) and len(v) == 2:
        v = (v[0], v[0], v[1], v[1])
    if not (isinstance(v, (tuple, list)) and len(v) == 4 and all(isinstance(p, int) and not isinstance(p, bool)
                                                                   for p in v)):
        raise TypeError(f"{op}: {name} must be an int, (h, w) or (top, bottom, left, right), got {v!r}")
    if any(p < 0 for p in v):
        raise ValueError(f"{op}: {name} must not be negative, got {tuple(v)!r}")
    return tuple(v)


def _check_operands(op, x, w, groups):
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError(f"{op}: expected input (N, C_in, H, W) and weight (C_in, C_out / groups, kH, kW), "
                         f"got shapes {list(x.shape)} and {list(w.shape)}")
    if not (x.dtype.is_floating_point and w.dtype.is_floating_point):
        raise TypeError(f"{op}: expected floating-point input and weight, got {x.dtype.name} and {w.dtype.name}")
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"{op}: groups must be a positive int, got {groups!r}")
    if w.shape[0] % groups:
        raise ValueError(f"{op}: groups={groups} does not divide the {w.shape[0]} input channels of weight "
                         f"shape {list(w.shape)}")
    if x.shape[1] != w.shape[0]:
        raise ValueError(f"{op}: input of shape {list(x.shape)} has {x.shape[1]} channels, but weight of shape "
                         f"{list(w.shape)} expects {w.shape[0]}")


def transposed_conv(op, x, w, bias, stride, pads, dilation, groups, out_hw):
    """The transposed convolution of x (N, C_in, H, W) by w (C_in, C_out / groups, kH, kW) onto an output
    of out_hw = (oh, ow), which starts `pads` (top, _, left, _) before the first input's window:
    output row o receives input row i through kernel row k where o = i * stride - top + k * dilation.

    It is conv2d_backward_input, the adjoint of conv2d(., w) with the same stride, padding, dilation
    and groups. That op needs the forward convolution of the output size to give back H: its bottom
    padding is chosen so; rows past the last one any input reaches (asked for by output_padding or
    'same') are zeros, joined after it."""
    x, w = as_tensor(x), as_tensor(w)
    _check_operands(op, x, w, groups)
    n, _, h, wd = x.shape
    kernel = (w.shape[2], w.shape[3])
    cout = w.shape[1] * groups
    sizes, kpads, extra = [], [], []
    for d, size in enumerate((h, wd)):
        ek = (kernel[d] - 1) * dilation[d] + 1
        top, out = pads[2 * d], out_hw[d]
        if out < 1:
            raise ValueError(f"{op}: output size {tuple(out_hw)} is not positive for input {list(x.shape)}, weight "
                             f"{list(w.shape)}, stride {stride}, padding {pads}, dilation {dilation}")
        bottom = (size - 1) * stride[d] - out - top + ek  # makes the forward output size `size`
        reached = out + min(bottom, 0)  # rows past (size-1)*stride - top + ek - 1 get nothing
        if reached < 1:
            raise ValueError(f"{op}: padding {pads} leaves no output row reached by input {list(x.shape)} with "
                             f"weight {list(w.shape)}")
        sizes.append(reached)
        kpads += [top, max(bottom, 0)]
        extra.append(out - reached)
    attrs = tuple(stride) + tuple(kpads) + tuple(dilation) + (groups, n, cout, sizes[0], sizes[1])
    y = apply(OP.conv2d_backward_input, (x, w), attrs)
    if extra[0]:
        y = concat((y, zeros(n, cout, extra[0], sizes[1], dtype=y.dtype)), 2)
    if extra[1]:
        y = concat((y, zeros(n, cout, out_hw[0], extra[1], dtype=y.dtype)), 3)
    if bias is not None:
        b = as_tensor(bias)
        if b.ndim != 1 or b.shape[0] != cout:
            raise ValueError(f"{op}: bias of shape {list(b.shape)} does not match the {cout} output channels")
        y = y + reshape(b, (1, cout, 1, 1))
    return y


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """Transposed 2-D convolution of input (N, C_in, H, W) by weight (C_in, C_out / groups, kH, kW):
    output size (H - 1) * stride - 2 * padding + dilation * (kH - 1) + output_padding + 1 per axis
    (padding an int or (h, w); output_padding below stride or dilation), PyTorch's
    conv_transpose2d."""
    op = "conv_transpose2d"
    x, w = as_tensor(input), as_tensor(weight)
    _check_operands(op, x, w, groups)
    stride, dilation = pair(op, "stride", stride), pair(op, "dilation", dilation)
    if min(stride) < 1 or min(dilation) < 1:
        raise ValueError(f"{op}: stride {stride} and dilation {dilation} must be positive")
    pads = _quad(op, "padding", padding)
    if isinstance(padding, (tuple, list)) and len(padding) == 4:
        raise TypeError(f"{op}: padding must be an int or (h, w), got {padding!r}")
    out_pad = pair(op, "output_padding", output_padding)
    out_hw = []
    for d in range(2):
        if not 0 <= out_pad[d] < max(stride[d], dilation[d]):
            raise ValueError(f"{op}: output_padding {out_pad} must be below stride {stride} or dilation {dilation}")
        ek = (w.shape[2 + d] - 1) * dilation[d] + 1
        out_hw.append((x.shape[2 + d] - 1) * stride[d] - pads[2 * d] - pads[2 * d + 1] + ek + out_pad[d])
    return transposed_conv(op, x, w, bias, stride, pads, dilation, groups, out_hw)


def _triple(op, name, v, low):
    t = (v,) * 3 if isinstance(v, int) and not isinstance(v, bool) else v
    if not (isinstance(t, (tuple, list)) and len(t) == 3
            and all(isinstance(a, int) and not isinstance(a, bool) and a >= low for a in t)):
        raise ValueError(f"{op}: {name} must be an int or three ints, each at least {low}, got {v!r}")
    return tuple(t)


def conv3d_pads(op, pad_mode, padding, size, kernel, stride, dilation):
    """(head, tail, top, bottom, left, right) for pad_mode 'pad' | 'same' | 'valid' (MindSpore's:
    'same' gives ceil(size / stride) outputs, the odd one of the padding at the end)."""
    if pad_mode == "valid":
        return (0,) * 6
    if pad_mode == "same":
        pads = []
        for d in range(3):
            ek = (kernel[d] - 1) * dilation[d] + 1
            total = max(0, (-(-size[d] // stride[d]) - 1) * stride[d] + ek - size[d])
            pads += [total // 2, total - total // 2]
        return tuple(pads)
    if pad_mode != "pad":
        raise ValueError(f"{op}: pad_mode must be 'pad', 'same' or 'valid', got {pad_mode!r}")
    if isinstance(padding, (tuple, list)) and len(padding) == 6:
        pads = tuple(padding)
    else:
        t = _triple(op, "padding", padding, 0)
        pads = (t[0], t[0], t[1], t[1], t[2], t[2])
    if not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in pads):
        raise ValueError(f"{op}: padding must be non-negative ints, got {padding!r}")
    return pads


def conv3d(input, weight, bias=None, stride=1, pad_mode="valid", padding=0, dilation=1, groups=1):
    """3-D convolution of input (N, C, D, H, W) by weight (O, C / groups, kD, kH, kW), MindSpore's
    ops.conv3d: stride and dilation an int or (d, h, w); padding (pad_mode 'pad') an int, (d, h, w)
    or (head, tail, top, bottom, left, right).

    One conv2d per kernel depth kd, the depth slices it reads folded into the batch, the kD
    results summed: exactly conv3d's products, no more, with conv2d's gradients."""
    op = "conv3d"
    x, w = as_tensor(input), as_tensor(weight)
    if x.ndim != 5 or w.ndim != 5:
        raise ValueError(f"{op}: expected input (N, C, D, H, W) and weight (O, C / groups, kD, kH, kW), got shapes "
                         f"{list(x.shape)} and {list(w.shape)}")
    stride, dilation = _triple(op, "stride", stride, 1), _triple(op, "dilation", dilation, 1)
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1 or x.shape[1] % groups \
            or w.shape[0] % groups or w.shape[1] * groups != x.shape[1]:
        raise ValueError(f"{op}: input of shape {list(x.shape)} and weight of shape {list(w.shape)} do not agree "
                         f"with groups={groups!r}")
    pads = conv3d_pads(op, pad_mode, padding, x.shape[2:], w.shape[2:], stride, dilation)
    n, c, depth, h, wd = x.shape
    kd = w.shape[2]
    parts = [x]
    if pads[0]:
        parts.insert(0, zeros(n, c, pads[0], h, wd, dtype=x.dtype))
    if pads[1]:
        parts.append(zeros(n, c, pads[1], h, wd, dtype=x.dtype))
    if len(parts) > 1:
        x = concat(parts, 2)
    padded = depth + pads[0] + pads[1]
    reach = (kd - 1) * dilation[0] + 1
    if reach > padded:
        raise ValueError(f"{op}: kernel depth {kd} (dilated {reach}) does not fit the padded input depth {padded}; "
                         f"input {list(input.shape)}, weight {list(w.shape)}")
    od = (padded - reach) // stride[0] + 1
    total = None
    for k in range(kd):
        # the depth slices k * dilation + j * stride for j < od, as a batch of 2-D images
        s = narrow(x, 2, k * dilation[0], (od - 1) * stride[0] + 1)
        if stride[0] > 1:
            s = concat((s, zeros(n, c, stride[0] - 1, h, wd, dtype=x.dtype)), 2)
            s = narrow(reshape(s, (n, c, od, stride[0], h, wd)), 3, 0, 1)
        s = reshape(permute(reshape(s, (n, c, od, h, wd)), (0, 2, 1, 3, 4)), (n * od, c, h, wd))
        wk = reshape(narrow(w, 2, k, 1), (w.shape[0], w.shape[1], w.shape[3], w.shape[4]))
        y = conv2d(s, wk, None, stride[1:], "pad", pads[2:], dilation[1:], groups)
        total = y if total is None else total + y
    oh, ow = total.shape[2], total.shape[3]
    out = permute(reshape(total, (n, od, w.shape[0], oh, ow)), (0, 2, 1, 3, 4))
    if bias is not None:
        b = as_tensor(bias)
        if b.ndim != 1 or b.shape[0] != w.shape[0]:
            raise ValueError(f"{op}: bias of shape {list(b.shape)} does not match weight of shape {list(w.shape)}")
        out = out + reshape(b, (1, w.shape[0], 1, 1, 1))
    return out
