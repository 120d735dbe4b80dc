"""Ops a ported PyTorch / MindSpore / JAX script meets (issue 30): the elementwise C ops tan ...
exp2, fmod, atan2, hypot, logaddexp (special values against NumPy, integer fmod, compiled and
fused equal to eager, ONNX); the composites (logsumexp, activations, products, distances, array
functions, cummax / cummin) against NumPy and finite differences and compiled equal to eager; the
random samplers (eager and compiled draw the same under one seed); masked_select and argwhere
(eager only, as nonzero). The table-driven rows of the C ops are in test_ops.py / test_ops_grad.py."""
import math
import warnings

import numpy as np
import pytest

import kiln
from kiln import ops
from compiled_equal import assert_compiled_equal, assert_never_compiled_silently
from conftest import check_grad


def T(a, dtype=None):
    return kiln.Tensor(np.asarray(a), dtype) if dtype is not None else kiln.Tensor(np.asarray(a))


def rng(seed=0):
    return np.random.default_rng(seed)


INF, NAN = np.inf, np.nan

# ---- elementwise C ops -----------------------------------------------------------------------------

UNARY_NP = {"tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh,
            "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "log2": np.log2,
            "log10": np.log10, "exp2": np.exp2}
SPECIAL = np.array([0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -3.0, 100.0, -100.0, INF, -INF, NAN, 1e-30])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(UNARY_NP))
def test_unary_special_values_match_numpy(name, dtype):
    """Domain edges, infinities, NaN and signed zeros: NumPy's values (NaN outside the domain)."""
    x = SPECIAL.astype(dtype)
    with np.errstate(all="ignore"):
        want = UNARY_NP[name](x)
    got = getattr(ops, name)(T(x))
    assert got.dtype.name == np.dtype(dtype).name
    np.testing.assert_allclose(got.numpy(), want, rtol=4e-7 if dtype == np.float32 else 1e-15, atol=0)
    assert np.array_equal(np.signbit(got.numpy()[:2]), np.signbit(want[:2]))  # (+-0 kept where NumPy keeps it)


def test_integer_inputs_give_float32():
    got = ops.log2(T(np.array([1, 2, 8], np.int32)))
    assert got.dtype is kiln.float32
    np.testing.assert_array_equal(got.numpy(), [0.0, 1.0, 3.0])
    assert ops.atan2(T([1, -1]), T([0, 0])).dtype is kiln.float32


def test_fmod_takes_the_dividends_sign_unlike_remainder():
    a, b = np.array([7.0, -7.0, 7.0, -7.0, 5.5, -0.0, INF, 3.0]), np.array([3.0, 3.0, -3.0, -3.0, 2.0, 2.0, 2.0, INF])
    got = ops.fmod(T(a), T(b)).numpy()
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got, np.fmod(a, b))
    np.testing.assert_array_equal(got[:4], [1.0, -1.0, 1.0, -1.0])
    np.testing.assert_array_equal(ops.remainder(T(a[:4]), T(b[:4])).numpy(), [1.0, 2.0, -2.0, -1.0])
    assert np.signbit(got[5])  # fmod(-0, 2) = -0
    with np.errstate(all="ignore"):
        assert np.isnan(ops.fmod(T([1.0]), T([0.0])).numpy()[0])


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_fmod_of_integers_is_exact_and_never_traps(dtype):
    info = np.iinfo(dtype)
    a = np.array([7, -7, 7, -7, info.min, info.max, 5, 0], dtype)
    b = np.array([3, 3, -3, -3, -1, 7, 0, 4], dtype)
    got = ops.fmod(T(a), T(b))
    assert got.dtype.name == np.dtype(dtype).name
    # C's truncated remainder; x fmod 0 and min fmod -1 give 0 (NumPy's fmod gives 0 for both)
    np.testing.assert_array_equal(got.numpy(), np.array([1, -1, 1, -1, 0, info.max % 7, 0, 0], dtype))
    np.testing.assert_array_equal((T(a).fmod(3)).numpy(), np.fmod(a, dtype(3)))


def test_binary_special_values_match_numpy():
    a = np.array([0.0, -0.0, 0.0, -0.0, 1.0, -1.0, INF, -INF, INF, NAN, 1e30, -INF, INF, 1000.0, 3.0, NAN])
    b = np.array([0.0, 0.0, -0.0, -0.0, -INF, INF, INF, -INF, NAN, INF, 1e30, -INF, INF, 1000.0, -1e4, 2.0])
    with np.errstate(all="ignore"):
        for name, nfn in (("atan2", np.arctan2), ("hypot", np.hypot), ("logaddexp", np.logaddexp)):
            for dt in (np.float32, np.float64):
                got = getattr(ops, name)(T(a.astype(dt)), T(b.astype(dt))).numpy()
                want = nfn(a.astype(dt), b.astype(dt))
                np.testing.assert_allclose(got, want, rtol=4e-7 if dt == np.float32 else 1e-15, atol=0,
                                           err_msg=f"{name} {np.dtype(dt).name}")
                if name == "atan2":  # the quadrant of signed zeros
                    assert np.array_equal(np.signbit(got), np.signbit(want))


def test_logaddexp_does_not_overflow():
    x = T(np.array([1000.0, -1000.0, 0.0], np.float32))
    np.testing.assert_allclose(ops.logaddexp(x, x - 1.0).numpy(), [1000.0 + math.log1p(math.exp(-1.0)),
                                                                   -1000.0 + math.log1p(math.exp(-1.0)),
                                                                   math.log1p(math.exp(-1.0))], rtol=1e-6)


