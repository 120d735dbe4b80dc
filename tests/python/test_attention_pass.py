"""The O1 pass fuse_attention (issue 33 item 1, src/passes/fuse_attention.c): attention written as
ops — softmax(q @ kᵀ * s + mask) @ v by hand with swapaxes / transpose / permute of k, the scale
multiplied or divided, a float mask added or a bool mask filled with -inf, grouped query heads
folded onto their kv head, nn.MultiheadAttention — becomes the fused attention op where the cost
model chooses it (KILN_ATTENTION=fused forces it for small test shapes), and stays unfused where an
intermediate is also returned or used, or the backward reads the probabilities; every capture mode
x O0/O1/O2 x kbk/sink equals eager and NumPy."""
import math

import numpy as np
import pytest

import kiln
from kiln import nn, ops

VARIANTS = [(level, backend, mode) for level in ("O0", "O1", "O2") for backend in ("kbk", "sink")
            for mode in ("trace", "ast", "bytecode")]

rng = np.random.default_rng(0)
B, H, HK, LQ, LK, D = 2, 4, 2, 37, 45, 16
Q = rng.standard_normal((B, H, LQ, D)).astype(np.float32)
K = rng.standard_normal((B, H, LK, D)).astype(np.float32)
V = rng.standard_normal((B, H, LK, D)).astype(np.float32)
KG = rng.standard_normal((B, HK, LK, D)).astype(np.float32)  # grouped kv heads
VG = rng.standard_normal((B, HK, LK, D)).astype(np.float32)
FMASK = rng.standard_normal((LQ, LK)).astype(np.float32)
BMASK = rng.random((B, 1, LQ, LK)) < 0.7
BMASK[..., 0] = True


def softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def swapaxes_scaled(q, k, v, m):
    return ops.matmul(ops.softmax(ops.matmul(q, k.swapaxes(-1, -2)) * (1 / math.sqrt(D)) + m, -1), v)


def transpose_divided(q, k, v, m):
    s = ops.matmul(q, ops.swapaxes(k, 2, 3)) / math.sqrt(D)
    return ops.matmul(ops.softmax(s + m, -1), v)


def permute_scale_first(q, k, v, m):
    s = 0.25 * ops.matmul(q, ops.permute(k, (0, 1, 3, 2)))
    return ops.matmul(ops.softmax(m + s, axis=-1), v)


def bool_filled(q, k, v, m):
    s = ops.matmul(q, k.swapaxes(-1, -2)) * 0.25
    return ops.matmul(ops.softmax(ops.where(m, s, -math.inf), -1), v)


def unscaled_unmasked(q, k, v, m):
    return ops.matmul(ops.softmax(ops.matmul(q, k.swapaxes(-1, -2)), -1), v)


