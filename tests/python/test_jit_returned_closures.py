"""kiln.jit on functions that return inner functions: each call's inner function must use that
call's tensors (a compiled replay would hand back the first call's closure)."""
import warnings

import numpy as np
import pytest

import kiln

MODES = [("ast", "O0"), ("ast", "O1"), ("bytecode", "O0"), ("bytecode", "O1"), ("trace", "O0"), ("trace", "O1")]


def _call(jf, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return jf(*args)


@pytest.mark.parametrize("mode,level", MODES)
def test_returned_lambda_uses_this_calls_tensor(mode, level):
    def f(x):
        return lambda: x + 1.0

    jf = kiln.jit(f, capture_mode=mode, jit_level=level)
    for k in range(3):
        x = kiln.Tensor([float(k), 2.0 * k])
        np.testing.assert_allclose(_call(jf, x)().asnumpy(), f(x)().asnumpy())


@pytest.mark.parametrize("mode,level", MODES)
def test_returned_pair_of_tensor_and_closure(mode, level):
    def f(x, y):
        s = x * y

        def scale(z):
            return z * s

        return s + 1.0, scale

    jf = kiln.jit(f, capture_mode=mode, jit_level=level)
    z = kiln.Tensor([1.0, -1.0])
    for k in range(3):
        x, y = kiln.Tensor([float(k), 1.0]), kiln.Tensor([2.0, float(k)])
        got_s, got_fn = _call(jf, x, y)
        want_s, want_fn = f(x, y)
        np.testing.assert_allclose(got_s.asnumpy(), want_s.asnumpy())
        np.testing.assert_allclose(got_fn(z).asnumpy(), want_fn(z).asnumpy())
