"""scaled_dot_product_attention's masks, causal flag and dropout: their checks, the mask as the
fused attention op takes it, and the unfused ops (scores, the mask added, softmax, dropout, the
product with value) for the calls the cost model leaves unfused, dropout's, and those whose mask
needs a gradient. Query heads that share a kv head (grouped-query attention) are folded onto it, as
the unmasked path does, and the mask is broadcast to the folded layout."""
import math

from .. import _C
from .array import arange, broadcast_to, full, reshape, swapaxes
from .math import softmax, where

_TensorBase = _C.TensorBase


def check_mask(attn_mask, is_causal):
    """Refuses what scaled_dot_product_attention cannot take: a mask that is no tensor, or is
    neither bool nor floating point, and a mask given with is_causal=True."""
    if attn_mask is not None and not isinstance(attn_mask, _TensorBase):
        raise TypeError(f"scaled_dot_product_attention: attn_mask must be a tensor or None, got "
                        f"{type(attn_mask).__name__} (pass the scale by keyword: scale=...)")
    if attn_mask is not None and is_causal:
        raise ValueError("scaled_dot_product_attention: give attn_mask or is_causal=True, not both")
    if attn_mask is not None and attn_mask.dtype != _C.bool and not attn_mask.dtype.is_floating_point:
        raise TypeError(f"scaled_dot_product_attention: attn_mask must be bool or floating point, got "
                        f"{attn_mask.dtype.name}")


def fused_mask(attn_mask, scores_shape):
    """The mask as the fused attention op takes it: the scores' number of axes (leading axes of 1
    added), each axis 1 or the scores' size; a mask that does not broadcast so raises."""
    shape = tuple(attn_mask.shape)
    nd = len(scores_shape)
    if len(shape) > nd or any(m not in (1, s) for m, s in zip(shape[::-1], scores_shape[::-1])):
        raise ValueError(f"scaled_dot_product_attention: attn_mask of shape {list(shape)} does not broadcast "
                         f"to the scores' shape {list(scores_shape)}")
    return reshape(attn_mask, (1,) * (nd - len(shape)) + shape) if len(shape) < nd else attn_mask


def additive_mask(attn_mask, is_causal, lq, lk, dtype):
    """The mask as a float tensor added to the scores (None: none). attn_mask: bool (True: the key
    takes part, PyTorch's F.scaled_dot_product_attention; not nn.MultiheadAttention's sense) or
    floating point (added); is_causal: query i sees keys j <= i (top-left aligned)."""
    check_mask(attn_mask, is_causal)
    if is_causal:
        attn_mask = reshape(arange(lk), 1, lk) <= reshape(arange(lq), lq, 1)
    if attn_mask is None:
        return None
    if attn_mask.dtype == _C.bool:
        return where(attn_mask, full((), 0.0, dtype), full((), -math.inf, dtype))
    return attn_mask


def masked_attention(q, k, v, mask, dropout_p, scale, matmul, dropout):
    """softmax(q kᵀ scale + mask) v with dropout on the probabilities. q (..., Hq, Lq, D), k and v
    (..., Hk, Lk, ·) with Hq a multiple of Hk; mask (additive) broadcasting against (..., Hq, Lq, Lk)."""
    lead, (hq, lq, d), (hk, lk, dv) = tuple(q.shape[:-3]), q.shape[-3:], v.shape[-3:]
    g = hq // hk
    full_shape = lead + (hq, lq, lk)
    try:
        mask = None if mask is None else broadcast_to(mask, full_shape)
    except (ValueError, TypeError) as e:
        raise ValueError(f"scaled_dot_product_attention: attn_mask of shape {list(mask.shape)} does not broadcast "
                         f"to the scores' shape {list(full_shape)}") from e
    qf = reshape(q, lead + (hk, g * lq, d))  # query heads folded per kv head
    scores = matmul(qf, swapaxes(k, -1, -2)) * scale
    if mask is not None:
        scores = scores + reshape(mask, lead + (hk, g * lq, lk))
    probs = softmax(scores, -1)
    if dropout_p:
        probs = dropout(probs, dropout_p, True)
    return reshape(matmul(probs, v), lead + (hq, lq, dv))
