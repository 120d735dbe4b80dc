"""The fused attention op with masks (issue 33 item 1): the causal flag, additive float masks and
bool masks broadcasting against (..., Hq, Lq, Lk), grouped kv heads, forward and backward (the
backward recomputing the score blocks), float32 through the blockwise kernel and float64 through
the reference loops, against NumPy in float64, the unfused ops and finite differences;
kiln.ops.scaled_dot_product_attention choosing fused or unfused by the cost model with equal
results both ways; bad masks."""
import math

import numpy as np
import pytest

import kiln
from kiln import ops
from kiln._optable import OP
from kiln.ops._util import apply


def numpy_attention(q, k, v, scale, mask=None, causal=False):
    """(out, lse, probabilities) in float64; mask additive (float) or bool (True keeps)."""
    rep = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    s = q @ np.swapaxes(k, -1, -2) * scale
    if mask is not None:
        s = s + (np.where(mask, 0.0, -np.inf) if mask.dtype == bool else mask)
    if causal:
        lq, lk = s.shape[-2:]
        s = np.where(np.arange(lk)[None, :] <= np.arange(lq)[:, None], s, -np.inf)
    mx = s.max(-1, keepdims=True)
    e = np.exp(s - mx)
    p = e / e.sum(-1, keepdims=True)
    return p @ v, (mx + np.log(e.sum(-1, keepdims=True)))[..., 0], p


def numpy_grads(q, k, v, scale, gout, glse, mask=None, causal=False):
    rep = q.shape[-3] // k.shape[-3]
    kr, vr = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    p = numpy_attention(q, k, v, scale, mask, causal)[2]
    gv = np.swapaxes(p, -1, -2) @ gout
    gp = gout @ np.swapaxes(vr, -1, -2)
    gs = p * (gp - (gp * p).sum(-1, keepdims=True) + glse[..., None]) * scale
    gq, gk = gs @ kr, np.swapaxes(gs, -1, -2) @ q

    def fold(g):
        return g.reshape(g.shape[:-3] + (k.shape[-3], rep) + g.shape[-2:]).sum(-3)

    return gq, fold(gk), fold(gv)


def inputs(shape, dtype, seed=0):
    b, hq, hk, lq, lk, d, dv = shape
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in ((b, hq, lq, d), (b, hk, lk, d), (b, hk, lk, dv))]


def make_mask(kind, shape, rng):
    """A mask of `kind` broadcasting against the scores (b, hq, lq, lk), in the op's layout (every
    axis present) or None. Bool masks keep every row's first key (no row fully masked)."""
    b, hq, _, lq, lk, _, _ = shape
    if kind == "none":
        return None
    if kind == "float_full":
        return rng.standard_normal((b, hq, lq, lk))
    if kind == "float_keys":  # a per-key bias, as padding or ALiBi-like terms are
        return rng.standard_normal((b, 1, 1, lk))
    if kind == "bool_rows":
        m = rng.random((1, 1, lq, lk)) < 0.6
        m[..., 0] = True
        return m
    if kind == "bool_heads":
        m = rng.random((1, hq, 1, lk)) < 0.5
        m[..., 0] = True
        return m
    raise AssertionError(kind)


SHAPES = [(1, 2, 2, 5, 3, 4, 4), (2, 4, 2, 70, 300, 16, 8), (1, 3, 1, 130, 257, 8, 12), (1, 2, 1, 300, 80, 16, 16)]
MASKS = ["none", "float_full", "float_keys", "bool_rows", "bool_heads"]


def call(q, k, v, scale, mask, causal):
    ins = tuple(kiln.Tensor(t) for t in (q, k, v))
    if mask is not None:
        ins += (kiln.Tensor(mask if mask.dtype == bool else mask.astype(q.dtype)),)
    return apply(OP.attention, ins, (int(causal),), (scale,))


