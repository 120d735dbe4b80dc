"""Neural-network ops: linear algebra, convolution, pooling, normalization, dropout."""
import math

from .. import _C
from .._optable import OP
from ._util import apply, as_tensor, pair
from .array import reshape, swapaxes
from .attention_masks import additive_mask, masked_attention
from .math import softmax


def matmul(input, other):
    """Matrix product with NumPy semantics (1-D operands, batch broadcasting)."""
    return apply(OP.matmul, (as_tensor(input), as_tensor(other)))


# When the fused op runs: only for calls that record no gradients, with at least FUSED_MIN_KEYS keys;
# every other call runs the unfused ops (matmul, softmax, matmul). bench/bench_flash.py on a quiet
# 2-core AVX2 EPYC (README, "Attention core"): fused / unfused 0.91-1.01 forward at 512 keys and
# 0.94-0.97 at 1024, but 1.06-1.10 at 256 keys, and 1.03-1.29 forward+backward (the blockwise
# backward recomputes each score block: five products per block pair against the unfused
# backward's four, which keeps the probabilities).
FUSED_MIN_KEYS = 512


def _fold_heads(q, k, v):
    """Whether q, k, v are what the op takes: one dtype, shapes (..., Hq, Lq, D), (..., Hk, Lk, D),
    (..., Hk, Lk, Dv) (anything else goes to the op, which says what is wrong)."""
    if not (q.ndim >= 3 and k.ndim == q.ndim and v.ndim == q.ndim and q.dtype == k.dtype == v.dtype):
        return False
    qs, ks, vs = q.shape, k.shape, v.shape
    return (qs[:-3] == ks[:-3] == vs[:-3] and ks[-3] == vs[-3] and ks[-3] > 0 and qs[-3] % ks[-3] == 0
            and ks[-2] == vs[-2] and ks[-1] == qs[-1])


