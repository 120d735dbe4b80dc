"""The fused attention op (issue 17 part 5, src/ops/attention.c): kiln.ops.scaled_dot_product_attention
against NumPy and the unfused ops (matmul, softmax, matmul), forward and backward, with sequences
that are not multiples of the kernel's blocks (64 query rows, 256 keys), grouped kv heads and
batch axes; float32 runs the blockwise kernel, float64 the reference one, so each checks the
other; finite differences through the reference; the log-sum-exp output's gradient; every compiled
variant of LlamaAttention (which uses the op) equal to eager; bad shapes."""
import math

import numpy as np
import pytest

import kiln
from kiln import models, nn, ops
from kiln._optable import OP
from kiln.ops._util import apply

# (batch, query heads, kv heads, query rows, keys, head dim, value dim)
SHAPES = [(1, 2, 2, 5, 3, 4, 4), (2, 4, 2, 70, 300, 16, 8), (1, 3, 1, 65, 257, 8, 12), (1, 1, 1, 130, 40, 32, 32)]


def numpy_attention(q, k, v, scale):
    """(out, lse, probabilities) in float64, kv heads repeated to the query heads."""
    rep = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    s = q @ np.swapaxes(k, -1, -2) * scale
    mx = s.max(-1, keepdims=True)
    e = np.exp(s - mx)
    p = e / e.sum(-1, keepdims=True)
    return p @ v, (mx + np.log(e.sum(-1, keepdims=True)))[..., 0], p


def numpy_attention_grads(q, k, v, scale, gout, glse):
    """Gradients of sum(out * gout) + sum(lse * glse) with respect to q, k, v."""
    rep = q.shape[-3] // k.shape[-3]
    kr, vr = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    _, _, p = numpy_attention(q, k, v, scale)
    gv = np.swapaxes(p, -1, -2) @ gout
    gp = gout @ np.swapaxes(vr, -1, -2)
    gs = p * (gp - (gp * p).sum(-1, keepdims=True) + glse[..., None]) * scale
    gq, gk = gs @ kr, np.swapaxes(gs, -1, -2) @ q

    def fold(g):  # the repeated kv heads' gradients summed back onto each kv head
        return g.reshape(g.shape[:-3] + (k.shape[-3], rep) + g.shape[-2:]).sum(-3)

    return gq, fold(gk), fold(gv)


def inputs(shape, dtype, seed=0):
    b, hq, hk, lq, lk, d, dv = shape
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in ((b, hq, lq, d), (b, hk, lk, d), (b, hk, lk, dv))]


def tol(dtype):
    return dict(rtol=2e-4, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["blockwise", "reference"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_matches_numpy_and_unfused(shape, dtype):
    q, k, v = inputs(shape, dtype)
    scale = 0.7
    out, lse = apply(OP.attention, tuple(kiln.Tensor(t) for t in (q, k, v)), (), (scale,))
    want, want_lse, _ = numpy_attention(*(t.astype(np.float64) for t in (q, k, v)), scale)
    np.testing.assert_allclose(out.asnumpy(), want, **tol(dtype))
    np.testing.assert_allclose(lse.asnumpy(), want_lse, **tol(dtype))
    if shape[1] == shape[2]:  # the unfused ops on the same inputs
        tq, tk, tv = (kiln.Tensor(t) for t in (q, k, v))
        unfused = ops.matmul(ops.softmax(ops.matmul(tq, ops.swapaxes(tk, -1, -2)) * scale, -1), tv)
        np.testing.assert_allclose(out.asnumpy(), unfused.asnumpy(), **tol(dtype))


def test_default_scale_and_strided_inputs():
    q, k, v = inputs((1, 2, 2, 9, 11, 8, 8), np.float32)
    # v given as a transposed view (as LlamaAttention's is), k as a slice of a larger tensor
    vt = ops.swapaxes(kiln.Tensor(np.ascontiguousarray(np.swapaxes(v, 1, 2))), 1, 2)
    kbig = kiln.Tensor(np.concatenate([k, k], -1))
    got = ops.scaled_dot_product_attention(kiln.Tensor(q), kbig[..., :8], vt)
    want, _, _ = numpy_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), 1 / math.sqrt(8))
    np.testing.assert_allclose(got.asnumpy(), want, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["blockwise", "reference"])
