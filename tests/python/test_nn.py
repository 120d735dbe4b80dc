"""kiln.nn: Cells, Parameters, layers, losses and optimizers against NumPy references."""
import copy
import math
import pickle

import numpy as np
import pytest

import kiln
from kiln import nn, ops


def T(a, dtype=None):
    return kiln.Tensor(np.asarray(a), dtype)


def rng(seed=0):
    return np.random.default_rng(seed)


def close(actual, expected, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol)


# ---- NumPy references ---------------------------------------------------------------------------


def conv2d_ref(x, w, b, stride, pads, dilation, groups):
    x = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[1]), (pads[2], pads[3])))
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    ho, wo = (h - (kh - 1) * dh - 1) // sh + 1, (wd - (kw - 1) * dw - 1) // sw + 1
    out = np.zeros((n, o, ho, wo), dtype=np.float64)
    og = o // groups
    for g in range(groups):
        xs = x[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh:i * dh + (ho - 1) * sh + 1:sh, j * dw:j * dw + (wo - 1) * sw + 1:sw]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, i, j])
    if b is not None:
        out += b[None, :, None, None]
    return out


def same_pads(size, k, s, d=(1, 1)):
    pads = []
    for i in range(2):
        keff = (k[i] - 1) * d[i] + 1
        out = -(-size[i] // s[i])
        total = max(0, (out - 1) * s[i] + keff - size[i])
        pads += [total // 2, total - total // 2]
    return pads


def pool_ref(x, k, s, pads, mode, count_include_pad=True):
    fill = -np.inf if mode == "max" else 0.0
    widths = ((0, 0), (0, 0), (pads[0], pads[1]), (pads[2], pads[3]))
    xp = np.pad(x, widths, constant_values=fill)
    ones = np.pad(np.ones_like(x), widths)
    h, w = xp.shape[2:]
    ho, wo = (h - k[0]) // s[0] + 1, (w - k[1]) // s[1] + 1
    out = np.zeros(x.shape[:2] + (ho, wo))
    for i in range(ho):
        for j in range(wo):
            win = xp[:, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]]
            if mode == "max":
                out[:, :, i, j] = win.max(axis=(2, 3))
            else:
                cnt = k[0] * k[1] if count_include_pad else \
                    ones[:, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]].sum(axis=(2, 3))
                out[:, :, i, j] = win.sum(axis=(2, 3)) / cnt
    return out


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def log_softmax_ref(z, axis=1):
    z = z - z.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def fd_param_grads(cell, inputs, h=1e-6, seed=1):
    """(analytic, numeric) gradients of sum(cell(*inputs) * R) w.r.t. cell.trainable_params()."""
    params = cell.trainable_params()
    out_shape = cell(*inputs).shape
    r = T(rng(seed).standard_normal(out_shape))

    def f(*xs):
        return ops.sum(cell(*xs) * r)

    _, grads = kiln.value_and_grad(f, None, params)(*inputs)
    assert len(grads) == len(params)
    numeric = []
    for p in params:
        a = p.asnumpy()  # shares the parameter's memory
        num = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            old = a[idx]
            a[idx] = old + h
            fp = f(*inputs).item()
            a[idx] = old - h
            fm = f(*inputs).item()
            a[idx] = old
            num[idx] = (fp - fm) / (2 * h)
        numeric.append(num)
    return [g.asnumpy() for g in grads], numeric


def check_param_grads(cell, inputs, rtol=1e-5, atol=1e-7):
    analytic, numeric = fd_param_grads(cell, inputs)
    for p, a, n in zip(cell.trainable_params(), analytic, numeric):
        assert a.shape == p.shape
        np.testing.assert_allclose(a, n, rtol=rtol, atol=atol, err_msg=p.name)


# ---- Parameter ------------------------------------------------------------------------------------