def test_names_methods_and_primitives():
    x, y = T(np.array([0.25, -0.5])), T(np.array([2.0, 3.0]))
    assert ops.arcsin is ops.asin and ops.arctan2 is ops.atan2 and ops.arccosh is ops.acosh
    for name in ("tan", "asin", "arcsin", "acos", "atan", "sinh", "cosh", "asinh", "atanh", "exp2", "arctanh"):
        np.testing.assert_array_equal(getattr(x, name)().numpy(), getattr(ops, name)(x).numpy())
    np.testing.assert_array_equal((y + 0.5).acosh().numpy(), ops.acosh(y + 0.5).numpy())
    np.testing.assert_array_equal(y.log2().numpy(), [1.0, math.log2(3.0)])
    np.testing.assert_array_equal(y.log10().numpy(), ops.log10(y).numpy())
    for name in ("fmod", "atan2", "arctan2", "hypot", "logaddexp"):
        np.testing.assert_array_equal(getattr(x, name)(y).numpy(), getattr(ops, name)(x, y).numpy())
    np.testing.assert_array_equal(ops.Atan2()(x, y).numpy(), ops.atan2(x, y).numpy())
    np.testing.assert_array_equal(ops.Tan()(x).numpy(), ops.tan(x).numpy())


def _all_c_ops(x, y):
    s = ops.tan(x * 0.5) + ops.asin(x * 0.4) + ops.acos(x * 0.3) + ops.atan(x) + ops.sinh(x) + ops.cosh(y)
    s = s + ops.asinh(x) + ops.acosh(y + 1.5) + ops.atanh(x * 0.4) + ops.log2(y) + ops.log10(y) + ops.exp2(x)
    return s * ops.fmod(x, y) + ops.atan2(x, y) * ops.hypot(x, y) - ops.logaddexp(x, y * 2.0)


def test_c_ops_compiled_and_fused_equal_eager_with_gradients():
    """Every capture mode x O0 / O1 / O2 x kbk / sink: the fused groups' generated C (O1, O2) holds
    each op's C expression; value and both gradients equal eager's."""
    r = rng(1)
    x = T(r.uniform(-2, 2, (3, 4)).astype(np.float32))
    y = T(r.uniform(0.3, 2, (4,)).astype(np.float32))
    assert_compiled_equal(lambda a, b: _all_c_ops(a, b).sum(), (x, y), grad=True)
    x64 = T(r.uniform(-2, 2, (2, 3)))
    assert_compiled_equal(_all_c_ops, (x64, T(r.uniform(0.3, 2, (2, 3)))))


def test_c_op_gradients_at_broadcast_shapes():
    r = rng(2)
    check_grad(_all_c_ops, r.uniform(-1.5, 1.5, (2, 3)), r.uniform(0.4, 2.0, (3,)))


def test_onnx_export_of_the_unary_ops_and_fmod(tmp_path):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx_runtime import FnCell, export_checked

    def fn(v):
        parts = [getattr(ops, n)(v * 0.4) for n in ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "atanh")]
        parts += [ops.acosh(ops.abs(v) + 1.0), ops.log2(ops.abs(v) + 0.5), ops.log10(ops.abs(v) + 0.5),
                  ops.exp2(v), ops.fmod(v * 7.0, 2.5), ops.fmod(v * 7.0, -2.5)]
        return ops.stack(parts)

    x = rng(3).uniform(-2, 2, (3, 4)).astype(np.float32)
    path = str(tmp_path / "m.onnx")
    export_checked(FnCell(fn), [x], path)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(got, fn(T(x)).numpy(), rtol=2e-6, atol=2e-6)
    ints = np.array([[7, -7, 5], [0, 9, -9]], np.int64)
    ipath = str(tmp_path / "i.onnx")
    export_checked(FnCell(lambda v: ops.fmod(v, T(np.array([3, -2, 0], np.int64)))), [ints], ipath)
    s2 = ort.InferenceSession(ipath, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(s2.run(None, {s2.get_inputs()[0].name: ints})[0],
                                  ops.fmod(T(ints), T(np.array([3, -2, 0], np.int64))).numpy())


# ---- composites ------------------------------------------------------------------------------------


def _np_lse(a, axis=None, keepdims=False):
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    out = np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis if axis is not None else tuple(range(a.ndim)))


def test_logsumexp_is_stable_and_matches_numpy():
    a = rng(4).normal(size=(3, 4, 5)) * 3
    for axis, keep in ((1, False), ((0, 2), True), (None, False), (-1, True)):
        np.testing.assert_allclose(ops.logsumexp(T(a), axis, keep).numpy(), _np_lse(a, axis, keep), rtol=1e-12)
    np.testing.assert_allclose(T(a).logsumexp(dim=2, keepdim=True).numpy(), _np_lse(a, 2, True), rtol=1e-12)
    big = np.array([[1000.0, 1000.0], [-INF, -INF], [INF, 1.0], [-1000.0, -1001.0]], np.float32)
    np.testing.assert_allclose(ops.logsumexp(T(big), 1).numpy(),
                               [1000 + math.log(2), -INF, INF, -1000 + math.log1p(math.exp(-1))], rtol=1e-6)
    assert ops.logsumexp(T(np.array([1, 2], np.int32)), 0).dtype is kiln.float32


