"""Functional activations (ops.leaky_relu, elu, selu, softplus, hardswish, hardsigmoid, mish, silu,
prelu) and the Cells that call them: float64 NumPy references, no overflow at large inputs,
finite-difference gradients, clear errors, every compiled variant equal to eager, symbolic sizes,
PyTorch's values when torch is importable."""
import numpy as np
import pytest

import kiln
from kiln import nn, ops
from compiled_equal import assert_compiled_equal
from conftest import check_grad

RNG = np.random.default_rng(5)
SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def T(a):
    return kiln.Tensor(np.asarray(a))


def np_softplus(x, beta=1.0, threshold=20.0):
    return np.where(x * beta > threshold, x, np.logaddexp(0.0, x * beta) / beta)


def np_elu(x, alpha=1.0):
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


# (name, kiln function, NumPy reference, the Cell computing the same)
TABLE = [
    ("leaky_relu", lambda x: ops.leaky_relu(x, 0.1), lambda a: np.where(a >= 0, a, 0.1 * a), nn.LeakyReLU(0.1)),
    ("leaky_relu_default", ops.leaky_relu, lambda a: np.where(a >= 0, a, 0.2 * a), nn.LeakyReLU()),
    ("elu", lambda x: ops.elu(x, 0.7), lambda a: np_elu(a, 0.7), nn.ELU(0.7)),
    ("selu", ops.selu, lambda a: SELU_SCALE * np_elu(a, SELU_ALPHA), None),
    ("softplus", ops.softplus, np_softplus, nn.Softplus()),
    ("softplus_beta", lambda x: ops.softplus(x, 2, 5), lambda a: np_softplus(a, 2.0, 5.0), nn.Softplus(2, 5)),
    ("hardswish", ops.hardswish, lambda a: a * np.clip(a + 3, 0, 6) / 6, nn.Hardswish()),
    ("hardsigmoid", ops.hardsigmoid, lambda a: np.clip(a + 3, 0, 6) / 6, nn.HSigmoid()),
    ("mish", ops.mish, lambda a: a * np.tanh(np_softplus(a)), nn.Mish()),
    ("silu", ops.silu, lambda a: a / (1 + np.exp(-a)), nn.SiLU()),
    ("prelu", lambda x: ops.prelu(x, T(np.array([0.1, -0.2, 0.3]))),
     lambda a: np.where(a >= 0, a, a * np.array([0.1, -0.2, 0.3])[None, :, None]), None),
]


@pytest.mark.parametrize("name,fn,ref,cell", TABLE, ids=[t[0] for t in TABLE])
def test_values_match_numpy_and_the_cell(name, fn, ref, cell):
    a = np.concatenate([RNG.standard_normal((2, 3, 4)) * 5, np.full((1, 3, 4), 40.0), np.full((1, 3, 4), -40.0)])
    got = fn(T(a))
    assert got.dtype is kiln.float64
    np.testing.assert_allclose(got.numpy(), ref(a), rtol=1e-12, atol=1e-300)
    f32 = fn(T(a.astype(np.float32)))
    assert f32.dtype is kiln.float32 and np.isfinite(f32.numpy()).all()
    np.testing.assert_allclose(f32.numpy(), ref(a), rtol=2e-6, atol=1e-6)
    if cell is not None:
        np.testing.assert_array_equal(cell(T(a)).numpy(), got.numpy())


def test_softplus_is_stable_far_out():
    x = T(np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0], np.float32))
    np.testing.assert_allclose(ops.softplus(x).numpy(), np_softplus(x.numpy().astype(np.float64)), rtol=1e-6)
    np.testing.assert_allclose(ops.softplus(x, threshold=1e9).numpy(), [0.0, np.exp(-50.0), np.log(2.0), 50.0, 1000.0],
                               rtol=1e-6)
    g = kiln.grad(lambda t: ops.softplus(t, threshold=1e9).sum() + ops.mish(t).sum())(x)
    assert np.isfinite(g.numpy()).all()