def test_parameter_is_a_tensor_leaf():
    p = nn.Parameter(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert isinstance(p, kiln.Tensor)
    assert p.requires_grad and p.is_leaf and p.name is None
    assert p.dtype == kiln.float32 and p.shape == (2, 3)
    y = ops.sum(p * 2.0)
    assert type(y) is kiln.Tensor and y.item() == 30.0
    q = nn.Parameter(T([1.0, 2.0]), name="q", requires_grad=False)
    assert q.name == "q" and not q.requires_grad
    gw = kiln.grad(lambda x: ops.sum(x * p), None, [p])(T(np.ones((2, 3), np.float32)))
    close(gw[0], np.ones((2, 3)))


def test_parameter_copies_data_and_keeps_dtype():
    src = np.ones((2,), np.float64)
    p = nn.Parameter(src)
    src[0] = 7
    assert p.dtype == kiln.float64 and p.asnumpy()[0] == 1.0
    p2 = nn.Parameter(src, dtype=kiln.float32)
    assert p2.dtype == kiln.float32
    assert not nn.Parameter(np.arange(3)).requires_grad  # an int parameter is state: it never requires grad
    assert not nn.Parameter(np.arange(3), requires_grad=False).requires_grad


def test_parameter_set_data_clone_deepcopy_pickle():
    p = nn.Parameter(np.zeros((2, 2), np.float32), name="w")
    p.set_data(np.full((2, 2), 3.0, np.float32))
    close(p, np.full((2, 2), 3.0))
    c = p.clone()
    assert isinstance(c, nn.Parameter) and c.name == "w" and not c._shares_storage(p)
    d = copy.deepcopy(p)
    assert isinstance(d, nn.Parameter) and d.name == "w"
    close(d, p)
    e = pickle.loads(pickle.dumps(p))
    assert isinstance(e, nn.Parameter) and e.name == "w" and e.requires_grad
    close(e, p)
    assert "name='w'" in repr(p)


# ---- Cell ---------------------------------------------------------------------------------------------


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(3, 4)
        self.scale = nn.Parameter(np.ones((4,), np.float32))
        self.drop = nn.Dropout(p=0.5)

    def construct(self, x):
        return self.drop(self.dense(x)) * self.scale


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.layers = nn.CellList([nn.Dense(4, 4), nn.ReLU()])
        self.head = nn.SequentialCell(nn.Dense(4, 2), nn.Identity())
        self.frozen = nn.Parameter(np.zeros((2,), np.float32), requires_grad=False)

    def construct(self, x):
        x = self.block(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x) + self.frozen


# MindSpore's (and PyTorch's) order: a cell's own parameters, then each sub-cell's, in registration order
EXPECTED_NAMES = ["frozen", "block.scale", "block.dense.weight", "block.dense.bias", "layers.0.weight",
                  "layers.0.bias", "head.0.weight", "head.0.bias"]


def test_cell_registration_and_names():
    net = Net()
    names = [n for n, _ in net.parameters_and_names()]
    assert names == EXPECTED_NAMES
    assert [p.name for _, p in net.parameters_and_names()] == EXPECTED_NAMES
    assert len(net.trainable_params()) == 7
    assert all(p.requires_grad for p in net.trainable_params())
    assert [p.name for p in net.untrainable_params()] == ["frozen"]
    assert len(list(net.get_parameters())) == 8
    assert list(net.parameters_dict()) == EXPECTED_NAMES
    assert list(net.name_cells()) == ["block", "layers", "head"]
    cell_names = [n for n, _ in net.cells_and_names()]
    assert cell_names == ["", "block", "block.dense", "block.drop", "layers", "layers.0", "layers.1", "head",
                          "head.0", "head.1"]
    # own parameters only
    assert [n for n, _ in net.block.parameters_and_names(expand=False)] == ["scale"]


def test_cell_explicit_names_shared_params_and_reassignment():
    class Tied(nn.Cell):
        def __init__(self):
            super().__init__()
            self.a = nn.Dense(2, 2, has_bias=False)
            self.b = nn.Dense(2, 2, has_bias=False)
            self.b.weight = self.a.weight  # tied: listed once
            self.named = nn.Parameter(np.ones(1, np.float32), name="custom")

        def construct(self, x):
            return self.b(self.a(x))

    net = Tied()
    assert [n for n, _ in net.parameters_and_names()] == ["named", "a.weight"]
    assert net.named.name == "custom"
    assert len(net.trainable_params()) == 2
    with pytest.raises(TypeError):
        net.a.weight = T(np.ones((2, 2), np.float32))  # a plain Tensor cannot replace a Parameter
    with pytest.raises(TypeError):
        net.a = 3  # nor a number a Cell
    net.named = None
    assert [n for n, _ in net.parameters_and_names()] == ["a.weight"]
    del net.b
    assert list(net.name_cells()) == ["a"]


def test_cell_without_super_init_explains():
    class Bad(nn.Cell):
        def __init__(self):
            self.w = nn.Parameter(np.ones(1, np.float32))

    with pytest.raises(AttributeError, match="super"):
        Bad()


def test_set_train_propagates():
    net = Net()
    assert not net.training and not net.block.drop.training  # MindSpore's default
    assert net.set_train() is net
    assert all(c.training for _, c in net.cells_and_names())
    net.set_train(False)
    assert not any(c.training for _, c in net.cells_and_names())
    net.block.set_train(True)
    assert net.block.drop.training and not net.training and not net.head.training


def test_set_jit_config_stores_config_and_compiles():
    net = Net()
    assert net.get_jit_config() is None
    x = kiln.Tensor(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32))
    eager = net(x).asnumpy()  # eval mode: dropout is the identity
    config = kiln.JitConfig(jit_level="O1")
    assert net.set_jit_config(config) is net
    assert net._jit_config is config and net.get_jit_config() is config
    np.testing.assert_array_equal(net(x).asnumpy(), eager)
    np.testing.assert_array_equal(net(x).asnumpy(), eager)
    info = net._jitted.cache_info()
    assert info.compiles == 1 and info.hits == 1
    with pytest.raises(TypeError, match="JitConfig"):
        net.set_jit_config({"jit_level": "O1"})


def test_apply_and_load_parameter_dict():
    net = Net()
    seen = []
    net.apply(lambda c: seen.append(type(c).__name__))
    assert seen[-1] == "Net" and seen.count("Dense") == 3
    other = Net()
    other.load_parameter_dict(net.parameters_dict())
    for (n1, p1), (n2, p2) in zip(net.parameters_and_names(), other.parameters_and_names()):
        assert n1 == n2
        close(p1, p2)
    with pytest.raises(KeyError):
        other.load_parameter_dict({"nope": T([1.0])})


def test_sequential_and_cell_list():
    kiln.manual_seed(0)
    seq = nn.SequentialCell([nn.Dense(3, 5), nn.ReLU(), nn.Dense(5, 2)])
    assert len(seq) == 3 and isinstance(seq[1], nn.ReLU)
    x = rng().standard_normal((4, 3)).astype(np.float32)
    w1, b1 = seq[0].weight.asnumpy(), seq[0].bias.asnumpy()
    w2, b2 = seq[2].weight.asnumpy(), seq[2].bias.asnumpy()
    close(seq(T(x)), np.maximum(x @ w1.T + b1, 0) @ w2.T + b2)
    seq.append(nn.Sigmoid())
    assert len(seq) == 4 and [n for n, _ in seq.parameters_and_names()] == ["0.weight", "0.bias", "2.weight",
                                                                            "2.bias"]
    assert isinstance(seq[1:], nn.SequentialCell) and len(seq[1:]) == 3
    from collections import OrderedDict

    named = nn.SequentialCell(OrderedDict([("fc", nn.Dense(2, 2)), ("act", nn.ReLU())]))
    assert [n for n, _ in named.parameters_and_names()] == ["fc.weight", "fc.bias"]
    cl = nn.CellList([nn.ReLU()])
    cl.append(nn.Dense(2, 2))
    cl.insert(0, nn.Identity())
    assert [type(c).__name__ for c in cl] == ["Identity", "ReLU", "Dense"]
    assert [n for n, _ in cl.parameters_and_names()] == ["2.weight", "2.bias"]
    del cl[0]
    assert [n for n, _ in cl.parameters_and_names()] == ["1.weight", "1.bias"]


# ---- initializers -------------------------------------------------------------------------------------


