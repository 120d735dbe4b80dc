"""The layers of kiln.nn.layers_extra (issue 30) against NumPy formulas (and PyTorch with copied
weights when torch is importable), gradients against finite differences where they are smooth, and
compiled (ast, bytecode, trace) equal to eager."""
import numpy as np
import pytest

import kiln
from kiln import nn
from conformance import run_all_modes

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 4, 6, 6)).astype(np.float32)


def np_softplus(v, beta=1.0, threshold=20.0):
    return np.where(v * beta > threshold, v, np.log1p(np.exp(v * beta)) / beta)


@pytest.mark.parametrize("cell, ref", [
    (nn.LeakyReLU(0.1), lambda v: np.where(v >= 0, v, 0.1 * v)),
    (nn.ELU(), lambda v: np.where(v > 0, v, np.expm1(np.minimum(v, 0)))),
    (nn.Softplus(), np_softplus),
    (nn.Softplus(beta=2.0, threshold=1.0), lambda v: np_softplus(v, 2.0, 1.0)),
    (nn.HSwish(), lambda v: v * np.clip(v + 3, 0, 6) / 6),
    (nn.HSigmoid(), lambda v: np.clip(v + 3, 0, 6) / 6),
    (nn.Mish(), lambda v: v * np.tanh(np_softplus(v))),
], ids=["leaky", "elu", "softplus", "softplus-beta", "hswish", "hsigmoid", "mish"])
def test_activations(cell, ref):
    np.testing.assert_allclose(cell(kiln.Tensor(X)).asnumpy(), ref(X.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_prelu_per_channel_and_its_gradient():
    p = nn.PReLU(4, w=0.3)
    np.testing.assert_allclose(p(kiln.Tensor(X)).asnumpy(), np.where(X >= 0, X, 0.3 * X), rtol=1e-6)
    g = kiln.grad(lambda t: p(t).sum(), None, p.trainable_params())(kiln.Tensor(X))
    np.testing.assert_allclose(g[0].asnumpy(), np.where(X < 0, X, 0).sum((0, 2, 3)), rtol=1e-5)


def test_group_and_instance_norm():
    gn = nn.GroupNorm(2, 4)
    g = X.reshape(2, 2, -1).astype(np.float64)
    want = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(X.shape)
    np.testing.assert_allclose(gn(kiln.Tensor(X)).asnumpy(), want, rtol=1e-4, atol=1e-5)
    inorm = nn.InstanceNorm2d(4)
    c = X.reshape(2, 4, -1).astype(np.float64)
    want = ((c - c.mean(-1, keepdims=True)) / np.sqrt(c.var(-1, keepdims=True) + 1e-5)).reshape(X.shape)
    np.testing.assert_allclose(inorm(kiln.Tensor(X)).asnumpy(), want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="GroupNorm: num_groups 3 must divide num_channels 4"):
        nn.GroupNorm(3, 4)


@pytest.mark.parametrize("out", [(1, 1), (3, 3), (4, 5), (6, 6)])
def test_adaptive_avg_pool_windows(out):
    y = nn.AdaptiveAvgPool2d(out)(kiln.Tensor(X)).asnumpy()
    want = np.zeros(X.shape[:2] + out)
    for i in range(out[0]):
        for j in range(out[1]):
            a, b = (i * 6) // out[0], -((-(i + 1) * 6) // out[0])
            c, d = (j * 6) // out[1], -((-(j + 1) * 6) // out[1])
            want[:, :, i, j] = X[:, :, a:b, c:d].mean((2, 3))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_resizing_and_reshaping_layers():
    np.testing.assert_array_equal(nn.Upsample(scale_factor=2)(kiln.Tensor(X)).asnumpy(),
                                  X.repeat(2, axis=2).repeat(2, axis=3))
    np.testing.assert_array_equal(nn.Upsample(size=(12, 18))(kiln.Tensor(X)).asnumpy(),
                                  X.repeat(2, axis=2).repeat(3, axis=3))
    ps = nn.PixelShuffle(2)(kiln.Tensor(X)).asnumpy()
    want = X.reshape(2, 1, 2, 2, 6, 6).transpose(0, 1, 4, 2, 5, 3).reshape(2, 1, 12, 12)
    np.testing.assert_array_equal(ps, want)
    np.testing.assert_array_equal(nn.PixelUnshuffle(2)(kiln.Tensor(ps)).asnumpy(), X)
    assert tuple(nn.Unflatten(1, (2, 2))(kiln.Tensor(X)).shape) == (2, 2, 2, 6, 6)
    d = nn.Dropout2d(0.5)
    d.set_train(False)
    np.testing.assert_array_equal(d(kiln.Tensor(X)).asnumpy(), X)
    d.set_train(True)
    kiln.manual_seed(0)
    y = d(kiln.Tensor(np.ones((8, 16, 3, 3), np.float32))).asnumpy()
    per_channel = y.reshape(8, 16, -1)
    assert np.all((per_channel == 0).all(-1) | (per_channel == 2).all(-1))  # whole channels, scaled 1 / (1 - p)


def test_conv1d_equals_a_direct_convolution():
    conv = nn.Conv1d(4, 3, 3, pad_mode="pad", padding=1, has_bias=True)
    x = RNG.standard_normal((2, 4, 10)).astype(np.float32)
    w = conv.conv.weight.asnumpy()[:, :, 0, :]
    b = conv.conv.bias.asnumpy()
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1)))
    want = np.stack([np.einsum("ncl,ocl->no", xp[:, :, t:t + 3], w) for t in range(10)], -1) + b[None, :, None]
    np.testing.assert_allclose(conv(kiln.Tensor(x)).asnumpy(), want, rtol=1e-4, atol=1e-5)


