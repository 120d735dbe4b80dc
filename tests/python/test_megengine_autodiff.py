"""MegEngine-style training code on kiln: autodiff.GradManager (attach with callbacks, record,
backward, `with gm:`), Module-style cells (forward, train(), eval()), optimizer step / clear_grad,
and kiln.trace's without_host / imperative, eagerly and traced: the compiled steps leave the same
losses and parameters as eager ones."""
import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.autodiff import GradManager

from conftest import to_numpy

RNG = np.random.default_rng(7)
XS = [RNG.standard_normal((4, 3)).astype(np.float32) for _ in range(4)]
YS = [RNG.standard_normal((4, 2)).astype(np.float32) for _ in range(4)]


class MLP(nn.Cell):  # written as a MegEngine / PyTorch module: forward, not construct
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 2)
        self.fc.weight.set_data(kiln.tensor(np.arange(6, dtype=np.float32).reshape(2, 3) / 10 - 0.2))
        self.fc.bias.set_data(kiln.tensor(np.array([0.1, -0.1], np.float32)))

    def forward(self, x):
        h = self.fc(x)
        if self.training:
            return h
        return h * 0.5


def test_grad_manager_gradients_equal_kiln_grad():
    net = MLP()
    params = net.trainable_params()
    x, y = kiln.tensor(XS[0]), kiln.tensor(YS[0])

    def loss_fn(x):
        return ((net(x) - y) ** 2).mean()

    expected = kiln.grad(loss_fn, None, params)(x)
    gm = GradManager().attach(params)
    with gm:
        gm.backward(loss_fn(x))
    for p, g in zip(params, expected):
        np.testing.assert_allclose(to_numpy(p.grad), to_numpy(g), rtol=1e-6)
    gm.record()  # a second backward accumulates into .grad
    gm.backward(loss_fn(x))
    for p, g in zip(params, expected):
        np.testing.assert_allclose(to_numpy(p.grad), 2 * to_numpy(g), rtol=1e-6)


def test_grad_manager_callbacks_dy_and_several_losses():
    net = MLP()
    w, b = net.fc.weight, net.fc.bias
    x = kiln.tensor(XS[1])
    seen = []

    def clip(p, g):
        seen.append(p.name)
        return g.clamp(-0.05, 0.05)

    gm = GradManager().attach([w], callbacks=[clip, lambda p, g: g * 2]).attach(b)
    with gm:
        out = net(x)
        dy = kiln.tensor(np.full((4, 2), 0.5, np.float32))
        gm.backward([out, out.sum()], [dy, kiln.tensor(np.float32(1.0))])
    gw, gb = kiln.grad(lambda x: (net(x) * dy).sum() + net(x).sum(), None, [w, b])(x)
    np.testing.assert_allclose(to_numpy(w.grad), 2 * np.clip(to_numpy(gw), -0.05, 0.05), rtol=1e-6)
    np.testing.assert_allclose(to_numpy(b.grad), to_numpy(gb), rtol=1e-6)
    assert seen == [w.name]
    assert gm.attached_tensors() == [w, b]


def test_grad_manager_misuse_is_a_clear_error():
    net = MLP()
    gm = GradManager().attach(net.trainable_params())
    loss = net(kiln.tensor(XS[0])).sum()
    with pytest.raises(RuntimeError, match="no recording"):
        gm.backward(loss)
    with pytest.raises(TypeError, match="Tensor"):
        GradManager().attach([1.0])
    with pytest.raises(TypeError, match="float"):
        GradManager().attach(kiln.tensor(np.array([1, 2], np.int32)))
    with pytest.raises(TypeError, match="callables"):
        GradManager().attach(net.trainable_params(), callbacks=[3])
    gm.record()
    with pytest.raises(RuntimeError, match="already recording"):
        gm.record()
    gm.release()


def _training(wrap):
    net = MLP()
    net.train()
    gm = GradManager().attach(net.trainable_params(), callbacks=lambda p, g: g * 0.5)
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1, momentum=0.9)

    def step(x, y):
        with gm:
            loss = ((net(x) - y) ** 2).mean()
            gm.backward(loss)
        opt.step()
        opt.clear_grad()
        return loss

    fn = wrap(step)
    losses = [to_numpy(fn(kiln.tensor(x), kiln.tensor(y))).item() for x, y in zip(XS, YS)]
    assert all(p.grad is None for p in net.trainable_params())
    return losses, [to_numpy(p).copy() for p in net.trainable_params()]


TRAINING_WRAPS = {
    "trace": lambda f: kiln.trace(f),
    "trace-without_host": lambda f: kiln.trace(f, without_host=True),
    "trace-imperative": lambda f: kiln.trace(f, imperative=True),
    "trace-O0-symbolic": lambda f: kiln.trace(f, opt_level=0, symbolic=True),
    "jit-ast": lambda f: kiln.jit(f, capture_mode="ast"),
    "jit-trace": lambda f: kiln.jit(f, capture_mode="trace"),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name", list(TRAINING_WRAPS))
def test_traced_training_step_with_grad_manager_equals_eager(name):
    eager_losses, eager_params = _training(lambda f: f)
    losses, params = _training(TRAINING_WRAPS[name])
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5)
    for p, q in zip(params, eager_params):
        np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-7)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_module_forward_train_and_eval_compiled_equal_eager(mode):
    net = MLP()
    jf = kiln.jit(net, capture_mode=mode)
    x = kiln.tensor(XS[2])
    assert net.train() is net and net.training and net.fc.training
    np.testing.assert_allclose(to_numpy(jf(x)), to_numpy(net.forward(x)), rtol=1e-6)
    assert net.eval() is net and not net.training and not net.fc.training
    np.testing.assert_allclose(to_numpy(jf(x)), to_numpy(net(x)), rtol=1e-6)
    np.testing.assert_allclose(to_numpy(net(x)), 0.5 * to_numpy(net.fc(x)), rtol=1e-6)

    class Neither(nn.Cell):
        pass

    with pytest.raises(NotImplementedError, match="construct"):
        Neither()(x)
    with pytest.raises(NotImplementedError, match="forward"):
        Neither().forward(x)


def test_trace_without_host_and_imperative():
    calls = []

    def f(x):
        calls.append(1)
        return (x * 3).relu().sum()

    x = kiln.tensor(XS[0])
    t = kiln.trace(f, without_host=True)
    assert t.verify is False
    for _ in range(3):
        np.testing.assert_allclose(to_numpy(t(x)), to_numpy(f(x)), rtol=1e-6)
    assert len(calls) == 3 + 1  # the recording, then f's own calls above: no Python after recording
    assert kiln.trace(f).verify is True
    ti = kiln.trace(f, imperative=True, opt_level=3)
    assert ti.jit_level == "O0"
    np.testing.assert_allclose(to_numpy(ti(x)), to_numpy(f(x)), rtol=1e-6)
    with pytest.raises(ValueError, match="without_host"):
        kiln.trace(f, without_host=True, verify=True)
    with pytest.raises(TypeError, match="imperative"):
        kiln.trace(f, imperative="yes")
