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
from compiled_equal import assert_compiled_equal
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