def test_initializers_and_seed():
    kiln.manual_seed(123)
    a = nn.Dense(50, 40)
    kiln.manual_seed(123)
    b = nn.Dense(50, 40)
    close(a.weight, b.weight, 0, 0)
    bound = 1 / math.sqrt(50)
    w = a.weight.asnumpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound
    assert np.abs(a.bias.asnumpy()).max() <= bound
    z = nn.initializer("zeros", (2, 3), kiln.float64)
    assert z.dtype == kiln.float64 and not z.asnumpy().any()
    c = nn.initializer(2.5, (3,))
    close(c, [2.5] * 3)
    x = nn.initializer(nn.init.XavierUniform(), (200, 300)).asnumpy()
    assert np.abs(x).max() <= math.sqrt(6 / 500)
    hn = nn.initializer("he_normal", (400, 100)).asnumpy()
    assert abs(hn.std() - math.sqrt(2 / 100)) < 0.01
    n = nn.initializer(nn.init.Normal(sigma=2.0, mean=1.0), (20000,)).asnumpy()
    assert abs(n.mean() - 1.0) < 0.05 and abs(n.std() - 2.0) < 0.05
    with pytest.raises(ValueError):
        nn.initializer("bogus", (2,))
    with pytest.raises(ValueError):
        nn.initializer(np.zeros((3,)), (2,))
    d = nn.Dense(2, 3, weight_init="ones", bias_init="zeros", dtype=kiln.float64)
    assert d.weight.dtype == kiln.float64
    close(d.weight, np.ones((3, 2)))


# ---- layers vs NumPy ------------------------------------------------------------------------------------


@pytest.mark.parametrize("activation,ref", [
    (None, lambda y: y),
    ("relu", lambda y: np.maximum(y, 0)),
    ("gelu", gelu_tanh),
    ("silu", lambda y: y / (1 + np.exp(-y))),
    ("sigmoid", lambda y: 1 / (1 + np.exp(-y))),
    ("tanh", np.tanh),
])
def test_dense_forward(activation, ref):
    kiln.manual_seed(1)
    layer = nn.Dense(5, 3, activation=activation)
    x = rng(2).standard_normal((4, 5)).astype(np.float32)
    w, b = layer.weight.asnumpy(), layer.bias.asnumpy()
    close(layer(T(x)), ref(x @ w.T + b), rtol=1e-5, atol=1e-5)
    assert layer.weight.shape == (3, 5) and layer.bias.shape == (3,)


def test_dense_no_bias_batched_input():
    layer = nn.Dense(4, 2, has_bias=False)
    assert layer.bias is None and len(layer.trainable_params()) == 1
    x = rng(3).standard_normal((2, 3, 4)).astype(np.float32)
    close(layer(T(x)), x @ layer.weight.asnumpy().T, atol=1e-5)


def test_activation_cells():
    x = rng(4).standard_normal((3, 4))
    close(nn.ReLU()(T(x)), np.maximum(x, 0))
    close(nn.GELU()(T(x)), gelu_tanh(x))
    from math import erf

    close(nn.GELU(approximate=False)(T(x)), 0.5 * x * (1 + np.vectorize(erf)(x / math.sqrt(2))))
    close(nn.SiLU()(T(x)), x / (1 + np.exp(-x)))
    close(nn.Softmax()(T(x)), np.exp(log_softmax_ref(x, -1)))
    close(nn.LogSoftmax(axis=0)(T(x)), log_softmax_ref(x, 0))
    i = T(x)
    assert nn.Identity()(i) is i
    with pytest.raises(ValueError):
        nn.get_activation("nope")


