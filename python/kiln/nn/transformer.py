"""Attention and Transformer layers with PyTorch's semantics and parameter names (in_proj_weight,
out_proj.weight, linear1, norm1, layers.0...), so a PyTorch state dict maps onto them one to one:
MultiheadAttention, TransformerEncoderLayer, TransformerDecoderLayer, TransformerEncoder,
TransformerDecoder. Everything is a composition of kiln's ops (linear, matmul, softmax, the fused
attention op where no mask or weights are asked for, layer_norm, dropout)."""
import copy
import math

from .. import _C
from .. import ops
from .cell import Cell, CellList
from .init import HeUniform, Uniform, XavierUniform, initializer
from .layers import Dropout
from .parameter import Parameter


def _param(init, shape, dtype):
    return Parameter(initializer(init, shape, dtype))


class _Linear(Cell):
    """x @ weight.T + bias with PyTorch's names and initialization (weight, bias)."""

    def __init__(self, in_features, out_features, bias=True, dtype=_C.float32, zero_bias=False):
        super().__init__()
        self.weight = _param(HeUniform(math.sqrt(5)), (out_features, in_features), dtype)
        self.bias = None
        if bias:
            self.bias = _param("zeros" if zero_bias else Uniform(1 / math.sqrt(in_features)), (out_features,), dtype)

    def construct(self, x):
        return ops.dense(x, self.weight, self.bias)


class _LayerNorm(Cell):
    """Layer normalization over the last axis with PyTorch's parameter names (weight, bias)."""

    def __init__(self, d_model, eps, bias=True, dtype=_C.float32):
        super().__init__()
        self.eps = float(eps)
        self.weight = _param("ones", (d_model,), dtype)
        self.bias = _param("zeros", (d_model,), dtype) if bias else None

    def construct(self, x):
        return ops.layer_norm(x, (self.weight.shape[0],), self.weight, self.bias, self.eps)


def _additive(name, what, mask, dtype):
    """A mask as a float tensor to add to the scores: a bool mask's True is -inf (not attended)."""
    if mask.dtype.name == "bool":
        return ops.where(mask, float("-inf"), ops.zeros(*mask.shape, dtype=dtype))
    if not mask.dtype.is_floating_point:
        raise TypeError(f"{name}: {what} must be bool or floating point, got {mask.dtype.name}")
    return mask


