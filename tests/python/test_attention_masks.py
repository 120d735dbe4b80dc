"""ops.scaled_dot_product_attention with PyTorch's attn_mask (bool: True takes part; float: added),
is_causal and dropout_p: NumPy reference, grouped-query heads, broadcast masks, gradients by finite
differences, every capture mode against eager, PyTorch with the same inputs where installed, and
clear errors."""
import math

import numpy as np
import pytest

import kiln
from kiln import ops

rng = np.random.default_rng(7)


def ref(q, k, v, mask=None, causal=False, scale=None):
    hq, hk = q.shape[-3], k.shape[-3]
    k, v = np.repeat(k, hq // hk, axis=-3), np.repeat(v, hq // hk, axis=-3)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    lq, lk = s.shape[-2:]
    if causal:
        mask = np.arange(lk)[None, :] <= np.arange(lq)[:, None]
    if mask is not None:
        s = s + (np.where(mask, 0.0, -np.inf) if mask.dtype == bool else mask)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


def qkv(b=2, hq=4, hk=2, lq=5, lk=6, d=8, dtype=np.float32):
    return (rng.standard_normal((b, hq, lq, d)).astype(dtype), rng.standard_normal((b, hk, lk, d)).astype(dtype),
            rng.standard_normal((b, hk, lk, d)).astype(dtype))


CASES = {
    "bool (Lq, Lk)": lambda lq, lk: rng.random((lq, lk)) < 0.7,
    "float (B, 1, Lq, Lk)": lambda lq, lk: rng.standard_normal((2, 1, lq, lk)).astype(np.float32),
    "bool (B, Hq, 1, Lk) padding": lambda lq, lk: np.arange(lk)[None, None, None, :] < np.array([4, 6])[:, None, None, None] + np.zeros((2, 4, 1, 1), bool),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_masks_match_numpy(case):
    q, k, v = qkv()
    m = CASES[case](5, 6)
    m[..., 0] = True if m.dtype == bool else m[..., 0]  # no row fully masked
    got = ops.scaled_dot_product_attention(kiln.Tensor(q), kiln.Tensor(k), kiln.Tensor(v), kiln.Tensor(m))
    np.testing.assert_allclose(got.asnumpy(), ref(q, k, v, m), rtol=1e-5, atol=1e-5)


def test_causal_and_scale_match_numpy():
    q, k, v = qkv(lq=6, lk=6)
    got = ops.scaled_dot_product_attention(kiln.Tensor(q), kiln.Tensor(k), kiln.Tensor(v), is_causal=True, scale=0.3)
    np.testing.assert_allclose(got.asnumpy(), ref(q, k, v, causal=True, scale=0.3), rtol=1e-5, atol=1e-5)
    q, k, v = qkv(lq=3, lk=5)  # Lq < Lk: top-left aligned, as PyTorch
    got = ops.scaled_dot_product_attention(kiln.Tensor(q), kiln.Tensor(k), kiln.Tensor(v), is_causal=True)
    np.testing.assert_allclose(got.asnumpy(), ref(q, k, v, causal=True), rtol=1e-5, atol=1e-5)


def test_gradients_by_finite_differences():
    q, k, v = qkv(b=1, hq=2, hk=1, lq=3, lk=4, d=3, dtype=np.float64)
    m = rng.standard_normal((3, 4))

    def f(a, b, c):
        return (ops.scaled_dot_product_attention(a, b, c, kiln.Tensor(m)) * kiln.Tensor(np.arange(6.0).reshape(1, 2, 3, 1))).sum()

    grads = kiln.grad(f, grad_position=(0, 1, 2))(kiln.Tensor(q), kiln.Tensor(k), kiln.Tensor(v))
    for arr, g in zip((q, k, v), grads):
        num = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            hi, lo = arr.copy(), arr.copy()
            hi[i] += 1e-6
            lo[i] -= 1e-6
            args = [kiln.Tensor(x) for x in ((hi, k, v) if arr is q else (q, hi, v) if arr is k else (q, k, hi))]
            args2 = [kiln.Tensor(x) for x in ((lo, k, v) if arr is q else (q, lo, v) if arr is k else (q, k, lo))]
            num[i] = (float(f(*args).asnumpy()) - float(f(*args2).asnumpy())) / 2e-6
        np.testing.assert_allclose(g.asnumpy(), num, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_compiled_agrees_with_eager(mode):
    q, k, v = (kiln.Tensor(a) for a in qkv(lq=6, lk=6))
    m = kiln.Tensor(rng.random((6, 6)) < 0.8)

    def f(q, k, v, m):
        a = ops.scaled_dot_product_attention(q, k, v, m)
        b = ops.scaled_dot_product_attention(q, k, v, is_causal=True)
        return a + b

    jf = kiln.jit(f, capture_mode=mode)
    for _ in range(2):
        np.testing.assert_allclose(jf(q, k, v, m).asnumpy(), f(q, k, v, m).asnumpy(), rtol=1e-5, atol=1e-6)
    assert jf.cache_info().eager_calls == 0

    def drop(q, k, v):
        return ops.scaled_dot_product_attention(q, k, v, dropout_p=0.5)

    kiln.manual_seed(3)
    want = drop(q, k, v).asnumpy()
    jd = kiln.jit(drop, capture_mode=mode)
    kiln.manual_seed(3)
    np.testing.assert_allclose(jd(q, k, v).asnumpy(), want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(want, ops.scaled_dot_product_attention(q, k, v).asnumpy())  # dropout did something


def test_matches_torch():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    q, k, v = qkv(hq=2, hk=2, lq=5, lk=5)
    m = rng.random((5, 5)) < 0.7
    m[:, 0] = True
    kt = [kiln.Tensor(a) for a in (q, k, v)]
    tt = [torch.tensor(a) for a in (q, k, v)]
    np.testing.assert_allclose(ops.scaled_dot_product_attention(*kt, kiln.Tensor(m)).asnumpy(),
                               F.scaled_dot_product_attention(*tt, attn_mask=torch.tensor(m)).numpy(), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(ops.scaled_dot_product_attention(*kt, is_causal=True).asnumpy(),
                               F.scaled_dot_product_attention(*tt, is_causal=True).numpy(), rtol=1e-5, atol=1e-5)


def test_clear_errors():
    q, k, v = (kiln.Tensor(a) for a in qkv())
    with pytest.raises(TypeError, match="attn_mask must be a tensor or None.*scale="):
        ops.scaled_dot_product_attention(q, k, v, 0.5)
    with pytest.raises(ValueError, match="attn_mask or is_causal"):
        ops.scaled_dot_product_attention(q, k, v, kiln.Tensor(np.ones((5, 6), bool)), is_causal=True)
    with pytest.raises(TypeError, match="bool or floating point, got int32"):
        ops.scaled_dot_product_attention(q, k, v, kiln.Tensor(np.ones((5, 6), np.int32)))
    with pytest.raises(ValueError, match=r"attn_mask of shape \[4, 6\] does not broadcast"):
        ops.scaled_dot_product_attention(q, k, v, kiln.Tensor(np.ones((4, 6), bool)))
    with pytest.raises(ValueError, match="dropout_p must be in"):
        ops.scaled_dot_product_attention(q, k, v, dropout_p=1.0)


def test_every_variant_with_a_decorated_helper_and_a_mutated_list():
    """User code as written: a decorated attention helper, outputs collected in a list mutated in
    place, bool and float masks and the causal flag; every capture mode x O0/O1 x kbk/sink agrees
    with eager, values and gradients."""
    import functools

    from conformance import run_all_modes

    def scaled(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            return fn(*args, **kwargs) * 0.5
        return wrapper

    @scaled
    def attend(q, k, v, **kw):
        return ops.scaled_dot_product_attention(q, k, v, **kw)

    def f(q, k, v, m, bias):
        outs = []
        outs.append(attend(q, k, v, attn_mask=m))
        outs.append(attend(q, k, v, is_causal=True))
        outs += [attend(q, k, v, attn_mask=bias, scale=0.2)]
        outs[0] = outs[0] + outs.pop()
        return outs

    def call(seed):
        r = np.random.default_rng(seed)
        q, k, v = (kiln.Tensor(r.standard_normal(s).astype(np.float32)) for s in ((2, 4, 6, 8), (2, 2, 6, 8), (2, 2, 6, 8)))
        m = r.random((6, 6)) < 0.7
        m[:, 0] = True
        return q, k, v, kiln.Tensor(m), kiln.Tensor(r.standard_normal((2, 1, 6, 6)).astype(np.float32))

    run_all_modes(f, call(1), call(2))
    run_all_modes(f, call(1), call(2),
                  around=lambda g: kiln.value_and_grad(lambda *a: sum(o.sum() for o in g(*a)), grad_position=(0, 1, 2)))
