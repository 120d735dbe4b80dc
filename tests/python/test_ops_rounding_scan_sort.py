"""floor / ceil / round / trunc, log1p / expm1, isnan / isinf / isfinite, cumsum / cumprod and sort /
argsort as users write them: every compiled variant (ast / bytecode / trace x O0 / O1 x kbk / sink,
and O2) equal to eager, gradients through compiled code, Python's math.floor and round() on tensors,
MindSpore's primitives, ONNX Runtime against kiln, and PyTorch where it is installed."""
import math
import warnings

import numpy as np
import pytest

import kiln
from kiln import ops
from conformance import run_all_modes
import onnx_runtime

# halves (ties of round), signed zeros, NaN, infinities and a value past float32's integers
HOSTILE = np.array([[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5], [-0.0, 0.0, np.nan, np.inf, -np.inf, 3e9],
                    [0.7, -0.7, 1e-7, -1e-7, 2.4999, -3.6]], np.float32)
with np.errstate(over="ignore"):
    HOSTILE_HALF = HOSTILE.astype(np.float16)  # (3e9 becomes inf)


def _t(a):
    return kiln.Tensor(np.asarray(a))


def test_rounding_and_classifying_compiled_equal_eager():
    def f(x):
        finite = ops.where(ops.isfinite(x), x, 0.0)  # masking NaN and inf, as a loss does
        return (ops.floor(x), ops.ceil(x), ops.round(x), x.trunc(), ops.round(x * 10.0, decimals=-1),
                ops.log1p(ops.abs(finite)), ops.expm1(finite * 0.01), ops.isnan(x), x.isinf(),
                ops.isnan(x).sum(), finite.round(decimals=2))

    run_all_modes(f, (_t(HOSTILE),), (_t(HOSTILE * -3.0),))


def test_rounding_keeps_integers_exact():
    big = np.array([2 ** 62 + 1, -(2 ** 53) - 1, 7, -7], np.int64)

    def f(i):
        return ops.floor(i), ops.round(i), i.ceil(), ops.trunc(i), ops.isnan(i), ops.isfinite(i)

    want = run_all_modes(f, (_t(big),))
    assert want[0][1][0].numpy().tolist() == big.tolist()  # not through double (2**62 + 1 survives)
    assert ops.floor(_t(big)).dtype == kiln.int64 and ops.isfinite(_t(big)).dtype == kiln.bool