ACTIVATIONS = [  # (name, kiln, NumPy, input range)
    ("relu6", ops.relu6, lambda v: np.clip(v, 0, 6), (-3, 9)),
    ("hardtanh", lambda v: ops.hardtanh(v, -0.5, 1.5), lambda v: np.clip(v, -0.5, 1.5), (-3, 3)),
    ("softsign", ops.softsign, lambda v: v / (1 + np.abs(v)), (-3, 3)),
    ("selu", ops.selu, lambda v: 1.0507009873554805 * np.where(v > 0, v, 1.6732632423543772 * np.expm1(v)), (-3, 3)),
    ("celu", lambda v: ops.celu(v, 0.7), lambda v: np.where(v > 0, v, 0.7 * np.expm1(v / 0.7)), (-3, 3)),
    ("glu", ops.glu, lambda v: v[..., :2] / (1 + np.exp(-v[..., 2:])), (-3, 3)),
    ("glu_axis0", lambda v: ops.glu(v, 0), lambda v: v[:1] / (1 + np.exp(-v[1:])), (-3, 3)),
    ("logit", ops.logit, lambda v: np.log(v / (1 - v)), (0.05, 0.95)),
    ("logit_eps", lambda v: ops.logit(v, 0.2), lambda v: np.log(np.clip(v, 0.2, 0.8) / (1 - np.clip(v, 0.2, 0.8))),
     (0.05, 0.95)),
    ("clamp_min", lambda v: ops.clamp_min(v, 0.3), lambda v: np.maximum(v, 0.3), (-2, 2)),
    ("clamp_max", lambda v: v.clamp_max(0.3), lambda v: np.minimum(v, 0.3), (-2, 2)),
]


@pytest.mark.parametrize("case", ACTIVATIONS, ids=lambda c: c[0])
def test_activations_match_numpy_and_finite_differences(case):
    name, kfn, nfn, (lo, hi) = case
    a = rng(5).uniform(lo, hi, (2, 4))
    a = np.where(np.abs(a - np.round(a)) < 0.05, a + 0.1, a)  # away from the kinks at integers
    np.testing.assert_allclose(kfn(T(a)).numpy(), nfn(a), rtol=1e-12, atol=1e-15)
    check_grad(kfn, a)


def _np_cum(a, axis, larger):
    """Running extreme and its latest index (PyTorch's tie rule; NaN sticks), by a plain loop."""
    a = np.moveaxis(a, axis, -1)
    vals, idx = np.empty_like(a), np.zeros(a.shape, np.int64)
    for pos in np.ndindex(a.shape[:-1]):
        best, at = None, 0
        for i, v in enumerate(a[pos]):
            if best is None or np.isnan(v) or (not np.isnan(best) and (v >= best if larger else v <= best)):
                best, at = v, i
            vals[pos + (i,)], idx[pos + (i,)] = best, at
    return np.moveaxis(vals, -1, axis), np.moveaxis(idx, -1, axis)


@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cummax_cummin_values_indices_and_gradient(name):
    a = np.round(rng(6).uniform(-3, 3, (3, 9)))  # ties
    a[1, 4] = NAN
    for axis in (1, 0, -1):
        v, i = getattr(ops, name)(T(a), axis)
        want_v, want_i = _np_cum(a, axis, name == "cummax")
        np.testing.assert_array_equal(v.numpy(), want_v)
        np.testing.assert_array_equal(i.numpy(), want_i)
    ints = np.array([[3, 1, 4, 1, 5, 9, 2, 6]], np.int32)
    v, i = getattr(T(ints), name)(dim=1)
    assert v.dtype is kiln.int32 and i.dtype is kiln.int64
    np.testing.assert_array_equal(v.numpy(), _np_cum(ints, 1, name == "cummax")[0])
    check_grad(lambda x: getattr(ops, name)(x, 1).values, rng(7).permutation(12).reshape(3, 4) * 0.5)


def test_cummax_against_torch():
    torch = pytest.importorskip("torch")
    a = np.round(rng(8).uniform(-2, 2, (4, 7)))
    a[2, 3] = NAN
    for name in ("cummax", "cummin"):
        tv, ti = getattr(torch, name)(torch.tensor(a), 1)
        v, i = getattr(ops, name)(T(a), 1)
        np.testing.assert_array_equal(v.numpy(), tv.numpy())
        np.testing.assert_array_equal(i.numpy(), ti.numpy())


