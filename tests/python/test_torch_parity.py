"""Forward values and gradients compared with PyTorch (CPU), where it is installed."""
import numpy as np
import pytest

import kiln
from kiln import ops

from conftest import to_numpy

torch = pytest.importorskip("torch")
F = torch.nn.functional

DTYPES = [(kiln.float32, torch.float32, np.float32, dict(rtol=2e-4, atol=2e-5)),
          (kiln.float64, torch.float64, np.float64, dict(rtol=1e-9, atol=1e-11))]
DTYPE_IDS = ["float32", "float64"]


def compare(kfn, tfn, arrays, kd, td, npd, tols, grad=True, seed=0):
    """Runs kfn on kiln tensors and tfn on torch tensors made from the same arrays; compares the
    outputs, then the gradients of sum(out * w) with respect to every array."""
    rng = np.random.default_rng(seed + 500)
    kin = [kiln.Tensor(np.asarray(a, npd), kd) for a in arrays]
    tin = [torch.tensor(np.asarray(a, npd), dtype=td, requires_grad=grad) for a in arrays]
    kout = kfn(*kin)
    tout = tfn(*tin)
    np.testing.assert_allclose(to_numpy(kout), tout.detach().numpy(), **tols, err_msg="forward")
    if not grad:
        return
    w = rng.standard_normal(tuple(tout.shape)).astype(npd)
    kw, tw = kiln.Tensor(w, kd), torch.tensor(w, dtype=td)
    kgrads = kiln.grad(lambda *xs: (kfn(*xs) * kw).sum(), grad_position=tuple(range(len(arrays))))(*kin)
    (tout * tw).sum().backward()
    for i, (kg, t) in enumerate(zip(kgrads, tin)):
        assert kg.dtype is kd
        np.testing.assert_allclose(to_numpy(kg), t.grad.numpy(), **tols, err_msg=f"gradient of input {i}")


def R(*shape, low=-2.0, high=2.0, seed=0):
    return np.random.default_rng(seed + sum(shape)).uniform(low, high, shape)


ELEMENTWISE = [
    ("exp", ops.exp, torch.exp, [R(3, 4)]),
    ("log", ops.log, torch.log, [R(3, 4, low=0.1)]),
    ("sqrt", ops.sqrt, torch.sqrt, [R(3, 4, low=0.1)]),
    ("rsqrt", ops.rsqrt, torch.rsqrt, [R(3, 4, low=0.1)]),
    ("sin", ops.sin, torch.sin, [R(3, 4)]),
    ("cos", ops.cos, torch.cos, [R(3, 4)]),
    ("tanh", ops.tanh, torch.tanh, [R(3, 4)]),
    ("sigmoid", ops.sigmoid, torch.sigmoid, [R(3, 4, low=-6, high=6)]),
    ("relu", ops.relu, torch.relu, [R(3, 4)]),
    ("gelu", ops.gelu, F.gelu, [R(3, 4, low=-4, high=4)]),
    ("gelu_tanh", lambda x: ops.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh"),
     [R(3, 4, low=-4, high=4)]),
    ("silu", ops.silu, F.silu, [R(3, 4, low=-6, high=6)]),
    ("erf", ops.erf, torch.erf, [R(3, 4)]),
    ("abs", ops.abs, torch.abs, [R(3, 4)]),
    ("clamp", lambda x: ops.clamp(x, -0.5, 1.0), lambda x: torch.clamp(x, -0.5, 1.0), [R(3, 4)]),
    ("add_bcast", ops.add, torch.add, [R(4, 1, 3), R(2, 1)]),
    ("sub_bcast", ops.sub, torch.sub, [R(2, 3), R(3)]),
    ("mul_bcast", ops.mul, torch.mul, [R(3, 1), R(1, 4)]),
    ("div_bcast", ops.div, torch.div, [R(2, 3), R(3, low=0.5, high=2)]),
    ("pow", ops.pow, torch.pow, [R(2, 3, low=0.5), R(2, 3)]),
    ("maximum", ops.maximum, torch.maximum, [R(2, 3), R(3, seed=7)]),
    ("minimum", ops.minimum, torch.minimum, [R(2, 3), R(3, seed=7)]),
    ("where", lambda a, b: ops.where(a > 0, a, b), lambda a, b: torch.where(a > 0, a, b), [R(2, 3), R(2, 3, seed=3)]),
]