def _unfused_attention(q, k, v, scale):
    """The same product by the unfused ops, query heads folded per kv head."""
    lead, (hq, lq, d), (hk, lk, dv) = tuple(q.shape[:-3]), q.shape[-3:], v.shape[-3:]
    qf = reshape(q, lead + (hk, hq // hk * lq, d))
    out = matmul(softmax(matmul(qf, swapaxes(k, -1, -2)) * scale, -1), v)
    return reshape(out, lead + (hq, lq, dv))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """softmax(scale * query @ keyᵀ + mask) @ value over the last two axes, PyTorch's
    F.scaled_dot_product_attention. query (..., Hq, Lq, D), key (..., Hk, Lk, D), value
    (..., Hk, Lk, Dv), equal leading axes and Hq a multiple of Hk: query head h attends with kv head
    h // (Hq // Hk), without copies of key and value. scale defaults to 1 / sqrt(D).
    attn_mask: bool (True: the key takes part) or floating point (added to the scores), broadcasting
    against (..., Hq, Lq, Lk); is_causal=True: query i sees keys j <= i; dropout_p: dropout on the
    probabilities (pass it only when training, as in PyTorch).
    Without mask or dropout, calls that record no gradients and have at least FUSED_MIN_KEYS keys
    run one blockwise op that never holds the score matrix (FlashAttention-2's loops); others the
    unfused ops (measured faster there on this project's machine)."""
    q, k, v = as_tensor(query), as_tensor(key), as_tensor(value)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.ndim and q.shape[-1] else 1.0
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"scaled_dot_product_attention: dropout_p must be in [0, 1), got {dropout_p}")
    if attn_mask is not None or is_causal or dropout_p:
        if not _fold_heads(q, k, v):
            apply(OP.attention, (q, k, v), (), (float(scale),))  # raises: names what is wrong
        mask = additive_mask(attn_mask, is_causal, q.shape[-2], k.shape[-2], q.dtype)
        return masked_attention(q, k, v, mask, dropout_p, float(scale), matmul, dropout)
    records = _C.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    keys = k.shape[-2] if k.ndim >= 2 else 0
    fused = not records and isinstance(keys, int) and keys >= FUSED_MIN_KEYS  # a symbolic length: unfused
    if not fused and _fold_heads(q, k, v):
        return _unfused_attention(q, k, v, float(scale))
    out, _ = apply(OP.attention, (q, k, v), (), (float(scale),))
    return out


def dense(input, weight, bias=None):
    """input @ weight.T + bias, weight of shape (out_features, in_features)."""
    ins = (as_tensor(input), as_tensor(weight)) + ((as_tensor(bias),) if bias is not None else ())
    return apply(OP.linear, ins)


linear = dense


def _conv_padding(op, pad_mode, padding, x, weight, stride, dilation):
    """(top, bottom, left, right) for pad_mode 'pad' | 'same' | 'valid'."""
    if pad_mode == "valid":
        return (0, 0, 0, 0)
    if pad_mode == "same":
        pads = []
        for d in range(2):
            size = x.shape[2 + d]
            k = (weight.shape[2 + d] - 1) * dilation[d] + 1
            out = -(-size // stride[d])
            total = max(0, (out - 1) * stride[d] + k - size)
            pads += [total // 2, total - total // 2]
        return tuple(pads)
    if pad_mode != "pad":
        raise ValueError(f"{op}: pad_mode must be 'pad', 'same' or 'valid', got {pad_mode!r}")
    if isinstance(padding, int):
        return (padding,) * 4
    if isinstance(padding, (tuple, list)) and len(padding) == 2:
        return (padding[0], padding[0], padding[1], padding[1])
    if isinstance(padding, (tuple, list)) and len(padding) == 4:
        return tuple(padding)
    raise TypeError(f"{op}: padding must be an int, (h, w) or (top, bottom, left, right), got {padding!r}")


def conv2d(input, weight, bias=None, stride=1, pad_mode="pad", padding=0, dilation=1, groups=1):
    """2-D convolution over NCHW input with OIHW weight."""
    x, w = as_tensor(input), as_tensor(weight)
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError(f"conv2d: expected 4-D input and weight, got shapes {x.shape} and {w.shape}")
    stride, dilation = pair("conv2d", "stride", stride), pair("conv2d", "dilation", dilation)
    pads = _conv_padding("conv2d", pad_mode, padding, x, w, stride, dilation)
    ins = (x, w) + ((as_tensor(bias),) if bias is not None else ())
    return apply(OP.conv2d, ins, stride + pads + dilation + (groups,))


def _pool_attrs(op, kernel_size, stride, padding, dilation, ceil_mode, count_include_pad=True):
    k = pair(op, "kernel_size", kernel_size)
    s = k if stride is None else pair(op, "stride", stride)
    if isinstance(padding, int):
        p = (padding,) * 4
    elif isinstance(padding, (tuple, list)) and len(padding) == 2:
        p = (padding[0], padding[0], padding[1], padding[1])
    else:
        p = tuple(padding)
    return k + s + p + pair(op, "dilation", dilation) + (bool(ceil_mode), bool(count_include_pad))


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Max over kernel_size windows of NCHW input."""
    return apply(OP.max_pool2d, (as_tensor(input),), _pool_attrs("max_pool2d", kernel_size, stride, padding,
                                                                  dilation, ceil_mode))


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """Average over kernel_size windows of NCHW input."""
    return apply(OP.avg_pool2d, (as_tensor(input),), _pool_attrs("avg_pool2d", kernel_size, stride, padding, 1,
                                                                  ceil_mode, count_include_pad))


def batch_norm(input, running_mean, running_var, weight, bias, training=False, momentum=0.1, eps=1e-5):
    """Batch normalization over axis 1. In training the running statistics are updated in place
    with weight `momentum` for the new batch (PyTorch's convention)."""
    x = as_tensor(input)
    y, _, _ = apply(OP.batch_norm, (x, as_tensor(weight), as_tensor(bias), running_mean, running_var),
                    (bool(training),), (float(eps), float(momentum)))
    return y


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalizes over the trailing `normalized_shape` axes."""
    x = as_tensor(input)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if x.shape[len(x.shape) - len(shape):] != shape:
        raise ValueError(f"layer_norm: normalized_shape {shape} does not match the end of input shape {x.shape}")
    from .array import full

    if weight is None:
        weight = full(shape, 1.0, x.dtype)
    if bias is None:
        bias = full(shape, 0.0, x.dtype)
    y, _, _ = apply(OP.layer_norm, (x, as_tensor(weight), as_tensor(bias)), (len(shape),), (float(eps),))
    return y


def rms_norm(input, weight, eps=1e-6):
    """x / sqrt(mean(x^2) + eps) * weight over the trailing axes of weight's shape."""
    x, w = as_tensor(input), as_tensor(weight)
    y, _ = apply(OP.rms_norm, (x, w), (w.ndim,), (float(eps),))
    return y


def dropout(input, p=0.5, training=True):
    """Zeroes elements with probability p and scales the rest by 1/(1-p) (when training)."""
    x = as_tensor(input)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout: p must be in [0, 1), got {p}")
    if not training or p == 0.0:
        return x
    y, _ = apply(OP.dropout, (x,), (), (float(p),))
    return y


def stop_gradient(input):
    """input without autograd history: no gradient flows back through it."""
    return as_tensor(input).detach()
