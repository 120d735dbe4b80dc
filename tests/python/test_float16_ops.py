"""float16 arithmetic (enable_ioc16's ops) against NumPy's float16 references: each op computes in
float32 and rounds its result to float16 once (NumPy's float16 ufuncs do the same), whether the
op runs its float16 loop (elementwise: F16C rows, src/core/half.c) or works on float32 copies
(matmul, softmax, norms, reductions)."""
import numpy as np
import pytest

import kiln
from kiln import ops

F16, F32 = np.float16, np.float32


def h(*shape, seed=0, scale=2.0):
    return (np.random.default_rng(seed + len(shape)).standard_normal(shape) * scale).astype(F16)


def t(a):
    return kiln.tensor(a)


def ulps(got, want):
    """The largest distance in float16 steps (NaN where both are NaN counts as 0)."""
    g, w = got.astype(F16).view(np.int16).astype(np.int32), want.astype(F16).view(np.int16).astype(np.int32)
    g, w = np.where(g < 0, -(g & 0x7FFF), g), np.where(w < 0, -(w & 0x7FFF), w)
    both_nan = np.isnan(got.astype(F32)) & np.isnan(want.astype(F32))
    return int(np.max(np.where(both_nan, 0, np.abs(g - w)), initial=0))


@pytest.mark.parametrize("name, fn, ref", [
    ("add broadcast", lambda a, b: a + b[:1], lambda a, b: a + b[:1]),
    ("mul by a scalar", lambda a, b: a * 0.3, lambda a, b: a * F16(0.3)),
    ("div transposed", lambda a, b: a.T / b.T, lambda a, b: a.T / b.T),
    ("exp", lambda a, b: ops.exp(a), lambda a, b: np.exp(a)),
    ("tanh", lambda a, b: ops.tanh(a), lambda a, b: np.tanh(a)),
    ("maximum", lambda a, b: ops.maximum(a, b), lambda a, b: np.maximum(a, b)),
    ("less", lambda a, b: a < b, lambda a, b: a < b),
])
def test_elementwise_float16(name, fn, ref):
    a, b = h(33, 70), h(33, 70, seed=1)
    got = fn(t(a), t(b)).asnumpy()
    want = ref(a, b)
    assert got.dtype == want.dtype
    if want.dtype == np.bool_:
        np.testing.assert_array_equal(got, want)
    else:
        assert ulps(got, want) <= 1  # NumPy's libm and kiln's may differ by a float32 step
        assert np.mean(got == want) >= 0.99


def test_rows_ops_float16():
    x, w, b = h(6, 40), h(40, seed=2, scale=0.5), h(40, seed=3, scale=0.5)
    x32 = x.astype(F32)
    # softmax
    e = np.exp(x32 - x32.max(-1, keepdims=True))
    assert ulps(ops.softmax(t(x), axis=-1).asnumpy(), (e / e.sum(-1, keepdims=True)).astype(F16)) <= 1
    # layer norm and RMS norm: float32 statistics, one rounding of the result
    mu, var = x32.mean(-1, keepdims=True), x32.var(-1, keepdims=True)
    want = ((x32 - mu) / np.sqrt(var + 1e-5) * w.astype(F32) + b.astype(F32)).astype(F16)
    assert ulps(ops.layer_norm(t(x), (40,), t(w), t(b)).asnumpy(), want) <= 1
    want = (x32 / np.sqrt((x32 * x32).mean(-1, keepdims=True) + 1e-6) * w.astype(F32)).astype(F16)
    assert ulps(ops.rms_norm(t(x), t(w)).asnumpy(), want) <= 1
    # reductions
    assert ulps(t(x).sum(axis=-1).asnumpy(), x32.sum(-1).astype(F16)) <= 1
    assert ulps(t(x).mean(axis=0).asnumpy(), x32.mean(0).astype(F16)) <= 1
    np.testing.assert_array_equal(t(x).max(axis=-1).asnumpy(), x.max(-1))


def test_matmul_float16():
    a, b = h(12, 40, scale=0.5), h(40, 9, seed=4, scale=0.5)
    got = ops.matmul(t(a), t(b)).asnumpy()
    assert got.dtype == F16
    assert ulps(got, (a.astype(F32) @ b.astype(F32)).astype(F16)) <= 1
