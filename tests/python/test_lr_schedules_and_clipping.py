"""MindSpore's learning-rate list builders and LearningRateSchedule Cells (their formulas, step by
step), a jitted training step following a schedule Cell without recompiling and equal to eager, and
gradient clipping (ops.clip_by_global_norm / clip_by_norm, nn.utils.clip_grad_norm_) against NumPy."""
import math

import numpy as np
import pytest

import kiln
from kiln import nn, ops


def test_list_builders():
    np.testing.assert_allclose(nn.cosine_decay_lr(0.01, 0.1, 6, 2, 2),
                               [0.1, 0.1, 0.055, 0.055, 0.01, 0.01], rtol=1e-12)
    np.testing.assert_allclose(nn.exponential_decay_lr(0.1, 0.5, 4, 1, 2), [0.1 * 0.5 ** (e / 2) for e in range(4)])
    np.testing.assert_allclose(nn.exponential_decay_lr(0.1, 0.5, 4, 1, 2, is_stair=True), [0.1, 0.1, 0.05, 0.05])
    np.testing.assert_allclose(nn.polynomial_decay_lr(0.1, 0.01, 5, 1, 2, 0.5),
                               [(0.09) * (1 - min(e, 2) / 2) ** 0.5 + 0.01 for e in range(5)])
    assert nn.piecewise_constant_lr([2, 5], [0.1, 0.05]) == [0.1, 0.1, 0.05, 0.05, 0.05]
    np.testing.assert_allclose(nn.warmup_lr(0.1, 6, 2, 2), [0.0, 0.0, 0.05, 0.05, 0.1, 0.1])
    with pytest.raises(ValueError, match="piecewise_constant_lr"):
        nn.piecewise_constant_lr([3, 2], [0.1, 0.2])
    with pytest.raises(ValueError, match="cosine_decay_lr: decay_epoch"):
        nn.cosine_decay_lr(0.0, 0.1, 4, 1, 0)


@pytest.mark.parametrize("schedule, formula", [
    (nn.CosineDecayLR(0.01, 0.1, 4), lambda s: 0.01 + 0.045 * (1 + math.cos(math.pi * min(s, 4) / 4))),
    (nn.WarmUpLR(0.1, 3), lambda s: 0.1 * min(s, 3) / 3),
    (nn.ExponentialDecayLR(0.1, 0.9, 2), lambda s: 0.1 * 0.9 ** (s / 2)),
    (nn.ExponentialDecayLR(0.1, 0.9, 2, is_stair=True), lambda s: 0.1 * 0.9 ** (s // 2)),
    (nn.PolynomialDecayLR(0.1, 0.01, 4, 2.0), lambda s: 0.09 * (1 - min(s, 4) / 4) ** 2 + 0.01),
    (nn.WarmUpCosineDecayLR(0.0, 1.0, 2, 4), lambda s: min(s, 2) / 2 if s < 2 else
     0.5 * (1 + math.cos(math.pi * min(s - 2, 4) / 4))),
], ids=["cosine", "warmup", "exp", "exp-stair", "poly", "warmup-cosine"])
def test_schedule_cells(schedule, formula):
    for s in range(8):
        assert abs(float(schedule(s).asnumpy()) - formula(s)) < 1e-6, s


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
@pytest.mark.parametrize("level, backend", [("O0", "kbk"), ("O1", "kbk"), ("O1", "sink")])
def test_jitted_step_follows_a_schedule_cell(mode, level, backend):
    def train(jit):
        kiln.manual_seed(0)
        net = nn.Dense(3, 2)
        params = net.trainable_params()
        opt = nn.AdamW(params, lr=nn.WarmUpCosineDecayLR(0.0, 0.05, 2, 5))
        grad_fn = kiln.value_and_grad(lambda x, y: ((net(x) - y) ** 2).mean(), None, params)

        def step(x, y):
            loss, grads = grad_fn(x, y)
            grads = ops.clip_by_global_norm(grads, 0.5)
            opt(grads)
            return loss

        f = kiln.jit(step, capture_mode=mode, jit_level=level, backend=backend) if jit else step
        rng = np.random.default_rng(2)
        losses = [float(f(kiln.Tensor(rng.standard_normal((4, 3)).astype(np.float32)),
                          kiln.Tensor(rng.standard_normal((4, 2)).astype(np.float32))).asnumpy()) for _ in range(7)]
        return losses, f

    want, _ = train(False)
    got, f = train(True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert f.stats.compiles <= 2, f.stats


def test_clipping_matches_numpy():
    a, b = np.array([3.0, 4.0], np.float32), np.array([[12.0]], np.float32)
    norm = math.sqrt(9 + 16 + 144)
    ca, cb = ops.clip_by_global_norm((kiln.Tensor(a), kiln.Tensor(b)), 6.5)
    np.testing.assert_allclose(ca.numpy(), a * 6.5 / norm, rtol=1e-6)
    np.testing.assert_allclose(cb.numpy(), b * 6.5 / norm, rtol=1e-6)
    same = ops.clip_by_global_norm((kiln.Tensor(a),), 10.0)[0]  # under the limit: unchanged
    np.testing.assert_allclose(same.numpy(), a)
    np.testing.assert_allclose(ops.clip_by_norm(kiln.Tensor(a), 1.0).numpy(), a / 5.0, rtol=1e-6)
    p = kiln.Parameter(kiln.Tensor(np.zeros(2, np.float32)), name="p")
    p.grad = kiln.Tensor(a.copy())
    total = nn.utils.clip_grad_norm_([p], 2.5)
    assert abs(float(total.asnumpy()) - 5.0) < 1e-6
    np.testing.assert_allclose(p.grad.numpy(), a / 2.0, rtol=1e-6)
    with pytest.raises(ValueError, match="clip_by_global_norm: clip_norm"):
        ops.clip_by_global_norm((kiln.Tensor(a),), 0.0)
