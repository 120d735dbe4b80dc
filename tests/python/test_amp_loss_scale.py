"""Loss scaling against a NumPy model of the algorithm: overflow detection, the skipped step, the
scale backing off after an overflow and growing after a window of good steps; an injected overflow
recovered by TrainOneStepWithLossScaleCell and MegEngine's GradScaler."""
import math

import numpy as np
import pytest

import kiln
from kiln import amp, nn, ops


class ModelScaler:
    """The dynamic loss-scaling rule in plain Python: what every kiln scaler must do."""

    def __init__(self, scale, factor, window, floor=1.0):
        self.scale, self.factor, self.window, self.floor, self.good = scale, factor, window, floor, 0

    def step(self, finite):
        if not finite:
            self.scale, self.good = max(self.scale / self.factor, self.floor), 0
            return
        self.good += 1
        if self.good >= self.window:
            if math.isfinite(np.float32(self.scale * self.factor)):
                self.scale *= self.factor
            self.good = 0


def finite_pattern(n, seed):
    return [bool(v) for v in np.random.default_rng(seed).random(n) > 0.2]


def test_dynamic_loss_scaler_follows_the_model():
    scaler = amp.DynamicLossScaler(scale_value=2.0 ** 10, scale_factor=2, scale_window=3)
    model = ModelScaler(2.0 ** 10, 2, 3)
    for k, finite in enumerate(finite_pattern(60, 0)):
        assert scaler.adjust(kiln.tensor(np.array(finite))) is True
        model.step(finite)
        assert float(scaler.scale_value) == model.scale, k
    assert scaler.scale_value.dtype is kiln.float32


def test_scale_unscale_and_all_finite():
    scaler = amp.DynamicLossScaler(scale_value=1024, scale_factor=2, scale_window=1)
    g = (kiln.tensor(np.array([0.5, -2.0], np.float32)), kiln.tensor(np.array([3.0], np.float32)))
    s = scaler.scale(g)
    np.testing.assert_array_equal(s[0].numpy(), [512.0, -2048.0])
    u = scaler.unscale(s)
    np.testing.assert_array_equal(u[0].numpy(), g[0].numpy())
    assert bool(amp.all_finite(u))
    bad = (kiln.tensor(np.array([np.nan, 1.0], np.float32)), g[1])
    assert not bool(amp.all_finite(bad))
    assert not bool(amp.all_finite(kiln.tensor(np.array([np.inf], np.float32))))
    # MindSpore's example: an overflow halves 1024
    scaler.adjust(amp.all_finite(scaler.unscale(bad)))
    assert float(scaler.scale_value) == 512.0


def test_the_scale_never_goes_below_one_nor_overflows():
    scaler = amp.DynamicLossScaler(scale_value=2, scale_factor=4, scale_window=1)
    for _ in range(3):
        scaler.adjust(False)
    assert float(scaler.scale_value) == 1.0
    big = amp.DynamicLossScaler(scale_value=2.0 ** 126, scale_factor=4, scale_window=1)
    big.adjust(True)
    assert float(big.scale_value) == 2.0 ** 126  # 2**128 is not a float32: kept


def test_dynamic_manager_and_update_cell_follow_the_model():
    m = amp.DynamicLossScaleManager(init_loss_scale=2 ** 12, scale_factor=2, scale_window=4)
    cell = m.get_update_cell()
    scale = kiln.tensor(np.array(m.get_loss_scale(), np.float32))
    model = ModelScaler(2.0 ** 12, 2, 4)
    for finite in finite_pattern(50, 1):
        m.update_loss_scale(not finite)
        out = cell(scale, kiln.tensor(np.array(not finite)))
        assert bool(out) == (not finite)
        model.step(finite)
        assert m.get_loss_scale() == model.scale
        assert float(scale) == model.scale


def test_fixed_manager():
    m = amp.FixedLossScaleManager(256.0, drop_overflow_update=False)
    assert m.get_loss_scale() == 256.0 and m.get_update_cell() is None
    m.update_loss_scale(True)
    assert m.get_loss_scale() == 256.0
    assert isinstance(amp.StaticLossScaleManager(8.0).get_update_cell(), amp.FixedLossScaleUpdateCell)


@pytest.mark.parametrize("bad", [0.5, float("inf"), float("nan"), "x"])
def test_bad_scales_are_refused(bad):
    with pytest.raises(ValueError, match="loss scale"):
        amp.DynamicLossScaler(bad, 2, 10)
    with pytest.raises(ValueError):
        amp.DynamicLossScaleManager(bad)
    with pytest.raises(ValueError):
        amp.FixedLossScaleManager(bad)


