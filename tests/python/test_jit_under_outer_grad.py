"""A jitted function or a Cell with a JitConfig called inside value_and_grad / grad of an
enclosing function (or with inputs that require grad) runs compiled -- as differentiable pieces,
a compiled forward and a tape node running the compiled backward -- not silently eager, and its
gradients equal eager's, in ast and trace capture."""
import numpy as np
import pytest

import kiln
from kiln import nn


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Dense(4, 8), nn.Dense(8, 3)

    def construct(self, x):
        return self.b(kiln.ops.relu(self.a(x)))


def _x(seed=0):
    return kiln.Tensor(np.random.default_rng(seed).standard_normal((5, 4)).astype(np.float32))


@pytest.mark.parametrize("mode", ["ast", "trace"])
@pytest.mark.parametrize("level", ["O0", "O1"])
def test_cell_with_jit_config_inside_value_and_grad(mode, level):
    kiln.manual_seed(0)
    net = MLP()
    params = net.trainable_params()

    def loss(x):
        return (net(x) ** 2).mean()

    want = [kiln.value_and_grad(loss, None, params)(_x(s)) for s in range(3)]
    net.set_jit_config(kiln.JitConfig(jit_level=level, capture_mode=mode))
    got = [kiln.value_and_grad(loss, None, params)(_x(s)) for s in range(3)]
    for (lw, gw), (lg, gg) in zip(want, got):
        np.testing.assert_allclose(lg.asnumpy(), lw.asnumpy(), rtol=1e-5)
        for a, b in zip(gg, gw):
            np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-6)
    stats = net.__dict__["_jitted"].stats
    assert stats.compiles >= 1 and stats.eager_calls == 0, stats


@pytest.mark.parametrize("mode", ["ast", "trace"])
def test_jitted_function_inside_grad_of_another(mode):
    w = kiln.Tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))

    def inner(x, w):
        return kiln.ops.tanh(x @ w).sum(1)

    jinner = kiln.jit(inner, capture_mode=mode)
    outer_eager = kiln.grad(lambda x, w: (inner(x, w) * 2.0).sum(), (0, 1))
    outer_jit = kiln.grad(lambda x, w: (jinner(x, w) * 2.0).sum(), (0, 1))
    for s in range(3):
        for a, b in zip(outer_jit(_x(s), w), outer_eager(_x(s), w)):
            np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-6)
    assert jinner.stats.compiles >= 1 and jinner.stats.eager_calls == 0
