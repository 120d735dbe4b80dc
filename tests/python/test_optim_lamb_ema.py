"""Lamb and the EMA of parameters (issue 30): a NumPy reference of each rule over several steps,
and a jitted training step using them in each capture mode equal to eager."""
import numpy as np
import pytest

import kiln
from kiln import nn

P0 = np.array([[1.0, -2.0, 3.0], [0.5, 0.0, -1.5]], np.float32)


def grads_of(p):
    return np.sin(p) + 0.5 * p


def ref_lamb(lr, b1, b2, eps, wd, steps=5, p0=P0):
    p, m, v = p0.astype(np.float64), 0, 0
    for t in range(1, steps + 1):
        g = grads_of(p.astype(np.float32)).astype(np.float64)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        r = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps) + wd * p
        wn, rn = np.linalg.norm(p), np.linalg.norm(r)
        trust = wn / rn if wn > 0 and rn > 0 else 1.0
        p = p - lr * trust * r
    return p


@pytest.mark.parametrize("wd, p0", [(0.0, P0), (0.01, P0), (0.0, np.zeros_like(P0))], ids=["plain", "decay", "zeros"])
def test_lamb_matches_numpy(wd, p0):
    p = kiln.Parameter(kiln.Tensor(p0.copy()), name="w")
    opt = nn.Lamb([p], 0.05, weight_decay=wd)
    for _ in range(5):
        opt([kiln.Tensor(grads_of(p.asnumpy()))])
    np.testing.assert_allclose(p.asnumpy(), ref_lamb(0.05, 0.9, 0.999, 1e-6, wd, p0=p0), rtol=2e-5, atol=1e-6)


def test_ema_matches_numpy_and_apply_restore_swap_weights():
    p = kiln.Parameter(kiln.Tensor(P0.copy()), name="w")
    ema = nn.EMA([p], decay=0.9, use_num_updates=True)
    shadow, values = P0.astype(np.float64), P0.astype(np.float64)
    for n in range(4):
        values = values * 0.5 + 1.0
        p.set_data(kiln.Tensor(values.astype(np.float32)))
        ema.update()
        d = min(0.9, (1 + n) / (10 + n))
        shadow = d * shadow + (1 - d) * values
    np.testing.assert_allclose(ema.shadow[0].asnumpy(), shadow, rtol=1e-5)
    ema.apply()
    np.testing.assert_allclose(p.asnumpy(), shadow, rtol=1e-5)
    with pytest.raises(RuntimeError, match="EMA.apply"):
        ema.apply()
    ema.restore()
    np.testing.assert_allclose(p.asnumpy(), values, rtol=1e-6)
    with pytest.raises(ValueError, match="EMA: decay"):
        nn.EMA([p], decay=1.5)


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
@pytest.mark.parametrize("level, backend", [("O0", "kbk"), ("O1", "sink")])
def test_jitted_step_with_lamb_and_ema_equals_eager(mode, level, backend):
    def train(jit):
        kiln.manual_seed(0)
        net = nn.Dense(3, 2)
        params = net.trainable_params()
        opt = nn.Lamb(params, [0.1, 0.05, 0.02], weight_decay=0.01)
        ema = nn.EMA(params, decay=0.8)
        grad_fn = kiln.value_and_grad(lambda x, y: ((net(x) - y) ** 2).mean(), None, params)

        def step(x, y):
            loss, grads = grad_fn(x, y)
            opt(grads)
            ema.update()
            return loss

        f = kiln.jit(step, capture_mode=mode, jit_level=level, backend=backend) if jit else step
        rng = np.random.default_rng(1)
        losses = [float(f(kiln.Tensor(rng.standard_normal((4, 3)).astype(np.float32)),
                          kiln.Tensor(rng.standard_normal((4, 2)).astype(np.float32))).asnumpy()) for _ in range(4)]
        return losses, [t.asnumpy().copy() for t in list(params) + list(ema.shadow)], f

    want, want_p, _ = train(False)
    got, got_p, f = train(True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(got_p, want_p):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert f.stats.compiles <= 2, f.stats


def test_lamb_bad_arguments_name_it():
    p = kiln.Parameter(kiln.Tensor(P0.copy()), name="w")
    with pytest.raises(ValueError, match="Lamb: beta1"):
        nn.Lamb([p], 0.1, beta1=1.0)