def test_scans_compiled_equal_eager():
    def f(x, i):
        return (ops.cumsum(x, 1), x.cumsum(dim=0), ops.cumprod(x * 0.5, 1), ops.cumsum(i, 0), i.cumprod(1),
                ops.cumsum(x), ops.CumSum(exclusive=True, reverse=True)(x, 1), ops.cumsum(i > 0, 1))

    x = np.array([[1.0, -2.0, 0.0, 3.5], [np.nan, 1.0, 2.0, 0.5], [0.25, np.inf, -1.0, 4.0]], np.float32)
    i = np.array([[3, -1, 2, 0], [5, 5, -7, 1], [2 ** 40, 2 ** 30, 3, -1]], np.int64)
    run_all_modes(f, (_t(x), _t(i)), (_t(x * 2), _t(i // 3)))


def test_scans_match_numpy_and_wrap_as_numpy():
    i = np.array([[2 ** 62, 2 ** 62, 5], [3, 2 ** 40, 2 ** 40]], np.int64)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(ops.cumsum(_t(i), 0).numpy(), np.cumsum(i, 0))  # wraps past int64
        np.testing.assert_array_equal(ops.cumprod(_t(i), 1).numpy(), np.cumprod(i, 1))
    small = np.array([100, 100, 100], np.int8)
    assert ops.cumsum(_t(small), 0).numpy().tolist() == [100, 200, 300]  # int64, as NumPy and PyTorch
    f = np.array([1e-8, 1.0, -1.0, 1e-8] * 3, np.float32)
    assert ops.cumsum(_t(f), 0).numpy()[-1] == np.float32(np.cumsum(f.astype(np.float64))[-1])  # in double


def test_sort_compiled_equal_eager():
    def f(x, i):
        v, k = ops.sort(x)
        d, dk = x.sort(0, descending=True)
        return v, k, d, dk, ops.argsort(i, 1, descending=True), ops.Sort(axis=0)(i), ops.argsort(x > 0.5, 1)

    x = np.array([[3.0, np.nan, -1.0, 3.0, -0.0, 0.0], [np.inf, 2.0, np.nan, -np.inf, 2.0, 1.0]], np.float32)
    i = np.array([[4, 1, 4, -2, 1, 0], [7, 7, 7, 1, 9, 1]], np.int32)
    run_all_modes(f, (_t(x), _t(i)), (_t(x[:, ::-1].copy()), _t(i * -1)))


def test_sort_result_is_a_named_tuple_in_every_variant():
    def f(x):
        top = x.sort(-1, descending=True)
        return top.values[:, :2] * 2.0, top.indices, ops.sort(x, 0)  # the result itself returned

    out = run_all_modes(f, (_t(HOSTILE),), (_t(HOSTILE * 2.0),))
    assert out is not None and ops.sort(_t(HOSTILE)).indices.dtype == kiln.int64
    assert type(ops.sort(_t(HOSTILE))).__name__ == "SortResult" and isinstance(ops.sort(_t(HOSTILE)), tuple)


def test_sort_is_stable_with_nan_last_as_numpy():
    a = np.array([2.0, np.nan, 1.0, 2.0, np.nan, -np.inf, 1.0, np.inf, -0.0, 0.0])
    v, k = ops.sort(_t(a))
    np.testing.assert_array_equal(k.numpy(), np.argsort(a, kind="stable"))
    np.testing.assert_array_equal(v.numpy(), np.sort(a, kind="stable"))
    d = ops.argsort(_t(a), descending=True).numpy()
    assert d.tolist() == [1, 4, 7, 0, 3, 2, 6, 8, 9, 5]  # NaN first, ties in their order


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_gradients_through_compiled_code(mode):
    def loss(x):
        v, _ = ops.sort(x, 1, descending=True)
        top = ops.cumsum(v, 1) * ops.floor(x + 0.5)
        return (top + ops.cumprod(x, 0) + ops.log1p(x * x) + ops.expm1(x * 0.1)).sum()

    x = np.array([[0.3, -1.2, 0.0, 2.1], [1.7, 0.0, -0.4, 0.9], [0.0, 1.1, 2.3, -0.6]])
    g_eager = kiln.grad(loss)(_t(x)).numpy()
    g_jit = kiln.grad(kiln.jit(loss, capture_mode=mode))(_t(x)).numpy()
    np.testing.assert_allclose(g_jit, g_eager, rtol=1e-12, atol=1e-12)
    eps, num = 1e-6, np.zeros_like(x)
    for idx in np.ndindex(x.shape):  # (floor's steps are at x + 0.5 integral: away from these values)
        e = np.zeros_like(x)
        e[idx] = eps
        num[idx] = (loss(_t(x + e)).numpy() - loss(_t(x - e)).numpy()) / (2 * eps)
    np.testing.assert_allclose(g_eager, num, rtol=1e-6, atol=1e-6)


def test_value_and_grad_every_variant():
    def loss(x):
        return (ops.cumprod(x, 1) * ops.sort(x, 0)[0] + ops.round(x) * x).sum()

    x = np.array([[0.5, 0.0, 2.0], [1.5, -1.0, 0.0]], np.float32)
    run_all_modes(loss, (_t(x),), (_t(x * 1.3),), around=lambda f: kiln.value_and_grad(f))


def test_level_o2_equal_eager():
    def f(x):
        return ops.floor(x * 3.0) + ops.isinf(x).astype(kiln.float32), ops.cumsum(ops.expm1(x), 0), ops.sort(x, 0)

    x = _t(HOSTILE)
    want = f(x)
    for backend in ("kbk", "sink"):
        got = kiln.jit(f, jit_level="O2", backend=backend)(x)
        for g, w in zip([got[0], got[1], *got[2]], [want[0], want[1], *want[2]]):
            np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_in_place_rounding_compiled_equal_eager():
    def f(x, y):
        x.floor_()
        y[0].round_(decimals=1)
        return x * 2.0, y.trunc_()

    run_all_modes(f, (_t(HOSTILE), _t(HOSTILE * 1.37)), (_t(HOSTILE * -2.0), _t(HOSTILE)))


def test_python_rounding_builtins_give_tensors():
    t = _t(np.array([2.5, -1.25], np.float32))
    assert isinstance(math.floor(t), kiln.Tensor) and math.floor(t).numpy().tolist() == [2.0, -2.0]
    assert math.ceil(t).numpy().tolist() == [3.0, -1.0] and math.trunc(t).numpy().tolist() == [2.0, -1.0]
    assert round(t).numpy().tolist() == [2.0, -1.0] and np.array_equal(round(t, 1).numpy(), np.float32([2.5, -1.2]))


def test_python_rounding_of_numbers_chosen_by_a_tensor():
    def f(x):
        k = 2.7 if x.sum() > 0 else -1.2
        n = 25 if x.sum() > 0 else 14
        b = True if x.sum() > 0 else False
        return (x * math.floor(k), round(k), math.ceil(k), round(k, 1), math.trunc(k), round(n, -1), round(n, 1),
                math.floor(n), round(b), math.ceil(b))

    run_all_modes(f, (_t(np.ones(3, np.float32)),), (_t(-np.ones(3, np.float32)),))


def test_bad_input_is_a_clear_error():
    x = _t(np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="floor: not supported for bool"):
        ops.floor(x > 0)
    with pytest.raises(TypeError, match="round: decimals=2 needs a floating-point tensor, got int64"):
        ops.round(_t(np.array([1, 2])), decimals=2)
    with pytest.raises(IndexError, match="sort: axis -3 is out of range"):
        ops.sort(x, -3)
    with pytest.raises(TypeError, match="sort: give axis or dim, not both"):
        ops.sort(x, 0, dim=1)
    with pytest.raises(TypeError, match="Tensor.cumsum: out= is not supported"):
        x.cumsum(0, out=x)
    # a bool result carries no gradient: what reaches x through it is 0, as through sign
    g = kiln.grad(lambda t: (ops.isnan(t).astype(kiln.float32) * t).sum())(x + 2.0)
    np.testing.assert_array_equal(g.numpy(), np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("fn", [
    ops.floor, ops.ceil, ops.round, ops.trunc, ops.log1p, ops.expm1, ops.isnan, ops.isinf, ops.isfinite,
    lambda t: ops.cumsum(t, 1), lambda t: ops.sort(t, 1), lambda t: ops.sort(t, 0, descending=True)],
    ids=["floor", "ceil", "round", "trunc", "log1p", "expm1", "isnan", "isinf", "isfinite", "cumsum", "sort",
         "sort_desc"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_onnx_runtime_equals_kiln(fn, dtype, tmp_path):
    _onnx_check(fn, HOSTILE if dtype == np.float32 else np.array([[3, -1, 3, 0], [2, 2, -5, 9]], dtype), tmp_path)


def _onnx_check(fn, x, tmp_path):
    """kiln.export(ONNX) of fn checked, run by ONNX Runtime on x and compared with kiln eager."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    path = str(tmp_path / "m.onnx")
    onnx_runtime.export_checked(onnx_runtime.FnCell(fn), [x], path)
    got = onnx_runtime.run(path, [x])
    want = fn(_t(x))
    for g, w in zip(got, want if isinstance(want, tuple) else (want,)):
        assert g.dtype == w.numpy().dtype and g.shape == w.numpy().shape
        np.testing.assert_allclose(g, w.numpy(), rtol=2e-6, atol=0, equal_nan=True)


@pytest.mark.parametrize("fn,x", [
    (lambda t: ops.sort(t, 1), HOSTILE_HALF),
    (lambda t: ops.sort(t > 0, 1, descending=True), HOSTILE),
    (lambda t: ops.cumsum(t, 1), HOSTILE_HALF),
    (lambda t: ops.cumsum(t, 0), np.array([[100, -100], [100, 27]], np.int8)),
    (ops.isfinite, HOSTILE_HALF),
    (ops.round, HOSTILE.astype(np.float64)),
    (ops.log1p, np.array([[0, 1], [7, 100]], np.int8))],
    ids=["sort-f16", "sort-bool", "cumsum-f16", "cumsum-i8", "isfinite-f16", "round-f64", "log1p-i8"])
def test_onnx_runtime_other_dtypes(fn, x, tmp_path):
    _onnx_check(fn, x, tmp_path)


def test_onnx_refuses_cumprod_by_name(tmp_path):
    pytest.importorskip("onnx")
    with pytest.raises(ValueError, match="the op 'cumprod' has no ONNX form"):
        kiln.export(onnx_runtime.FnCell(lambda t: ops.cumprod(t, 0)), _t(HOSTILE), file_name=str(tmp_path / "m.onnx"),
                    file_format="ONNX")


def test_matches_torch():
    torch = pytest.importorskip("torch")
    x = HOSTILE.astype(np.float64)
    tx = torch.tensor(x)
    for name in ("floor", "ceil", "round", "trunc", "isnan", "isinf", "isfinite"):
        np.testing.assert_array_equal(getattr(ops, name)(_t(x)).numpy(), getattr(torch, name)(tx).numpy(), name)
    for name in ("log1p", "expm1"):  # (PyTorch's vectorized libm may differ from glibc's in the last bit)
        np.testing.assert_allclose(getattr(ops, name)(_t(x)).numpy(), getattr(torch, name)(tx).numpy(), rtol=1e-14,
                                   equal_nan=True, err_msg=name)
    np.testing.assert_allclose(ops.cumsum(_t(x), 1).numpy(), torch.cumsum(tx, 1).numpy(), equal_nan=True)
    np.testing.assert_allclose(ops.cumprod(_t(x), 0).numpy(), torch.cumprod(tx, 0).numpy(), equal_nan=True)
    for desc in (False, True):
        v, k = ops.sort(_t(x), 1, descending=desc)
        tv, tk = torch.sort(tx, dim=1, descending=desc, stable=True)
        np.testing.assert_array_equal(v.numpy(), tv.numpy())
        np.testing.assert_array_equal(k.numpy(), tk.numpy())
    w = np.array([[0.5, 0.0, 2.0, 1.5], [0.0, 1.2, 0.0, -2.0]])
    tw = torch.tensor(w, requires_grad=True)
    torch.cumprod(tw, 1).sum().backward()
    np.testing.assert_allclose(kiln.grad(lambda t: ops.cumprod(t, 1).sum())(_t(w)).numpy(), tw.grad.numpy())


def test_dynamic_shapes_optimize_once():
    def f(x):
        v, k = ops.sort(x, 1)
        return ops.cumsum(v, 1) + ops.floor(x) + ops.cumprod(x, 0), k, ops.isnan(x)

    jf = kiln.jit(f, dynamic=True)
    for n in (3, 5, 7):
        x = _t(np.random.default_rng(n).standard_normal((4, n)).astype(np.float32))
        for g, w in zip(jf(x), f(x)):
            np.testing.assert_array_equal(g.numpy(), w.numpy())
    (info,) = jf.cache_info().dynamic
    assert info["instances"] == 3 and info["optimized_once"] and info["planned_once"], info


def test_onnx_with_dynamic_axes(tmp_path):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")

    def f(x):
        v, k = ops.sort(x, 1)
        return v + ops.cumsum(x, 1) + ops.floor(x), k

    path = str(tmp_path / "m.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kiln.export(onnx_runtime.FnCell(f), _t(np.zeros((3, 5), np.float32)), file_name=path, file_format="ONNX",
                    dynamic_axes={"x": {0: "batch", 1: "n"}})
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for shape in [(3, 5), (2, 9), (4, 1)]:
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        for got, want in zip(session.run(None, {session.get_inputs()[0].name: x}), f(_t(x))):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)
