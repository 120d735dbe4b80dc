"""Grouped-query attention without copies of K/V (issue 17 part 5): kiln.models.LlamaAttention
runs each kv head's matmuls once for the n_rep query heads that share it, instead of repeating K
and V per query head (models.repeat_kv). Checked against the repeated formulation run eagerly
with the same weights (output and the gradients of x and every projection), against NumPy's
float64 forward, jitted (O1) like eager, and the jitted graph expands neither K nor V."""
import math

import numpy as np
import pytest

import kiln
from kiln import models, ops

HIDDEN, HEADS = 64, 8


def repeated(attn, x, position_ids):
    """LlamaAttention.construct as it was: K and V repeated to every query head."""
    b, s, _ = x.shape
    hd = attn.head_dim
    q = ops.swapaxes(ops.reshape(attn.q_proj(x), (b, s, attn.num_heads, hd)), 1, 2)
    k = ops.swapaxes(ops.reshape(attn.k_proj(x), (b, s, attn.num_kv_heads, hd)), 1, 2)
    v = ops.swapaxes(ops.reshape(attn.v_proj(x), (b, s, attn.num_kv_heads, hd)), 1, 2)
    cos, sin = attn.rotary(position_ids, x.dtype)
    q = q * cos + models.rotate_half(q) * sin
    k = k * cos + models.rotate_half(k) * sin
    n_rep = attn.num_heads // attn.num_kv_heads
    k, v = models.repeat_kv(k, n_rep), models.repeat_kv(v, n_rep)
    scores = ops.matmul(q, ops.swapaxes(k, -1, -2)) / math.sqrt(hd)
    out = ops.matmul(ops.softmax(scores, -1), v)
    return attn.o_proj(ops.reshape(ops.swapaxes(out, 1, 2), (b, s, attn.hidden_size)))


def numpy_attention(attn, x, pos):
    """The forward in float64 NumPy, K/V repeated with np.repeat."""
    w = {n: getattr(attn, n).weight.asnumpy().astype(np.float64) for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    b, s, _ = x.shape
    hd, nh, nkv = attn.head_dim, attn.num_heads, attn.num_kv_heads
    q = (x @ w["q_proj"].T).reshape(b, s, nh, hd).transpose(0, 2, 1, 3)
    k = (x @ w["k_proj"].T).reshape(b, s, nkv, hd).transpose(0, 2, 1, 3)
    v = (x @ w["v_proj"].T).reshape(b, s, nkv, hd).transpose(0, 2, 1, 3)
    inv_freq = attn.rope_theta ** (-np.arange(0, hd, 2) / hd)
    emb = np.concatenate([pos[..., None] * inv_freq] * 2, -1)[:, None]

    def rope(t):
        return t * np.cos(emb) + np.concatenate((-t[..., hd // 2:], t[..., :hd // 2]), -1) * np.sin(emb)

    q, k = rope(q), rope(k)
    k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    out = (p / p.sum(-1, keepdims=True)) @ v
    return out.transpose(0, 2, 1, 3).reshape(b, s, nh * hd) @ w["o_proj"].T


def close(got, want, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(want).max()), err_msg=what)


@pytest.mark.parametrize("kv_heads,batch,seq", [(2, 1, 12), (4, 2, 7), (8, 1, 5), (1, 1, 9)], ids=str)
def test_grouped_heads_match_repeated_kv(kv_heads, batch, seq):
    kiln.manual_seed(kv_heads)
    attn = models.LlamaAttention(HIDDEN, HEADS, kv_heads, rope_theta=10000.0)
    rng = np.random.default_rng(seq)
    x_np = rng.standard_normal((batch, seq, HIDDEN))
    pos_np = np.tile(np.arange(seq), (batch, 1)) + 3
    x, pos = kiln.Tensor(x_np.astype(np.float32)), kiln.Tensor(pos_np.astype(np.int64))
    params = attn.trainable_params()
    grouped_e = kiln.value_and_grad(attn, 0, params)
    repeated_e = kiln.value_and_grad(lambda xt, pt: repeated(attn, xt, pt), 0, params)
    value, (gx, gw) = grouped_e(x, pos)
    want, (want_gx, want_gw) = repeated_e(x, pos)
    close(value.asnumpy(), numpy_attention(attn, x_np.astype(np.float32).astype(np.float64), pos_np), "vs numpy")
    close(value.asnumpy(), want.asnumpy(), "output")
    close(gx.asnumpy(), want_gx.asnumpy(), "grad x")
    for p, g, w in zip(params, gw, want_gw):
        close(g.asnumpy(), w.asnumpy(), f"grad {p.name}")
    jitted = kiln.jit(attn, jit_level="O1")
    grouped_j = kiln.value_and_grad(jitted, 0, params)
    for _ in range(2):  # traced, then compiled
        value_j, (gx_j, gw_j) = grouped_j(x, pos)
        close(value_j.asnumpy(), value.asnumpy(), "jit output")
        close(gx_j.asnumpy(), gx.asnumpy(), "jit grad x")
        for p, g, w in zip(params, gw_j, gw):
            close(g.asnumpy(), w.asnumpy(), f"jit grad {p.name}")
    # the scores come from one matmul per kv head over its n_rep * seq query rows; nothing
    # expands K or V (the repeated formulation's graph has two expand nodes)
    text = jitted.graph_str(x, pos)
    rows = HEADS // kv_heads * seq
    assert f"float32[{batch}, {kv_heads}, {rows}, {seq}] = matmul" in text and "expand(" not in text, text