def tol(dtype):
    return dict(rtol=2e-4, atol=3e-5) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["blockwise", "reference"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("kind", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_matches_numpy(shape, kind, causal, dtype):
    q, k, v = inputs(shape, dtype)
    mask = make_mask(kind, shape, np.random.default_rng(1))
    out, lse = call(q, k, v, 0.6, mask, causal)
    want, want_lse, _ = numpy_attention(*(t.astype(np.float64) for t in (q, k, v)), 0.6,
                                        None if mask is None else (mask if mask.dtype == bool else
                                                                   mask.astype(dtype).astype(np.float64)), causal)
    np.testing.assert_allclose(out.asnumpy(), want, **tol(dtype))
    np.testing.assert_allclose(lse.asnumpy(), want_lse, **tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["blockwise", "reference"])
@pytest.mark.parametrize("causal,kind", [(True, "none"), (False, "float_full"), (False, "bool_heads"),
                                         (True, "float_keys"), (True, "bool_rows")])
@pytest.mark.parametrize("shape", SHAPES[1:], ids=str)
def test_backward_matches_numpy(shape, kind, causal, dtype):
    q, k, v = inputs(shape, dtype, seed=2)
    rng = np.random.default_rng(3)
    mask = make_mask(kind, shape, rng)
    gout = rng.standard_normal(shape[:2] + (shape[3], shape[6])).astype(dtype)
    glse = rng.standard_normal(shape[:2] + (shape[3],)).astype(dtype)
    w, wl = kiln.Tensor(gout), kiln.Tensor(glse)
    mt = None if mask is None else kiln.Tensor(mask if mask.dtype == bool else mask.astype(dtype))

    def loss(a, b, c):
        out, lse = apply(OP.attention, (a, b, c) + ((mt,) if mt is not None else ()), (int(causal),), (0.4,))
        return ops.sum(out * w) + ops.sum(lse * wl)

    got = kiln.grad(loss, (0, 1, 2))(*(kiln.Tensor(t) for t in (q, k, v)))
    m64 = None if mask is None else (mask if mask.dtype == bool else mask.astype(dtype).astype(np.float64))
    want = numpy_grads(*(t.astype(np.float64) for t in (q, k, v)), 0.4, gout.astype(np.float64),
                       glse.astype(np.float64), m64, causal)
    for name, g, wnt in zip("qkv", got, want):
        np.testing.assert_allclose(g.asnumpy(), wnt, err_msg=f"grad {name}",
                                   **(dict(rtol=1e-3, atol=2e-4) if dtype == np.float32 else tol(dtype)))


@pytest.mark.parametrize("causal,kind", [(True, "none"), (False, "float_full"), (True, "bool_rows")])
def test_finite_differences(causal, kind):
    shape = (1, 2, 1, 4, 5, 3, 2)
    q, k, v = inputs(shape, np.float64, seed=5)
    rng = np.random.default_rng(6)
    mask = make_mask(kind, shape, rng)
    w, wl = rng.standard_normal((1, 2, 4, 2)), rng.standard_normal((1, 2, 4))
    extra = () if mask is None else (kiln.Tensor(mask),)

    def value(a, b, c):
        out, lse = apply(OP.attention, (a, b, c) + extra, (int(causal),), (0.8,))
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


def sdpa_case(seed, lead_mask):
    rng = np.random.default_rng(seed)
    q, k, v = inputs((2, 4, 2, 70, 90, 16, 8), np.float32, seed=seed)
    fmask = rng.standard_normal((70, 90) if lead_mask else (2, 1, 70, 90)).astype(np.float32)
    bmask = rng.random((70, 90)) < 0.7
    bmask[:, 0] = True
    w = rng.standard_normal((2, 4, 70, 8)).astype(np.float32)
    return q, k, v, fmask, bmask, w


@pytest.mark.parametrize("masking", ["causal", "float", "float_2d", "bool", "none"])
def test_sdpa_fused_equals_unfused_with_and_without_grad(monkeypatch, masking):
    """The eager entry: forced fused and forced unfused (KILN_ATTENTION) give the same values and
    gradients, both equal to NumPy's."""
    q, k, v, fmask, bmask, w = sdpa_case(7, masking == "float_2d")
    mask = {"float": fmask, "float_2d": fmask, "bool": bmask}.get(masking)
    kw = dict(is_causal=masking == "causal", attn_mask=None if mask is None else kiln.Tensor(mask), scale=0.3)
    ts, wt = [kiln.Tensor(t) for t in (q, k, v)], kiln.Tensor(w)

    def loss(a, b, c):
        return ops.sum(ops.scaled_dot_product_attention(a, b, c, **kw) * wt)

    m64 = None if mask is None else (mask if mask.dtype == bool else mask.astype(np.float64))
    want = numpy_attention(*(t.astype(np.float64) for t in (q, k, v)), 0.3, m64, masking == "causal")[0]
    want_g = numpy_grads(*(t.astype(np.float64) for t in (q, k, v)), 0.3, w.astype(np.float64),
                         np.zeros((2, 4, 70)), m64, masking == "causal")
    results = {}
    for how in ("fused", "unfused"):
        monkeypatch.setenv("KILN_ATTENTION", how)
        with kiln.no_grad():
            out = ops.scaled_dot_product_attention(*ts, **kw).asnumpy()
        np.testing.assert_allclose(out, want, rtol=2e-4, atol=3e-5, err_msg=how)
        grads = [g.asnumpy() for g in kiln.grad(loss, (0, 1, 2))(*ts)]
        for name, g, wg in zip("qkv", grads, want_g):
            np.testing.assert_allclose(g, wg, rtol=1e-3, atol=2e-4, err_msg=f"{how} grad {name}")
        results[how] = out, grads
    np.testing.assert_allclose(results["fused"][0], results["unfused"][0], rtol=2e-4, atol=3e-5)


def test_sdpa_records_the_fused_op_and_its_backward(monkeypatch):
    """Fused, a differentiated call records attention and attention_backward (no softmax)."""
    monkeypatch.setenv("KILN_ATTENTION", "fused")
    q, k, v, fmask, _, w = sdpa_case(8, False)
    ts, wt, mt = [kiln.Tensor(t) for t in (q, k, v)], kiln.Tensor(w), kiln.Tensor(fmask)

    def step(a, b, c):
        return kiln.grad(lambda x, y, z: ops.sum(ops.scaled_dot_product_attention(x, y, z, attn_mask=mt) * wt),
                         (0, 1, 2))(a, b, c)

    jitted = kiln.jit(step, capture_mode="trace")
    got = jitted(*ts)
    text = jitted.graph_str()
    assert "= attention(" in text and "attention_backward(" in text and "softmax(" not in text, text
    for g, want in zip(got, step(*ts)):
        np.testing.assert_allclose(g.asnumpy(), want.asnumpy(), rtol=1e-5, atol=1e-6)


def test_mask_that_needs_a_gradient_runs_unfused(monkeypatch):
    """A float mask that requires grad gets its gradient (unfused ops), even when fusing is forced."""
    monkeypatch.setenv("KILN_ATTENTION", "fused")
    q, k, v, fmask, _, w = sdpa_case(9, False)
    ts, wt = [kiln.Tensor(t) for t in (q, k, v, fmask)], kiln.Tensor(w)
    gm = kiln.grad(lambda a, b, c, m: ops.sum(ops.scaled_dot_product_attention(a, b, c, attn_mask=m) * wt), 3)(*ts)
    # d/dmask: the scores' gradient summed over the heads the mask broadcast along
    q64, k64, v64, m64 = (t.astype(np.float64) for t in (q, k, v, fmask))
    kr, vr = np.repeat(k64, 2, axis=1), np.repeat(v64, 2, axis=1)
    p = numpy_attention(q64, k64, v64, 0.25, m64)[2]
    gp = w.astype(np.float64) @ np.swapaxes(vr, -1, -2)
    gs = p * (gp - (gp * p).sum(-1, keepdims=True))
    np.testing.assert_allclose(gm.asnumpy(), gs.sum(1, keepdims=True), rtol=1e-3, atol=1e-5)
    with pytest.raises(ValueError, match="no gradient with respect to the mask"):
        kiln.grad(lambda m: ops.sum(apply(OP.attention, (ts[0], ts[1], ts[2], m), (0,), (0.25,))[0]))(ts[3])


def test_fully_masked_rows_are_nan_as_the_unfused_softmax_gives(monkeypatch):
    q, k, v = inputs((1, 2, 2, 6, 7, 4, 4), np.float32, seed=10)
    mask = np.ones((6, 7), bool)
    mask[2] = False
    got = {}
    for how in ("fused", "unfused"):
        monkeypatch.setenv("KILN_ATTENTION", how)
        got[how] = ops.scaled_dot_product_attention(*(kiln.Tensor(t) for t in (q, k, v)),
                                                    attn_mask=kiln.Tensor(mask)).asnumpy()
    for how, out in got.items():
        assert np.isnan(out[:, :, 2]).all(), how
        assert np.isfinite(np.delete(out, 2, axis=2)).all(), how
    np.testing.assert_allclose(got["fused"], got["unfused"], rtol=2e-4, atol=3e-5)


def test_cost_model_chooses_per_shape_and_says_why():
    """Short sequences: the unfused ops; long ones (the scores beyond the cache): fused, forward
    and forward + backward; dropout: unfused; causal lowers the fused cost."""
    from kiln.ops.nn_functional import attention_choice

    def choice(b, h, l, d, **kw):
        q = kiln.Tensor(np.zeros((b, h, l, d), np.float32))
        return attention_choice(q, q, q, **kw)

    short = choice(1, 2, 16, 64)
    long_fwd, long_bwd = choice(4, 8, 2048, 64), choice(4, 8, 2048, 64, backward=True)
    assert not short[0] and long_fwd[0] and long_bwd[0], (short, long_fwd, long_bwd)
    assert "estimated fused" in long_fwd[3] and "the scores in memory" in long_fwd[3]
    causal = choice(4, 8, 2048, 64, is_causal=True)
    assert causal[1] < long_fwd[1] and causal[2] >= long_fwd[2], (causal, long_fwd)
    dropped = choice(4, 8, 2048, 64, dropout_p=0.1)
    assert not dropped[0] and "dropout" in dropped[3]


@pytest.mark.parametrize("mask,match,exc", [
    (np.zeros((3, 90), np.float32), "does not broadcast", ValueError),
    (np.zeros((70, 90), np.int32), "bool or floating point", TypeError),
])
def test_bad_masks(monkeypatch, mask, match, exc):
    q, k, v, *_ = sdpa_case(11, True)
    for how in ("fused", "unfused"):
        monkeypatch.setenv("KILN_ATTENTION", how)
        with pytest.raises(exc, match=match):
            ops.scaled_dot_product_attention(*(kiln.Tensor(t) for t in (q, k, v)), attn_mask=kiln.Tensor(mask))
    with pytest.raises(ValueError, match="attention: expected a mask"):
        apply(OP.attention, tuple(kiln.Tensor(t) for t in (q, k, v)) + (kiln.Tensor(np.zeros((70, 90), bool)),),
              (0,), (1.0,))
    with pytest.raises(ValueError, match="not both"):
        ops.scaled_dot_product_attention(*(kiln.Tensor(t) for t in (q, k, v)),
                                         attn_mask=kiln.Tensor(np.zeros((70, 90), bool)), is_causal=True)


def test_forward_mode_honours_masks_and_onnx_refuses_them(tmp_path):
    """kiln.jvp through the fused op with the causal flag or a mask equals NumPy's central
    differences (forward mode used to refuse them); a tangent on the mask itself is refused, and so
    is ONNX export, rather than ignoring the mask."""
    q, k, v, fmask, *_ = sdpa_case(12, False)
    ts = [kiln.Tensor(t) for t in (q, k, v)]
    mt = kiln.Tensor(fmask)
    tq = np.random.default_rng(13).standard_normal(q.shape)
    q64, k64, v64, h = q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), 1e-5
    for ints, mask in (((1,), None), ((0,), fmask)):
        extra = () if mask is None else (mt,)
        _, got = kiln.jvp(lambda a: apply(OP.attention, (a, ts[1], ts[2]) + extra, ints, (0.5,))[0], (ts[0],),
                          (kiln.Tensor(tq.astype(np.float32)),))
        plus, minus = (numpy_attention(q64 + d * tq, k64, v64, 0.5, mask, bool(ints[0]))[0] for d in (h, -h))
        np.testing.assert_allclose(got.asnumpy(), (plus - minus) / (2 * h), rtol=1e-3, atol=1e-4)
    with pytest.raises(ValueError, match="no forward-mode rule with respect to its mask"):
        kiln.jvp(lambda m: apply(OP.attention, (ts[0], ts[1], ts[2], m), (0,), (0.5,))[0], (mt,), (mt,))
    from kiln import nn
    from kiln.jit.onnx_export import OnnxExportError

    net = nn.Cell()
    net.construct = lambda a, b, c: apply(OP.attention, (a, b, c), (1,), (0.5,))[0]
    with pytest.raises(OnnxExportError, match="mask or the causal flag"):
        kiln.export(net, *ts, file_name=str(tmp_path / "m"), file_format="ONNX")
