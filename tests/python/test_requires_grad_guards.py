"""Freezing or unfreezing a parameter between calls of a jitted function (fine-tuning scripts do
it: `p.requires_grad = False` on a backbone) changes which gradients eager computes and whether
outputs carry history. A compiled graph kept the state of its capture without a word: a frozen
weight kept getting its gradient, and an unfrozen one got none. Each tensor a graph reads from
outside is now guarded on requires_grad; a change captures again."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn, ops

VARIANTS = [(m, lv, b) for m in ("ast", "bytecode", "trace") for lv in ("O0", "O1") for b in ("kbk", "sink")]
IDS = ["-".join(v) for v in VARIANTS]


def t(*shape, seed=0):
    return kiln.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def jit(fn, variant):
    mode, level, backend = variant
    return kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)


def assert_all_close(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-5, atol=1e-6)


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_grad_of_a_jitted_function_after_freezing_a_weight(variant):
    kiln.manual_seed(0)
    net = nn.Dense(4, 3)
    params = list(net.get_parameters())
    loss = lambda x: (net(x) ** 2).sum()  # noqa: E731
    compiled = kiln.grad(jit(loss, variant), None, params)
    eager = kiln.grad(loss, None, params)
    x = t(2, 4)
    assert_all_close(compiled(x), eager(x))
    net.weight.requires_grad = False
    frozen = eager(x)
    assert float(np.abs(frozen[0].asnumpy()).sum()) == 0.0
    assert_all_close(compiled(x), frozen)
    net.weight.requires_grad = True
    assert_all_close(compiled(x), eager(x))


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_grad_through_a_jitted_forward_after_unfreezing(variant):
    kiln.manual_seed(1)
    net = nn.Dense(4, 3)
    params = list(net.get_parameters())
    for p in params:
        p.requires_grad = False
    forward = jit(lambda x: net(x), variant)
    x = t(2, 4, seed=1)
    forward(x)  # captured while frozen: outputs without history
    for p in params:
        p.requires_grad = True
    got = kiln.grad(lambda x: (forward(x) * forward(x)).sum(), None, params)(x)
    want = kiln.grad(lambda x: (net(x) * net(x)).sum(), None, params)(x)
    assert float(np.abs(want[0].asnumpy()).sum()) > 0
    assert_all_close(got, want)


def fine_tune(wrap):
    """Trains a two-layer net, freezing the first layer after two steps (the usual fine-tuning move)."""
    kiln.manual_seed(2)
    net = nn.SequentialCell(nn.Dense(6, 8), nn.ReLU(), nn.Dense(8, 2))
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    grads = kiln.value_and_grad(lambda x, y: ((net(x) - y) ** 2).mean(), None, opt.parameters)

    def step(x, y):
        loss, g = grads(x, y)
        opt(g)
        return loss

    f = wrap(step)
    losses = []
    for i in range(6):
        if i == 2:
            for p in net[0].get_parameters():
                p.requires_grad = False
        losses.append(f(t(5, 6, seed=10 + i), t(5, 2, seed=20 + i)).asnumpy())
    return np.array(losses), [p.asnumpy() for p in net.get_parameters()]


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_fine_tuning_step_with_a_layer_frozen_midway(variant):
    want_losses, want_params = fine_tune(lambda f: f)
    got_losses, got_params = fine_tune(lambda f: jit(f, variant))
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_params, want_params):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_the_change_is_named_as_the_reason_to_capture_again():
    kiln.manual_seed(3)
    net = nn.Dense(3, 2)
    f = kiln.jit(lambda x: net(x), capture_mode="trace")
    x = t(2, 3)
    f(x)
    net.bias.requires_grad = False
    f(x)
    assert f.cache_info().compiles == 2
    assert "recompile 1: the value of requires_grad of a tensor read from outside" in str(f.explain())
