"""Second derivatives (kiln.grad of kiln.grad): exact where the first-order backward ops have
gradient rules (tanh, sigmoid, relu, gelu, silu, softmax, log_softmax, and the piecewise constant
sign and floor division, whose derivative is 0), checked against closed forms and finite
differences of the first derivative; a clear error where they have none (layer_norm's backward
op) -- never a silent zero, which is what a backward op left off the tape used to give."""
import numpy as np
import pytest

import kiln
from kiln import ops

X = np.array([0.5, 1.0, -0.35, 2.2], np.float64)  # away from the jumps of x // 0.3


def second(f):
    return kiln.grad(lambda a: kiln.grad(f)(a).sum())


def fd_of_first(f, x, eps=1e-6):
    """d/dx_i of sum_j df/dx_j, by central differences of the first derivative."""
    first = lambda v: kiln.grad(f)(kiln.Tensor(v)).asnumpy().sum()  # noqa: E731
    out = np.zeros_like(x)
    for i in range(x.size):
        hi, lo = x.copy(), x.copy()
        hi[i] += eps
        lo[i] -= eps
        out[i] = (first(hi) - first(lo)) / (2 * eps)
    return out


CASES = {
    "tanh squared": (lambda b: (b.tanh() ** 2).sum(),
                     lambda x: 2 * (1 - np.tanh(x) ** 2) ** 2 - 4 * np.tanh(x) ** 2 * (1 - np.tanh(x) ** 2)),
    "sigmoid": (lambda b: b.sigmoid().sum(), lambda x: (s := 1 / (1 + np.exp(-x))) * (1 - s) * (1 - 2 * s)),
    "relu times x": (lambda b: (b.relu() * b).sum(), lambda x: 2.0 * (x > 0)),
    "sign times x squared": (lambda b: (ops.sign(b) * b * b).sum(), lambda x: 2 * np.sign(x)),
    "floor division times x squared": (lambda b: ((b // 0.3) * b * b).sum(), lambda x: 2 * (x // 0.3)),
    "abs cubed": (lambda b: (abs(b) ** 3).sum(), lambda x: 6 * np.abs(x)),
    "tanh of sigmoid": (lambda b: b.sigmoid().tanh().sum(), None),
    "gelu": (lambda b: (ops.gelu(b) * b).sum(), None),
    "silu weighted": (lambda b: (ops.silu(b) * kiln.Tensor(np.arange(4.0) - 1.5)).sum(), None),
    "softmax weighted": (lambda b: (ops.softmax(b * b, -1) * kiln.Tensor(np.arange(4.0))).sum(), None),
    "softmax along rows": (lambda b: (ops.softmax(b.reshape(2, 2), 0) * (b * b * kiln.Tensor(np.arange(4.0)))
                                      .reshape(2, 2)).sum(), None),
    "log_softmax times x": (lambda b: (ops.log_softmax(b, -1) * b).sum(), None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_second_derivative(case):
    f, closed = CASES[case]
    got = second(f)(kiln.Tensor(X)).asnumpy()
    assert np.abs(got).max() > 1e-3  # (a case whose second derivative vanishes would check little)
    if closed is not None:
        np.testing.assert_allclose(got, closed(X), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got, fd_of_first(f, X), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name, f", [
    ("layer_norm_backward", lambda b: (ops.layer_norm(b.reshape(1, 4), (4,)) * kiln.Tensor(np.arange(4.0))).sum()),
])
def test_no_second_derivative_raises_instead_of_zero(name, f):
    with pytest.raises(RuntimeError, match=f"{name} is not differentiable"):
        second(f)(kiln.Tensor(X))


def test_first_derivatives_of_piecewise_constant_ops_are_zero():
    """sign and // now have a gradient rule (0, as PyTorch's sign) instead of none: a first
    derivative through them is 0, as it was."""
    g = kiln.grad(lambda b: (ops.sign(b) + b // 0.7).sum())(kiln.Tensor(X))
    assert g.asnumpy().tolist() == [0.0] * 4


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_compiled_second_derivatives_agree_or_raise(mode):
    """kiln.jit over grad and over grad of grad: equal to eager where eager has the second
    derivative, the same error where it has not (never zeros)."""
    def tanh_cubed(b):
        return (b.tanh() * b * b).sum()

    def soft(b):
        return (ops.softmax(b, -1) * b).sum()

    def norm(b):
        return (ops.layer_norm(b.reshape(1, 4), (4,)) * kiln.Tensor(np.arange(4.0))).sum()

    x = kiln.Tensor(X)
    for f in (tanh_cubed, soft):
        want = second(f)(x).asnumpy()
        np.testing.assert_allclose(want, fd_of_first(f, X), rtol=1e-5, atol=1e-6)
        jg = kiln.jit(kiln.grad(f), capture_mode=mode)
        np.testing.assert_allclose(kiln.grad(lambda a: jg(a).sum())(x).asnumpy(), want, rtol=1e-10)
        jh = kiln.jit(lambda a: second(f)(a), capture_mode=mode)
        np.testing.assert_allclose(jh(x).asnumpy(), want, rtol=1e-10)
    with pytest.raises(RuntimeError, match="not differentiable|gradients of gradients"):
        kiln.grad(lambda a: kiln.jit(kiln.grad(norm), capture_mode=mode)(a).sum())(x)
    with pytest.raises(RuntimeError, match="layer_norm_backward is not differentiable"):
        kiln.jit(lambda a: second(norm)(a), capture_mode=mode)(x)
