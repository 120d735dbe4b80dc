"""MindSpore's ops.assign / assign_add / assign_sub: in-place writes that return the variable,
eagerly and in every kiln.jit variant (a Parameter is written without history, as optimizers do)."""
import numpy as np
import pytest

import kiln
from kiln import ops
from conformance import run_all_modes

rng = np.random.default_rng(7)


def t(*shape):
    return kiln.Tensor(rng.standard_normal(shape).astype(np.float32))


def test_assign_family_eager_values():
    v = kiln.Tensor(np.arange(4, dtype=np.float32))
    assert ops.assign(v, kiln.Tensor(np.full(4, 2, np.float32))) is v
    np.testing.assert_array_equal(v.numpy(), [2, 2, 2, 2])
    ops.assign_add(v, kiln.Tensor(np.arange(4, dtype=np.float32)))
    np.testing.assert_array_equal(v.numpy(), [2, 3, 4, 5])
    ops.assign_sub(v, 1.0)
    np.testing.assert_array_equal(v.numpy(), [1, 2, 3, 4])


def test_assign_parameter_in_every_variant():
    p = kiln.Parameter(kiln.Tensor(np.ones(4, np.float32)), name="p")

    def step(x):
        ops.assign(p, p + x.sum(0))
        ops.assign_add(p, x[0])
        ops.assign_sub(p, 1.0)
        return p * 2

    def reset():
        p.set_data(kiln.Tensor(np.ones(4, np.float32)))

    run_all_modes(step, (t(8, 4),), (t(8, 4),), (t(8, 4),), reset=reset, observe=lambda: [p.numpy().copy()])


def test_assign_buffer_inside_a_gradient():
    buf = kiln.Tensor(np.zeros(4, np.float32))
    w = kiln.Parameter(kiln.Tensor(np.ones(4, np.float32)), name="w")

    def loss(x):
        y = (x * w).sum(0)
        ops.assign(buf, y)
        return (y * y).sum()

    grad = kiln.value_and_grad(loss, None, [w])

    def reset():
        buf[...] = 0

    run_all_modes(lambda x: grad(x), (t(8, 4),), (t(8, 4),), reset=reset, observe=lambda: [buf.numpy().copy()])


def test_assign_refuses_what_does_not_fit():
    v = kiln.Tensor(np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="ops.assign"):
        ops.assign(np.zeros(3), v)
    with pytest.raises(Exception, match=r"\b3\b|shape|broadcast"):
        ops.assign(v, kiln.Tensor(np.zeros(4, np.float32)))