def test_products_match_numpy():
    r = rng(9)
    a, b, v = r.normal(size=(3, 4)), r.normal(size=(4, 5)), r.normal(size=4)
    np.testing.assert_allclose(ops.outer(T(v), T(v[:3])).numpy(), np.outer(v, v[:3]), rtol=1e-12)
    np.testing.assert_array_equal(ops.ger(T(v), T(v)).numpy(), T(v).outer(T(v)).numpy())
    np.testing.assert_allclose(ops.dot(T(v), T(v)).numpy(), v @ v, rtol=1e-12)
    np.testing.assert_allclose(T(a).mv(T(v)).numpy(), a @ v, rtol=1e-12)
    c = r.normal(size=(5,))
    np.testing.assert_allclose(ops.addmm(T(c), T(a), T(b), beta=0.5, alpha=2.0).numpy(), 0.5 * c + 2 * a @ b,
                               rtol=1e-12)
    nan_input = np.full((3, 5), NAN)
    np.testing.assert_allclose(ops.addmm(T(nan_input), T(a), T(b), beta=0).numpy(), a @ b, rtol=1e-12)
    x3, y3, i3 = r.normal(size=(2, 3, 4)), r.normal(size=(2, 4, 2)), r.normal(size=(1, 3, 2))
    np.testing.assert_allclose(ops.baddbmm(T(i3), T(x3), T(y3), alpha=-1.0).numpy(), i3 - x3 @ y3, rtol=1e-12)
    np.testing.assert_allclose(T(a).trace().numpy(), np.trace(a), rtol=1e-12)
    np.testing.assert_allclose(ops.kron(T(a[:2, :2]), T(b[:3])).numpy(), np.kron(a[:2, :2], b[:3]), rtol=1e-12)
    np.testing.assert_allclose(ops.kron(T(v[:2]), T(a)).numpy(), np.kron(v[:2], a), rtol=1e-12)
    t1, t2, t3 = r.normal(size=(3, 1)), r.normal(size=(4,)), r.uniform(1, 2, size=(3, 4))
    np.testing.assert_allclose(ops.addcmul(T(a[:, :4]), T(t1), T(t2), value=0.5).numpy(), a + 0.5 * t1 * t2,
                               rtol=1e-12)
    np.testing.assert_allclose(T(a).addcdiv(T(t1), T(t3), value=-2).numpy(), a - 2 * t1 / t3, rtol=1e-12)
    np.testing.assert_allclose(ops.lerp(T(a), T(t3), 0.25).numpy(), a + 0.25 * (t3 - a), rtol=1e-12)
    np.testing.assert_allclose(T(a).lerp(T(t3), T(t1)).numpy(), a + t1 * (t3 - a), rtol=1e-12)


def test_product_gradients():
    r = rng(10)
    check_grad(lambda p, q: ops.outer(p, q), r.normal(size=3), r.normal(size=4))
    check_grad(lambda p, q, c: ops.addmm(c, p, q, beta=0.5, alpha=1.5), r.normal(size=(2, 3)),
               r.normal(size=(3, 4)), r.normal(size=(4,)))
    check_grad(lambda p, q, c: ops.baddbmm(c, p, q), r.normal(size=(2, 2, 3)), r.normal(size=(2, 3, 2)),
               r.normal(size=(2, 2)))
    check_grad(lambda p, q: ops.kron(p, q), r.normal(size=(2, 2)), r.normal(size=(3, 1)))
    check_grad(lambda p: ops.trace(p) * ops.dot(p[0], p[1]), r.normal(size=(3, 3)))
    check_grad(lambda p, q, w: ops.lerp(p, q, w) + ops.addcdiv(p, q, w + 3.0), r.normal(size=(2, 3)),
               r.normal(size=(2, 3)), r.uniform(0, 1, size=(3,)))


def test_distances_match_numpy():
    r = rng(11)
    a, b = r.normal(size=(2, 4, 3)), r.normal(size=(2, 5, 3))
    want = np.sqrt(((a[:, :, None] - b[:, None]) ** 2).sum(-1))
    np.testing.assert_allclose(ops.cdist(T(a), T(b)).numpy(), want, rtol=1e-10)
    np.testing.assert_allclose(ops.cdist(T(a), T(b), 1.0).numpy(), np.abs(a[:, :, None] - b[:, None]).sum(-1),
                               rtol=1e-12)
    np.testing.assert_allclose(ops.cdist(T(a), T(b), 3).numpy(),
                               (np.abs(a[:, :, None] - b[:, None]) ** 3).sum(-1) ** (1 / 3), rtol=1e-12)
    np.testing.assert_allclose(ops.cdist(T(a), T(b), INF).numpy(), np.abs(a[:, :, None] - b[:, None]).max(-1),
                               rtol=1e-12)
    x, y = r.normal(size=(4, 6)), r.normal(size=(4, 6))
    cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
    np.testing.assert_allclose(ops.cosine_similarity(T(x), T(y)).numpy(), cos, rtol=1e-12)
    np.testing.assert_allclose(ops.cosine_similarity(T(x), T(y[:1]), dim=-1).numpy(),
                               (x * y[:1]).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y[0])), rtol=1e-12)
    np.testing.assert_allclose(ops.pairwise_distance(T(x), T(y)).numpy(), np.linalg.norm(x - y + 1e-6, axis=1),
                               rtol=1e-12)
    np.testing.assert_allclose(ops.pairwise_distance(T(x), T(y), p=1, keepdim=True).numpy(),
                               np.abs(x - y + 1e-6).sum(1, keepdims=True), rtol=1e-12)
    same = ops.cdist(T(a[0]), T(a[0]))  # zero distances: gradient 0, not NaN
    np.testing.assert_allclose(np.diag(same.numpy()), 0.0, atol=1e-7)
    g = kiln.grad(lambda p: ops.cdist(p, p).sum())(T(a[0]))
    assert np.isfinite(g.numpy()).all()
    check_grad(lambda p, q: ops.cdist(p, q), a[0], b[0])
    check_grad(lambda p, q: ops.cosine_similarity(p, q) + ops.pairwise_distance(p, q), x, y)


def test_distances_against_torch():
    torch = pytest.importorskip("torch")
    r = rng(12)
    a, b = r.normal(size=(3, 7, 4)), r.normal(size=(3, 6, 4))
    for p in (2.0, 1.0, 0.5):
        np.testing.assert_allclose(ops.cdist(T(a), T(b), p).numpy(), torch.cdist(torch.tensor(a), torch.tensor(b), p).numpy(),
                                   rtol=1e-10)
    x, y = r.normal(size=(5, 3)), r.normal(size=(5, 3))
    F = torch.nn.functional
    np.testing.assert_allclose(ops.cosine_similarity(T(x), T(y)).numpy(),
                               F.cosine_similarity(torch.tensor(x), torch.tensor(y)).numpy(), rtol=1e-12)
    np.testing.assert_allclose(ops.pairwise_distance(T(x), T(y), 3.0).numpy(),
                               F.pairwise_distance(torch.tensor(x), torch.tensor(y), 3.0).numpy(), rtol=1e-12)


