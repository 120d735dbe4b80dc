"""AdamWeightDecay/AdamW, Momentum, RMSProp and Adagrad (issue 30): NumPy references of their
rules over several steps (with weight decay, a centered RMSProp, Nesterov momentum), PyTorch's
with copied weights when torch is importable, and a jitted training step in each capture mode
equal to eager, following a per-step learning-rate list without recompiling."""
import numpy as np
import pytest

import kiln
from kiln import nn

P0 = np.array([[1.0, -2.0, 3.0], [0.5, 0.0, -1.5]], np.float32)


def grads_of(p):
    return np.sin(p) + 0.5 * p  # a gradient that changes with p


def run_kiln(make, steps=5):
    p = kiln.Parameter(kiln.Tensor(P0.copy()), name="w")
    opt = make([p])
    for _ in range(steps):
        opt([kiln.Tensor(grads_of(p.asnumpy()))])
    return p.asnumpy()


def ref_adamw(lr, b1, b2, eps, wd, steps=5):
    p, m, v = P0.astype(np.float64), 0, 0
    for t in range(1, steps + 1):
        g = grads_of(p.astype(np.float32)).astype(np.float64)
        p = p - lr * wd * p
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        p = p - lr / (1 - b1 ** t) * m / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return p


def ref_momentum(lr, mom, wd, nesterov, steps=5):
    p, acc = P0.astype(np.float64), 0
    for _ in range(steps):
        g = grads_of(p.astype(np.float32)).astype(np.float64) + wd * p
        acc = mom * acc + g
        p = p - lr * (g + mom * acc if nesterov else acc)
    return p


def ref_rmsprop(lr, decay, mom, eps, centered, steps=5):
    p, ms, mg, m = P0.astype(np.float64), 0, 0, 0
    for _ in range(steps):
        g = grads_of(p.astype(np.float32)).astype(np.float64)
        ms = decay * ms + (1 - decay) * g * g
        denom = ms
        if centered:
            mg = decay * mg + (1 - decay) * g
            denom = ms - mg * mg
        m = mom * m + lr * g / np.sqrt(denom + eps)
        p = p - m
    return p


def ref_adagrad(lr, accum, steps=5):
    p, acc = P0.astype(np.float64), accum
    for _ in range(steps):
        g = grads_of(p.astype(np.float32)).astype(np.float64)
        acc = acc + g * g
        p = p - lr * g / np.sqrt(acc)
    return p


@pytest.mark.parametrize("make, ref", [
    (lambda ps: nn.AdamWeightDecay(ps, 0.05, weight_decay=0.1), lambda: ref_adamw(0.05, 0.9, 0.999, 1e-6, 0.1)),
    (lambda ps: nn.AdamW(ps, lr=0.02), lambda: ref_adamw(0.02, 0.9, 0.999, 1e-8, 0.01)),
    (lambda ps: nn.Momentum(ps, 0.05, 0.9), lambda: ref_momentum(0.05, 0.9, 0.0, False)),
    (lambda ps: nn.Momentum(ps, 0.05, 0.9, weight_decay=0.01, use_nesterov=True),
     lambda: ref_momentum(0.05, 0.9, 0.01, True)),
    (lambda ps: nn.Momentum(ps, 0.05, 0.9, nesterov=True), lambda: ref_momentum(0.05, 0.9, 0.0, True)),
    (lambda ps: nn.RMSProp(ps, 0.01), lambda: ref_rmsprop(0.01, 0.9, 0.0, 1e-10, False)),
    (lambda ps: nn.RMSProp(ps, 0.01, momentum=0.5, centered=True), lambda: ref_rmsprop(0.01, 0.9, 0.5, 1e-10, True)),
    (lambda ps: nn.Adagrad(ps, learning_rate=0.1), lambda: ref_adagrad(0.1, 0.1)),
], ids=["AdamWeightDecay", "AdamW", "Momentum", "Momentum-nesterov-wd", "Momentum-nesterov-pytorch-name", "RMSProp", "RMSProp-centered", "Adagrad"])
def test_rules_match_numpy(make, ref):
    np.testing.assert_allclose(run_kiln(make), ref(), rtol=2e-5, atol=1e-6)


def test_against_torch_when_installed():
    torch = pytest.importorskip("torch")
    pairs = [(lambda ps: nn.AdamW(ps, lr=0.02, weight_decay=0.05), lambda ps: torch.optim.AdamW(ps, lr=0.02,
                                                                                              weight_decay=0.05)),
             (lambda ps: nn.Momentum(ps, 0.05, 0.9), lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)),
             (lambda ps: nn.Adagrad(ps, accum=0.0, learning_rate=0.1, eps=1e-10),
              lambda ps: torch.optim.Adagrad(ps, lr=0.1, eps=1e-10))]
    for make_k, make_t in pairs:
        tp = torch.nn.Parameter(torch.tensor(P0.copy()))
        topt = make_t([tp])
        for _ in range(5):
            topt.zero_grad()
            tp.grad = torch.tensor(grads_of(tp.detach().numpy()))
            topt.step()
        np.testing.assert_allclose(run_kiln(make_k), tp.detach().numpy(), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
@pytest.mark.parametrize("level, backend", [("O0", "kbk"), ("O1", "kbk"), ("O1", "sink")])
@pytest.mark.parametrize("name", ["AdamW", "Momentum", "RMSProp", "Adagrad"])
def test_jitted_training_step_follows_a_schedule_like_eager(mode, name, level, backend):
    def train(jit):
        kiln.manual_seed(0)
        net = nn.Dense(3, 2)
        params = net.trainable_params()
        schedule = [0.1, 0.05, 0.02, 0.01, 0.005]
        opt = {"AdamW": lambda: nn.AdamW(params, lr=schedule), "Momentum": lambda: nn.Momentum(params, schedule, 0.9),
               "RMSProp": lambda: nn.RMSProp(params, schedule, centered=True),
               "Adagrad": lambda: nn.Adagrad(params, learning_rate=schedule)}[name]()
        grad_fn = kiln.value_and_grad(lambda x, y: ((net(x) - y) ** 2).mean(), None, params)

        def step(x, y):
            loss, grads = grad_fn(x, y)
            opt(grads)
            return loss

        f = kiln.jit(step, capture_mode=mode, jit_level=level, backend=backend) if jit else step
        rng = np.random.default_rng(1)
        losses = [float(f(kiln.Tensor(rng.standard_normal((4, 3)).astype(np.float32)),
                          kiln.Tensor(rng.standard_normal((4, 2)).astype(np.float32))).asnumpy()) for _ in range(5)]
        return losses, [p.asnumpy().copy() for p in params], f

    want, want_p, _ = train(False)
    got, got_p, f = train(True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(got_p, want_p):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert f.stats.compiles <= 2, f.stats  # the schedule is read in the graph: no compile per rate


def test_bad_arguments_name_the_optimizer():
    p = kiln.Parameter(kiln.Tensor(P0.copy()), name="w")
    with pytest.raises(ValueError, match="RMSProp: decay"):
        nn.RMSProp([p], decay=1.5)
    with pytest.raises(ValueError, match="Momentum: momentum"):
        nn.Momentum([p], 0.1, -0.5)
    with pytest.raises(ValueError, match="Adagrad: accum"):
        nn.Adagrad([p], accum=-1)