@pytest.mark.parametrize("dt", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", ELEMENTWISE, ids=lambda c: c[0])
def test_elementwise(case, dt):
    name, kfn, tfn, arrays = case
    compare(kfn, tfn, arrays, *dt)


REDUCTIONS = [
    ("sum", lambda x: ops.sum(x, 1), lambda x: torch.sum(x, 1)),
    ("sum_all", lambda x: ops.sum(x), lambda x: torch.sum(x)),
    ("mean_keep", lambda x: ops.mean(x, (0, 2), True), lambda x: torch.mean(x, (0, 2), keepdim=True)),
    ("max", lambda x: ops.max(x, -1), lambda x: torch.amax(x, -1)),
    ("min", lambda x: ops.min(x, 0), lambda x: torch.amin(x, 0)),
    ("prod", lambda x: ops.prod(x, 1), lambda x: torch.prod(x, 1)),
    ("var", lambda x: ops.var(x, 1, ddof=1), lambda x: torch.var(x, 1, correction=1)),
    ("std", lambda x: ops.std(x, (1, 2)), lambda x: torch.std(x, (1, 2), correction=0)),
    ("softmax", lambda x: ops.softmax(x, 1), lambda x: torch.softmax(x, 1)),
    ("log_softmax", lambda x: ops.log_softmax(x, -1), lambda x: torch.log_softmax(x, -1)),
]


@pytest.mark.parametrize("dt", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", REDUCTIONS, ids=lambda c: c[0])
def test_reductions(case, dt):
    name, kfn, tfn = case
    x = np.random.default_rng(1).permutation(24).reshape(2, 3, 4) * 0.1 - 1.2  # distinct values
    compare(kfn, tfn, [x], *dt)


def test_argmax_argmin():
    x = np.random.default_rng(2).standard_normal((3, 4, 5))
    for axis in (0, 1, 2):
        np.testing.assert_array_equal(to_numpy(ops.argmax(kiln.Tensor(x), axis)),
                                      torch.argmax(torch.tensor(x), axis).numpy())
        np.testing.assert_array_equal(to_numpy(ops.argmin(kiln.Tensor(x), axis)),
                                      torch.argmin(torch.tensor(x), axis).numpy())


@pytest.mark.parametrize("dt", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((2, 3, 4), (4, 2)), ((4,), (2, 4, 3)), ((2, 1, 3, 4), (3, 4, 2)),
                                    ((5,), (5,))], ids=str)
def test_matmul(shapes, dt):
    compare(ops.matmul, torch.matmul, [R(*shapes[0]), R(*shapes[1], seed=1)], *dt)


@pytest.mark.parametrize("dt", DTYPES, ids=DTYPE_IDS)
def test_linear(dt):
    compare(ops.dense, F.linear, [R(2, 3, 5), R(4, 5, seed=1), R(4, seed=2)], *dt)


CONV = [
    ((2, 3, 8, 8), (4, 3, 3, 3), dict(padding=1)),
    ((1, 4, 9, 7), (6, 2, 3, 3), dict(groups=2, padding=1)),
    ((1, 4, 9, 9), (4, 1, 3, 3), dict(groups=4, stride=2, padding=1)),
    ((1, 3, 11, 10), (2, 3, 3, 2), dict(dilation=(2, 3), padding=(2, 1))),
    ((2, 2, 10, 10), (4, 2, 5, 5), dict(stride=(2, 3), padding=2)),
    ((1, 6, 12, 12), (6, 3, 3, 3), dict(groups=2, dilation=2, stride=2, padding=2)),
    ((1, 3, 7, 7), (2, 3, 1, 1), dict(stride=2)),
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dt", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("case", CONV, ids=lambda c: f"{c[0]}*{c[1]}-{c[2]}")
def test_conv2d(case, dt, bias):
    xs, ws, kw = case
    arrays = [R(*xs), R(*ws, seed=1)] + ([R(ws[0], seed=2)] if bias else [])
    kd, td, npd, tols = dt
    tols = dict(rtol=tols["rtol"] * 5, atol=tols["atol"] * 20)
    compare(lambda *a: ops.conv2d(*a, **kw), lambda *a: F.conv2d(*a, **kw), arrays, kd, td, npd, tols)


def test_conv2d_same_matches_torch():
    # odd kernels, stride 1: 'same' pads symmetrically, as torch's padding='same'
    x, w = R(1, 2, 7, 6), R(3, 2, 3, 5, seed=1)
    for kd, td, npd, tols in DTYPES:
        compare(lambda a, b: ops.conv2d(a, b, pad_mode="same"), lambda a, b: F.conv2d(a, b, padding="same"), [x, w],
                kd, td, npd, dict(rtol=tols["rtol"] * 5, atol=tols["atol"] * 20))


POOLS = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0)),
    dict(kernel_size=3, stride=2, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=2, stride=1),
]