def grouped_heads(q, k, v, m):
    """Query heads folded onto their kv head (as LlamaAttention's unfused path writes it)."""
    qf = ops.reshape(q, (B, HK, H // HK * LQ, D))
    s = ops.matmul(qf, k.swapaxes(-1, -2)) * 0.25
    return ops.reshape(ops.matmul(ops.softmax(s, -1), v), (B, H, LQ, D))


def sdpa_style(q, k, v, m):
    return ops.scaled_dot_product_attention(q, k, v, attn_mask=m)


def sdpa_causal(q, k, v, m):
    return ops.scaled_dot_product_attention(q, k, v, is_causal=True)


def reference(name):
    """NumPy float64 for each user function"""
    q, k, v = (t.astype(np.float64) for t in (Q, K, V))
    kt = np.swapaxes(k, -1, -2)
    if name == "grouped_heads":
        kg, vg = KG.astype(np.float64), VG.astype(np.float64)
        p = softmax(q.reshape(B, HK, -1, D) @ np.swapaxes(kg, -1, -2) * 0.25)
        return (p @ vg).reshape(B, H, LQ, D)
    s = q @ kt
    if name in ("swapaxes_scaled", "transpose_divided", "sdpa_style", "sdpa_causal"):
        s = s / math.sqrt(D)
    elif name in ("permute_scale_first", "bool_filled"):
        s = s * 0.25
    if name == "bool_filled":
        s = np.where(BMASK, s, -np.inf)
    elif name == "sdpa_causal":
        s = np.where(np.arange(LK)[None] <= np.arange(LQ)[:, None], s, -np.inf)
    elif name != "unscaled_unmasked":
        s = s + FMASK
    return softmax(s) @ v


FUNCTIONS = [swapaxes_scaled, transpose_divided, permute_scale_first, bool_filled, unscaled_unmasked, grouped_heads,
             sdpa_style, sdpa_causal]


def args_for(fn):
    kv = (KG, VG) if fn is grouped_heads else (K, V)
    mask = BMASK if fn is bool_filled else FMASK
    return [kiln.Tensor(t) for t in (Q,) + kv + (mask,)]


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_every_variant_equals_eager_and_the_pass_fires_at_o1(monkeypatch, fn):
    monkeypatch.setenv("KILN_ATTENTION", "fused")
    args = args_for(fn)
    want = fn(*args).asnumpy()
    np.testing.assert_allclose(want, reference(fn.__name__), rtol=2e-4, atol=3e-5)
    for level, backend, mode in VARIANTS:
        jf = kiln.jit(fn, jit_level=level, backend=backend, capture_mode=mode)
        for _ in range(2):
            np.testing.assert_allclose(jf(*args).asnumpy(), want, rtol=2e-4, atol=3e-5,
                                       err_msg=f"{fn.__name__} {level} {backend} {mode}")
        text = jf.graph_str()
        if fn.__name__.startswith("sdpa"):  # the eager entry records the fused op itself
            assert "= attention(" in text, text
        elif level == "O0":
            assert "= attention(" not in text and "softmax(" in text, text
        else:
            assert "= attention(" in text and "softmax(" not in text, f"{level} {backend} {mode}\n{text}"


def returns_probabilities(q, k, v, m):
    p = ops.softmax(ops.matmul(q, k.swapaxes(-1, -2)) * 0.25 + m, -1)
    return ops.matmul(p, v), p


def returns_scores(q, k, v, m):
    s = ops.matmul(q, k.swapaxes(-1, -2)) * 0.25
    return ops.matmul(ops.softmax(s + m, -1), v), s


def reuses_masked_scores(q, k, v, m):
    s = ops.matmul(q, k.swapaxes(-1, -2)) * 0.25 + m
    return ops.matmul(ops.softmax(s, -1), v) + ops.sum(s)


def softmax_over_queries(q, k, v, m):  # not attention: softmax along the query axis
    p = ops.softmax(ops.matmul(q, k.swapaxes(-1, -2)), 2)
    return ops.matmul(p, v)


@pytest.mark.parametrize("fn", [returns_probabilities, returns_scores, reuses_masked_scores, softmax_over_queries],
                         ids=lambda f: f.__name__)
def test_the_pass_leaves_intermediates_in_use_alone(monkeypatch, fn):
    monkeypatch.setenv("KILN_ATTENTION", "fused")
    args = [kiln.Tensor(t) for t in (Q, K, V, FMASK)]
    want = fn(*args)
    want = want if isinstance(want, tuple) else (want,)
    for mode in ("trace", "ast", "bytecode"):
        jf = kiln.jit(fn, jit_level="O1", capture_mode=mode)
        got = jf(*args)
        got = got if isinstance(got, tuple) else (got,)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-5, atol=1e-5, err_msg=mode)
        assert "= attention(" not in jf.graph_str(), jf.graph_str()


def test_a_write_in_place_between_the_products_keeps_the_ops(monkeypatch):
    """v written in place after the scores (the fused op would read the new v only at the last
    product, the ops read it there too) and k written after its product (the fused op would read
    the new k): the pass leaves both alone; compiled equals eager."""
    monkeypatch.setenv("KILN_ATTENTION", "fused")

    def writes_k(q, k, v, m):
        s = ops.matmul(q, k.swapaxes(-1, -2)) * 0.25 + m
        k.add_(1.0)
        return ops.matmul(ops.softmax(s, -1), v)

    for mode in ("trace", "ast", "bytecode"):
        args = [kiln.Tensor(t.copy()) for t in (Q, K, V, FMASK)]
        want = writes_k(*[kiln.Tensor(t.copy()) for t in (Q, K, V, FMASK)]).asnumpy()
        jf = kiln.jit(writes_k, jit_level="O1", capture_mode=mode)
        for _ in range(2):
            args = [kiln.Tensor(t.copy()) for t in (Q, K, V, FMASK)]
            np.testing.assert_allclose(jf(*args).asnumpy(), want, rtol=1e-5, atol=1e-5, err_msg=mode)
            np.testing.assert_allclose(args[1].asnumpy(), K + 1.0, err_msg=mode)
        assert "= attention(" not in jf.graph_str(), jf.graph_str()


TRAINED = [swapaxes_scaled, transpose_divided, permute_scale_first, bool_filled, grouped_heads, sdpa_style,
           sdpa_causal]


@pytest.mark.parametrize("fn", TRAINED, ids=lambda f: f.__name__)
def test_training_graphs_use_the_fused_backward_and_equal_eager(monkeypatch, fn):
    """A training step captured whole (the gradient taken inside the jitted function): the pass
    turns the hand-written forward and its recorded backward (matmul, softmax_backward, scale,
    matmuls) into attention and attention_backward, returning the loss or not; sdpa-style code
    records them itself. Gradients equal eager's and NumPy's; every variant of the jitted loss
    differentiated from outside equals eager too."""
    monkeypatch.setenv("KILN_ATTENTION", "fused")
    w = kiln.Tensor(rng.standard_normal((B, H, LQ, D)).astype(np.float32))
    args = args_for(fn)

    def loss(q, k, v, m):
        return ops.sum(fn(q, k, v, m) * w)

    def step(q, k, v, m):
        return kiln.grad(loss, (0, 1, 2))(q, k, v, m)

    def step_and_loss(q, k, v, m):
        return kiln.value_and_grad(loss, (0, 1, 2))(q, k, v, m)

    want = [g.asnumpy() for g in step(*args)]
    for f, grads_of in ((step, lambda r: r), (step_and_loss, lambda r: r[1])):
        for level, backend in (("O0", "kbk"), ("O1", "kbk"), ("O1", "sink"), ("O2", "kbk")):
            js = kiln.jit(f, jit_level=level, backend=backend, capture_mode="trace")
            for _ in range(2):
                for name, g, wg in zip("qkv", grads_of(js(*args)), want):
                    np.testing.assert_allclose(g.asnumpy(), wg, rtol=1e-4, atol=1e-5,
                                               err_msg=f"{fn.__name__} {f.__name__} {level} {backend} {name}")
            text = js.graph_str()
            if level != "O0" or fn.__name__.startswith("sdpa"):
                assert "attention_backward(" in text and "softmax" not in text, f"{f.__name__} {level}\n{text}"
    for level, backend, mode in VARIANTS:
        jf = kiln.jit(loss, jit_level=level, backend=backend, capture_mode=mode)
        got = kiln.grad(jf, (0, 1, 2))(*args)
        for name, g, wg in zip("qkv", got, want):
            np.testing.assert_allclose(g.asnumpy(), wg, rtol=1e-4, atol=1e-5,
                                       err_msg=f"{fn.__name__} {level} {backend} {mode} {name}")


def test_training_graph_with_a_gradient_for_the_mask_stays_unfused(monkeypatch):
    """The fused backward gives no gradient for the mask: a step that asks for one keeps the ops."""
    monkeypatch.setenv("KILN_ATTENTION", "fused")
    args = args_for(swapaxes_scaled)

    def step(q, k, v, m):
        return kiln.grad(lambda *a: ops.sum(swapaxes_scaled(*a)), (0, 3))(q, k, v, m)

    want = [g.asnumpy() for g in step(*args)]
    js = kiln.jit(step, jit_level="O1", capture_mode="trace")
    for _ in range(2):
        for g, wg in zip(js(*args), want):
            np.testing.assert_allclose(g.asnumpy(), wg, rtol=1e-4, atol=1e-5)
    text = js.graph_str()
    assert "= attention(" not in text and "attention_backward(" not in text and "softmax_backward(" in text, text


def test_multihead_attention_with_a_mask(monkeypatch):
    """nn.MultiheadAttention with attn_mask and need_weights=False computes the scores by hand:
    the pass fuses them; with need_weights the probabilities are returned and it does not."""
    monkeypatch.setenv("KILN_ATTENTION", "fused")
    kiln.manual_seed(3)
    mha = nn.MultiheadAttention(32, 4, batch_first=True)
    x = kiln.Tensor(rng.standard_normal((2, 19, 32)).astype(np.float32))
    mask = kiln.Tensor(rng.standard_normal((19, 19)).astype(np.float32))

    def no_weights(t, m):
        return mha(t, t, t, attn_mask=m, need_weights=False)[0]

    def weights(t, m):
        return mha(t, t, t, attn_mask=m, need_weights=True)

    with kiln.no_grad():
        want = no_weights(x, mask).asnumpy()
        for mode in ("trace", "ast", "bytecode"):
            jf = kiln.jit(no_weights, jit_level="O1", capture_mode=mode)
            np.testing.assert_allclose(jf(x, mask).asnumpy(), want, rtol=2e-4, atol=3e-5, err_msg=mode)
            assert "= attention(" in jf.graph_str(), jf.graph_str()
        jw = kiln.jit(weights, jit_level="O1", capture_mode="trace")
        out, wts = jw(x, mask)
        ref_out, ref_w = weights(x, mask)
        np.testing.assert_allclose(out.asnumpy(), ref_out.asnumpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(wts.asnumpy(), ref_w.asnumpy(), rtol=1e-5, atol=1e-6)
        assert "= attention(" not in jw.graph_str()


def test_cost_model_decides_without_the_override_and_explain_says_why():
    """Unforced: a long sequence fuses at O1 and explain() names the decision; a short one stays
    unfused."""
    r = np.random.default_rng(5)
    long_q = kiln.Tensor(r.standard_normal((1, 2, 1024, 32)).astype(np.float32))
    long_k = kiln.Tensor(r.standard_normal((1, 2, 1024, 32)).astype(np.float32))
    short = [kiln.Tensor(t) for t in (Q[:1, :1, :8], K[:1, :1, :8], V[:1, :1, :8])]
    with kiln.no_grad():
        jf = kiln.jit(unscaled_unmasked, jit_level="O1", capture_mode="trace")
        got = jf(long_q, long_k, long_k, None)
        want = unscaled_unmasked(long_q, long_k, long_k, None)
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=2e-4, atol=3e-5)
        assert "= attention(" in jf.graph_str()
        report = str(jf.explain())
        assert "attention: fused" in report and "estimated fused" in report, report
        js = kiln.jit(unscaled_unmasked, jit_level="O1", capture_mode="trace")
        js(*short, None)
        assert "= attention(" not in js.graph_str()
