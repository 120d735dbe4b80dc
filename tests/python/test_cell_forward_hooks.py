"""Cell.register_forward_pre_hook / register_forward_hook (MindSpore's and PyTorch's names and
meaning): a pre-hook sees (cell, inputs) and may replace the inputs, a hook sees (cell, inputs,
output) and may replace the output; the handle's remove() takes it away. Every kiln.jit variant
runs them as eager does, adding or removing a hook captures again, and hooks with Python side
effects (collecting features) run at every call."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn, ops

from conformance import run_all_modes

VARIANTS = [(m, lv, b) for m in ("ast", "bytecode", "trace") for lv in ("O0", "O1") for b in ("kbk", "sink")]


def t(*shape, seed=0):
    return kiln.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = nn.Dense(4, 6)
        self.b = nn.Dense(6, 2)

    def construct(self, x):
        return self.b(ops.relu(self.a(x)))


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_eager_semantics():
    kiln.manual_seed(0)
    net = Net()
    x = t(3, 4)
    plain = net(x).asnumpy()
    seen = []
    h1 = net.a.register_forward_hook(lambda cell, inputs, out: out * 0)  # the rest sees b's bias only
    h2 = net.b.register_forward_pre_hook(lambda cell, inputs: seen.append((cell, len(inputs))))
    np.testing.assert_allclose(net(x).asnumpy(), np.broadcast_to(net.b.bias.asnumpy(), (3, 2)), rtol=1e-6)
    assert seen == [(net.b, 1)]
    h1.remove()
    h2.remove()
    h2.remove()  # (twice is harmless)
    np.testing.assert_allclose(net(x).asnumpy(), plain, rtol=1e-6)
    doubled = net(x * 2).asnumpy()
    with net.register_forward_pre_hook(lambda cell, inputs: inputs[0] * 2):  # one value stands for a 1-tuple
        np.testing.assert_allclose(net(x).asnumpy(), doubled, rtol=1e-6)
    np.testing.assert_allclose(net(x).asnumpy(), plain, rtol=1e-6)
    with pytest.raises(TypeError, match="register_forward_hook: the hook must be callable"):
        net.register_forward_hook(3)


def test_compiled_hooks_equal_eager_with_feature_collection():
    kiln.manual_seed(1)
    net = Net()
    feats = []
    net.a.register_forward_hook(lambda cell, inputs, out: out * 2)
    net.b.register_forward_pre_hook(lambda cell, inputs: (inputs[0] + 1,))
    net.a.register_forward_hook(lambda cell, inputs, out: feats.append(out.sum()))

    def f(x):
        return net(x)

    run_all_modes(f, (t(3, 4),), (t(3, 4, seed=1),), (t(3, 4, seed=2),), reset=feats.clear,
                  observe=lambda: [float(v.asnumpy()) for v in feats])


def test_hook_on_the_jitted_cell_itself():
    kiln.manual_seed(2)
    net = Net()
    net.register_forward_hook(lambda cell, inputs, out: out - 5)
    net.register_forward_pre_hook(lambda cell, inputs: (inputs[0] * 0.5,))
    run_all_modes(net, (t(3, 4),), (t(3, 4, seed=1),), (t(3, 4, seed=2),))


@pytest.mark.parametrize("variant", VARIANTS, ids=["-".join(v) for v in VARIANTS])
def test_adding_and_removing_a_hook_captures_again(variant):
    mode, level, backend = variant
    kiln.manual_seed(3)
    net = Net()
    f = kiln.jit(lambda x: net(x), capture_mode=mode, jit_level=level, backend=backend)
    x = t(2, 4)
    before = f(x).asnumpy()
    handle = net.a.register_forward_hook(lambda cell, inputs, out: out * 0)
    hooked = f(x).asnumpy()
    np.testing.assert_allclose(hooked, net(x).asnumpy(), rtol=1e-6)
    assert not np.allclose(hooked, before)
    handle.remove()
    np.testing.assert_allclose(f(x).asnumpy(), before, rtol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS, ids=["-".join(v) for v in VARIANTS])
def test_gradients_flow_through_what_a_hook_returns(variant):
    mode, level, backend = variant
    kiln.manual_seed(4)
    net = Net()
    net.a.register_forward_hook(lambda cell, inputs, out: ops.tanh(out) * 3)
    params = list(net.get_parameters())
    loss = lambda x: (net(x) ** 2).sum()  # noqa: E731
    got = kiln.jit(kiln.grad(loss, None, params), capture_mode=mode, jit_level=level, backend=backend)(t(3, 4))
    want = kiln.grad(loss, None, params)(t(3, 4))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-5, atol=1e-6)


def test_set_jit_config_cell_runs_its_hooks_once():
    kiln.manual_seed(5)
    net = Net()
    calls = []
    net.register_forward_pre_hook(lambda cell, inputs: calls.append(1))
    net.register_forward_hook(lambda cell, inputs, out: out + 1)
    want = Net.construct(net, t(2, 4)).asnumpy() + 1
    net.set_jit_config(kiln.JitConfig(jit_level="O1"))
    for k in range(3):
        np.testing.assert_allclose(net(t(2, 4)).asnumpy(), want, rtol=1e-6)
    assert len(calls) == 3


def test_decorated_hook_and_decorated_function_with_container_state():
    """A functools.wraps-decorated hook that appends to a dict of lists, called from a decorated
    function: every variant runs it at every call, as eager does."""
    import functools

    def counting(fn):
        @functools.wraps(fn)
        def wrapper(*args):
            CALLS["n"] += 1
            return fn(*args)
        return wrapper

    kiln.manual_seed(6)
    net = Net()
    CALLS = {"n": 0, "sums": []}

    @counting
    def hook(cell, inputs, out):
        CALLS["sums"].append(out.sum())
        return out + 1

    net.b.register_forward_hook(hook)

    @counting
    def f(x):
        return net(x) * 2

    run_all_modes(f, (t(3, 4),), (t(3, 4, seed=1),), reset=lambda: CALLS.update(n=0, sums=[]),
                  observe=lambda: (CALLS["n"], [float(v.asnumpy()) for v in CALLS["sums"]]))


def test_grad_of_a_compiled_function_runs_the_forward_hooks():
    """kiln.grad around a jitted function (bytecode capture's differentiable pieces run a hooked
    cell's call in Python): the hook runs, as eagerly; it was once skipped there (construct inlined)."""
    kiln.manual_seed(7)
    net = Net()
    net.register_forward_hook(lambda cell, inputs, out: out * 3)  # (a cell whose construct is user code)
    params = list(net.get_parameters())

    def loss(x):
        return (net(x) ** 2).sum()

    run_all_modes(loss, (t(3, 4),), (t(3, 4, seed=1),), around=lambda f: kiln.grad(f, 0, params))
