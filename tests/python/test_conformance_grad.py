"""Conformance: gradients of compiled functions agree with eager gradients (and eager with central
differences): several arguments, multi-output functions, has_aux, Cell weights, gradients through
tensor control flow taking other branches on later calls, closure values changed between calls,
and a whole value_and_grad step compiled."""
import numpy as np

import kiln
from kiln import nn
from conftest import check_grad
from conformance import Call, rand, run_all_modes, t

F64 = kiln.float64


def r64(*shape, seed=0):
    return rand(*shape, seed=seed, dtype=F64)


def test_value_and_grad_of_two_arguments():
    def f(x, y):
        return ((x * y).sin() + x * x).sum()

    check_grad(f, np.random.default_rng(0).standard_normal(3), np.random.default_rng(1).standard_normal(3))
    run_all_modes(f, (r64(3), r64(3, seed=1)), (r64(3, seed=2), r64(3, seed=3)), (r64(5), r64(5, seed=1)),
                  around=lambda g: kiln.value_and_grad(g, grad_position=(0, 1)))


def test_grad_of_multi_output_function():
    def f(x, y):
        return (x * y).sum(), (x - y).exp().sum(), x * 2

    check_grad(f, np.random.default_rng(0).standard_normal(3), np.random.default_rng(1).standard_normal(3))
    run_all_modes(f, (r64(3), r64(3, seed=1)), (r64(3, seed=2), r64(3, seed=3)),
                  around=lambda g: kiln.grad(g, grad_position=(0, 1)))


def test_value_and_grad_with_aux_tuple():
    def f(x):
        loss = (x * x).sum()
        return loss, (x.mean(), x * 3)

    run_all_modes(f, (r64(4),), (r64(4, seed=1),), around=lambda g: kiln.value_and_grad(g, has_aux=True))
    run_all_modes(f, (r64(4),), (r64(4, seed=1),), around=lambda g: kiln.grad(g, has_aux=True))


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 2)

    def construct(self, x):
        return (self.fc(x).tanh() ** 2).sum()


def test_grad_with_respect_to_cell_weights():
    kiln.manual_seed(0)
    net = Net()

    def f(x):
        return net(x)

    run_all_modes(f, (rand(4, 3),), (rand(4, 3, seed=1),), (rand(2, 3, seed=2),),
                  around=lambda g: kiln.value_and_grad(g, None, net.trainable_params()))


def test_grad_through_tensor_if_taking_other_branches():
    def f(x):
        if x.sum() > 0:
            y = x * x
        else:
            y = x.exp()
        return y.sum()

    run_all_modes(f, (t(1.0, 2.0, dtype=F64),), (t(-1.0, -2.0, dtype=F64),), (t(3.0, -1.0, dtype=F64),),
                  around=lambda g: kiln.value_and_grad(g))


def test_grad_through_tensor_while_loop():
    def f(x):
        i = t(0.0, dtype=F64)
        while i < 3:
            x = (x * 1.5).sin()
            i = i + 1
        return x.sum()

    check_grad(f, np.array([0.3, -0.7]))
    run_all_modes(f, (t(0.3, -0.7, dtype=F64),), (t(1.0, 0.2, dtype=F64),), around=lambda g: kiln.value_and_grad(g))


def test_grad_with_closure_scale_changed_between_calls():
    state = {"k": 2.0}

    def make():
        def f(x):
            return (x * state["k"]).pow(2).sum()
        return f

    f = make()

    def set_k(v):
        def before():
            state["k"] = v
        return before

    run_all_modes(f, (r64(3),), Call((r64(3),), before=set_k(-1.0)), Call((r64(3),), before=set_k(0.5)),
                  reset=set_k(2.0), around=lambda g: kiln.grad(g))


def test_compiled_step_around_value_and_grad():
    def loss(w, x):
        return ((x * w).sum() - 1.0) ** 2

    def step(w, x):
        value, g = kiln.value_and_grad(loss)(w, x)
        return value, w - 0.1 * g

    run_all_modes(step, (r64(3), r64(3, seed=1)), (r64(3, seed=2), r64(3, seed=3)), (r64(4), r64(4, seed=1)))