class MultiheadAttention(Cell):
    """PyTorch's nn.MultiheadAttention: softmax(q kᵀ / sqrt(head_dim) + masks) v per head, with input
    and output projections. forward(query, key, value, key_padding_mask=None, need_weights=True,
    attn_mask=None, average_attn_weights=True, is_causal=False) -> (output, weights or None).
    Inputs (L, N, E) ((N, L, E) with batch_first, (L, E) unbatched); key_padding_mask (N, S) and
    attn_mask (L, S) or (N * num_heads, L, S), bool (True: not attended) or added to the scores.
    is_causal=True without attn_mask applies the causal mask (PyTorch asks for the mask too).
    has_bias is MindSpore's spelling of bias."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, has_bias=True, add_bias_kv=False, add_zero_attn=False,
                 kdim=None, vdim=None, batch_first=False, dtype=_C.float32, *, bias=None):
        super().__init__()
        if bias is not None:
            has_bias = bias
        for arg, v in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"MultiheadAttention: {arg} must be a positive int, got {v!r}")
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        if add_bias_kv or add_zero_attn:
            raise ValueError("MultiheadAttention: add_bias_kv and add_zero_attn are not supported")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MultiheadAttention: dropout must be in [0, 1), got {dropout}")
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self.dropout, self.batch_first = float(dropout), bool(batch_first)
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = _param(XavierUniform(), (3 * embed_dim, embed_dim), dtype)
        else:
            self.q_proj_weight = _param(XavierUniform(), (embed_dim, embed_dim), dtype)
            self.k_proj_weight = _param(XavierUniform(), (embed_dim, self.kdim), dtype)
            self.v_proj_weight = _param(XavierUniform(), (embed_dim, self.vdim), dtype)
        self.in_proj_bias = _param("zeros", (3 * embed_dim,), dtype) if has_bias else None
        self.out_proj = _Linear(embed_dim, embed_dim, bool(has_bias), dtype, zero_bias=True)

    def _projection(self, i):
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            w = ops.narrow(self.in_proj_weight, 0, i * e, e)
        else:
            w = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)[i]
        b = None if self.in_proj_bias is None else ops.narrow(self.in_proj_bias, 0, i * e, e)
        return w, b

    def _check(self, query, key, value):
        name = "MultiheadAttention"
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ValueError(f"{name}: query, key and value must all be 3-D (batched) or 2-D (unbatched), got shapes "
                             f"{list(query.shape)}, {list(key.shape)}, {list(value.shape)}")
        for what, t, dim in (("query", query, self.embed_dim), ("key", key, self.kdim), ("value", value, self.vdim)):
            if t.shape[-1] != dim:
                raise ValueError(f"{name}: {what} of shape {list(t.shape)} must end in {dim}")
        if key.shape[:-1] != value.shape[:-1]:
            raise ValueError(f"{name}: key {list(key.shape)} and value {list(value.shape)} must agree but for the "
                             f"last axis")
        b = 0 if self.batch_first else 1
        if query.ndim == 3 and query.shape[b] != key.shape[b]:
            raise ValueError(f"{name}: query {list(query.shape)} and key {list(key.shape)} have different batch "
                             f"sizes (batch_first={self.batch_first})")

    def _mask(self, attn_mask, key_padding_mask, is_causal, n, lq, ls, dtype):
        """The masks as one additive float tensor broadcasting against (N, H, L, S), or None."""
        name, total = "MultiheadAttention", None
        if attn_mask is not None:
            m = _additive(name, "attn_mask", attn_mask, dtype)
            if m.ndim == 2 and tuple(m.shape) == (lq, ls):
                pass
            elif m.ndim == 3 and tuple(m.shape) == (n * self.num_heads, lq, ls):
                m = ops.reshape(m, (n, self.num_heads, lq, ls))
            else:
                raise ValueError(f"{name}: attn_mask of shape {list(attn_mask.shape)} must be (L, S) = "
                                 f"{[lq, ls]} or (N * num_heads, L, S) = {[n * self.num_heads, lq, ls]}")
            total = m
        elif is_causal:  # key j is masked from query i where j > i
            later = ops.reshape(ops.arange(ls), (1, ls)) > ops.reshape(ops.arange(lq), (lq, 1))
            total = ops.where(later, float("-inf"), ops.zeros(lq, ls, dtype=dtype))
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (n, ls):
                raise ValueError(f"{name}: key_padding_mask of shape {list(key_padding_mask.shape)} must be "
                                 f"(N, S) = {[n, ls]}")
            k = ops.reshape(_additive(name, "key_padding_mask", key_padding_mask, dtype), (n, 1, 1, ls))
            total = k if total is None else total + k
        return total

    def construct(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                  average_attn_weights=True, is_causal=False):
        self._check(query, key, value)
        batched = query.ndim == 3
        if not batched:  # (L, E) -> (1, L, E); a key_padding_mask (S,) -> (1, S)
            query, key, value = ops.unsqueeze(query, 0), ops.unsqueeze(key, 0), ops.unsqueeze(value, 0)
            if key_padding_mask is not None and key_padding_mask.ndim == 1:
                key_padding_mask = ops.unsqueeze(key_padding_mask, 0)
        elif not self.batch_first:
            query, key, value = (ops.swapaxes(t, 0, 1) for t in (query, key, value))
        n, lq, ls, h, d = query.shape[0], query.shape[1], key.shape[1], self.num_heads, self.head_dim

        def heads(t, i, length):
            w, b = self._projection(i)
            return ops.permute(ops.reshape(ops.dense(t, w, b), (n, length, h, d)), (0, 2, 1, 3))

        q, k, v = heads(query, 0, lq), heads(key, 1, ls), heads(value, 2, ls)
        mask = self._mask(attn_mask, key_padding_mask, is_causal, n, lq, ls, q.dtype)
        drop = self.dropout if self.training else 0.0
        weights = None
        if mask is None and not need_weights and drop == 0.0:
            out = ops.scaled_dot_product_attention(q, k, v)
        else:
            scores = ops.matmul(q * math.sqrt(1.0 / d), ops.swapaxes(k, -1, -2))
            if mask is not None:
                scores = scores + mask
            probs = ops.softmax(scores, -1)
            if drop:
                probs = ops.dropout(probs, drop, True)
            out = ops.matmul(probs, v)
            if need_weights:
                weights = probs.mean(1) if average_attn_weights else probs
        out = self.out_proj(ops.reshape(ops.permute(out, (0, 2, 1, 3)), (n, lq, self.embed_dim)))
        if not batched:
            return ops.squeeze(out, 0), None if weights is None else ops.squeeze(weights, 0)
        if not self.batch_first:
            out = ops.swapaxes(out, 0, 1)
        return out, weights


def _activation(name, activation):
    """'relu', 'gelu' (the exact erf form, PyTorch's F.gelu) or a callable; kept by name, so a layer
    deep-copies (kiln's op functions are C objects)."""
    if not (callable(activation) or activation in ("relu", "gelu")):
        raise ValueError(f"{name}: activation must be 'relu', 'gelu' or a callable, got {activation!r}")
    return activation


def _activate(activation, x):
    if activation == "relu":
        return ops.relu(x)
    if activation == "gelu":
        return ops.gelu(x)
    return activation(x)


class TransformerEncoderLayer(Cell):
    """PyTorch's nn.TransformerEncoderLayer: self-attention then a feed-forward block, each with a
    residual and layer norm (after, or before with norm_first). forward(src, src_mask=None,
    src_key_padding_mask=None, is_causal=False)."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu", layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, dtype=_C.float32):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout, bias, batch_first=batch_first, dtype=dtype)
        self.linear1 = _Linear(d_model, dim_feedforward, bias, dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = _Linear(dim_feedforward, d_model, bias, dtype)
        self.norm_first = bool(norm_first)
        self.norm1 = _LayerNorm(d_model, layer_norm_eps, bias, dtype)
        self.norm2 = _LayerNorm(d_model, layer_norm_eps, bias, dtype)
        self.dropout1, self.dropout2 = Dropout(dropout), Dropout(dropout)
        self.activation = _activation("TransformerEncoderLayer", activation)

    def _sa(self, x, mask, padding, is_causal):
        return self.dropout1(self.self_attn(x, x, x, padding, False, mask, True, is_causal)[0])

    def _ff(self, x):
        return self.dropout2(self.linear2(self.dropout(_activate(self.activation, self.linear1(x)))))

    def construct(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        _check_model_dim("TransformerEncoderLayer", "src", src, self.self_attn.embed_dim)
        x = src
        if self.norm_first:
            x = x + self._sa(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff(self.norm2(x))
        x = self.norm1(x + self._sa(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff(x))


class TransformerDecoderLayer(Cell):
    """PyTorch's nn.TransformerDecoderLayer: self-attention, attention over memory, feed-forward,
    each with a residual and layer norm. forward(tgt, memory, tgt_mask=None, memory_mask=None,
    tgt_key_padding_mask=None, memory_key_padding_mask=None, tgt_is_causal=False,
    memory_is_causal=False)."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu", layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True, dtype=_C.float32):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout, bias, batch_first=batch_first, dtype=dtype)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout, bias, batch_first=batch_first, dtype=dtype)
        self.linear1 = _Linear(d_model, dim_feedforward, bias, dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = _Linear(dim_feedforward, d_model, bias, dtype)
        self.norm_first = bool(norm_first)
        self.norm1 = _LayerNorm(d_model, layer_norm_eps, bias, dtype)
        self.norm2 = _LayerNorm(d_model, layer_norm_eps, bias, dtype)
        self.norm3 = _LayerNorm(d_model, layer_norm_eps, bias, dtype)
        self.dropout1, self.dropout2, self.dropout3 = Dropout(dropout), Dropout(dropout), Dropout(dropout)
        self.activation = _activation("TransformerDecoderLayer", activation)

    def _sa(self, x, mask, padding, is_causal):
        return self.dropout1(self.self_attn(x, x, x, padding, False, mask, True, is_causal)[0])

    def _mha(self, x, mem, mask, padding, is_causal):
        return self.dropout2(self.multihead_attn(x, mem, mem, padding, False, mask, True, is_causal)[0])

    def _ff(self, x):
        return self.dropout3(self.linear2(self.dropout(_activate(self.activation, self.linear1(x)))))

    def construct(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                  memory_key_padding_mask=None, tgt_is_causal=False, memory_is_causal=False):
        _check_model_dim("TransformerDecoderLayer", "tgt", tgt, self.self_attn.embed_dim)
        _check_model_dim("TransformerDecoderLayer", "memory", memory, self.self_attn.embed_dim)
        x = tgt
        if self.norm_first:
            x = x + self._sa(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            return x + self._ff(self.norm3(x))
        x = self.norm1(x + self._sa(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
        return self.norm3(x + self._ff(x))


def _check_model_dim(name, what, x, d_model):
    if x.ndim not in (2, 3) or x.shape[-1] != d_model:
        raise ValueError(f"{name}: {what} must be (L, N, {d_model}), (N, L, {d_model}) or (L, {d_model}), got "
                         f"{list(x.shape)}")


def _clones(name, layer, cls, num_layers):
    if not isinstance(layer, cls):
        raise TypeError(f"{name}: expected a {cls.__name__}, got {type(layer).__name__}")
    if not isinstance(num_layers, int) or isinstance(num_layers, bool) or num_layers < 1:
        raise ValueError(f"{name}: num_layers must be a positive int, got {num_layers!r}")
    return CellList([copy.deepcopy(layer) for _ in range(num_layers)])


class TransformerEncoder(Cell):
    """num_layers deep copies of encoder_layer (named layers.0, layers.1, ...) run in turn, then
    norm if given. forward(src, mask=None, src_key_padding_mask=None, is_causal=None)."""

    def __init__(self, encoder_layer, num_layers, norm=None, enable_nested_tensor=True, mask_check=True):
        super().__init__()
        self.layers = _clones("TransformerEncoder", encoder_layer, TransformerEncoderLayer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def construct(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        x = src
        for layer in self.layers:
            x = layer(x, mask, src_key_padding_mask, bool(is_causal))
        return x if self.norm is None else self.norm(x)


class TransformerDecoder(Cell):
    """num_layers deep copies of decoder_layer (layers.0, ...) run in turn over memory, then norm if
    given. forward(tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
    memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False)."""

    def __init__(self, decoder_layer, num_layers, norm=None):
        super().__init__()
        self.layers = _clones("TransformerDecoder", decoder_layer, TransformerDecoderLayer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def construct(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                  memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        x = tgt
        for layer in self.layers:
            x = layer(x, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                      bool(tgt_is_causal), memory_is_causal)
        return x if self.norm is None else self.norm(x)


__all__ = ["MultiheadAttention", "TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder",
           "TransformerDecoder"]