@pytest.mark.parametrize("shape", SHAPES[1:], ids=str)
def test_backward_matches_numpy(shape, dtype):
    q, k, v = inputs(shape, dtype, seed=1)
    rng = np.random.default_rng(2)
    gout = rng.standard_normal(shape[:2] + (shape[3], shape[6])).astype(dtype)
    glse = rng.standard_normal(shape[:2] + (shape[3],)).astype(dtype)
    scale = 0.3
    w, wl = kiln.Tensor(gout), kiln.Tensor(glse)

    def loss(a, b, c):
        out, lse = apply(OP.attention, (a, b, c), (), (scale,))
        return ops.sum(out * w) + ops.sum(lse * wl)

    got = kiln.grad(loss, (0, 1, 2))(*(kiln.Tensor(t) for t in (q, k, v)))
    want = numpy_attention_grads(*(t.astype(np.float64) for t in (q, k, v, )), scale, gout.astype(np.float64),
                                 glse.astype(np.float64))
    for name, g, wnt in zip("qkv", got, want):
        np.testing.assert_allclose(g.asnumpy(), wnt, err_msg=f"grad {name}",
                                   **(dict(rtol=1e-3, atol=1e-4) if dtype == np.float32 else tol(dtype)))


def test_backward_matches_unfused_eager_with_grouped_heads():
    """LlamaAttention's formulation: query heads folded per kv head; the op's gradients equal the
    unfused ops' (blockwise kernel, float32)."""
    q, k, v = inputs((1, 2, 2, 4 * 70, 70, 16, 16), np.float32, seed=3)
    w = kiln.Tensor(np.random.default_rng(4).standard_normal((1, 2, 280, 16)).astype(np.float32))

    def fused(a, b, c):
        return ops.sum(apply(OP.attention, (a, b, c), (), (1 / math.sqrt(16),))[0] * w)

    def unfused(a, b, c):
        s = ops.matmul(a, ops.swapaxes(b, -1, -2)) / math.sqrt(16)
        return ops.sum(ops.matmul(ops.softmax(s, -1), c) * w)

    ts = [kiln.Tensor(t) for t in (q, k, v)]
    for name, g, want in zip("qkv", kiln.grad(fused, (0, 1, 2))(*ts), kiln.grad(unfused, (0, 1, 2))(*ts)):
        np.testing.assert_allclose(g.asnumpy(), want.asnumpy(), rtol=1e-3, atol=1e-5, err_msg=f"grad {name}")


def test_finite_differences():
    shape = (1, 2, 1, 3, 4, 3, 2)
    q, k, v = inputs(shape, np.float64, seed=5)
    rng = np.random.default_rng(6)
    w, wl = rng.standard_normal((1, 2, 3, 2)), rng.standard_normal((1, 2, 3))

    def value(a, b, c):
        out, lse = apply(OP.attention, (a, b, c), (), (0.8,))
        return ops.sum(out * kiln.Tensor(w)) + ops.sum(lse * kiln.Tensor(wl))

    grads = kiln.grad(value, (0, 1, 2))(*(kiln.Tensor(t) for t in (q, k, v)))
    arrays, eps = [q, k, v], 1e-6
    for n, (arr, g) in enumerate(zip(arrays, grads)):
        fd = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            plus = [a.copy() for a in arrays]
            minus = [a.copy() for a in arrays]
            plus[n][idx] += eps
            minus[n][idx] -= eps
            fd[idx] = (float(value(*map(kiln.Tensor, plus)).asnumpy()) -
                       float(value(*map(kiln.Tensor, minus)).asnumpy())) / (2 * eps)
        np.testing.assert_allclose(g.asnumpy(), fd, rtol=1e-6, atol=1e-8, err_msg=f"input {n}")


@pytest.mark.parametrize("how", ["fused", "unfused", "cost model"])
def test_sdpa_runs_what_the_cost_model_chooses(monkeypatch, how):
    """scaled_dot_product_attention runs the fused op or matmul, softmax, matmul as
    attention_choice says (with and without recorded gradients; KILN_ATTENTION forces either).
    Same values and gradients either way."""
    from kiln.ops.nn_functional import attention_choice

    if how != "cost model":
        monkeypatch.setenv("KILN_ATTENTION", how)
    for lk in (512, 7):
        q, k, v = inputs((1, 4, 2, 6, lk, 4, 4), np.float32, seed=9)
        w = np.random.default_rng(10).standard_normal((1, 4, 6, 4)).astype(np.float32)
        ts, wt = [kiln.Tensor(t) for t in (q, k, v)], kiln.Tensor(w)

        def loss(a, b, c):
            return ops.sum(ops.scaled_dot_product_attention(a, b, c) * wt)

        want = numpy_attention(*(t.astype(np.float64) for t in (q, k, v)), 0.5)[0]
        with kiln.no_grad():
            np.testing.assert_allclose(ops.scaled_dot_product_attention(*ts).asnumpy(), want, rtol=2e-4, atol=2e-5)
        grads = kiln.grad(loss, (0, 1, 2))(*ts)
        want_grads = numpy_attention_grads(*(t.astype(np.float64) for t in (q, k, v)), 0.5, w.astype(np.float64),
                                           np.zeros((1, 4, 6)))
        for name, g, wnt in zip("qkv", grads, want_grads):
            np.testing.assert_allclose(g.asnumpy(), wnt, rtol=1e-3, atol=1e-4, err_msg=f"grad {name}")

        class Core(nn.Cell):  # q, k, v as parameters: a captured call records gradients
            def __init__(self):
                super().__init__()
                self.q, self.k, self.v = (nn.Parameter(t, name=n) for t, n in zip(ts, "qkv"))

            def construct(self, x):
                return loss(self.q, self.k, self.v) * x

        core, one = Core(), kiln.Tensor(np.float32(1))
        for backward in (True, False):
            fused = attention_choice(ts[0], ts[1], ts[2], backward=backward)[0]
            assert fused == (how == "fused") or how == "cost model"
            if backward:
                text = kiln.jit(core).graph_str(one)
            else:
                with kiln.no_grad():
                    text = kiln.jit(core).graph_str(one)
            assert ("= attention(" in text) == fused and ("softmax(" in text) != fused, text


