"""Neural-network ops: linear algebra, convolution, pooling, normalization, dropout."""
import math

from .. import _C
from .._optable import OP
from ._util import apply, as_tensor, pair
from .array import reshape, swapaxes
from .attention_masks import additive_mask, check_mask, fused_mask, masked_attention
from .math import softmax


def matmul(input, other):
    """Matrix product with NumPy semantics (1-D operands, batch broadcasting)."""
    return apply(OP.matmul, (as_tensor(input), as_tensor(other)))


def _fold_heads(q, k, v, same_dtype=True):
    """Whether q, k, v are what the op takes: one dtype (unless not same_dtype), shapes (..., Hq,
    Lq, D), (..., Hk, Lk, D), (..., Hk, Lk, Dv) (anything else goes to the op, which says what is
    wrong)."""
    if not (q.ndim >= 3 and k.ndim == q.ndim and v.ndim == q.ndim and (q.dtype == k.dtype == v.dtype or not same_dtype)):
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


def attention_choice(q, k, v, masked=False, is_causal=False, dropout_p=0.0, backward=False):
    """(fused, fused cost, unfused cost, why): the cost model's choice between the fused attention
    op and the unfused ops for these operands (kiln._C.attention_choice, src/ops/attention_cost.c;
    the O1 pass fuse_attention decides by the same model). Symbolic sizes: unfused."""
    sizes = tuple(q.shape[:-1]) + (k.shape[-2], q.shape[-1], v.shape[-1])
    if not all(type(n) is int for n in sizes):  # a dynamic capture's SymInt passes isinstance(n, int)
        return False, 0.0, 0.0, "symbolic sizes"
    heads = math.prod(q.shape[:-2])
    return _C.attention_choice(heads, q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1], q.dtype, bool(is_causal),
                               bool(masked), bool(dropout_p), bool(backward))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """softmax(scale * query @ keyᵀ + mask) @ value over the last two axes, PyTorch's
    F.scaled_dot_product_attention. query (..., Hq, Lq, D), key (..., Hk, Lk, D), value
    (..., Hk, Lk, Dv), equal leading axes and Hq a multiple of Hk: query head h attends with kv head
    h // (Hq // Hk), without copies of key and value. scale defaults to 1 / sqrt(D).
    attn_mask: bool (True: the key takes part) or floating point (added to the scores), broadcasting
    against (..., Hq, Lq, Lk); is_causal=True: query i sees keys j <= i; dropout_p: dropout on the
    probabilities (pass it only when training, as in PyTorch).
    The fused blockwise op (FlashAttention-2's loops, masks and the causal flag included, its
    backward recomputing the score blocks) or the unfused ops, as the cost model chooses per shape
    and CPU (attention_choice), with or without gradients; dropout and a mask that needs a
    gradient run the unfused ops."""
    q, k, v = as_tensor(query), as_tensor(key), as_tensor(value)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.ndim and q.shape[-1] else 1.0
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"scaled_dot_product_attention: dropout_p must be in [0, 1), got {dropout_p}")
    check_mask(attn_mask, is_causal)
    # under amp the op casts float operands of mixed dtypes to one, so only their shapes are checked
    # (a validating call there would not raise: it would compute an attention thrown away)
    if not _fold_heads(q, k, v, same_dtype=_C.amp_state() is None):
        apply(OP.attention, (q, k, v), (), (float(scale),))  # raises: names what is wrong
    records = _C.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, attn_mask) if t is not None)
    mask_grad = records and attn_mask is not None and attn_mask.requires_grad
    fused = not mask_grad and attention_choice(q, k, v, attn_mask is not None, is_causal, dropout_p, records)[0]
    if fused:
        ins = (q, k, v)
        if attn_mask is not None:
            ins += (fused_mask(attn_mask, tuple(q.shape[:-1]) + (k.shape[-2],)),)
        out, _ = apply(OP.attention, ins, (int(bool(is_causal)),), (float(scale),))
        return out
    if attn_mask is not None or is_causal or dropout_p:
        mask = additive_mask(attn_mask, is_causal, q.shape[-2], k.shape[-2], q.dtype)
        return masked_attention(q, k, v, mask, dropout_p, float(scale), matmul, dropout)
    return _unfused_attention(q, k, v, float(scale))


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