def test_bad_factor_and_window_are_refused():
    with pytest.raises(ValueError, match="scale_factor"):
        amp.DynamicLossScaler(8, 1, 10)
    with pytest.raises(ValueError, match="scale_window"):
        amp.DynamicLossScaler(8, 2, 0)
    with pytest.raises(ValueError, match="growth_interval"):
        amp.GradScaler(growth_interval=0)


class Linear(nn.Cell):
    """y = x @ w with a switch that poisons the loss (an injected overflow)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(kiln.tensor(np.full((3, 1), 0.5, np.float32)), "w")
        self.poison = False

    def construct(self, x, y):
        loss = ops.mean((ops.matmul(x, self.w) - y) ** 2)
        return loss * float("inf") if self.poison else loss


def data():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 3)).astype(np.float32)
    return kiln.tensor(x), kiln.tensor(x @ np.array([[1.0], [-2.0], [0.5]], np.float32))


def test_train_one_step_with_loss_scale_skips_an_overflow_and_recovers():
    net = Linear()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    update = amp.DynamicLossScaleManager(init_loss_scale=2 ** 8, scale_factor=2, scale_window=2).get_update_cell()
    step = amp.TrainOneStepWithLossScaleCell(net, opt, update)
    x, y = data()
    model = ModelScaler(2.0 ** 8, 2, 2)
    w = net.w.numpy().copy()
    losses = []
    for k in range(8):
        net.poison = k == 3
        loss, overflow, scale = step(x, y)
        assert float(scale) == model.scale  # the scale this step used
        assert bool(overflow) == net.poison
        model.step(not net.poison)
        if net.poison:
            np.testing.assert_array_equal(net.w.numpy(), w)  # the step was skipped
        else:
            # SGD on the true (unscaled) gradient
            grad = 2 * x.numpy().T @ (x.numpy() @ w - y.numpy()) / 8
            np.testing.assert_allclose(net.w.numpy(), w - 0.1 * grad, rtol=1e-5, atol=1e-6)
            losses.append(float(loss))
        w = net.w.numpy().copy()
    assert losses[-1] < losses[0] / 4  # training went on after the overflow


def test_build_train_network_with_a_loss_scale_manager():
    net = Linear()
    step = amp.build_train_network(net, nn.SGD(net.trainable_params(), learning_rate=0.1), level="O2",
                                   dtype=kiln.bfloat16,
                                   loss_scale_manager=amp.DynamicLossScaleManager(2 ** 6, 2, 1000))
    assert isinstance(step, amp.TrainOneStepWithLossScaleCell)
    x, y = data()
    first = float(step(x, y)[0])
    for _ in range(10):
        loss, overflow, _ = step(x, y)
    assert not bool(overflow) and float(loss) < first / 4
    assert net.w.dtype is kiln.float32
    assert isinstance(amp.build_train_network(Linear(), nn.SGD(Linear().trainable_params(), 0.1)), nn.TrainOneStepCell)
    with pytest.raises(TypeError, match="LossScaleManager"):
        amp.build_train_network(net, nn.SGD(net.trainable_params(), 0.1), level="O2", loss_scale_manager=3)
    with pytest.raises(ValueError, match="unknown arguments"):
        amp.build_train_network(net, nn.SGD(net.trainable_params(), 0.1), levle="O2")


def test_grad_scaler_skips_and_backs_off_then_grows():
    net = Linear()
    gm = kiln.autodiff.GradManager().attach(net.trainable_params())
    opt = nn.SGD(net.trainable_params(), learning_rate=0.1)
    scaler = amp.GradScaler(init_scale=2.0 ** 4, growth_factor=2.0, backoff_factor=0.5, growth_interval=2)
    x, y = data()
    scales = []
    for k in range(6):
        net.poison = k == 1
        w = net.w.numpy().copy()
        with gm:
            loss = net(x, y)
            scaler.backward(gm, loss)
        if net.poison:
            assert net.w.grad is None  # every gradient dropped: nothing to apply
        else:
            grad = 2 * x.numpy().T @ (x.numpy() @ w - y.numpy()) / 8
            np.testing.assert_allclose(net.w.grad.numpy(), grad, rtol=1e-5, atol=1e-6)
            opt.step()
            net.w.grad = None
        scales.append(scaler.scale_factor)
    # 16 -> good: 16 (1 of 2) -> overflow: 8 -> good: 8 -> good: 16 -> good: 16 -> good: 32
    assert scales == [16.0, 8.0, 8.0, 16.0, 16.0, 32.0]