VARIANTS = [(level, backend, mode) for level in ("O0", "O1", "O2") for backend in ("kbk", "sink")
            for mode in ("trace", "ast")] + [("O1", "kbk", "bytecode")]


def test_every_compiled_variant_equals_eager(monkeypatch):
    """The op and its gradient rule in every compiled variant (forward and backward), and
    LlamaAttention without gradients at 512 tokens, the fused op forced (KILN_ATTENTION)."""
    q, k, v = inputs((1, 4, 2, 70, 300, 16, 8), np.float32, seed=11)
    w = kiln.Tensor(np.random.default_rng(12).standard_normal((1, 4, 70, 8)).astype(np.float32))
    ts = [kiln.Tensor(t) for t in (q, k, v)]

    def loss(a, b, c):
        return ops.sum(apply(OP.attention, (a * 1.5, b, c), (), (0.25,))[0] * w)

    value, grads = kiln.value_and_grad(loss, (0, 1, 2))(*ts)
    for level, backend, mode in VARIANTS:
        f = kiln.value_and_grad(kiln.jit(loss, jit_level=level, backend=backend, capture_mode=mode), (0, 1, 2))
        for _ in range(2):  # captured, then compiled
            v_j, g_j = f(*ts)
            what = f"{level} {backend} {mode}"
            np.testing.assert_allclose(v_j.asnumpy(), value.asnumpy(), rtol=1e-5, atol=1e-5, err_msg=what)
            for name, g, want in zip("qkv", g_j, grads):
                np.testing.assert_allclose(g.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-6, err_msg=f"{what} {name}")
    monkeypatch.setenv("KILN_ATTENTION", "fused")
    kiln.manual_seed(7)
    attn = models.LlamaAttention(32, 4, 2, rope_theta=10000.0)
    seq = 512
    x = kiln.Tensor(np.random.default_rng(8).standard_normal((1, seq, 32)).astype(np.float32))
    pos = kiln.Tensor(np.arange(seq, dtype=np.int64).reshape(1, seq))
    with kiln.no_grad():
        want = attn(x, pos).asnumpy()
        for level, backend, mode in VARIANTS:
            jitted = kiln.jit(attn, jit_level=level, backend=backend, capture_mode=mode)
            for _ in range(2):
                np.testing.assert_allclose(jitted(x, pos).asnumpy(), want, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{level} {backend} {mode}")
        text = kiln.jit(attn, jit_level="O1").graph_str(x, pos)
    assert "= attention(" in text and "softmax" not in text, text


@pytest.mark.parametrize("shapes,match", [
    (((4, 3), (4, 3), (4, 3)), "attention: expected q"),                                  # no head axis
    (((1, 2, 4, 8), (1, 2, 5, 7), (1, 2, 5, 8)), "attention: expected q"),             # head dims differ
    (((1, 3, 4, 8), (1, 2, 5, 8), (1, 2, 5, 8)), "attention: expected q"),             # 3 heads over 2 kv heads
    (((1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 6, 8)), "attention: expected q"),             # k and v lengths differ
    (((2, 2, 4, 8), (1, 2, 5, 8), (1, 2, 5, 8)), "attention: expected q"),             # batch differs
])
def test_bad_shapes_name_the_op(shapes, match):
    ts = [kiln.Tensor(np.zeros(s, np.float32)) for s in shapes]
    with pytest.raises(ValueError, match=match) as e:
        ops.scaled_dot_product_attention(*ts)
    assert str(tuple(shapes[0])).replace(" ", "") in str(e.value).replace(" ", ""), str(e.value)


def test_mixed_dtypes_raise():
    q = kiln.Tensor(np.zeros((1, 1, 2, 4), np.float32))
    with pytest.raises(TypeError, match="attention: q, k and v must have one floating-point dtype"):
        ops.scaled_dot_product_attention(q, kiln.Tensor(np.zeros((1, 1, 2, 4), np.float64)), q)
