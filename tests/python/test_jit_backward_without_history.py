"""A compiled function that reads parameters, called in grad mode but outside kiln.grad /
value_and_grad / GradManager, runs its graph without autograd history. Eagerly its result carries
history back to those parameters, so `loss = jf(x) + penalty(params); loss.backward()` used to
succeed while leaving out jf's share of the parameters' gradients: a silent wrong result. Such a
result now requires grad, as eagerly, and backward through it raises an error naming the function;
every way of differentiating a compiled function that kiln supports still gives eager's gradients."""
import functools
import warnings

import numpy as np
import pytest

import kiln
from conformance import TRACE_VARIANTS, VARIANTS
from kiln import nn
from kiln.autodiff import GradManager

ALL = VARIANTS + TRACE_VARIANTS


def _net():
    kiln.manual_seed(0)
    return nn.Dense(4, 3)


def _x():
    return kiln.Tensor(np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32))


def _clear(net):
    for p in net.trainable_params():
        p.grad = None


def _eager_grads(net, f, x):
    _clear(net)
    loss = f(x) + (net.weight * net.weight).sum()
    loss.backward()
    return [p.grad.asnumpy().copy() for p in net.trainable_params()]


@pytest.mark.parametrize("variant", ALL, ids=repr)
def test_backward_through_a_compiled_result_raises_instead_of_dropping_its_share(variant):
    net, x = _net(), _x()

    def f(x):
        return (net(x) ** 2).sum()

    jf = variant.wrap(f)
    for call in range(3):  # the capturing call and the calls served by the compiled graph
        _clear(net)
        out = jf(x)
        assert out.requires_grad == f(x).requires_grad, (variant, call)
        loss = out + (net.weight * net.weight).sum()
        with pytest.raises(RuntimeError, match=r"a result of .*f reached backward"):
            loss.backward()


@pytest.mark.parametrize("variant", ALL, ids=repr)
def test_no_grad_results_do_not_require_grad(variant):
    net, x = _net(), _x()

    def f(x):
        return net(x).sum()

    jf = variant.wrap(f)
    for _ in range(2):
        with kiln.no_grad():
            out, want = jf(x), f(x)
        assert not out.requires_grad and not want.requires_grad
        np.testing.assert_allclose(out.asnumpy(), want.asnumpy(), rtol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS, ids=repr)
def test_value_and_grad_of_the_compiled_function_equals_eager(variant):
    net, x = _net(), _x()

    def f(x):
        return (net(x) ** 2).sum()

    params = net.trainable_params()
    want = kiln.value_and_grad(f, None, params)(x)
    step = kiln.value_and_grad(variant.wrap(f), None, params)
    for _ in range(3):
        value, grads = step(x)
        np.testing.assert_allclose(value.asnumpy(), want[0].asnumpy(), rtol=1e-5)
        for g, w in zip(grads, want[1]):
            np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", ALL, ids=repr)
def test_grad_manager_gives_eager_gradients(variant):
    net, x = _net(), _x()

    def f(x):
        return (net(x) ** 2).sum()

    want = _eager_grads(net, f, x)
    jf = variant.wrap(f)
    gm = GradManager().attach(net.trainable_params())
    for _ in range(3):
        _clear(net)
        with gm:
            loss = jf(x) + (net.weight * net.weight).sum()
            gm.backward(loss)
        for p, w in zip(net.trainable_params(), want):
            np.testing.assert_allclose(p.grad.asnumpy(), w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS, ids=repr)
def test_inputs_that_require_grad_still_backpropagate(variant):
    net, x = _net(), _x()

    def f(x):
        return (net(x) ** 2).sum()

    want = _eager_grads(net, f, x)
    jf = variant.wrap(f)
    for _ in range(3):
        _clear(net)
        xg = kiln.Tensor(x.asnumpy())
        xg.requires_grad = True
        loss = jf(xg) + (net.weight * net.weight).sum()
        loss.backward()
        for p, w in zip(net.trainable_params(), want):
            np.testing.assert_allclose(p.grad.asnumpy(), w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", ALL, ids=repr)
def test_a_function_without_parameters_is_unchanged(variant):
    x = _x()

    def g(x):
        return (x * 2).sum()

    jg = variant.wrap(g)
    for _ in range(2):
        out = jg(x)
        assert not out.requires_grad
        np.testing.assert_allclose(out.asnumpy(), g(x).asnumpy(), rtol=1e-6)


def _logged(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args)
    return wrapper


@pytest.mark.parametrize("variant", VARIANTS, ids=repr)
def test_decorated_function_and_a_list_written_in_place(variant):
    """A decorated function that reads parameters behaves as the plain one (backward raises); one
    that also appends to an outer list runs eagerly in ast and trace capture (a side effect), so the
    list grows at every call and backward gives eager's gradients, the capturing call's own run
    included."""
    net, x = _net(), _x()

    @_logged
    def f(x):
        return (net(x) ** 2).sum()

    jf = variant.wrap(f)
    for _ in range(2):
        loss = jf(x) + (net.weight * net.weight).sum()
        with pytest.raises(RuntimeError, match=r"a result of .*f reached backward"):
            loss.backward()

    log = []

    @_logged
    def g(x):
        y = (net(x) ** 2).sum()
        log.append(y)
        return y

    want = _eager_grads(net, g, x)
    log.clear()
    if variant.name.startswith("bytecode"):
        # bytecode capture compiles g in two graphs around the append: the second keeps the first's
        # history (it used to return y detached at the capturing call), so backward raises at every call
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            jg = variant.wrap(g)
            for call in range(3):
                loss = jg(x) + (net.weight * net.weight).sum()
                assert len(log) == call + 1 and loss.requires_grad
                with pytest.raises(RuntimeError, match=r"a result of .*g reached backward"):
                    loss.backward()
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (the side effect: g runs eagerly, with a warning)
        jg = variant.wrap(g)
        for call in range(3):
            _clear(net)
            loss = jg(x) + (net.weight * net.weight).sum()
            assert len(log) == call + 1
            loss.backward()
            for p, w in zip(net.trainable_params(), want):
                np.testing.assert_allclose(p.grad.asnumpy(), w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", VARIANTS, ids=repr)
def test_a_graph_break_between_reading_a_parameter_and_using_it(variant):
    """A parameter held in a local across a graph break (bytecode capture splits the function there;
    the side effect makes ast and trace capture run f eagerly) is used after it: the graph after the
    break records its backward, so backward gives eager's gradients at every call, the capturing one
    included (it used to return that call's result without history)."""
    net, x = _net(), _x()
    seen = []

    def f(x):
        w = net.weight
        seen.append(len(seen))
        return (x @ w.T).sum()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        jf = variant.wrap(f)
        for call in range(3):
            _clear(net)
            out = jf(x)
            assert out.requires_grad, (variant, call)
            (out + (net.weight * net.weight).sum()).backward()
            want = 2 * net.weight.asnumpy() + np.tile(x.asnumpy().sum(0), (3, 1))
            np.testing.assert_allclose(net.weight.grad.asnumpy(), want, rtol=1e-5, atol=1e-6)
            assert len(seen) == call + 1