@pytest.mark.parametrize("dt", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kw", POOLS + [dict(kernel_size=3, stride=2, dilation=2),
                                        dict(kernel_size=2, dilation=(2, 1))], ids=str)
def test_max_pool2d(kw, dt):
    x = np.random.default_rng(3).permutation(2 * 3 * 9 * 8).reshape(2, 3, 9, 8) * 0.01  # no ties
    compare(lambda a: ops.max_pool2d(a, **kw), lambda a: F.max_pool2d(a, **kw), [x], *dt)


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("dt", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("kw", POOLS, ids=str)
def test_avg_pool2d(kw, dt, count_include_pad):
    compare(lambda a: ops.avg_pool2d(a, count_include_pad=count_include_pad, **kw),
            lambda a: F.avg_pool2d(a, count_include_pad=count_include_pad, **kw), [R(2, 3, 9, 8)], *dt)


@pytest.mark.parametrize("dt", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("xshape", [(4, 3, 5, 5), (8, 3)], ids=str)
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm(training, xshape, dt):
    kd, td, npd, tols = dt
    c = xshape[1]
    rm0, rv0 = R(c, seed=5) * 0.1, R(c, low=0.5, high=1.5, seed=6)
    kstats = [kiln.Tensor(rm0.astype(npd), kd), kiln.Tensor(rv0.astype(npd), kd)]
    tstats = [torch.tensor(rm0, dtype=td), torch.tensor(rv0, dtype=td)]
    tols = dict(rtol=tols["rtol"] * 10, atol=tols["atol"] * 100)

    def kfn(x, g, b):
        return ops.batch_norm(x, kstats[0], kstats[1], g, b, training=training, momentum=0.3, eps=1e-4)

    def tfn(x, g, b):
        return F.batch_norm(x, tstats[0], tstats[1], g, b, training=training, momentum=0.3, eps=1e-4)

    x = R(*xshape) * 2 + 0.5
    g, b = R(c, low=0.5, high=1.5, seed=1), R(c, seed=2)
    compare(kfn, tfn, [x, g, b], kd, td, npd, tols)
    # compare ran kiln's forward twice (the value, then under grad) and torch's once
    with torch.no_grad():
        tfn(torch.tensor(x, dtype=td), torch.tensor(g, dtype=td), torch.tensor(b, dtype=td))
    np.testing.assert_allclose(to_numpy(kstats[0]), tstats[0].numpy(), **tols)
    np.testing.assert_allclose(to_numpy(kstats[1]), tstats[1].numpy(), **tols)


@pytest.mark.parametrize("dt", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("ns", [(5,), (4, 5)], ids=str)
def test_layer_norm(ns, dt):
    kd, td, npd, tols = dt
    tols = dict(rtol=tols["rtol"] * 10, atol=tols["atol"] * 100)
    compare(lambda x, w, b: ops.layer_norm(x, ns, w, b), lambda x, w, b: F.layer_norm(x, ns, w, b),
            [R(3, 4, 5), R(*ns, low=0.5, seed=1), R(*ns, seed=2)], kd, td, npd, tols)


@pytest.mark.parametrize("dt", DTYPES, ids=DTYPE_IDS)
def test_rms_norm(dt):
    kd, td, npd, tols = dt
    if not hasattr(F, "rms_norm"):
        pytest.skip("torch has no rms_norm")
    tols = dict(rtol=tols["rtol"] * 10, atol=tols["atol"] * 100)
    compare(lambda x, w: ops.rms_norm(x, w, eps=1e-6), lambda x, w: F.rms_norm(x, (6,), w, eps=1e-6),
            [R(3, 6), R(6, low=0.5, seed=1)], kd, td, npd, tols)


@pytest.mark.parametrize("dt", DTYPES, ids=DTYPE_IDS)
def test_cross_entropy(dt):
    """log_softmax + nll (gather of the target log-probabilities) against F.cross_entropy."""
    kd, td, npd, tols = dt
    logits = R(6, 5) * 3
    target = np.array([0, 4, 2, 2, 1, 3])
    kt = kiln.Tensor(target)
    rows = kiln.Tensor(np.arange(6))

    def kfn(z):
        logp = ops.log_softmax(z, -1)
        return -ops.mean(logp[rows, kt])

    def tfn(z):
        return F.cross_entropy(z, torch.tensor(target))

    compare(kfn, tfn, [logits], kd, td, npd, tols)

    def kfn2(z):  # through gather_elements
        logp = ops.log_softmax(z, 1)
        return -ops.sum(ops.gather_elements(logp, 1, kiln.Tensor(target.reshape(-1, 1))))

    compare(kfn2, lambda z: F.cross_entropy(z, torch.tensor(target), reduction="sum"), [logits], kd, td, npd, tols)


@pytest.mark.parametrize("dt", DTYPES, ids=DTYPE_IDS)
def test_movement_and_indexing(dt):
    compare(lambda x: ops.concat([x[:, ::2], x[::-1, 1:3]], 1),
            lambda x: torch.cat([x[:, ::2], torch.flip(x, [0])[:, 1:3]], 1), [R(3, 5)], *dt)
    idx = np.array([2, 0, 2, 1])
    compare(lambda x: ops.gather(x, kiln.Tensor(idx), 1), lambda x: torch.index_select(x, 1, torch.tensor(idx)),
            [R(3, 4)], *dt)
    compare(lambda w: ops.embedding(kiln.Tensor(np.array([[1, 3], [3, 0]])), w),
            lambda w: F.embedding(torch.tensor([[1, 3], [3, 0]]), w), [R(4, 3)], *dt)
    compare(lambda x: ops.stack(ops.split(x, 2, 1), 0), lambda x: torch.stack(torch.split(x, 2, 1), 0), [R(3, 4)], *dt)
    compare(lambda x: x.reshape(2, 6).permute(1, 0)[None], lambda x: x.reshape(2, 6).permute(1, 0)[None], [R(3, 4)],
            *dt)


@pytest.mark.parametrize("dt", DTYPES, ids=DTYPE_IDS)
def test_small_network(dt):
    """conv -> batch_norm (training) -> relu -> max_pool -> flatten -> linear -> log_softmax."""
    kd, td, npd, tols = dt
    tols = dict(rtol=tols["rtol"] * 20, atol=tols["atol"] * 100)
    ks = [kiln.Tensor(np.zeros(4, npd)), kiln.Tensor(np.ones(4, npd))]
    ts = [torch.zeros(4, dtype=td), torch.ones(4, dtype=td)]

    def kfn(x, w, g, b, fw):
        h = ops.conv2d(x, w, stride=1, padding=1)
        h = ops.relu(ops.batch_norm(h, ks[0], ks[1], g, b, training=True))
        h = ops.max_pool2d(h, 2)
        return ops.log_softmax(ops.dense(ops.flatten(h, 1), fw), -1)

    def tfn(x, w, g, b, fw):
        h = F.conv2d(x, w, stride=1, padding=1)
        h = F.relu(F.batch_norm(h, ts[0], ts[1], g, b, training=True))
        h = F.max_pool2d(h, 2)
        return F.log_softmax(F.linear(torch.flatten(h, 1), fw), -1)

    compare(kfn, tfn, [R(3, 2, 6, 6), R(4, 2, 3, 3, seed=1), R(4, low=0.5, seed=2), R(4, seed=3),
                       R(5, 36, seed=4) * 0.3], kd, td, npd, tols)