def test_cell_dict_and_linear():
    d = nn.CellDict({"enc": nn.Dense(3, 4), "dec": nn.Dense(4, 3)})
    assert list(d) == ["enc", "dec"] and "enc" in d and len(d) == 2
    assert [n for n, _ in d.parameters_and_names()] == ["enc.weight", "enc.bias", "dec.weight", "dec.bias"]
    lin = nn.Linear(3, 2, bias=False)
    assert lin.bias is None and tuple(lin.weight.shape) == (2, 3)


def test_compiled_variants_agree_with_eager():
    net = nn.SequentialCell(nn.Conv1d(4, 8, 3), nn.Mish(), nn.LeakyReLU())
    gn, pool, up = nn.GroupNorm(2, 4), nn.AdaptiveAvgPool2d(3), nn.Upsample(scale_factor=2)

    def f(x, seq):
        return net(seq), up(pool(gn(x))), nn.HSwish()(x).sum()

    run_all_modes(f, (kiln.Tensor(X), kiln.Tensor(RNG.standard_normal((2, 4, 9)).astype(np.float32))),
                  (kiln.Tensor(X * 2), kiln.Tensor(RNG.standard_normal((2, 4, 9)).astype(np.float32))))


@pytest.mark.parametrize("out", [2, (3, 2)])
def test_adaptive_avg_pool_keeps_an_inf_in_its_own_windows(out):
    x = np.zeros((1, 1, 4, 5), np.float32)
    x[0, 0, 0, 0] = np.inf
    got = nn.AdaptiveAvgPool2d(out)(kiln.Tensor(x)).asnumpy()
    oh, ow = (out, out) if isinstance(out, int) else out
    want = np.zeros((1, 1, oh, ow), np.float32)
    want[0, 0, 0, 0] = np.inf  # only the window holding the inf; no NaN elsewhere
    np.testing.assert_array_equal(got, want)


def test_adaptive_avg_pool_sizes_are_checked_and_never_loop_per_window():
    """A huge output_size is refused at once (it used to loop once per window in Python: a hang),
    a bad one names the layer, and windows of unequal width (output larger than the input too)
    are PyTorch's, a NaN staying in its own windows."""
    x = np.arange(2 * 3 * 7 * 5, dtype=np.float32).reshape(2, 3, 7, 5)
    x[0, 0, 2, 1] = np.nan
    with pytest.raises(MemoryError, match=r"AdaptiveAvgPool2d: output_size \(1000000000, 1000000000\)"):
        nn.AdaptiveAvgPool2d(10 ** 9)(kiln.Tensor(x))
    for bad in (0, -2, (3,), "4", True):
        with pytest.raises(ValueError, match="AdaptiveAvgPool2d: output_size must be a positive int"):
            nn.AdaptiveAvgPool2d(bad)
    for oh, ow in ((3, 2), (9, 8), (7, 3)):
        want = np.empty((2, 3, oh, ow), np.float32)
        for i in range(oh):
            for j in range(ow):
                a, b = i * 7 // oh, -(-(i + 1) * 7 // oh)
                c, d = j * 5 // ow, -(-(j + 1) * 5 // ow)
                want[:, :, i, j] = x[:, :, a:b, c:d].mean((2, 3))
        got = nn.AdaptiveAvgPool2d((oh, ow))(kiln.Tensor(x)).asnumpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)
