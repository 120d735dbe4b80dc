"""Tensor.backward() inside a jitted function accumulates into the leaves' .grad at every call, as
eagerly (PyTorch's micro-batch accumulation): a replayed graph would not touch .grad, so such a
function runs eagerly (kiln.jit says why) and .grad equals eager's after every call."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn

VARIANTS = [(m, lv, b) for m in ("ast", "bytecode", "trace") for lv in ("O0", "O1") for b in ("kbk", "sink")]
IDS = ["-".join(v) for v in VARIANTS]
W = kiln.Parameter(kiln.tensor(np.array([1.0, 2.0], np.float32)), name="w")


def micro_step(x):
    loss = (W * x).sum()
    loss.backward()
    return loss


def grads_over_calls(fn):
    x = kiln.tensor(np.array([3.0, 4.0], np.float32))
    W.grad = None
    seen = []
    for _ in range(3):
        fn(x)
        seen.append(W.grad.numpy().tolist())
    W.grad = kiln.tensor(np.array([1.0, 1.0], np.float32))  # a gradient set outside
    fn(x)
    seen.append(W.grad.numpy().tolist())
    return seen


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_backward_accumulates_at_every_call(variant):
    mode, level, backend = variant
    jf = kiln.jit(micro_step, capture_mode=mode, jit_level=level, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = grads_over_calls(jf)
    assert got == grads_over_calls(micro_step) == [[3.0, 4.0], [6.0, 8.0], [9.0, 12.0], [4.0, 5.0]]


def train(wrap):
    rng = np.random.default_rng(0)
    net = nn.Dense(4, 3)
    net.weight.set_data(kiln.tensor(rng.standard_normal((3, 4)).astype(np.float32)))
    net.bias.set_data(kiln.tensor(np.zeros(3, np.float32)))
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)

    def micro(x):
        loss = (net(x) ** 2).mean()
        loss.backward()
        return loss

    step = wrap(micro)
    for _ in range(2):
        for _ in range(3):  # three micro-batches accumulate, then one update
            step(kiln.tensor(rng.standard_normal((5, 4)).astype(np.float32)))
        opt.step()
        for p in net.trainable_params():
            p.grad = None
    return net.weight.numpy()


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_micro_batch_accumulation_trains_as_eager(mode):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = train(lambda f: kiln.jit(f, capture_mode=mode))
    np.testing.assert_allclose(got, train(lambda f: f), rtol=1e-6, atol=1e-7)


def test_jit_says_why_it_runs_eagerly():
    jf = kiln.jit(micro_step, capture_mode="trace")
    with pytest.warns(RuntimeWarning, match=r"Tensor.backward\(\)"):
        jf(kiln.tensor(np.array([3.0, 4.0], np.float32)))
    W.grad = None