def test_array_functions_match_numpy():
    r = rng(13)
    m, v = r.normal(size=(3, 4)), r.normal(size=3)
    for k in (-4, -1, 0, 2, 5):
        np.testing.assert_array_equal(ops.diag(T(m), k).numpy(), np.diag(m, k))
    for k in (-2, 0, 1):
        np.testing.assert_array_equal(T(v).diag(k).numpy(), np.diag(v, k))
    for lo, fn in ((True, ops.tril_indices), (False, ops.triu_indices)):
        for args in ((3, 3, 0), (3, 5, 1), (4, 2, -1)):
            got = fn(*args)
            want = (np.tril_indices if lo else np.triu_indices)(args[0], args[2], args[1])
            assert got.dtype is kiln.int64
            np.testing.assert_array_equal(got.numpy(), np.stack(want))
    t = r.normal(size=(2, 3, 4, 5))
    for src, dst in ((0, -1), ((0, 1), (3, 0)), (2, 2), ([1, 3], [0, 1])):
        np.testing.assert_array_equal(ops.movedim(T(t), src, dst).numpy(), np.moveaxis(t, src, dst))
    np.testing.assert_array_equal(ops.moveaxis(T(t), 1, 0).numpy(), T(t).moveaxis(1, 0).numpy())
    parts = T(t).unbind(2)
    assert len(parts) == 4
    for i, p in enumerate(parts):
        np.testing.assert_array_equal(p.numpy(), t[:, :, i])
    np.testing.assert_array_equal(ops.hstack([T(m), T(m[:, :1])]).numpy(), np.hstack([m, m[:, :1]]))
    np.testing.assert_array_equal(ops.hstack([T(v), T(v)]).numpy(), np.hstack([v, v]))
    np.testing.assert_array_equal(ops.vstack([T(m), T(m[0])]).numpy(), np.vstack([m, m[0]]))
    np.testing.assert_array_equal(T(m.T).ravel().numpy(), m.T.ravel())
    idx = np.array([[0, 3], [2, 2], [1, 0]])
    np.testing.assert_array_equal(ops.take_along_dim(T(m), T(idx), 1).numpy(), np.take_along_axis(m, idx, 1))
    np.testing.assert_array_equal(T(m).take_along_dim(T(idx[:1]), 1).numpy(),
                                  np.take_along_axis(m, np.broadcast_to(idx[:1], (3, 2)), 1))
    np.testing.assert_array_equal(ops.take_along_dim(T(m), T(np.array([5, 0]))).numpy(), m.ravel()[[5, 0]])
    for k in (-3, -1, 0, 1, 2, 3, 6):
        np.testing.assert_array_equal(ops.rot90(T(t), k, (1, 3)).numpy(), np.rot90(t, k, (1, 3)))
    np.testing.assert_array_equal(T(m).expand_as(T(np.zeros((2, 3, 4)))).numpy(), np.broadcast_to(m, (2, 3, 4)))
    assert T(m).type_as(T(np.zeros(1, np.int32))).dtype is kiln.int32
    check_grad(lambda p: ops.diag(p, 1).sum() * ops.diag(ops.diag(p, -1)) + ops.rot90(p).sum(), m)
    check_grad(lambda p: ops.take_along_dim(ops.movedim(p, 0, 1), T(idx.T), 0) * ops.hstack([p, p])[0, 5], m)


