"""TrainOneStepWithLossScaleCell compiled by kiln.jit: the overflow skip is a select in the graph
(the optimizer's writes kept or undone by the overflow tensor), so a jitted training step equals
the eager one step for step -- an injected overflow (an infinite gradient) skips the update and
lowers the scale, and training recovers -- in every capture mode, jit level and backend."""
import numpy as np
import pytest

import kiln
from kiln import amp, nn, ops

VARIANTS = [(m, lv, b) for m in ("ast", "bytecode", "trace") for lv in ("O0", "O1") for b in ("kbk", "sink")]


class Regression(nn.Cell):
    """A two-layer regression whose loss is multiplied by `gain`: 1, or inf to poison a step."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(5)
        self.w1 = nn.Parameter(kiln.tensor(rng.standard_normal((4, 6)).astype(np.float32) * 0.5), "w1")
        self.w2 = nn.Parameter(kiln.tensor(rng.standard_normal((6, 1)).astype(np.float32) * 0.5), "w2")

    def construct(self, x, y, gain):
        h = ops.tanh(ops.matmul(x, self.w1))
        return ops.mean((ops.matmul(h, self.w2) - y) ** 2) * gain


def make_step(optimizer):
    net = Regression()
    opt = optimizer(net.trainable_params())
    update = amp.DynamicLossScaleManager(init_loss_scale=2 ** 10, scale_factor=2, scale_window=3).get_update_cell()
    return net, opt, amp.TrainOneStepWithLossScaleCell(net, opt, update)


def data():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-1.0], [0.5], [2.0]], np.float32)).astype(np.float32)
    return kiln.tensor(x), kiln.tensor(y)


POISONED = (2, 5, 6)  # steps whose gradient is infinite


def run(step, net, steps=10):
    """Per step: (loss, overflow, scale used, the weights after)."""
    x, y = data()
    out = []
    for k in range(steps):
        gain = kiln.tensor(np.array(np.inf if k in POISONED else 1.0, np.float32))
        loss, overflow, scale = step(x, y, gain)
        out.append((float(loss), bool(overflow), float(scale), net.w1.numpy().copy(), net.w2.numpy().copy()))
    return out


OPTIMIZERS = {
    "sgd_momentum": lambda ps: nn.SGD(ps, learning_rate=0.05, momentum=0.9),
    "adam": lambda ps: nn.Adam(ps, learning_rate=0.02),
}


def test_eager_follows_the_dynamic_rule():
    net, opt, step = make_step(OPTIMIZERS["sgd_momentum"])
    got = run(step, net)
    scale, good = 2.0 ** 10, 0
    for k, (loss, overflow, used, w1, _) in enumerate(got):
        assert used == scale and overflow == (k in POISONED)
        if overflow:
            np.testing.assert_array_equal(w1, got[k - 1][3])  # skipped: the weights did not move
            scale, good = max(scale / 2, 1.0), 0
        else:
            good += 1
            if good == 3:
                scale, good = scale * 2, 0
    losses = [g[0] for g in got if not g[1]]
    assert losses[-1] < losses[0]
    assert opt.global_step == 10 - len(POISONED)  # skipped steps are not counted


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("mode,level,backend", VARIANTS)
def test_jitted_step_equals_eager_through_an_overflow(mode, level, backend, opt_name):
    net_e, opt_e, step_e = make_step(OPTIMIZERS[opt_name])
    want = run(step_e, net_e)
    net_j, opt_j, step_j = make_step(OPTIMIZERS[opt_name])
    jitted = kiln.jit(lambda x, y, g: step_j(x, y, g), capture_mode=mode, jit_level=level, backend=backend)
    got = run(jitted, net_j)
    where = f"{mode} {level} {backend} {opt_name}"
    for k, (g, w) in enumerate(zip(got, want)):
        assert g[1] == w[1] == (k in POISONED), f"{where}: overflow at step {k}"
        assert g[2] == w[2], f"{where}: scale at step {k}: {g[2]} != {w[2]}"
        if not w[1]:
            np.testing.assert_allclose(g[0], w[0], rtol=1e-6, err_msg=f"{where}: loss at step {k}")
        np.testing.assert_allclose(g[3], w[3], rtol=1e-6, atol=1e-7, err_msg=f"{where}: w1 after step {k}")
        np.testing.assert_allclose(g[4], w[4], rtol=1e-6, atol=1e-7, err_msg=f"{where}: w2 after step {k}")
    assert opt_j.global_step == opt_e.global_step == 10 - len(POISONED)
    for (name, a), (_, b) in zip(opt_j.state_for_checkpoint(), opt_e.state_for_checkpoint()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-7, err_msg=f"{where}: {name}")
    assert step_j.loss_scaling_manager.get_loss_scale() == step_e.loss_scaling_manager.get_loss_scale()
    assert step_j.loss_scaling_manager.cur_iter == step_e.loss_scaling_manager.cur_iter


def test_update_cell_takes_a_python_bool_and_refuses_a_number_scale():
    cell = amp.DynamicLossScaleUpdateCell(8.0, 2, 2)
    scale = kiln.tensor(np.array(8.0, np.float32))
    assert bool(cell(scale, True)) and float(scale) == 4.0 and cell.get_loss_scale() == 4.0
    assert not bool(cell(scale, False)) and cell.cur_iter == 1
    with pytest.raises(TypeError, match="loss_scale must be a float32 tensor"):
        cell(8.0, False)
