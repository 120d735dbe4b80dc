"""Adam with AMSGrad (issue 30): MindSpore's nn.Adam(use_amsgrad=True), PyTorch's amsgrad=True, the
adam_amsgrad_update op. A NumPy reference of the rule over several steps (float32 and float64, with
and without weight decay, gradients that shrink so the kept maximum is what divides), PyTorch's
Adam/AdamW(amsgrad=True) with copied weights when torch is importable, a jitted training step in
every capture mode, level and backend equal to eager, the state in checkpoints, and bad state named
by the op."""
import os
import tempfile

import numpy as np
import pytest

import kiln
from kiln import nn
from kiln import _C
from kiln._optable import OP

P0 = np.array([[1.0, -2.0, 3.0], [0.5, 0.1, -1.5]], np.float32)
SCALES = [3.0, 2.0, 0.3, 0.1, 0.05, 0.02]  # gradients shrink: v falls below its maximum


def grads_of(p, t):
    return SCALES[t] * (np.sin(p) + 0.5 * p)


def ref_adam(lr, b1, b2, eps, wd, amsgrad, dtype=np.float32, decoupled=False):
    p, m, v, vmax = P0.astype(np.float64), 0.0, 0.0, 0.0
    for t in range(1, len(SCALES) + 1):
        g = grads_of(p.astype(dtype), t - 1).astype(np.float64)
        if decoupled:
            p = p - lr * wd * p
        else:
            g = g + wd * p
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        vmax = np.maximum(vmax, v)
        denom = np.sqrt((vmax if amsgrad else v) / (1 - b2 ** t)) + eps
        p = p - lr / (1 - b1 ** t) * m / denom
    return p


def run_kiln(make, dtype=np.float32):
    p = kiln.Parameter(kiln.Tensor(P0.astype(dtype)), name="w")
    opt = make([p])
    for t in range(len(SCALES)):
        opt([kiln.Tensor(grads_of(p.asnumpy(), t).astype(dtype))])
    return p.asnumpy(), opt


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("make, ref", [
    (lambda ps: nn.Adam(ps, 0.1, use_amsgrad=True), lambda d: ref_adam(0.1, 0.9, 0.999, 1e-8, 0.0, True, dtype=d)),
    (lambda ps: nn.Adam(ps, lr=0.05, betas=(0.8, 0.9), amsgrad=True, weight_decay=0.1),
     lambda d: ref_adam(0.05, 0.8, 0.9, 1e-8, 0.1, True, dtype=d)),
    (lambda ps: nn.AdamW(ps, lr=0.05, weight_decay=0.1, amsgrad=True),
     lambda d: ref_adam(0.05, 0.9, 0.999, 1e-8, 0.1, True, decoupled=True, dtype=d)),
    (lambda ps: nn.AdamWeightDecay(ps, 0.05, weight_decay=0.1, use_amsgrad=True),
     lambda d: ref_adam(0.05, 0.9, 0.999, 1e-6, 0.1, True, decoupled=True, dtype=d)),
    (lambda ps: nn.Adam(ps, 0.1), lambda d: ref_adam(0.1, 0.9, 0.999, 1e-8, 0.0, False, dtype=d)),
], ids=["Adam-use_amsgrad", "Adam-torch-names-wd", "AdamW-amsgrad", "AdamWeightDecay-amsgrad", "Adam-plain"])
def test_rule_matches_numpy(make, ref, dtype):
    got, _ = run_kiln(make, dtype)
    rtol = 2e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, ref(dtype), rtol=rtol, atol=rtol / 10)


def test_amsgrad_changes_the_update():
    """The reference's gradients make AMSGrad differ from Adam, so the test above would see it ignored."""
    for b2 in (0.999, 0.9):  # 50x and 5000x the tolerance
        a = ref_adam(0.1, 0.9, b2, 1e-8, 0.0, True)
        b = ref_adam(0.1, 0.9, b2, 1e-8, 0.0, False)
        assert np.abs(a - b).max() > (1e-4 if b2 == 0.999 else 1e-2)
    got, opt = run_kiln(lambda ps: nn.Adam(ps, 0.1, use_amsgrad=True))
    assert opt.use_amsgrad and opt.amsgrad
    v, vmax = opt.moment2[0].asnumpy(), opt.max_moment2[0].asnumpy()
    assert (vmax >= v).all() and (vmax > v).all()  # the maximum is kept, not the last (smaller) v


