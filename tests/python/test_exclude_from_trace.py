"""MegEngine's exclude_from_trace: ops inside run eagerly each call and are not recorded; their
results may feed the traced computation, and every call gives eager's result (kiln.trace returns
each call's own run; kiln.jit runs the function eagerly with a warning); a trace that runs no
Python after recording refuses it."""
import numpy as np
import pytest

import kiln
from kiln.jit import exclude_from_trace


def flipper(state):
    def f(x):
        x = -x
        with exclude_from_trace():
            if state[0] % 2:
                x = -x
        x = x * 2
        return x

    return f


@pytest.mark.parametrize("symbolic", [False, True])
def test_excluded_code_runs_each_call(symbolic):
    state = [0]
    traced = kiln.trace(flipper(state), symbolic=symbolic)
    eager = flipper(state)
    for i in range(5):
        state[0] = i
        x = kiln.Tensor(np.arange(3, dtype=np.float32) + i)
        np.testing.assert_allclose(traced(x).asnumpy(), eager(x).asnumpy())


def test_excluded_code_reads_values_without_error():
    seen = []

    def f(x):
        y = x * 3
        with exclude_from_trace():
            seen.append(float(y.sum().item()))
        return y + 1

    tr = kiln.trace(f)
    for i in range(3):
        out = tr(kiln.Tensor(np.full(2, float(i), np.float32)))
        np.testing.assert_allclose(out.asnumpy(), np.full(2, 3.0 * i + 1))
    assert seen == [0.0, 6.0, 12.0]


def test_without_host_refuses_it():
    state = [1]
    tr = kiln.trace(flipper(state), without_host=True)
    with pytest.raises(kiln.TraceMismatchError, match="exclude_from_trace"):
        tr(kiln.Tensor(np.ones(3, np.float32)))


def test_jit_runs_a_function_using_it_eagerly():
    state = [0]
    f = kiln.jit(flipper(state))
    for i in range(4):
        state[0] = i
        x = kiln.Tensor(np.ones(3, np.float32))
        with pytest.warns(RuntimeWarning) if i == 0 else _nothing():
            got = f(x)
        np.testing.assert_allclose(got.asnumpy(), flipper(state)(x).asnumpy())


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
