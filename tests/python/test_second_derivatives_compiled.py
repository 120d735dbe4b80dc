"""Second derivatives through kiln.jit in every capture mode x O0/O1 x kbk/sink, in the four ways
user code reaches them: the gradient of a jitted gradient, a jitted second derivative, grad of grad
of a jitted function (bytecode capture refused it: its compiled pieces' backward is not
differentiable, so such calls now run on the eager tape), and a jitted function called inside an
inner grad. Each equals eager grad of grad in float64 (whose values test_second_derivatives.py
checks against closed forms and finite differences)."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import ops

X = np.array([0.5, 1.0, -0.35, 2.2], np.float64)
W = np.arange(4.0) - 1.5


def tanh_squared(b):
    return (b.tanh() ** 2).sum()


def sigmoid_weighted(b):
    return (b.sigmoid() * kiln.Tensor(W)).sum()


def gelu_times_x(b):
    return (ops.gelu(b) * b).sum()


def silu_weighted(b):
    return (ops.silu(b) * kiln.Tensor(W)).sum()


def softmax_weighted(b):
    return (ops.softmax(b * b, -1) * kiln.Tensor(np.arange(4.0))).sum()


def log_softmax_times_x(b):
    return (ops.log_softmax(b, -1) * b).sum()


FUNCTIONS = [tanh_squared, sigmoid_weighted, gelu_times_x, silu_weighted, softmax_weighted, log_softmax_times_x]
VARIANTS = [(m, lv, b) for m in ("ast", "bytecode", "trace") for lv in ("O0", "O1") for b in ("kbk", "sink")]


def second(f):
    return kiln.grad(lambda a: kiln.grad(f)(a).sum())


def forms(f, jit):
    """The four ways: each a callable of x giving the second derivative (summed over the first's outputs)."""
    jitted_grad = jit(kiln.grad(f))
    jitted_second = jit(second(f))
    jitted_f = jit(f)
    return {
        "grad of jitted grad": lambda x: kiln.grad(lambda a: jitted_grad(a).sum())(x),
        "jitted grad of grad": jitted_second,
        "grad of grad of jitted": lambda x: kiln.grad(lambda a: kiln.grad(jitted_f)(a).sum())(x),
        "jitted called inside the inner grad": lambda x: kiln.grad(
            lambda a: kiln.grad(lambda c: jitted_f(c) * 2.0)(a).sum())(x),
    }


@pytest.mark.parametrize("variant", VARIANTS, ids=["-".join(v) for v in VARIANTS])
@pytest.mark.parametrize("f", FUNCTIONS, ids=lambda f: f.__name__)
def test_second_derivative_compiled_equals_eager(f, variant):
    mode, level, backend = variant
    x = kiln.Tensor(X)
    want = second(f)(x).asnumpy()
    assert np.abs(want).max() > 1e-3
    jit = lambda fn: kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a lambda's source may send ast capture to trace, with a warning)
        for name, form in forms(f, jit).items():
            scale = 2.0 if name == "jitted called inside the inner grad" else 1.0
            for _ in range(2):  # the capturing call, then a compiled one
                got = form(x).asnumpy()
                np.testing.assert_allclose(got, scale * want, rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_first_order_calls_stay_compiled(mode):
    """Only a call that may be differentiated twice runs eagerly: a plain gradient of the same jitted
    function still runs its compiled pieces."""
    jf = kiln.jit(tanh_squared, capture_mode=mode)
    x = kiln.Tensor(X)
    kiln.grad(lambda a: kiln.grad(jf)(a).sum())(x)
    eager_after_second = jf.cache_info().eager_calls
    for _ in range(3):
        np.testing.assert_allclose(kiln.grad(jf)(x).asnumpy(), kiln.grad(tanh_squared)(x).asnumpy(), rtol=1e-12)
    assert jf.cache_info().eager_calls == eager_after_second