CONV_CASES = [
    # (in, out, k, stride, pad_mode, padding, dilation, group, has_bias, H, W)
    (3, 4, 3, 1, "same", 0, 1, 1, False, 6, 7),
    (3, 4, 3, 2, "same", 0, 1, 1, True, 7, 6),
    (2, 4, (2, 3), 1, "valid", 0, 1, 1, True, 5, 6),
    (2, 2, 3, 2, "valid", 0, 2, 1, False, 9, 8),
    (4, 6, 3, 1, "pad", 1, 1, 2, True, 5, 5),
    (2, 3, 3, (2, 1), "pad", (1, 0, 2, 1), 1, 1, True, 6, 5),
    (2, 2, 1, 1, "pad", (2, 1), 1, 1, False, 3, 4),
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_forward(case):
    cin, cout, k, stride, pad_mode, padding, dilation, group, has_bias, h, w = case
    kiln.manual_seed(5)
    conv = nn.Conv2d(cin, cout, k, stride, pad_mode, padding, dilation, group, has_bias)
    x = rng(6).standard_normal((2, cin, h, w)).astype(np.float32)
    kk = (k, k) if isinstance(k, int) else k
    ss = (stride, stride) if isinstance(stride, int) else stride
    dd = (dilation, dilation)
    if pad_mode == "same":
        pads = same_pads((h, w), kk, ss, dd)
    elif pad_mode == "valid":
        pads = [0, 0, 0, 0]
    elif isinstance(padding, int):
        pads = [padding] * 4
    elif len(padding) == 2:
        pads = [padding[0], padding[0], padding[1], padding[1]]
    else:
        pads = list(padding)
    ref = conv2d_ref(x.astype(np.float64), conv.weight.asnumpy().astype(np.float64),
                     conv.bias.asnumpy() if has_bias else None, ss, pads, dd, group)
    out = conv(T(x))
    assert out.shape == ref.shape
    close(out, ref, rtol=1e-4, atol=1e-4)
    if pad_mode == "same":
        assert out.shape[2:] == (-(-h // ss[0]), -(-w // ss[1]))


def test_conv2d_defaults_and_errors():
    conv = nn.Conv2d(3, 8, 3)
    assert conv.pad_mode == "same" and conv.bias is None and conv.weight.shape == (8, 3, 3, 3)
    assert conv.stride == (1, 1) and conv.group == 1
    with pytest.raises(ValueError):
        nn.Conv2d(3, 8, 3, pad_mode="same", padding=1)
    with pytest.raises(ValueError):
        nn.Conv2d(3, 8, 3, pad_mode="full")
    with pytest.raises(ValueError):
        nn.Conv2d(3, 8, 3, group=2)


def bn_ref_train(x, gamma, beta, rm, rv, momentum, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean = x.mean(axis=axes)
    var = x.var(axis=axes)
    n = x.size // x.shape[1]
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * gamma.reshape(shape) + beta.reshape(shape)
    rm = momentum * rm + (1 - momentum) * mean
    rv = momentum * rv + (1 - momentum) * var * n / (n - 1)
    return y, rm, rv


def test_batchnorm2d_train_and_eval():
    c = 3
    bn = nn.BatchNorm2d(c, eps=1e-3, momentum=0.8)
    assert [n for n, _ in bn.parameters_and_names()] == ["moving_mean", "moving_variance", "gamma", "beta"]
    assert [p.name for p in bn.trainable_params()] == ["gamma", "beta"]
    assert not bn.moving_mean.requires_grad and bn.running_var is bn.moving_variance
    bn.gamma.set_data(np.array([1.0, 2.0, 0.5], np.float32))
    bn.beta.set_data(np.array([0.0, -1.0, 0.3], np.float32))
    gamma, beta = bn.gamma.asnumpy().copy(), bn.beta.asnumpy().copy()
    rm, rv = np.zeros(c), np.ones(c)
    bn.set_train()
    for step in range(2):
        x = (rng(10 + step).standard_normal((4, c, 3, 5)) * 2 + 1).astype(np.float32)
        y_ref, rm, rv = bn_ref_train(x.astype(np.float64), gamma, beta, rm, rv, 0.8, 1e-3)
        close(bn(T(x)), y_ref, rtol=1e-4, atol=1e-4)
        close(bn.moving_mean, rm, rtol=1e-5, atol=1e-6)
        close(bn.moving_variance, rv, rtol=1e-5, atol=1e-6)
    bn.set_train(False)
    x = rng(20).standard_normal((2, c, 4, 4)).astype(np.float32)
    shape = (1, -1, 1, 1)
    y_ref = (x - rm.reshape(shape)) / np.sqrt(rv.reshape(shape) + 1e-3) * gamma.reshape(shape) + beta.reshape(shape)
    close(bn(T(x)), y_ref, rtol=1e-4, atol=1e-4)
    close(bn.moving_mean, rm, rtol=1e-5, atol=1e-6)  # eval does not update
    # use_batch_statistics=True uses batch statistics even in eval mode
    bn2 = nn.BatchNorm2d(c, use_batch_statistics=True)
    y2 = bn2(T(x)).asnumpy()
    close(y2.mean(axis=(0, 2, 3)), np.zeros(c), atol=1e-5)
    with pytest.raises(ValueError):
        bn(T(np.ones((2, 3), np.float32)))


def test_batchnorm1d():
    bn = nn.BatchNorm1d(4).set_train()
    x = rng(21).standard_normal((8, 4)).astype(np.float32)
    y_ref, rm, rv = bn_ref_train(x.astype(np.float64), np.ones(4), np.zeros(4), np.zeros(4), np.ones(4), 0.9, 1e-5)
    close(bn(T(x)), y_ref, rtol=1e-4, atol=1e-4)
    close(bn.moving_mean, rm, atol=1e-6)


def test_layernorm_forward():
    ln = nn.LayerNorm((4, 5), epsilon=1e-5)
    ln.gamma.set_data(rng(1).standard_normal((4, 5)).astype(np.float32))
    ln.beta.set_data(rng(2).standard_normal((4, 5)).astype(np.float32))
    x = rng(3).standard_normal((3, 4, 5)).astype(np.float64)
    mean = x.mean(axis=(1, 2), keepdims=True)
    var = x.var(axis=(1, 2), keepdims=True)
    ref = (x - mean) / np.sqrt(var + 1e-5) * ln.gamma.asnumpy() + ln.beta.asnumpy()
    close(ln(T(x.astype(np.float32))), ref, rtol=1e-4, atol=1e-4)
    assert nn.LayerNorm(8, eps=1e-3).epsilon == 1e-3 and nn.LayerNorm([8]).normalized_shape == (8,)
    ms_style = nn.LayerNorm((4, 5), begin_norm_axis=1, begin_params_axis=-2)
    close(ms_style(T(x)), (x - mean) / np.sqrt(var + 1e-5), rtol=1e-6, atol=1e-8)
    with pytest.raises(ValueError, match="begin_norm_axis"):
        nn.LayerNorm((4, 5), begin_norm_axis=2)(T(x))
    assert [n for n, _ in ln.parameters_and_names()] == ["gamma", "beta"]


def test_rmsnorm_forward():
    rms = nn.RMSNorm(6)
    assert rms.eps == 1e-6 and rms.weight.shape == (6,)
    rms.weight.set_data(rng(4).standard_normal(6).astype(np.float32))
    x = rng(5).standard_normal((2, 3, 6))
    ref = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * rms.weight.asnumpy()
    close(rms(T(x.astype(np.float32))), ref, rtol=1e-4, atol=1e-5)


def test_embedding_forward():
    kiln.manual_seed(7)
    emb = nn.Embedding(10, 4, padding_idx=3)
    table = emb.embedding_table.asnumpy()
    assert table.shape == (10, 4) and not table[3].any()
    assert emb.weight is emb.embedding_table
    ids = np.array([[1, 3, 9], [0, 0, 2]], np.int64)
    close(emb(T(ids)), table[ids], 0, 0)
    close(emb(T(ids.astype(np.int32))), table[ids], 0, 0)
    with pytest.raises(Exception):
        emb(T(np.array([10], np.int64)))
    assert nn.Embedding(4, 2, dtype=kiln.int32).embedding_table.dtype == kiln.float32  # MindSpore's ids dtype


@pytest.mark.parametrize("cls,mode", [(nn.MaxPool2d, "max"), (nn.AvgPool2d, "avg")])
@pytest.mark.parametrize("k,s,pad_mode,padding", [
    (2, 2, "valid", 0), (3, 1, "valid", 0), (3, 2, "same", 0), (2, 2, "same", 0), (3, 2, "pad", 1),
])
def test_pool_forward(cls, mode, k, s, pad_mode, padding):
    x = rng(8).standard_normal((2, 3, 7, 6)).astype(np.float64)
    pool = cls(k, s, pad_mode=pad_mode, padding=padding)
    if pad_mode == "same":
        pads = same_pads(x.shape[2:], (k, k), (s, s))
    else:
        pads = [padding] * 4
    ref = pool_ref(x, (k, k), (s, s), pads, mode, count_include_pad=pad_mode != "same")
    out = pool(T(x))
    assert out.shape == ref.shape
    close(out, ref, rtol=1e-6, atol=1e-9)


def test_pool_defaults():
    p = nn.MaxPool2d()
    assert p.kernel_size == (1, 1) and p.stride == (1, 1) and p.pad_mode == "valid"
    with pytest.raises(ValueError):
        nn.AvgPool2d(2, 2, pad_mode="same", padding=1)


def test_flatten_dropout_identity():
    x = T(rng(9).standard_normal((2, 3, 4)).astype(np.float32))
    assert nn.Flatten()(x).shape == (2, 12)
    assert nn.Flatten(0, 1)(x).shape == (6, 4)
    d = nn.Dropout(p=0.25)
    assert d(x) is x  # not training: identity
    kiln.manual_seed(3)
    d.set_train()
    big = T(np.ones((200, 100), np.float32))
    y = d(big).asnumpy()
    kept = y != 0
    assert 0.7 < kept.mean() < 0.8
    close(y[kept], np.full(kept.sum(), 1 / 0.75))
    assert nn.Dropout(keep_prob=0.9).p == pytest.approx(0.1)
    assert nn.Dropout(p=0.0).set_train()(x) is x
    with pytest.raises(ValueError):
        nn.Dropout(p=1.0)


# ---- parameter gradients vs finite differences (float64) ---------------------------------------------------


def test_dense_param_grads():
    kiln.manual_seed(11)
    layer = nn.Dense(3, 4, activation="tanh", dtype=kiln.float64)
    x = T(rng(12).standard_normal((5, 3)))
    check_param_grads(layer, (x,))


def test_mlp_param_grads():
    kiln.manual_seed(12)
    net = nn.SequentialCell(nn.Dense(3, 4, activation="silu", dtype=kiln.float64),
                            nn.Dense(4, 2, activation="gelu", dtype=kiln.float64))
    check_param_grads(net, (T(rng(13).standard_normal((4, 3))),))


@pytest.mark.parametrize("pad_mode,padding,stride,group,has_bias", [
    ("same", 0, 1, 1, True), ("valid", 0, 2, 1, False), ("pad", 1, 1, 2, True)])
def test_conv2d_param_grads(pad_mode, padding, stride, group, has_bias):
    kiln.manual_seed(13)
    conv = nn.Conv2d(2, 2, 3, stride, pad_mode, padding, 1, group, has_bias, dtype=kiln.float64)
    check_param_grads(conv, (T(rng(14).standard_normal((2, 2, 5, 4))),))


def test_batchnorm2d_param_grads():
    bn = nn.BatchNorm2d(3, dtype=kiln.float64).set_train()
    bn.gamma.set_data(rng(15).standard_normal(3))
    check_param_grads(bn, (T(rng(16).standard_normal((2, 3, 3, 2))),))


def test_layernorm_param_grads():
    ln = nn.LayerNorm(4, dtype=kiln.float64)
    ln.gamma.set_data(rng(17).standard_normal(4))
    check_param_grads(ln, (T(rng(18).standard_normal((3, 4))),))


def test_rmsnorm_param_grads():
    rms = nn.RMSNorm(5, dtype=kiln.float64)
    check_param_grads(rms, (T(rng(19).standard_normal((2, 5))),))


def test_embedding_param_grads():
    kiln.manual_seed(20)
    emb = nn.Embedding(6, 3, dtype=kiln.float64)
    check_param_grads(emb, (T(np.array([[0, 2, 2], [5, 1, 0]], np.int64)),))


def test_input_grad_through_cell():
    kiln.manual_seed(21)
    layer = nn.Dense(3, 2, dtype=kiln.float64)
    x = rng(22).standard_normal((4, 3))
    gx = kiln.grad(lambda t: ops.sum(layer(t)))(T(x))
    close(gx, np.ones((4, 2)) @ layer.weight.asnumpy(), atol=1e-12)
    # grad_position and weights together
    (gx2, gw) = kiln.grad(lambda t: ops.sum(layer(t)), 0, layer.trainable_params())(T(x))
    close(gx2, gx)
    close(gw[0], np.ones((2, 4)) @ x, atol=1e-12)
    close(gw[1], np.full(2, 4.0), atol=1e-12)
    gcell = kiln.grad(lambda t: ops.sum(layer(t)), None, layer)(T(x))  # a Cell as weights
    close(gcell[0], gw[0])


# ---- losses ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_and_l1(reduction):
    a = rng(23).standard_normal((3, 4))
    b = rng(24).standard_normal((3, 4))
    red = {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction]
    close(nn.MSELoss(reduction)(T(a), T(b)), red((a - b) ** 2), atol=1e-12)
    close(nn.L1Loss(reduction)(T(a), T(b)), red(np.abs(a - b)), atol=1e-12)
    with pytest.raises(ValueError):
        nn.MSELoss("avg")
    with pytest.raises(ValueError):
        nn.MSELoss()(T(a), T(b[:2]))


def ce_ref(z, y, weight=None, ignore_index=-100, smoothing=0.0, reduction="mean"):
    logp = log_softmax_ref(z, 1)
    c = z.shape[1]
    w = np.ones(c) if weight is None else weight
    keep = y != ignore_index
    ys = np.where(keep, y, 0)
    picked = np.take_along_axis(logp, ys[:, None], 1)[:, 0]
    sw = keep * w[ys]
    loss = -picked * sw
    if smoothing:
        smooth = -(logp * w).sum(1) * keep
        loss = (1 - smoothing) * loss + smoothing / c * smooth
    if reduction == "mean":
        return loss.sum() / sw.sum()
    return loss.sum() if reduction == "sum" else loss


@pytest.mark.parametrize("kw", [
    {}, {"reduction": "sum"}, {"reduction": "none"}, {"label_smoothing": 0.1},
    {"weight": np.array([0.2, 1.0, 2.0, 0.5])}, {"ignore_index": 2},
    {"weight": np.array([0.2, 1.0, 2.0, 0.5]), "label_smoothing": 0.2, "ignore_index": 1},
])
def test_cross_entropy_int_labels(kw):
    z = rng(25).standard_normal((6, 4)) * 2
    y = np.array([0, 2, 3, 1, 2, 0])
    kwargs = dict(kw)
    if "weight" in kwargs:
        kwargs["weight"] = T(kwargs["weight"])
    loss = nn.CrossEntropyLoss(**kwargs)
    ref_kw = {"weight": kw.get("weight"), "ignore_index": kw.get("ignore_index", -100),
              "smoothing": kw.get("label_smoothing", 0.0), "reduction": kw.get("reduction", "mean")}
    close(loss(T(z), T(y)), ce_ref(z, y, **ref_kw), atol=1e-12)
    close(loss(T(z), T(y.astype(np.int32))), ce_ref(z, y, **ref_kw), atol=1e-12)


def test_cross_entropy_probabilities_and_grad():
    z = rng(26).standard_normal((5, 3))
    p = rng(27).random((5, 3))
    p /= p.sum(1, keepdims=True)
    logp = log_softmax_ref(z)
    close(nn.CrossEntropyLoss()(T(z), T(p)), -(p * logp).sum(1).mean(), atol=1e-12)
    ps = p * 0.9 + 0.1 / 3
    close(nn.CrossEntropyLoss(label_smoothing=0.1, reduction="sum")(T(z), T(p)), -(ps * logp).sum(), atol=1e-12)
    # gradient of the mean loss w.r.t. logits with int labels: (softmax - onehot) / N
    y = np.array([2, 0, 1, 1, 0])
    g = kiln.grad(lambda t: nn.CrossEntropyLoss()(t, T(y)))(T(z))
    close(g, (np.exp(logp) - np.eye(3)[y]) / 5, atol=1e-12)


def test_cross_entropy_spatial_and_errors():
    z = rng(28).standard_normal((2, 3, 4))
    y = rng(29).integers(0, 3, (2, 4))
    logp = log_softmax_ref(z, 1)
    ref = -np.take_along_axis(logp, y[:, None], 1).mean()
    close(nn.CrossEntropyLoss()(T(z), T(y)), ref, atol=1e-12)
    with pytest.raises(ValueError):
        nn.CrossEntropyLoss()(T(z), T(y[:, :2]))
    with pytest.raises(ValueError):
        nn.CrossEntropyLoss(label_smoothing=2.0)


def test_nll_loss():
    z = rng(30).standard_normal((4, 3))
    logp = log_softmax_ref(z)
    y = np.array([0, 1, 2, 1])
    close(nn.NLLLoss()(T(logp), T(y)), -logp[np.arange(4), y].mean(), atol=1e-12)


# ---- issue 18, item 5: labels out of range raise (a negative label used to wrap to class C - 1);
# ignore_index (default -100) adds nothing to the loss or its gradient ------------------------------


@pytest.mark.parametrize("label", [-1, 4, 7, -101])
@pytest.mark.parametrize("loss_cls", [nn.CrossEntropyLoss, nn.NLLLoss])
def test_loss_labels_out_of_range_raise(loss_cls, label):
    logits = T(rng(40).standard_normal((3, 4)))
    labels = T(np.array([0, label, 2]))
    with pytest.raises(IndexError, match=rf"label {label} is out of range for 4 classes"):
        loss_cls()(logits, labels)
    with pytest.raises(IndexError, match=rf"label {label} is out of range for 4 classes"):
        loss_cls()(logits, T(np.array([0, label, 2], np.int32)))
    # -1 is a valid ignore_index; the default -100 is ignored
    loss_cls(ignore_index=label)(logits, labels)
    loss_cls()(logits, T(np.array([0, -100, 2])))


@pytest.mark.parametrize("jit_kw", [{}, {"jit_level": "O1"}, {"jit_level": "O1", "backend": "sink"}, {"jit_level": "O2"}],
                         ids=lambda k: "-".join(map(str, k.values())) or "O0")
def test_jitted_loss_checks_labels_in_c(jit_kw):
    # compiled with valid labels, then given bad ones: the graph's class_labels kernel raises
    loss_fn = nn.CrossEntropyLoss()

    def f(z, y):
        return loss_fn(z, y)

    z = T(rng(41).standard_normal((3, 5)))
    jf = kiln.jit(f, **jit_kw)
    jf(z, T(np.array([0, 1, 2])))
    assert "class_labels(" in jf.graph_str(z, T(np.array([0, 1, 2])))
    close(jf(z, T(np.array([4, -100, 2]))), ce_ref(z.asnumpy(), np.array([4, -100, 2])), atol=1e-12)
    for bad in (-1, 5):
        with pytest.raises(IndexError, match=rf"label {bad} is out of range for 5 classes"):
            jf(z, T(np.array([0, bad, 2])))
    assert jf.cache_info().eager_calls == 0
    # the compiled backward too
    step = kiln.value_and_grad(jf)
    with pytest.raises(IndexError, match="label -1 is out of range for 5 classes"):
        step(z, T(np.array([0, -1, 2])))


def _ce_grad_ref(z, y, weight=None, ignore_index=-100, smoothing=0.0, reduction="mean"):
    """d loss / d logits by PyTorch's rules: per counted sample w[y] * (softmax - target), the
    target mixing the one-hot with s / C (weighted by w per class); ignored samples 0."""
    c = z.shape[1]
    w = np.ones(c) if weight is None else weight
    p = np.exp(log_softmax_ref(z, 1))
    keep = y != ignore_index
    ys = np.where(keep, y, 0)
    onehot = np.eye(c)[ys]
    # d(-w[y] logp[y]) = w[y] (p - onehot); d(-sum_k w_k logp_k) = sum_k w_k p - w
    g = (1 - smoothing) * w[ys][:, None] * (p - onehot) + smoothing / c * (w.sum() * p - w)
    g = g * keep[:, None]
    if reduction == "mean":
        g = g / (keep * w[ys]).sum()
    return g


@pytest.mark.parametrize("kw", [
    {}, {"reduction": "sum"}, {"label_smoothing": 0.2}, {"ignore_index": 1},
    {"weight": np.array([0.2, 1.0, 2.0, 0.5]), "label_smoothing": 0.1},
    {"weight": np.array([0.2, 1.0, 2.0, 0.5]), "label_smoothing": 0.3, "reduction": "sum"},
])
@pytest.mark.parametrize("compiled", [False, True])
def test_cross_entropy_ignore_index_forward_and_grad(kw, compiled):
    z = rng(42).standard_normal((6, 4)) * 2
    ignore = kw.get("ignore_index", -100)
    y = np.array([0, ignore, 3, 1, ignore, 2])
    z[1, 0] = z[4, 0] = -np.inf  # an ignored sample's class 0 at -inf still adds exactly 0
    kwargs = dict(kw)
    if "weight" in kwargs:
        kwargs["weight"] = T(kwargs["weight"])
    loss_fn = nn.CrossEntropyLoss(**kwargs)

    def f(t, labels):
        return loss_fn(t, labels)

    f = kiln.jit(f, jit_level="O1") if compiled else f
    ref_kw = {"weight": kw.get("weight"), "ignore_index": ignore,
              "smoothing": kw.get("label_smoothing", 0.0), "reduction": kw.get("reduction", "mean")}
    zk = z.copy()
    zk[1, 0] = zk[4, 0] = 0.0  # NumPy's reference reads them; they must not matter
    expected = ce_ref(zk, y, **ref_kw)
    for _ in range(2):  # compiled: capture, then the graph
        loss, g = kiln.value_and_grad(f)(T(z), T(y))
        close(loss, expected, atol=1e-12)
        g = g.asnumpy()
        assert np.isfinite(g).all(), g
        np.testing.assert_array_equal(g[[1, 4]], 0.0)
        zg = z.copy()
        zg[1, 0] = zg[4, 0] = 0.0
        close(g, _ce_grad_ref(zg, y, **ref_kw), atol=1e-12)


def test_cross_entropy_mean_divides_by_the_counted_labels():
    z = rng(43).standard_normal((2, 3, 5))  # (N, C, d): spatial labels
    y = np.array([[0, -100, 2, 1, -100], [2, 2, -100, 0, 1]])
    logp = log_softmax_ref(z, 1)
    keep = y != -100
    picked = np.take_along_axis(logp, np.where(keep, y, 0)[:, None], 1)[:, 0]
    close(nn.CrossEntropyLoss()(T(z), T(y)), -(picked * keep).sum() / keep.sum(), atol=1e-12)
    close(nn.NLLLoss()(T(logp), T(y)), -(picked * keep).sum() / keep.sum(), atol=1e-12)
    close(nn.CrossEntropyLoss(reduction="none")(T(z), T(y)), -picked * keep, atol=1e-12)
    # every label ignored: 0 / 0, as PyTorch
    assert math.isnan(nn.CrossEntropyLoss()(T(z), T(np.full((2, 5), -100))).item())


def test_cross_entropy_finite_differences():
    from conftest import check_grad

    y = T(np.array([2, -100, 0, 1]))
    w = T(np.array([0.5, 1.0, 2.0]))
    z = rng(44).standard_normal((4, 3))
    check_grad(lambda t: nn.CrossEntropyLoss()(t, y), z)
    check_grad(lambda t: nn.CrossEntropyLoss(weight=w, label_smoothing=0.2)(t, y), z)
    check_grad(lambda t: nn.NLLLoss(weight=w, reduction="sum")(t, y), z)


@pytest.mark.parametrize("kw", [
    {}, {"reduction": "sum"}, {"reduction": "none"}, {"ignore_index": 1}, {"label_smoothing": 0.15},
    {"weight": [0.2, 1.0, 2.0, 0.5], "label_smoothing": 0.2},
])
def test_cross_entropy_against_torch(kw):
    torch = pytest.importorskip("torch")
    z = rng(45).standard_normal((6, 4))
    y = np.array([0, -100, 3, 1, 1, 2])
    tkw = {k: (torch.tensor(v, dtype=torch.float64) if k == "weight" else v) for k, v in kw.items()}
    kkw = {k: (T(np.array(v)) if k == "weight" else v) for k, v in kw.items()}
    zt = torch.tensor(z, requires_grad=True)
    lt = torch.nn.CrossEntropyLoss(**tkw)(zt, torch.tensor(y))
    lt.sum().backward()
    fn = nn.CrossEntropyLoss(**kkw)
    loss, g = kiln.value_and_grad(lambda t: fn(t, T(y)).sum())(T(z))
    close(fn(T(z), T(y)), lt.detach().numpy(), atol=1e-12)
    close(g, zt.grad.numpy(), atol=1e-12)
    with pytest.raises(IndexError):
        torch.nn.CrossEntropyLoss()(zt, torch.tensor([0, -1, 3, 1, 1, 2]))


# ---- optimizers vs NumPy ---------------------------------------------------------------------------------------


def _opt_setup(dtype=np.float64):
    r = rng(31)
    p0 = [r.standard_normal((3, 2)).astype(dtype), r.standard_normal((4,)).astype(dtype)]
    grads = [[r.standard_normal(a.shape).astype(dtype) for a in p0] for _ in range(3)]
    params = [nn.Parameter(a, name=f"p{i}") for i, a in enumerate(p0)]
    return p0, grads, params


def sgd_ref(p, grads, lr, momentum, dampening, wd, nesterov):
    p = [a.copy() for a in p]
    bufs = [None] * len(p)
    for gs in grads:
        for i, g in enumerate(gs):
            d = g + wd * p[i]
            if momentum:
                bufs[i] = d.copy() if bufs[i] is None else momentum * bufs[i] + (1 - dampening) * d
                d = d + momentum * bufs[i] if nesterov else bufs[i]
            p[i] = p[i] - lr * d
    return p


@pytest.mark.parametrize("kw", [
    {}, {"momentum": 0.9}, {"momentum": 0.9, "nesterov": True}, {"momentum": 0.8, "dampening": 0.3},
    {"momentum": 0.9, "weight_decay": 0.01}, {"weight_decay": 0.1},
])
def test_sgd_matches_numpy(kw):
    p0, grads, params = _opt_setup()
    opt = nn.SGD(params, learning_rate=0.05, **kw)
    for i, gs in enumerate(grads):
        if i == 1:
            opt.step([T(g) for g in gs])
        else:
            assert opt(tuple(T(g) for g in gs))
    ref = sgd_ref(p0, grads, 0.05, kw.get("momentum", 0.0), kw.get("dampening", 0.0), kw.get("weight_decay", 0.0),
                  kw.get("nesterov", False))
    for p, r in zip(params, ref):
        close(p, r, rtol=1e-12, atol=1e-12)
    assert opt.global_step == 3


def adam_ref(p, grads, lr, b1, b2, eps, wd):
    p = [a.copy() for a in p]
    m = [np.zeros_like(a) for a in p]
    v = [np.zeros_like(a) for a in p]
    for t, gs in enumerate(grads, 1):
        for i, g in enumerate(gs):
            g = g + wd * p[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            mhat = m[i] / (1 - b1 ** t)
            vhat = v[i] / (1 - b2 ** t)
            p[i] = p[i] - lr * mhat / (np.sqrt(vhat) + eps)
    return p


@pytest.mark.parametrize("kw", [{}, {"beta1": 0.5, "beta2": 0.9, "eps": 1e-3}, {"weight_decay": 0.05}])
def test_adam_matches_numpy(kw):
    p0, grads, params = _opt_setup()
    opt = nn.Adam(params, learning_rate=0.01, **kw)
    for gs in grads:
        opt(tuple(T(g) for g in gs))
    ref = adam_ref(p0, grads, 0.01, kw.get("beta1", 0.9), kw.get("beta2", 0.999), kw.get("eps", 1e-8),
                   kw.get("weight_decay", 0.0))
    for p, r in zip(params, ref):
        close(p, r, rtol=1e-10, atol=1e-12)
    assert [m.name for m in opt.moment1] == ["moment1.p0", "moment1.p1"]


def test_optimizer_float32_groups_schedules_and_errors():
    p0, grads, params = _opt_setup(np.float32)
    opt = nn.SGD([{"params": [params[0]], "lr": 0.1}, {"params": [params[1]], "weight_decay": 0.5}],
                 learning_rate=[0.2, 0.01])
    for gs in grads[:2]:
        opt([T(g) for g in gs])
    r0 = p0[0] - 0.1 * grads[0][0] - 0.1 * grads[1][0]
    p1 = p0[1] - 0.2 * (grads[0][1] + 0.5 * p0[1])
    p1 = p1 - 0.01 * (grads[1][1] + 0.5 * p1)
    close(params[0], r0, rtol=1e-5, atol=1e-6)
    close(params[1], p1, rtol=1e-5, atol=1e-6)
    assert opt.get_lr() == 0.1 and opt.get_lr_parameter(params[1]) == 0.01
    sched = nn.Adam(params, learning_rate=lambda step: 0.1 / (step + 1))
    assert sched.get_lr() == 0.1
    # None gradients are skipped; .grad is used when no gradients are given
    before = params[1].asnumpy().copy()
    opt([T(grads[2][0]), None])
    close(params[1], before, 0, 0)
    params[0].grad = T(np.ones((3, 2), np.float32))
    params[1].grad = None
    opt.step()
    with pytest.raises(ValueError):
        opt([T(grads[0][0])])
    with pytest.raises(ValueError):
        nn.SGD(params, momentum=0.0, nesterov=True)
    with pytest.raises(ValueError):
        nn.SGD([params[0], params[0]])
    with pytest.raises(ValueError):
        nn.Adam(params, beta1=1.0)
    with pytest.raises(TypeError):
        nn.Adam(params, 1e-3, 0.9, 0.999, 1e-8, 0.01)  # weight_decay is keyword-only
    with pytest.raises(ValueError):
        opt([T(np.ones((2, 2), np.float32)), None])  # wrong shape: the op reports it


def test_optimizer_updates_are_not_recorded():
    p = nn.Parameter(np.ones((2,), np.float32))
    opt = nn.SGD([p], learning_rate=0.5, momentum=0.9)
    with kiln.enable_grad():
        opt([T(np.ones(2, np.float32))])
    assert p.is_leaf and p.requires_grad
    close(p, [0.5, 0.5])


# ---- training ----------------------------------------------------------------------------------------------------


def _blobs(n_per=40, seed=0):
    r = rng(seed)
    centers = np.array([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])
    x = np.concatenate([c + 0.6 * r.standard_normal((n_per, 2)) for c in centers]).astype(np.float32)
    y = np.repeat(np.arange(3), n_per).astype(np.int64)
    return x, y


def test_mlp_classifier_trains_with_adam():
    kiln.manual_seed(42)
    x, y = _blobs()
    net = nn.SequentialCell(nn.Dense(2, 16, activation="relu"), nn.Dense(16, 3))
    loss_fn = nn.CrossEntropyLoss()
    opt = nn.Adam(net.trainable_params(), learning_rate=0.02)
    step = kiln.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    xt, yt = T(x), T(y)
    losses = []
    for _ in range(100):
        loss, grads = step(xt, yt)
        opt(grads)
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])
    acc = (net(xt).asnumpy().argmax(1) == y).mean()
    assert acc > 0.9


def test_mlp_regression_trains_with_sgd_and_train_one_step_cell():
    kiln.manual_seed(7)
    r = rng(1)
    x = r.uniform(-2, 2, (64, 1)).astype(np.float32)
    target = (np.sin(2 * x) + 0.5 * x).astype(np.float32)

    class MLP(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(1, 32, activation="tanh")
            self.fc2 = nn.Dense(32, 1)

        def construct(self, v):
            return self.fc2(self.fc1(v))

    net = MLP()
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.05,
                                                                          momentum=0.9))
    train.set_train()
    assert [p.name for p in net.trainable_params()] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    xt, tt = T(x), T(target)
    losses = [train(xt, tt).item() for _ in range(100)]
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])
    # deterministic: the same seed gives the same run
    kiln.manual_seed(7)
    net2 = MLP()
    train2 = nn.TrainOneStepCell(nn.WithLossCell(net2, nn.MSELoss()), nn.SGD(net2.trainable_params(), 0.05,
                                                                            momentum=0.9))
    losses2 = [train2(xt, tt).item() for _ in range(100)]
    assert losses2 == losses


def test_small_cnn_trains():
    kiln.manual_seed(3)
    r = rng(2)
    n = 32
    x = r.standard_normal((n, 1, 6, 6)).astype(np.float32)
    y = (x[:, 0, :3].sum(axis=(1, 2)) > x[:, 0, 3:].sum(axis=(1, 2))).astype(np.int64)
    net = nn.SequentialCell(nn.Conv2d(1, 4, 3, has_bias=True), nn.BatchNorm2d(4), nn.ReLU(),
                            nn.MaxPool2d(2, 2), nn.Flatten(), nn.Dense(36, 2))
    net.set_train()
    loss_fn = nn.CrossEntropyLoss()
    opt = nn.Adam(net.trainable_params(), learning_rate=0.02)
    step = kiln.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)
    xt, yt = T(x), T(y)
    losses = []
    for _ in range(60):
        loss, grads = step(xt, yt)
        opt(grads)
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])
    assert np.abs(net[1].moving_mean.asnumpy()).sum() > 0  # running statistics were updated
