"""A loop value the body only adds rows into (index_add of it, its one reader: a scan's stacked
outputs) is written in place by the compiled loop and by its gradient's rerun of the loop. The
caller's tensors it starts from are never written, a buffer read elsewhere in the body or by the
condition is not written in place, and values and gradients stay equal to eager's."""
import numpy as np
import pytest

import kiln
from kiln import ops

from conftest import to_numpy
from loop_variants import JIT_IDS, JIT_VARIANTS, jitted

STEPS = 6


def rows(x, buf):
    """Row i of buf += tanh(x * i); the caller's buf is where the loop starts."""
    def body(i, h, b):
        h = (h * 0.9 + x).tanh()
        return i + 1, h, ops.index_add(b, 0, i.reshape((1,)), h.unsqueeze(0))

    _, h, out = ops.while_loop(lambda i, h, b: i < STEPS, body, (ops.zeros((), dtype=kiln.int64), x, buf))
    return h, out


def rows_read_too(x, buf):
    """The buffer is also read by the body (its sum): no in-place write may change what it reads."""
    def body(i, h, b):
        h = (h * 0.9 + x).tanh() + b.sum() * 0.01
        return i + 1, h, ops.index_add(b, 0, i.reshape((1,)), h.unsqueeze(0))

    _, h, out = ops.while_loop(lambda i, h, b: i < STEPS, body, (ops.zeros((), dtype=kiln.int64), x, buf))
    return h, out


def rows_in_cond(x, buf):
    """The condition reads the buffer: not written in place either."""
    def body(i, h, b):
        h = (h * 0.9 + x).tanh()
        return i + 1, h, ops.index_add(b, 0, i.reshape((1,)), h.unsqueeze(0))

    _, h, out = ops.while_loop(lambda i, h, b: (b.abs().sum() < 1e9) & (i < STEPS), body,
                               (ops.zeros((), dtype=kiln.int64), x, buf))
    return h, out


def data(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(4), rng.standard_normal((STEPS, 4))


@pytest.mark.parametrize("variant", JIT_VARIANTS, ids=JIT_IDS)
@pytest.mark.parametrize("fn", [rows, rows_read_too, rows_in_cond], ids=["rows", "read_too", "in_cond"])
def test_values_and_the_callers_buffer(variant, fn):
    x0, b0 = data(0)
    x, buf = kiln.tensor(x0), kiln.tensor(b0)
    want = fn(x, buf)
    jf = jitted(fn, variant)
    for _ in range(3):
        got = jf(x, buf)
        for g, w in zip(got, want):
            np.testing.assert_allclose(to_numpy(g), to_numpy(w), rtol=1e-12)
        np.testing.assert_array_equal(to_numpy(buf), b0)  # (never written)
        np.testing.assert_array_equal(to_numpy(x), x0)


@pytest.mark.parametrize("variant", JIT_VARIANTS[::3], ids=JIT_IDS[::3])
@pytest.mark.parametrize("fn", [rows, rows_read_too], ids=["rows", "read_too"])
def test_gradients_through_the_rerun(variant, fn):
    x0, b0 = data(1)
    x, buf = kiln.tensor(x0), kiln.tensor(b0)

    def loss(x, buf):
        h, out = fn(x, buf)
        return (out * out.sin()).sum() + h.sum()

    want = kiln.grad(loss, (0, 1))(x, buf)
    grad = kiln.grad(jitted(loss, variant), (0, 1))
    for _ in range(2):
        for g, w in zip(grad(x, buf), want):
            np.testing.assert_allclose(to_numpy(g), to_numpy(w), rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(to_numpy(buf), b0)


def test_a_loop_that_runs_no_step_returns_the_callers_values():
    x0, b0 = data(2)
    x, buf = kiln.tensor(x0), kiln.tensor(b0)

    def none(x, buf):
        def body(i, b):
            return i + 1, ops.index_add(b, 0, i.reshape((1,)), x.unsqueeze(0))
        return ops.while_loop(lambda i, b: i < 0, body, (ops.zeros((), dtype=kiln.int64), buf))[1]

    jf = kiln.jit(none, capture_mode="trace")
    for _ in range(2):
        np.testing.assert_array_equal(to_numpy(jf(x, buf)), b0)
