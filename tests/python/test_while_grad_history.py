"""while_grad keeps, per iteration, only the loop values its backward body reads: a loop that
writes per-step results into a buffer it carries (a recurrent layer's outputs) must not hold one
copy of that buffer per iteration while differentiated (quadratic memory). And a captured tensor
whose gradient nobody asked for gets none built per iteration, the others' still equal eager's
and central differences."""
import numpy as np
import pytest

import kiln
from kiln import ops

from conftest import to_numpy

STEPS, WIDTH = 32, 256


def written_buffer(x, w):
    """h = tanh(h * w) for STEPS steps, each step's h written into row i of a carried buffer."""
    def body(i, h, buf):
        h = (h * w).tanh()
        return i + 1, h, ops.index_add(buf, 0, i.reshape((1,)), h.unsqueeze(0))

    buf = ops.zeros((STEPS, WIDTH), dtype=x.dtype)
    _, h, buf = ops.while_loop(lambda i, h, b: i < STEPS, body, (ops.zeros((), dtype=kiln.int64), x, buf))
    return (buf * buf).sum() + h.sum()


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_a_write_only_buffer_is_not_kept_per_iteration(mode):
    rng = np.random.default_rng(0)
    x = kiln.tensor(rng.uniform(0.5, 1, WIDTH).astype(np.float32))
    w = kiln.tensor(rng.uniform(0.5, 1.5, WIDTH).astype(np.float32))
    grad = kiln.grad(kiln.jit(written_buffer, capture_mode=mode), (0, 1))
    want = kiln.grad(written_buffer, (0, 1))(x, w)
    grad(x, w)  # compiled
    kiln._C.reset_peak_memory()
    before, _ = kiln._C.memory_stats()
    got = grad(x, w)
    _, peak = kiln._C.memory_stats()
    buffer_bytes = STEPS * WIDTH * 4
    assert peak - before < 8 * buffer_bytes, (peak - before, buffer_bytes)  # (kept per iteration: 32 of them)
    for g, e in zip(got, want):
        np.testing.assert_allclose(to_numpy(g), to_numpy(e), rtol=1e-5, atol=1e-6)


def test_unwanted_captured_gradients_leave_the_wanted_ones_right():
    """Only w differentiated: x (captured by the body) gets no per-iteration gradient."""
    rng = np.random.default_rng(1)
    x0, w0 = rng.standard_normal(4), rng.standard_normal(4)

    def f(x, w):
        def body(i, h):
            return i + 1, (h * w + x).sin()

        _, h = ops.while_loop(lambda i, h: i < 5, body, (ops.zeros((), dtype=kiln.int64), ops.ones((4,), kiln.float64)))
        return (h * h).sum()

    x, w = kiln.tensor(x0), kiln.tensor(w0)
    got = kiln.grad(kiln.jit(f, capture_mode="trace"), 1)(x, w)
    np.testing.assert_allclose(to_numpy(got), to_numpy(kiln.grad(f, 1)(x, w)), rtol=1e-12)
    eps = 1e-6
    for k in range(4):
        up, down = w0.copy(), w0.copy()
        up[k] += eps
        down[k] -= eps
        fd = (f(x, kiln.tensor(up)).item() - f(x, kiln.tensor(down)).item()) / (2 * eps)
        np.testing.assert_allclose(to_numpy(got)[k], fd, rtol=1e-6, atol=1e-8)