def test_reductions_and_predicates_match_numpy():
    r = rng(14)
    a = r.normal(size=(3, 5))
    vm, mm = ops.var_mean(T(a), 1)
    np.testing.assert_allclose(vm.numpy(), a.var(1), rtol=1e-12)
    np.testing.assert_allclose(mm.numpy(), a.mean(1), rtol=1e-12)
    sd, mn = ops.std_mean(T(a), 0, True, correction=1)
    np.testing.assert_allclose(sd.numpy(), a.std(0, ddof=1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(mn.numpy(), a.mean(0, keepdims=True), rtol=1e-12)
    for n, axis in ((1, -1), (2, 0), (3, 1), (0, 0)):
        np.testing.assert_allclose(ops.diff(T(a), n, axis).numpy(), np.diff(a, n, axis), rtol=1e-12)
    np.testing.assert_allclose(T(a).diff(dim=0, prepend=T(a[:1] * 0), append=T(a[:1])).numpy(),
                               np.diff(a, axis=0, prepend=a[:1] * 0, append=a[:1]), rtol=1e-12)
    b = r.random((2, 6)) < 0.5
    np.testing.assert_array_equal(ops.diff(T(b)).numpy(), np.diff(b))
    special = np.array([NAN, INF, -INF, 1.5, -0.0], np.float32)
    np.testing.assert_array_equal(ops.nan_to_num(T(special)).numpy(), np.nan_to_num(special))
    np.testing.assert_array_equal(T(special).nan_to_num(1.0, 9.0, -9.0).numpy(),
                                  np.nan_to_num(special, nan=1.0, posinf=9.0, neginf=-9.0))
    ints = np.array([[0, 2, 0], [1, 0, 0]])
    assert ops.nan_to_num(T(ints)).dtype is kiln.int64
    np.testing.assert_array_equal(ops.count_nonzero(T(ints)).numpy(), 2)
    np.testing.assert_array_equal(T(ints).count_nonzero(dim=0).numpy(), np.count_nonzero(ints, 0))
    assert ops.count_nonzero(T(ints), 1, True).shape == (2, 1)
    p = np.array([1.0, 1.0 + 1e-6, NAN, INF, -INF, 1.0, 0.0])
    q = np.array([1.0, 1.0, NAN, INF, INF, 1.1, 1e-9])
    for kw in ({}, {"equal_nan": True}, {"rtol": 0.2}, {"atol": 0.0, "rtol": 0.0}):
        np.testing.assert_array_equal(ops.isclose(T(p), T(q), **kw).numpy(), np.isclose(p, q, **kw))
    assert ops.allclose(T(a), T(a + 1e-9)) is True and T(a).allclose(T(a + 1e-3)) is False
    np.testing.assert_array_equal(ops.logical_xor(T(ints), T(np.array([1.0, 0.0, 0.0]))).numpy(),
                                  np.logical_xor(ints, [1.0, 0.0, 0.0]))
    check_grad(lambda x: ops.var_mean(x, 0)[0] * ops.std_mean(x, 1, True)[1] + ops.diff(x, 2).sum(), a)
    check_grad(lambda x: ops.nan_to_num(ops.log(x)), np.abs(a) + 0.1)


def test_bad_arguments_raise_errors_naming_the_op():
    m, v = T(np.ones((3, 4))), T(np.ones(3))
    cases = [
        (lambda: ops.dot(v, T(np.ones(4))), ValueError, "dot: expected two 1-D tensors of one length"),
        (lambda: ops.mv(m, v), ValueError, "mv: expected a matrix (n, m) and a vector (m,)"),
        (lambda: ops.outer(m, v), ValueError, "outer: expected two 1-D tensors"),
        (lambda: ops.addmm(T(np.ones(4)), m, m.T), ValueError, "addmm: input of shape [4]"),
        (lambda: ops.addmm(T(np.ones(4)), m, m.T, beta=0), ValueError, "addmm: input of shape [4]"),
        (lambda: ops.addmm(v, m, m), ValueError, "addmm: expected matrices"),
        (lambda: ops.glu(T(np.ones((2, 3)))), ValueError, "glu: the length of axis 1 must be even"),
        (lambda: ops.diag(T(np.ones((2, 2, 2)))), ValueError, "diag: input must be 1-D or 2-D"),
        (lambda: ops.trace(v), ValueError, "trace: expected a matrix"),
        (lambda: ops.cdist(m, T(np.ones((2, 3)))), ValueError, "cdist: expected (..., P, M) and (..., R, M)"),
        (lambda: ops.movedim(m, (0, 1), 0), ValueError, "movedim: source"),
        (lambda: ops.rot90(m, 1, (0, 0)), ValueError, "rot90: dims must be two different axes"),
        (lambda: ops.take_along_dim(m, T(np.zeros((2, 2), np.int64)), 1), ValueError, "take_along_dim"),
        (lambda: ops.diff(T(1.0)), ValueError, "diff: input must have at least 1 dimension"),
        (lambda: ops.cummax(m), TypeError, "cummax: axis (PyTorch: dim) is required"),
        (lambda: ops.relu6(T(np.ones(2, np.int32))), TypeError, "relu6: input must be floating point"),
        (lambda: ops.hardtanh(m, 1.0, -1.0), ValueError, "hardtanh: min_val"),
        (lambda: ops.isclose(m, m, rtol=-1.0), ValueError, "isclose: rtol and atol must be non-negative"),
        (lambda: ops.tril_indices(-1, 3), ValueError, "tril_indices: row and col must be non-negative"),
        (lambda: ops.masked_select(m, T(np.ones(4))), TypeError, "masked_select: mask must be bool"),
        (lambda: ops.masked_select(m, T(np.ones(3, bool))), ValueError, "masked_select: input of shape [3, 4]"),
    ]
    for call, exc, text in cases:
        with pytest.raises(exc) as info:
            call()
        assert text in str(info.value), (text, str(info.value))


def _composites(x, y, i):
    lse = ops.logsumexp(x, 1) + ops.logsumexp(y, (0, 1), True).sum()
    act = ops.relu6(x * 4.0) + ops.hardtanh(x) + ops.softsign(x) + ops.celu(x) + ops.selu(x)
    act = act + ops.logit(ops.sigmoid(x), 1e-3) + ops.clamp_min(x, 0.1) * ops.clamp_max(y[:, :4], 0.5)
    g = ops.glu(ops.hstack([x, x * 0.5]))
    prod = ops.addmm(x[:, 0], x, y[:, :4].T * 0.1, beta=0.5) + ops.addcmul(y[:, :3], x[:, :3], x[:, 1:], value=0.3)[:, 0]
    dist = ops.cdist(x, y[:, :4]) + ops.cdist(x, y[:, 1:], 1.0) + ops.cosine_similarity(x, y[:, :4], 1)[:, None]
    arr = ops.diag(ops.diag(x[:, :3])) + ops.rot90(x[:, :3]).T + ops.movedim(ops.kron(x[:2, :2], y[:2, :2]), 0, 1)[:3, :3]
    cm = ops.cummax(x, 1).values + ops.cummin(x, 0)[0] + ops.take_along_dim(x, i, 1).sum()
    var, mean = ops.var_mean(x, 0, True)
    red = ops.diff(x, 1, 1).sum() + ops.nan_to_num(ops.log(x)).sum() + ops.trace(x[:, :3]) + var.sum() * mean.sum()
    return (lse.sum() + act.sum() + g.sum() + prod.sum() + dist.sum() + arr.sum() + cm.sum() + red
            + ops.lerp(x, y[:, :4], 0.3).sum() + ops.dot(x[0], y[0, :4]))


def test_composites_compiled_equal_eager_with_gradients():
    r = rng(15)
    x = T(r.uniform(-2, 2, (3, 4)))
    y = T(r.uniform(-2, 2, (3, 5)))
    i = T(r.integers(0, 4, (3, 2)))
    np.testing.assert_allclose(_composites(x, y, i).numpy(), _composites(x, y, i).numpy())
    assert_compiled_equal(_composites, (x, y, i), grad=True)


def test_composite_results_compiled_equal_eager():
    def fn(x, i):
        v, k = ops.cummax(x, 0)
        return (v, k, ops.count_nonzero(x > 0, 1), ops.isclose(x, x * 1.0000001), ops.logical_xor(x > 0, i > 1),
                ops.unbind(x, 1)[2], ops.diff(i, 1, 0), ops.tril_indices(3, 4) + i[0, 0], ops.ravel(x.T))

    r = rng(16)
    assert_compiled_equal(fn, (T(r.normal(size=(4, 3)).astype(np.float32)), T(r.integers(0, 4, (4, 3)))))


# ---- data-dependent sizes: eager only, as nonzero -------------------------------------------------


def test_masked_select_and_argwhere_match_numpy():
    r = rng(17)
    a = r.normal(size=(3, 4))
    mask = r.random((3, 4)) < 0.5
    np.testing.assert_array_equal(ops.masked_select(T(a), T(mask)).numpy(), a[mask])
    row = np.array([True, False, True, True])  # broadcast against input
    np.testing.assert_array_equal(T(a).masked_select(T(row)).numpy(), a[np.broadcast_to(row, a.shape)])
    np.testing.assert_array_equal(ops.argwhere(T(a > 0)).numpy(), np.argwhere(a > 0))
    np.testing.assert_array_equal(T(a).argwhere().numpy(), np.argwhere(a))
    g = kiln.grad(lambda x: (ops.masked_select(x, T(mask)) ** 2).sum())(T(a))  # gradient reaches the chosen elements
    np.testing.assert_allclose(g.numpy(), np.where(mask, 2 * a, 0.0))


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_masked_select_and_argwhere_are_never_compiled_silently(mode):
    """As nonzero: under kiln.jit an error naming the op, or (where the mode can) the function run
    eagerly with a warning naming it; never a size baked in from the capture."""
    inputs = (T(np.array([1.0, -1.0, 2.0])), T(np.array([3.0, 3.0, -1.0, 5.0])))
    for op, fn in (("masked_select", lambda x: ops.masked_select(x, x > 0) * 2),
                   ("argwhere", lambda x: ops.argwhere(x > 0) + 1)):
        assert_never_compiled_silently(op, fn, mode, inputs)


# ---- random sampling ---------------------------------------------------------------------------------


def _draws(x, w):
    return (ops.rand_like(x), ops.randn_like(x, dtype=kiln.float64), ops.randint(3, 9, (2, 5)),
            ops.randint(4, size=3, dtype=kiln.int32), ops.randperm(7), ops.bernoulli(ops.sigmoid(x)),
            x.bernoulli(0.25), ops.multinomial(w, 2), w.multinomial(6, replacement=True),
            ops.multinomial(w[0], 3))


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
@pytest.mark.parametrize("level", ["O0", "O1"])
@pytest.mark.parametrize("backend", ["kbk", "sink"])
def test_samplers_compiled_draw_what_eager_draws_under_one_seed(mode, level, backend):
    x = T(rng(18).normal(size=(3, 4)).astype(np.float32))
    w = T(np.array([[0.1, 0.0, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0]], np.float32))
    kiln.manual_seed(42)
    want = _draws(x, w)
    jf = kiln.jit(_draws, capture_mode=mode, jit_level=level, backend=backend)
    for call in range(2):  # the capturing call and a replay
        kiln.manual_seed(42)
        got = jf(x, w)
        for k, (g, e) in enumerate(zip(got, want)):
            assert g.dtype is e.dtype and g.shape == e.shape, (call, k)
            np.testing.assert_array_equal(g.numpy(), e.numpy(), err_msg=f"call {call} draw {k}")
    assert jf.cache_info().eager_calls == 0


def test_samplers_draw_from_their_distributions():
    kiln.manual_seed(7)
    n = 20000
    ints = ops.randint(-2, 3, (n,)).numpy()
    assert ints.dtype == np.int64 and ints.min() == -2 and ints.max() == 2
    np.testing.assert_allclose(np.bincount(ints + 2) / n, 0.2, atol=0.02)
    for k in (0, 1, 9):
        assert sorted(ops.randperm(k).numpy().tolist()) == list(range(k))
    p = T(np.full((n,), 0.3))
    b = ops.bernoulli(p).numpy()
    assert set(np.unique(b)) <= {0.0, 1.0} and abs(b.mean() - 0.3) < 0.02
    u = ops.rand_like(T(np.zeros((n,), np.float32))).numpy()
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.02
    z = ops.randn_like(T(np.zeros((n,)))).numpy()
    assert abs(z.mean()) < 0.03 and abs(z.std() - 1) < 0.03
    w = np.array([0.0, 1.0, 3.0, 0.0, 4.0])
    draws = ops.multinomial(T(np.tile(w, (n // 10, 1))), 1, True).numpy().ravel()
    np.testing.assert_allclose(np.bincount(draws, minlength=5) / draws.size, w / w.sum(), atol=0.03)
    without = ops.multinomial(T(np.tile(w, (200, 1))), 3).numpy()
    assert all(sorted(row) == [1, 2, 4] for row in without.tolist())  # every positive category, none twice
    first = ops.multinomial(T(np.tile(w, (n // 10, 1))), 2).numpy()[:, 0]
    np.testing.assert_allclose(np.bincount(first, minlength=5) / first.size, w / w.sum(), atol=0.03)


def test_sampler_bad_arguments():
    cases = [
        (lambda: ops.randint(5, 5, (2,)), ValueError, "randint: high (5) must be greater than low (5)"),
        (lambda: ops.randint(0, 5), TypeError, "randint: size is required"),
        (lambda: ops.randperm(-1), ValueError, "randperm: n must be a non-negative int"),
        (lambda: ops.bernoulli(T(np.ones(2, np.int32))), TypeError, "bernoulli: input must be floating point"),
        (lambda: ops.multinomial(T(np.ones(3)), 4), ValueError, "multinomial: cannot draw 4 samples"),
        (lambda: ops.multinomial(T(np.ones((2, 2, 2))), 1), ValueError, "multinomial: input must be 1-D or 2-D"),
        (lambda: ops.rand_like(T(np.ones(2, np.int64))), TypeError, "rand_like: samples are floating point"),
    ]
    for call, exc, text in cases:
        with pytest.raises(exc) as info:
            call()
        assert text in str(info.value), (text, str(info.value))


# ---- symbolic sizes and export of the new ops ----------------------------------------------------


@pytest.mark.parametrize("mode", ["ast", "trace"])
def test_one_dynamic_capture_serves_other_sizes(mode):
    """KILN_SYM rules of the C ops, and the composites' parts: compiled once with dynamic=True, the
    function serves new sizes equal to eager."""
    def fn(x, y):
        z = _all_c_ops(x, y) + ops.relu6(x) * ops.softsign(y)
        return ops.logsumexp(z, 1) + ops.cdist(z, z).sum(1) + ops.diff(z, 1, 1).sum(1)

    def scan(x):  # cummax's number of log steps follows the length: a new length may compile again
        return ops.cummax(x, 0).values

    f, g = kiln.jit(fn, capture_mode=mode, dynamic=True), kiln.jit(scan, capture_mode=mode, dynamic=True)
    r = rng(19)
    for n, m in ((3, 4), (5, 4), (4, 6)):
        x, y = T(r.uniform(-1.5, 1.5, (n, m))), T(r.uniform(0.4, 2.0, (n, m)))
        np.testing.assert_allclose(f(x, y).numpy(), fn(x, y).numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(g(x).numpy(), scan(x).numpy())
    assert f.cache_info().compiles == 1


def test_composites_export_to_onnx(tmp_path):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx_runtime import FnCell, export_checked

    def fn(v):
        h = ops.logsumexp(v, 1, True) + ops.hardtanh(v) + ops.glu(ops.hstack([v, v * 0.5]))
        h = h + ops.cdist(v, v * 0.5) @ ops.diag(ops.diag(v[:, :4])) + ops.kron(v[:1, :2], v[:2, :2])[:, :4].sum()
        return h + ops.rot90(ops.lerp(v, v * v, 0.25)[:, :3]).T.sum(1, True) + ops.nan_to_num(ops.log(v)).sum(1, True)

    x = rng(20).uniform(-2, 2, (4, 4)).astype(np.float32)
    path = str(tmp_path / "c.onnx")
    export_checked(FnCell(fn), [x], path)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(got, fn(T(x)).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["atan2", "hypot", "logaddexp"])
def test_ops_without_an_onnx_operator_are_refused_by_name(name, tmp_path):
    pytest.importorskip("onnx")
    from kiln.jit.onnx_export import OnnxExportError
    from onnx_runtime import FnCell

    with pytest.raises(OnnxExportError, match=f"the op '{name}' has no ONNX form"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kiln.export(FnCell(lambda v: getattr(ops, name)(v, v * 2.0)), T(np.ones((2, 2), np.float32)),
                    file_name=str(tmp_path / "m.onnx"), file_format="ONNX")


HOSTILE = np.array([[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5], [-0.0, 0.0, NAN, INF, -INF, 3e9],
                    [0.7, -0.7, 1e-7, -1e-7, 100.0, -100.0]], np.float32)


def test_c_ops_on_hostile_values_compiled_equal_eager():
    """NaN, infinities, signed zeros, huge and tiny values through the fused groups' generated C
    (float32 exp, erf, tanh and log: the eager kernels' approximations, src/core/approx_f32.h):
    every variant gives eager's values."""
    def fn(x, y):
        unary = [getattr(ops, n)(x) for n in sorted(UNARY_NP)]
        binary = [ops.fmod(x, y), ops.atan2(x, y), ops.hypot(x, y), ops.logaddexp(x, y), ops.logaddexp(y, x)]
        return [u * 1.0 for u in unary] + [b + 0.0 for b in binary]

    y = np.roll(HOSTILE, 1, axis=1) * -1.5
    with np.errstate(all="ignore"):
        assert_compiled_equal(fn, (T(HOSTILE), T(y)), (T(HOSTILE.astype(np.float64)), T(y.astype(np.float64))))
