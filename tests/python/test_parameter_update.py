"""Integer Parameters (state such as a step counter: never requiring grad) and `self.param += x`
in a Cell's construct, which assigns in place as MindSpore does: the Parameter keeps its identity,
dtype and shape; eager and compiled calls leave the same values."""
import numpy as np
import pytest

import kiln
from kiln import nn

from conftest import to_numpy


def test_integer_parameters_do_not_require_grad():
    step = nn.Parameter(kiln.tensor(np.array(0, dtype=np.int32)), name="step")
    assert step.requires_grad is False and step.dtype is kiln.int32
    flag = nn.Parameter(kiln.tensor(np.array([True, False])), requires_grad=True)
    assert flag.requires_grad is False
    w = nn.Parameter(kiln.tensor(np.ones(2, np.float32)))
    assert w.requires_grad is True


class Accumulator(nn.Cell):
    def __init__(self):
        super().__init__()
        self.step = nn.Parameter(kiln.tensor(np.array(0, dtype=np.int32)), name="step")
        self.total = nn.Parameter(kiln.tensor(np.zeros(3, np.float32)), name="total", requires_grad=False)
        self.scale = nn.Parameter(kiln.tensor(np.ones(3, np.float32)), name="scale", requires_grad=False)
        self.w = nn.Parameter(kiln.tensor(np.array([1.0, 2.0, 3.0], np.float32)), name="w")

    def construct(self, x):
        self.step += 1
        self.total += x * self.w
        self.scale *= 0.5
        self.total -= self.scale
        return self.total * self.step


def _run(net, call, xs):
    ids = [id(p) for p in (net.step, net.total, net.scale)]
    outs = [to_numpy(call(x)) for x in xs]
    assert ids == [id(p) for p in (net.step, net.total, net.scale)]  # the same Parameter objects
    assert type(net.step) is nn.Parameter and net.step.dtype is kiln.int32
    assert [p.name for p in net.trainable_params()] == ["w"]
    return outs, [to_numpy(p) for p in (net.step, net.total, net.scale)]


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_in_place_update_of_parameters_compiled_equals_eager(mode):
    xs = [kiln.tensor(np.array([1.0, -1.0, 2.0], np.float32) * k) for k in range(1, 5)]
    eager_net = Accumulator()
    expected_outs, expected_state = _run(eager_net, eager_net, xs)
    assert expected_state[0] == 4
    net = Accumulator()
    jf = kiln.jit(net, capture_mode=mode)
    outs, state = _run(net, jf, xs)
    for a, b in zip(outs + state, expected_outs + expected_state):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert jf.stats.eager_calls == 0 and jf.stats.compiles == 1  # compiled: not a Python side effect


def test_in_place_update_of_a_parameter_cannot_change_its_shape_or_dtype_kind():
    p = nn.Parameter(kiln.tensor(np.zeros(3, np.float32)), name="p", requires_grad=False)
    with pytest.raises(ValueError, match="shape"):
        p += kiln.tensor(np.ones((2, 3), np.float32))
    n = nn.Parameter(kiln.tensor(np.array([4, 6], np.int32)), name="n")
    with pytest.raises(TypeError, match="integer"):
        n /= 2
    n += 1
    assert n.dtype is kiln.int32 and to_numpy(n).tolist() == [5, 7]