def test_against_torch_when_installed():
    torch = pytest.importorskip("torch")
    pairs = [(lambda ps: nn.Adam(ps, 0.1, use_amsgrad=True), lambda ps: torch.optim.Adam(ps, lr=0.1, amsgrad=True)),
             (lambda ps: nn.Adam(ps, lr=0.05, betas=(0.8, 0.9), amsgrad=True, weight_decay=0.1),
              lambda ps: torch.optim.Adam(ps, lr=0.05, betas=(0.8, 0.9), amsgrad=True, weight_decay=0.1)),
             (lambda ps: nn.AdamW(ps, lr=0.05, weight_decay=0.1, amsgrad=True),
              lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1, amsgrad=True))]
    for make_k, make_t in pairs:
        tp = torch.nn.Parameter(torch.tensor(P0.copy()))
        topt = make_t([tp])
        for t in range(len(SCALES)):
            topt.zero_grad()
            tp.grad = torch.tensor(grads_of(tp.detach().numpy(), t))
            topt.step()
        got, opt = run_kiln(make_k)
        np.testing.assert_allclose(got, tp.detach().numpy(), rtol=2e-5, atol=1e-6)
        np.testing.assert_allclose(opt.max_moment2[0].asnumpy(), topt.state[tp]["max_exp_avg_sq"].numpy(),
                                   rtol=2e-5, atol=1e-9)


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
@pytest.mark.parametrize("level, backend", [("O0", "kbk"), ("O0", "sink"), ("O1", "kbk"), ("O1", "sink")])
def test_jitted_step_equals_eager(mode, level, backend):
    def train(jit):
        kiln.manual_seed(0)
        net = nn.Dense(3, 2)
        params = net.trainable_params()
        opt = nn.Adam(params, [0.1, 0.05, 0.05, 0.02, 0.01, 0.01], use_amsgrad=True, weight_decay=0.01)
        grad_fn = kiln.value_and_grad(lambda x, y, s: ((net(x) - y) ** 2).mean() * s, None, params)

        def step(x, y, s):
            loss, grads = grad_fn(x, y, s)
            opt(grads)
            return loss

        f = kiln.jit(step, capture_mode=mode, jit_level=level, backend=backend) if jit else step
        rng = np.random.default_rng(1)
        losses = []
        for s in SCALES:
            x = kiln.Tensor(rng.standard_normal((4, 3)).astype(np.float32))
            y = kiln.Tensor(rng.standard_normal((4, 2)).astype(np.float32))
            losses.append(float(f(x, y, kiln.Tensor(np.float32(s))).asnumpy()))
        return losses, [p.asnumpy().copy() for p in params], [m.asnumpy().copy() for m in opt.max_moment2], f

    want, want_p, want_v, _ = train(False)
    got, got_p, got_v, f = train(True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(got_p + got_v, want_p + want_v):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert f.stats.compiles <= 2, f.stats


def test_state_is_checkpointed():
    _, opt = run_kiln(lambda ps: nn.Adam(ps, 0.1, use_amsgrad=True))
    names = [n for n, _ in opt.state_for_checkpoint()]
    assert "max_moment2.0" in names and "moment2.0" in names
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "opt.ckpt")
        kiln.save_checkpoint(opt, path)
        saved = opt.max_moment2[0].asnumpy().copy()
        p2 = kiln.Parameter(kiln.Tensor(P0.copy()), name="w")
        opt2 = nn.Adam([p2], 0.1, use_amsgrad=True)
        kiln.load_param_into_net(opt2, kiln.load_checkpoint(path))
        np.testing.assert_array_equal(opt2.max_moment2[0].asnumpy(), saved)


def test_bad_state_names_the_op():
    p = kiln.Tensor(P0.copy())
    g = kiln.Tensor(P0.copy())
    m, v = kiln.ops.zeros_like(p), kiln.ops.zeros_like(p)
    step = kiln.ops.zeros((), dtype=kiln.int64)
    with pytest.raises(ValueError, match="adam_amsgrad_update: the largest second moment vmax must match"):
        _C.apply(OP.adam_amsgrad_update, (p, g, m, v, kiln.ops.zeros((3,)), step), (),
                 (0.1, 0.9, 0.999, 1e-8, 0.0))
    with pytest.raises(TypeError, match="adam_amsgrad_update: step must be"):
        _C.apply(OP.adam_amsgrad_update, (p, g, m, v, kiln.ops.zeros_like(p), kiln.ops.zeros(())), (),
                 (0.1, 0.9, 0.999, 1e-8, 0.0))
