"""A .grad assigned by user code inside a compiled function happens at every call, as eagerly:
kiln.jit runs such a function eagerly (a graph cannot set Python state later), and
kiln.trace(without_host=True), which runs no Python after recording, sets the recorded .grad
values from each replay's outputs."""
import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.autodiff import GradManager
from conformance import run_all_modes, rand


def _net():
    net = nn.Dense(3, 2)
    net.weight.set_data(kiln.Tensor(np.ones((2, 3), np.float32)))
    net.bias.set_data(kiln.Tensor(np.zeros(2, np.float32)))
    return net


NET = _net()


def _reset():
    NET.weight.grad = kiln.Tensor(np.full((2, 3), 5.0, np.float32))
    NET.bias.grad = None


def _grads():
    return tuple(None if p.grad is None else p.grad.asnumpy().copy() for p in (NET.weight, NET.bias))


def test_grad_cleared_inside_a_jitted_function_each_call():
    def f(x):
        loss = (NET(x) ** 2).sum()
        NET.weight.grad = None
        return loss

    run_all_modes(f, (rand(1, 3),), (rand(1, 3, seed=1),), (rand(2, 3, seed=2),),
                  reset=_reset, observe=_grads)


def test_grad_set_to_a_computed_tensor_each_call():
    def f(x):
        y = NET(x)
        NET.bias.grad = y.sum(0) * 2
        return y

    run_all_modes(f, (rand(1, 3),), (rand(1, 3, seed=1),), (rand(4, 3, seed=2),), reset=_reset, observe=_grads)


def _gm_step(net, gm):
    def step(x):
        with gm:
            loss = (net(x) ** 2).sum()
            gm.backward(loss)
        return loss
    return step


@pytest.mark.parametrize("symbolic", [False, True])
def test_trace_without_host_sets_the_recorded_grads_at_each_replay(symbolic):
    results = {}
    for kind in ("eager", "traced"):
        net = _net()
        gm = GradManager().attach(net.trainable_params())
        step = _gm_step(net, gm)
        f = step if kind == "eager" else kiln.trace(step, symbolic=symbolic, without_host=True)
        seen = []
        for i in range(4):
            for p in net.trainable_params():
                p.grad = None
            loss = f(kiln.Tensor(np.full((2, 3), i + 1.0, np.float32)))
            seen.append((float(loss.asnumpy()), net.weight.grad.asnumpy().copy(), net.bias.grad.asnumpy().copy()))
        results[kind] = seen
    for (l0, w0, b0), (l1, w1, b1) in zip(results["eager"], results["traced"]):
        assert abs(l0 - l1) < 1e-4 * max(1.0, abs(l0))
        np.testing.assert_allclose(w1, w0, rtol=1e-5)
        np.testing.assert_allclose(b1, b0, rtol=1e-5)


def test_trace_without_host_replays_a_grad_cleared():
    net = _net()

    def step(x):
        loss = (net(x) ** 2).sum()
        net.weight.grad = None
        return loss

    f = kiln.trace(step, without_host=True)
    for i in range(3):
        net.weight.grad = kiln.Tensor(np.ones((2, 3), np.float32))
        f(kiln.Tensor(np.full((1, 3), i + 1.0, np.float32)))
        assert net.weight.grad is None


def _gm_training_net():
    net = _net()
    gm = GradManager().attach(net.trainable_params())
    opt = kiln.nn.SGD(net.trainable_params(), learning_rate=0.1)
    return net, gm, opt


GM_NET, GM, GM_OPT = _gm_training_net()


def _reset_gm_net():
    GM_NET.weight.set_data(kiln.Tensor(np.ones((2, 3), np.float32)))
    GM_NET.bias.set_data(kiln.Tensor(np.zeros(2, np.float32)))
    for p in GM_NET.trainable_params():
        p.grad = None


def test_megengine_style_step_with_gradmanager_and_optimizer_step():
    """GradManager.backward sets .grad, SGD.step() reads it, the loop clears it: each call trains
    as eager does (bytecode capture used to keep the first call's gradients in the step's graph)."""
    def step(x):
        with GM:
            loss = (GM_NET(x) ** 2).sum()
            GM.backward(loss)
        GM_OPT.step()
        for p in GM_NET.trainable_params():
            p.grad = None
        return loss

    run_all_modes(step, *[(kiln.Tensor(np.full((1, 3), i + 1.0, np.float32)),) for i in range(4)],
                  reset=_reset_gm_net, observe=lambda: GM_NET.weight.asnumpy().copy())