def test_prelu_slope_shapes_and_the_cell():
    a = RNG.standard_normal((2, 3, 4))
    np.testing.assert_allclose(ops.prelu(T(a), T(np.array([0.25]))).numpy(), np.where(a >= 0, a, 0.25 * a))
    np.testing.assert_allclose(ops.prelu(T(a[0, 0]), T(np.array([0.5]))).numpy(),
                               np.where(a[0, 0] >= 0, a[0, 0], 0.5 * a[0, 0]))
    cell = nn.PReLU(3, 0.1)
    x = T(a.astype(np.float32))
    np.testing.assert_array_equal(cell(x).numpy(), ops.prelu(x, cell.w).numpy())
    g = kiln.grad(lambda t: cell(t).sum(), weights=cell.trainable_params())(x)
    want = np.where(a < 0, a, 0.0).sum((0, 2))
    np.testing.assert_allclose(g[1][0].numpy(), want, rtol=1e-5)  # (input gradients, weight gradients)


def test_bad_arguments_raise_clear_errors():
    x = T(RNG.standard_normal((2, 3)))
    cases = [
        (lambda: ops.leaky_relu(T([1, 2])), TypeError, "leaky_relu: input must be floating point"),
        (lambda: ops.softplus(x, 0), ValueError, "softplus: beta must be a nonzero number"),
        (lambda: ops.prelu(x, T(np.ones(2))), ValueError, "prelu: weight of 2 slopes for input of shape \\[2, 3\\]"),
        (lambda: ops.prelu(x, T(np.ones((3, 1)))), ValueError, "prelu: weight must be 0-D or 1-D"),
        (lambda: ops.mish(T([True])), TypeError, "mish: input must be floating point"),
    ]
    for call, exc, message in cases:
        with pytest.raises(exc, match=message):
            call()


@pytest.mark.parametrize("name,fn,ref,cell", TABLE, ids=[t[0] for t in TABLE])
def test_gradients_match_finite_differences(name, fn, ref, cell):
    a = RNG.uniform(0.1, 4.0, (2, 3, 2)) * RNG.choice([-1.0, 1.0], (2, 3, 2))
    a[np.abs(np.abs(a) - 3.0) < 0.1] += 0.3  # away from hardswish's and hardsigmoid's kinks
    check_grad(fn, a)


def _all(x, w):
    return tuple(fn(x) for _, fn, _, _ in TABLE) + (ops.prelu(x, w),)


def test_compiled_variants_equal_eager():
    calls = [(T(RNG.standard_normal((2, 3, 4)).astype(np.float32) * 4), T(np.float32([0.1, 0.2, -0.3])))
             for _ in range(2)]
    assert_compiled_equal(_all, *calls)
    assert_compiled_equal(lambda x, w: sum(y.sum() for y in _all(x, w)), *calls, grad=True)


def test_dynamic_shapes_compile_once():
    f = kiln.jit(lambda x: ops.mish(x) + ops.softplus(x, 2) + ops.hardswish(x) + ops.leaky_relu(x), dynamic=True)
    for n in (3, 6, 10):
        a = RNG.standard_normal((n, 4)).astype(np.float32)
        want = a * np.tanh(np_softplus(a)) + np_softplus(a, 2.0) + a * np.clip(a + 3, 0, 6) / 6 + np.where(a >= 0, a,
                                                                                                            0.2 * a)
        np.testing.assert_allclose(f(T(a)).numpy(), want, rtol=1e-5, atol=1e-6)
    assert f.cache_info().compiles == 1, f.cache_info()


def test_torch_agrees():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    a = RNG.standard_normal((2, 3, 4)) * 6
    t, x = torch.tensor(a), T(a)
    pairs = [(ops.leaky_relu(x, 0.1), F.leaky_relu(t, 0.1)), (ops.elu(x, 0.5), F.elu(t, 0.5)), (ops.selu(x), F.selu(t)),
             (ops.softplus(x, 2, 3), F.softplus(t, 2, 3)), (ops.hardswish(x), F.hardswish(t)),
             (ops.hardsigmoid(x), F.hardsigmoid(t)), (ops.mish(x), F.mish(t)),
             (ops.prelu(x, T(np.array([0.1, 0.2, 0.3]))), F.prelu(t, torch.tensor([0.1, 0.2, 0.3], dtype=t.dtype)))]
    for got, want in pairs:
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)
