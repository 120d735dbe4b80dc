"""kiln.trace and the .grad of tensors: a replay must leave every .grad as eager execution would,
or the trace must refuse with TraceMismatchError. Written as the user code that showed each
symptom: a replay with verify=False kept the first call's gradient after Tensor.backward(), and a
GradManager step that accumulated across calls had its gradient set instead of added to."""
import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.autodiff import GradManager
from kiln.jit import TraceMismatchError

REPLAYING = {  # the traces that run no Python after the recording
    "verify=False": dict(verify=False),
    "symbolic,verify=False": dict(symbolic=True, verify=False),
    "without_host": dict(without_host=True),
}
VERIFYING = {"verify": {}, "symbolic": dict(symbolic=True), "O0": dict(opt_level=0)}
ALL = {**REPLAYING, **VERIFYING}


def _xs(n=3):
    return [kiln.tensor(np.linspace(-1, 1, 3).astype(np.float32) * (i + 1)) for i in range(n)]


def _weight():
    return kiln.Parameter(kiln.tensor(np.array([0.5, -1.0, 2.0], np.float32)), name="w")


def _backward_step(w):
    def step(x):
        w.grad = None
        loss = (w * w * x).sum()
        loss.backward()
        return loss
    return step


def _grads_through(wrap, make_step, calls=3, clear_between=False):
    w = _weight()
    fn = wrap(make_step(w))
    out = []
    for x in _xs(calls):
        if clear_between:
            w.grad = None
        loss = fn(x)
        out.append((loss.numpy().copy(), None if w.grad is None else w.grad.numpy().copy()))
    return out


def _assert_same(got, want):
    for (loss, g), (eloss, eg) in zip(got, want):
        np.testing.assert_allclose(loss, eloss, rtol=1e-6)
        assert (g is None) == (eg is None)
        if g is not None:
            np.testing.assert_allclose(g, eg, rtol=1e-6)


@pytest.mark.parametrize("name", list(REPLAYING))
def test_tensor_backward_in_a_replaying_trace_is_refused(name):
    w = _weight()
    fn = kiln.trace(_backward_step(w), **REPLAYING[name])
    with pytest.raises(TraceMismatchError, match=r"Tensor\.backward"):
        fn(_xs(1)[0])


@pytest.mark.parametrize("name", list(VERIFYING))
def test_tensor_backward_in_a_verifying_trace_matches_eager(name):
    want = _grads_through(lambda f: f, _backward_step)
    got = _grads_through(lambda f: kiln.trace(f, **VERIFYING[name]), _backward_step)
    _assert_same(got, want)
    assert not np.allclose(want[0][1], want[2][1])  # each call's gradient differs: a stale one would show


def _manager_step(w, clear_inside):
    gm = GradManager().attach([w])

    def step(x):
        with gm:
            loss = (w * w * x).sum()
            gm.backward(loss)
        if clear_inside:
            w.grad = None
        return loss
    return step


@pytest.mark.parametrize("name", list(ALL))
def test_grad_manager_gradients_cleared_between_calls_match_eager(name):
    make = lambda w: _manager_step(w, False)  # noqa: E731
    want = _grads_through(lambda f: f, make, clear_between=True)
    got = _grads_through(lambda f: kiln.trace(f, **ALL[name]), make, clear_between=True)
    _assert_same(got, want)
    assert not np.allclose(want[0][1], want[2][1])  # each call's gradient differs: a stale one would show


@pytest.mark.parametrize("name", list(ALL))
def test_grad_manager_accumulating_across_calls_is_refused_or_matches(name):
    make = lambda w: _manager_step(w, False)  # noqa: E731
    want = _grads_through(lambda f: f, make)
    np.testing.assert_allclose(want[1][1], want[0][1] + _grads_through(lambda f: f, make, clear_between=True)[1][1],
                               rtol=1e-6)
    try:
        got = _grads_through(lambda f: kiln.trace(f, **ALL[name]), make)
    except TraceMismatchError as e:
        assert "grad" in str(e) or "ops than recorded" in str(e)
        return
    _assert_same(got, want)


@pytest.mark.parametrize("name", list(ALL))
def test_grad_assigned_by_the_function_is_set_by_each_replay(name):
    def make(w):
        def step(x):
            loss = (w * x).sum()
            w.grad = x * 2.0 + w  # a gradient the user computes and sets
            return loss
        return step
    want = _grads_through(lambda f: f, make)
    got = _grads_through(lambda f: kiln.trace(f, **ALL[name]), make)
    _assert_same(got, want)


@pytest.mark.parametrize("name", list(ALL))
def test_megengine_training_step_clearing_inside_matches_eager(name):
    def train(wrap):
        kiln.set_seed(3)
        net = nn.Dense(4, 2)
        params = net.trainable_params()
        gm = GradManager().attach(params)
        opt = nn.SGD(params, learning_rate=0.1)

        def step(x, y):
            with gm:
                loss = ((net(x) - y) ** 2).mean()
                gm.backward(loss)
            opt.step()
            opt.clear_grad()
            return loss
        fn = wrap(step)
        rng = np.random.default_rng(0)
        losses = [fn(kiln.tensor(rng.standard_normal((5, 4)).astype(np.float32)),
                     kiln.tensor(rng.standard_normal((5, 2)).astype(np.float32))).numpy().item() for _ in range(4)]
        assert all(p.grad is None for p in params)
        return losses, [p.numpy().copy() for p in params]
    want_losses, want_params = train(lambda f: f)
    losses, params = train(lambda f: kiln.trace(f, **ALL[name]))
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    for p, q in zip(params, want_params):
        np.testing.assert_allclose(p, q, rtol=1e-5, atol=1e-7)
