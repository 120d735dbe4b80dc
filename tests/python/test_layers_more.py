"""kiln.nn layers a ported script still meets (issue 30): activations, 2-D padding, 1-D pooling,
BatchNorm3d, Dropout1d / Dropout3d, distances, five losses, ParameterList / ParameterDict and the
PyTorch container names; NumPy references, finite-difference gradients, PyTorch's modules where
torch is importable, and a network of them compiled equal to eager (every capture mode)."""
import numpy as np
import pytest

import kiln
from kiln import nn, ops
from compiled_equal import assert_compiled_equal
from conftest import check_grad


def T(a, dtype=None):
    return kiln.Tensor(np.asarray(a), dtype) if dtype is not None else kiln.Tensor(np.asarray(a))


def rng(seed=0):
    return np.random.default_rng(seed)


def _softmax(v, axis):
    e = np.exp(v - v.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


ACTIVATIONS = [  # (name, cell, NumPy)
    ("ReLU6", lambda: nn.ReLU6(), lambda v: np.clip(v, 0, 6)),
    ("Hardtanh", lambda: nn.Hardtanh(-2.0, 0.5), lambda v: np.clip(v, -2, 0.5)),
    ("Softsign", lambda: nn.Softsign(), lambda v: v / (1 + np.abs(v))),
    ("SELU", lambda: nn.SELU(), lambda v: 1.0507009873554805 * np.where(v > 0, v, 1.6732632423543772 * np.expm1(v))),
    ("CELU", lambda: nn.CELU(2.0), lambda v: np.where(v > 0, v, 2.0 * np.expm1(v / 2.0))),
    ("GLU", lambda: nn.GLU(dim=1), lambda v: v[:, :2] / (1 + np.exp(-v[:, 2:]))),
    ("Softmin", lambda: nn.Softmin(dim=0), lambda v: _softmax(-v, 0)),
    ("Threshold", lambda: nn.Threshold(0.1, -5.0), lambda v: np.where(v > 0.1, v, -5.0)),
]


@pytest.mark.parametrize("case", ACTIVATIONS, ids=lambda c: c[0])
def test_activations_match_numpy_and_finite_differences(case):
    name, make, nfn = case
    a = rng(1).uniform(-4, 8, (3, 4))
    a = np.where(np.abs(a - np.round(a)) < 0.05, a + 0.1, a)  # away from kinks
    cell = make()
    np.testing.assert_allclose(cell(T(a)).numpy(), nfn(a), rtol=1e-12, atol=1e-15)
    check_grad(cell, a)


def test_padding_matches_numpy():
    x = rng(2).normal(size=(2, 3, 4, 5))
    pads = (1, 2, 3, 0)  # (left, right, top, bottom)
    np_pads = ((0, 0), (0, 0), (3, 0), (1, 2))
    np.testing.assert_array_equal(nn.ZeroPad2d(pads)(T(x)).numpy(), np.pad(x, np_pads))
    np.testing.assert_array_equal(nn.ConstantPad2d(2, -1.5)(T(x[0])).numpy(),
                                  np.pad(x[0], ((0, 0), (2, 2), (2, 2)), constant_values=-1.5))
    np.testing.assert_array_equal(nn.ReflectionPad2d(pads)(T(x)).numpy(), np.pad(x, np_pads, mode="reflect"))
    np.testing.assert_array_equal(nn.ReplicationPad2d(2)(T(x)).numpy(),
                                  np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)), mode="edge"))
    check_grad(nn.ReflectionPad2d((1, 1, 2, 0)), x[:1, :2])
    check_grad(nn.ReplicationPad2d(1), x[:1, :2])


def _windows(x, k, s, p, fill):
    xp = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(p, p)], constant_values=fill)
    n = (xp.shape[-1] - k) // s + 1
    return np.stack([xp[..., i * s:i * s + k] for i in range(n)], -2)


def test_pool1d_matches_numpy():
    x = rng(3).normal(size=(2, 3, 11))
    np.testing.assert_array_equal(nn.MaxPool1d(3, 2)(T(x)).numpy(), _windows(x, 3, 2, 0, -np.inf).max(-1))
    np.testing.assert_array_equal(nn.MaxPool1d(3, 1, "pad", 1)(T(x[0])).numpy(), _windows(x[0], 3, 1, 1, -np.inf).max(-1))
    np.testing.assert_allclose(nn.AvgPool1d(4, 3)(T(x)).numpy(), _windows(x, 4, 3, 0, 0).mean(-1), rtol=1e-12)
    np.testing.assert_allclose(nn.AvgPool1d(3, 2, "pad", 1)(T(x)).numpy(), _windows(x, 3, 2, 1, 0.0).mean(-1),
                               rtol=1e-12)
    out = nn.AdaptiveAvgPool1d(4)(T(x)).numpy()  # windows [floor(i L / 4), ceil((i + 1) L / 4))
    want = np.stack([x[..., (i * 11) // 4:-(-(i + 1) * 11 // 4)].mean(-1) for i in range(4)], -1)
    np.testing.assert_allclose(out, want, rtol=1e-12)
    np.testing.assert_allclose(nn.AdaptiveAvgPool1d(1)(T(x[0])).numpy(), x[0].mean(-1, keepdims=True), rtol=1e-12)
    check_grad(nn.AvgPool1d(3, 2), x[:1])
    check_grad(nn.AdaptiveAvgPool1d(3), x[:1])


def test_batchnorm3d_matches_numpy_in_training_and_eval():
    x = rng(4).normal(size=(2, 3, 2, 3, 2)).astype(np.float32)
    bn = nn.BatchNorm3d(3, momentum=0.9)
    bn.set_train()
    y = bn(T(x)).numpy()
    mean, var = x.mean((0, 2, 3, 4), keepdims=True), x.var((0, 2, 3, 4), keepdims=True)
    np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-5)
    n = x.size / 3
    np.testing.assert_allclose(bn.moving_mean.numpy(), 0.1 * mean.ravel(), rtol=1e-5)
    np.testing.assert_allclose(bn.moving_variance.numpy(), 0.9 + 0.1 * var.ravel() * n / (n - 1), rtol=1e-5)
    bn.set_train(False)
    m, v = bn.moving_mean.numpy().reshape(1, 3, 1, 1, 1), bn.moving_variance.numpy().reshape(1, 3, 1, 1, 1)
    np.testing.assert_allclose(bn(T(x)).numpy(), (x - m) / np.sqrt(v + 1e-5), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="BatchNorm3d: expected a 5-D input"):
        bn(T(x[0]))


@pytest.mark.parametrize("cls,shape", [(nn.Dropout1d, (4, 6, 5)), (nn.Dropout1d, (40, 5)), (nn.Dropout3d, (2, 9, 2, 3, 2)),
                                       (nn.Dropout3d, (40, 2, 3, 2))])
def test_channel_dropout_zeroes_whole_channels(cls, shape):
    x = T(np.ones(shape, np.float32))
    d = cls(0.5)
    np.testing.assert_array_equal(d(x).numpy(), x.numpy())  # eval: the identity
    d.set_train()
    kiln.manual_seed(3)
    y = d(x).numpy()
    spatial = 1 if cls is nn.Dropout1d else 3
    per_channel = y.reshape(y.shape[:y.ndim - spatial] + (-1,))
    assert set(np.unique(per_channel)) <= {0.0, 2.0}
    assert (per_channel.min(-1) == per_channel.max(-1)).all()  # each channel all kept or all dropped
    assert 0 < (per_channel[..., 0] == 0).sum() < per_channel[..., 0].size
    with pytest.raises(ValueError, match=f"{cls.__name__}: expected"):
        d(T(np.ones((2,) * (spatial + 3), np.float32)))


def test_distance_cells():
    r = rng(5)
    a, b = r.normal(size=(4, 3)), r.normal(size=(4, 3))
    np.testing.assert_allclose(nn.CosineSimilarity()(T(a), T(b)).numpy(),
                               (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1), rtol=1e-12)
    np.testing.assert_allclose(nn.PairwiseDistance(p=1.0, keepdim=True)(T(a), T(b)).numpy(),
                               np.abs(a - b + 1e-6).sum(1, keepdims=True), rtol=1e-12)


def test_losses_match_numpy():
    r = rng(6)
    x, y = r.normal(size=(4, 3)), r.normal(size=(4, 3))
    d = x - y
    huber = np.where(np.abs(d) <= 0.5, 0.5 * d * d, 0.5 * (np.abs(d) - 0.25))
    np.testing.assert_allclose(nn.HuberLoss(delta=0.5)(T(x), T(y)).numpy(), huber.mean(), rtol=1e-12)
    np.testing.assert_allclose(nn.HuberLoss("none")(T(x), T(y)).numpy(),
                               np.where(np.abs(d) <= 1, 0.5 * d * d, np.abs(d) - 0.5), rtol=1e-12)
    p, t = r.uniform(0.05, 0.95, (4, 3)), (r.random((4, 3)) < 0.5).astype(np.float64)
    w = r.uniform(0.5, 2, (3,))
    bce = -(t * np.log(p) + (1 - t) * np.log(1 - p))
    np.testing.assert_allclose(nn.BCELoss()(T(p), T(t)).numpy(), bce.mean(), rtol=1e-12)
    np.testing.assert_allclose(nn.BCELoss(T(w), "sum")(T(p), T(t)).numpy(), (bce * w).sum(), rtol=1e-12)
    edge = nn.BCELoss(reduction="none")(T(np.array([0.0, 1.0])), T(np.array([1.0, 0.0]))).numpy()
    np.testing.assert_array_equal(edge, [100.0, 100.0])  # log clamped at -100, as PyTorch
    sign = np.where(r.random(4) < 0.5, -1.0, 1.0)
    x1, x2 = r.normal(size=4), r.normal(size=4)
    np.testing.assert_allclose(nn.MarginRankingLoss(0.3)(T(x1), T(x2), T(sign)).numpy(),
                               np.maximum(0, -sign * (x1 - x2) + 0.3).mean(), rtol=1e-12)
    np.testing.assert_allclose(nn.SoftMarginLoss("sum")(T(x), T(np.sign(y))).numpy(),
                               np.log1p(np.exp(-np.sign(y) * x)).sum(), rtol=1e-12)
    big = nn.SoftMarginLoss("none")(T(np.array([-1000.0])), T(np.array([1.0]))).numpy()
    np.testing.assert_allclose(big, [1000.0])  # no overflow
    cos = (x * y).sum(1) / np.sqrt(((x * x).sum(1) + 1e-12) * ((y * y).sum(1) + 1e-12))
    lab = np.array([1, -1, 1, -1])
    want = np.where(lab == 1, 1 - cos, np.maximum(cos - 0.1, 0))
    np.testing.assert_allclose(nn.CosineEmbeddingLoss(0.1, "none")(T(x), T(y), T(lab)).numpy(), want, rtol=1e-12)
    for cell, args in ((nn.HuberLoss(), (x, y)), (nn.BCELoss(), (p, t)), (nn.MarginRankingLoss(0.3), (x1, x2)),
                       (nn.SoftMarginLoss(), (x, np.sign(y))), (nn.CosineEmbeddingLoss(0.1), (x, y))):
        extra = {nn.MarginRankingLoss: (T(sign),), nn.CosineEmbeddingLoss: (T(lab),)}.get(type(cell), ())
        if extra:
            check_grad(lambda u, v, c=cell, e=extra: c(u, v, *e), *args)
        else:
            check_grad(lambda u, c=cell, lab_=T(args[1]): c(u, lab_), args[0])


def test_parameter_containers_register_and_train():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.scales = nn.ParameterList([T(np.ones(3, np.float32)), T(np.full(3, 2.0, np.float32))])
            self.extra = nn.ParameterDict({"bias": T(np.zeros(3, np.float32))})
            self.extra["gain"] = nn.Parameter(T(np.ones(1, np.float32)))

        def construct(self, x):
            for s in self.scales:
                x = x * s
            return x * self.extra["gain"] + self.extra["bias"]

    net = Net()
    names = [n for n, _ in net.parameters_and_names()]
    assert names == ["scales.0", "scales.1", "extra.bias", "extra.gain"]
    assert len(net.scales) == 2 and len(net.extra) == 2 and "gain" in net.extra and list(net.extra) == ["bias", "gain"]
    assert net.scales[-1] is net.scales[1] and all(isinstance(p, nn.Parameter) for p in net.scales)
    net.scales.append(T(np.ones(3, np.float32)))
    assert len(net.trainable_params()) == 5
    x = T(np.array([1.0, -2.0, 3.0], np.float32))
    grads = kiln.grad(lambda v: net(v).sum(), grad_position=None, weights=net.trainable_params())(x)
    np.testing.assert_allclose(grads[0].numpy(), 2.0 * x.numpy())
    np.testing.assert_allclose(grads[3].numpy(), [1.0, 1.0, 1.0])
    del net.extra["gain"]
    assert [n for n, _ in net.parameters_and_names()] == ["scales.0", "scales.1", "scales.2", "extra.bias"]
    with pytest.raises(TypeError, match="ParameterList: expected a Parameter or a Tensor"):
        nn.ParameterList([1.0])
    with pytest.raises(IndexError, match="ParameterList index 5 out of range"):
        net.scales[5]
    assert nn.ModuleList is nn.CellList and nn.Sequential is nn.SequentialCell and nn.ModuleDict is nn.CellDict


class _Model(nn.Cell):
    def __init__(self):
        super().__init__()
        self.pad = nn.ReflectionPad2d(1)
        self.act = nn.Sequential(nn.ReLU6(), nn.Hardtanh(-0.5, 3.0))
        self.pool = nn.MaxPool1d(2, 2)
        self.apool = nn.AdaptiveAvgPool1d(3)
        self.glu = nn.GLU(1)
        self.mods = nn.ModuleList([nn.Softsign(), nn.CELU(0.5), nn.SELU(), nn.Threshold(0.0, 0.1)])
        self.w = nn.ParameterList([T(np.linspace(0.5, 1.5, 12).astype(np.float32))])
        self.softmin = nn.Softmin(-1)

    def construct(self, x):
        h = self.pad(x)  # (N, C, H + 2, W + 2)
        h = self.act(h * 3.0).reshape(h.shape[0], h.shape[1], -1)
        h = self.pool(h) + self.mods[0](h[..., 1::2])
        h = self.apool(h)
        for m in self.mods:
            h = m(h)
        return ops.softmax(self.softmin(self.glu(h.reshape(h.shape[0], -1)[:, :12] * self.w[0])), -1)


def test_network_of_new_layers_compiled_equal_eager_with_gradients():
    r = rng(7)
    x = T(r.normal(size=(2, 4, 3, 3)).astype(np.float32))
    model = _Model()
    y = model(x)
    assert y.shape == (2, 6)
    huber = nn.HuberLoss()
    assert_compiled_equal(lambda v: model(v).sum() + huber(model(v), model(v * 0.5)), (x,), grad=True)


def test_against_torch_modules():
    torch = pytest.importorskip("torch")
    tnn = torch.nn
    r = rng(8)
    x = r.normal(size=(2, 4, 6, 5))
    x1 = r.normal(size=(2, 4, 9))
    pairs = [
        (nn.ReLU6(), tnn.ReLU6(), x), (nn.Hardtanh(-0.7, 0.4), tnn.Hardtanh(-0.7, 0.4), x), (nn.Softsign(), tnn.Softsign(), x),
        (nn.SELU(), tnn.SELU(), x), (nn.CELU(1.3), tnn.CELU(1.3), x), (nn.GLU(1), tnn.GLU(1), x),
        (nn.Softmin(dim=2), tnn.Softmin(dim=2), x), (nn.Threshold(0.2, -1.0), tnn.Threshold(0.2, -1.0), x),
        (nn.ZeroPad2d((1, 0, 2, 1)), tnn.ZeroPad2d((1, 0, 2, 1)), x),
        (nn.ConstantPad2d(2, 0.5), tnn.ConstantPad2d(2, 0.5), x),
        (nn.ReflectionPad2d((2, 1, 0, 3)), tnn.ReflectionPad2d((2, 1, 0, 3)), x),
        (nn.ReplicationPad2d(3), tnn.ReplicationPad2d(3), x),
        (nn.MaxPool1d(3, 2), tnn.MaxPool1d(3, 2), x1), (nn.MaxPool1d(3, 2, "pad", 1), tnn.MaxPool1d(3, 2, 1), x1),
        (nn.AvgPool1d(2, 2), tnn.AvgPool1d(2, 2), x1), (nn.AvgPool1d(3, 2, "pad", 1), tnn.AvgPool1d(3, 2, 1), x1),
        (nn.AdaptiveAvgPool1d(4), tnn.AdaptiveAvgPool1d(4), x1),
    ]
    for ours, theirs, a in pairs:
        np.testing.assert_allclose(ours(T(a)).numpy(), theirs(torch.tensor(a)).numpy(), rtol=1e-12, atol=1e-14,
                                   err_msg=type(ours).__name__)
    x5 = r.normal(size=(2, 3, 2, 4, 3)).astype(np.float32)
    ours, theirs = nn.BatchNorm3d(3, momentum=0.8), tnn.BatchNorm3d(3, momentum=0.2)
    g, bt = r.uniform(0.5, 1.5, 3).astype(np.float32), r.normal(size=3).astype(np.float32)
    ours.gamma.set_data(T(g)), ours.beta.set_data(T(bt))
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(g)), theirs.bias.copy_(torch.tensor(bt))
    ours.set_train(), theirs.train()
    np.testing.assert_allclose(ours(T(x5)).numpy(), theirs(torch.tensor(x5)).detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours.moving_variance.numpy(), theirs.running_var.numpy(), rtol=1e-5)
    ours.set_train(False), theirs.eval()
    np.testing.assert_allclose(ours(T(x5)).numpy(), theirs(torch.tensor(x5)).detach().numpy(), rtol=1e-4, atol=1e-5)
    a, b = r.normal(size=(5, 4)), r.normal(size=(5, 4))
    lab = np.array([1.0, -1.0, 1.0, 1.0, -1.0])
    prob, tgt = r.uniform(0.01, 0.99, (5, 4)), (r.random((5, 4)) < 0.5).astype(np.float64)
    losses = [
        (nn.HuberLoss("sum", 0.7)(T(a), T(b)), tnn.HuberLoss("sum", 0.7)(torch.tensor(a), torch.tensor(b))),
        (nn.BCELoss(T(a[0] ** 2))(T(prob), T(tgt)), tnn.BCELoss(torch.tensor(a[0] ** 2))(torch.tensor(prob), torch.tensor(tgt))),
        (nn.MarginRankingLoss(0.2)(T(a[:, 0]), T(b[:, 0]), T(lab)),
         tnn.MarginRankingLoss(0.2)(torch.tensor(a[:, 0]), torch.tensor(b[:, 0]), torch.tensor(lab))),
        (nn.SoftMarginLoss()(T(a), T(np.sign(b))), tnn.SoftMarginLoss()(torch.tensor(a), torch.tensor(np.sign(b)))),
        (nn.CosineEmbeddingLoss(0.3, "none")(T(a), T(b), T(lab)),
         tnn.CosineEmbeddingLoss(0.3, reduction="none")(torch.tensor(a), torch.tensor(b), torch.tensor(lab))),
        (nn.CosineSimilarity(0)(T(a), T(b)), tnn.CosineSimilarity(0)(torch.tensor(a), torch.tensor(b))),
        (nn.PairwiseDistance(3.0)(T(a), T(b)), tnn.PairwiseDistance(3.0)(torch.tensor(a), torch.tensor(b))),
    ]
    for k, (ours_v, theirs_v) in enumerate(losses):
        np.testing.assert_allclose(ours_v.numpy(), theirs_v.numpy(), rtol=1e-12, atol=1e-14, err_msg=f"loss {k}")


def test_bad_arguments_name_the_layer():
    cases = [
        (lambda: nn.Hardtanh(1.0, -1.0), ValueError, "Hardtanh: min_val"),
        (lambda: nn.CELU(0.0), ValueError, "CELU: alpha must be a nonzero number"),
        (lambda: nn.ZeroPad2d((1, 2)), ValueError, "ZeroPad2d: padding must be an int or 4 ints"),
        (lambda: nn.ReflectionPad2d(1)(T(np.ones(3))), ValueError, "ReflectionPad2d: expected (N, C, H, W)"),
        (lambda: nn.MaxPool1d(0), ValueError, "MaxPool1d: kernel_size must be an int >= 1"),
        (lambda: nn.MaxPool1d(2)(T(np.ones((1, 1, 2, 2)))), ValueError, "MaxPool1d: expected (N, C, L) or (C, L)"),
        (lambda: nn.AvgPool1d(2, padding=1), ValueError, "AvgPool1d: padding"),
        (lambda: nn.HuberLoss(delta=0), ValueError, "HuberLoss: delta must be a positive number"),
        (lambda: nn.BCELoss(reduction="avg"), ValueError, "BCELoss: reduction must be one of"),
        (lambda: nn.BCELoss()(T(np.ones(3)), T(np.ones(2))), ValueError, "binary_cross_entropy: input and target"),
        (lambda: nn.CosineEmbeddingLoss()(T(np.ones((2, 3))), T(np.ones((2, 3))), T(np.ones(3))), ValueError,
         "cosine_embedding_loss: target must have shape [2]"),
        (lambda: nn.GLU()(T(np.ones((2, 3)))), ValueError, "glu: the length of axis 1 must be even"),
    ]
    for call, exc, text in cases:
        with pytest.raises(exc) as info:
            call()
        assert text in str(info.value), (text, str(info.value))
