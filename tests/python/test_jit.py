"""kiln.jit (trace capture, kernel-by-kernel backend): jitted results equal eager ones for every op
family; decorator forms; functions, methods and Cells with live parameters; nested containers;
the cache and its key; the recompile limit; the IR text; execution order; the memory plan
(poisoned freed buffers, reuse); autodiff through jit and a compiled training step; validation."""
import gc
import inspect
import os
import subprocess
import sys
import warnings
import weakref
import zlib

import numpy as np
import pytest

import kiln
from kiln import nn, ops
from kiln.jit import JitFunction, tree

from conftest import to_kiln

FLOATS = (kiln.float32, kiln.float64)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- helpers ------------------------------------------------------------------------------------


def leaves_of(obj):
    out = []
    spec = tree.flatten(obj, out)
    return spec, out


def assert_same(got, expected, what="result"):
    """got and expected have the same structure, and their tensors the same dtype, shape and
    values (bitwise: a compiled graph runs the same kernels as eager execution)."""
    gspec, gl = leaves_of(got)
    espec, el = leaves_of(expected)
    assert gspec == espec, f"{what}: structure {tree.describe(gspec)} vs {tree.describe(espec)}"
    for i, (g, e) in enumerate(zip(gl, el)):
        assert isinstance(g, kiln.Tensor), f"{what}[{i}]: {type(g).__name__} is not a kiln.Tensor"
        assert g.dtype is e.dtype, f"{what}[{i}]: dtype {g.dtype} vs {e.dtype}"
        assert g.shape == e.shape, f"{what}[{i}]: shape {g.shape} vs {e.shape}"
        ga, ea = np.asarray(g.asnumpy()), np.asarray(e.asnumpy())
        if g.dtype.is_floating_point:
            np.testing.assert_array_equal(ga, ea, err_msg=f"{what}[{i}]", strict=True)
        else:
            np.testing.assert_array_equal(ga, ea, err_msg=f"{what}[{i}]")


def T(a, dtype=None):
    return kiln.Tensor(np.asarray(a), dtype)


def rnd(rng, *shape, dtype=kiln.float32, lo=-2.0, hi=2.0):
    return kiln.Tensor(rng.uniform(lo, hi, size=shape), dtype)


# ---- every op family: jitted == eager -----------------------------------------------------------
#
# A case is (name, function, input specs). Specs describe NumPy inputs:
#   ("f", shape[, lo, hi[, layout]])  a float tensor of the test's dtype ('contiguous',
#                                      'transposed' or 'strided' layout)
#   ("i", shape, high)                int64 indices in [0, high)
#   ("p", shape, n)                   int64 rows of a permutation of range(n) (unique indices)
# Each input is rebuilt fresh for every call, so in-place updates of inputs can be compared too.


def F(*shape, lo=-2.0, hi=2.0, layout="contiguous"):
    return ("f", shape, lo, hi, layout)


def P(*shape):  # positive floats
    return F(*shape, lo=0.2, hi=2.0)


def I(shape, high):
    return ("i", shape, high)


def make_arrays(specs, rng):
    arrays = []
    for s in specs:
        if s[0] == "f":
            arrays.append(("f", rng.uniform(s[2], s[3], size=s[1]), s[4]))
        elif s[0] == "i":
            arrays.append(("i", rng.integers(0, s[2], size=s[1]).astype(np.int64), None))
        else:
            raise ValueError(s)
    return arrays


def to_tensors(arrays, dtype):
    return [to_kiln(a, dtype, layout) if kind == "f" else kiln.Tensor(a) for kind, a, layout in arrays]


def perm_index(n, k, seed=0):
    return T(np.random.default_rng(seed).permutation(n)[:k].astype(np.int64))


def _setitem(x, y):
    z = x.clone()
    z[1:3] = 0.5
    z[:, 0] = y[:, 1]
    z[0, 1:] = z[0, 1:] * 2
    return z


def _index_put(x, idx, v):
    z = x * 1
    z[idx] = v
    return z


def _creation(a):
    d = a.dtype
    return (a + ops.zeros(3, 4, dtype=d) + ops.ones(3, 4, dtype=d) * 2 + ops.full((3, 4), 0.5, dtype=d)
            + ops.arange(12, dtype=d).reshape(3, 4) * a + ops.linspace(0, 1, 4, dtype=d) + ops.eye(3, 4, dtype=d)
            + ops.zeros_like(a) + ops.full_like(a, 3.0) + ops.ones_like(a),
            ops.arange(0, 10, 3), T(np.arange(4.0), d) * a[0])


def _mutate_input(x, y):
    x[1] = y[0]
    x[2:, 1:] = 0.0
    return x * 2


def _batch_norm_train(x, rm, rv, w, b):
    y = ops.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
    return y, rm * 1, rv * 1


CASES = [
    # elementwise: arithmetic, broadcasting, scalars
    ("add", lambda a, b: a + b, [F(3, 4), F(3, 4)]),
    ("add_broadcast", lambda a, b: a + b, [F(3, 1, 4), F(5, 1)]),
    ("sub_mul_div", lambda a, b: (a - b, a * b, a / b, ops.div(b, a)), [P(2, 5), P(2, 5)]),
    ("scalar_ops", lambda a: ((a * 2.5 - 1) / 3 + 0.5, 1 - a, 2 / (ops.abs(a) + 1), 3 * a, -a), [F(4, 3)]),
    ("pow", lambda a, b: (a ** 3, a ** 0.5, ops.pow(a, b), 2 ** b), [P(3, 4), F(3, 4)]),
    ("unary", lambda a: (ops.abs(a), ops.neg(a), ops.exp(a), ops.sin(a), ops.cos(a), ops.tanh(a),
                         ops.sigmoid(a), ops.relu(a), ops.silu(a), ops.erf(a), ops.sign(a), ops.square(a)),
     [F(5, 6)]),
    ("unary_positive", lambda a: (ops.log(a), ops.sqrt(a), ops.rsqrt(a), ops.reciprocal(a)), [P(5, 6)]),
    ("gelu", lambda a: (ops.gelu(a), ops.gelu(a, "tanh")), [F(4, 7)]),
    ("clamp_max_min", lambda a, b: (ops.clamp(a, -0.5, 0.7), ops.clamp(a, min=0.0), ops.clamp(a, max=0.1),
                                    ops.maximum(a, b), ops.minimum(a, b)), [F(3, 4), F(4)]),
    ("compare_where_logical", lambda a, b: (a < b, a >= b, ops.eq(a, a), a != b, ops.where(a > 0, a, b),
                                            ops.logical_and(a > 0, b > 0), ops.logical_or(a > 0, b > 0),
                                            ops.logical_not(a > 0)), [F(3, 4), F(3, 4)]),
    ("cast", lambda a: (ops.cast(a * 3, kiln.int32), ops.cast(a, kiln.float64), ops.cast(a, kiln.float32),
                        ops.cast(a, kiln.float16), (a > 0).astype(a.dtype)), [F(3, 4)]),
    ("non_contiguous_inputs", lambda a, b: a * b + a.sum(0), [F(4, 5, layout="transposed"),
                                                             F(4, 5, layout="strided")]),
    # reductions
    ("sum_mean_prod", lambda a: (a.sum(), a.sum(1), ops.sum(a, (0, 2), keepdims=True), a.mean(), a.mean(-1),
                                 ops.prod(a, 1)), [F(3, 4, 5, lo=0.5, hi=1.5)]),
    ("max_min_arg", lambda a: (a.max(), ops.max(a, 1), ops.min(a, 0, keepdims=True), ops.amax(a, (0, 1)),
                               ops.amin(a, -1), ops.argmax(a, 1), ops.argmin(a)), [F(3, 4, 5)]),
    ("var_std", lambda a: (ops.var(a, 1), ops.std(a, 0, ddof=1), ops.var(a)), [F(6, 5)]),
    ("all_any", lambda a: (ops.all(a > -1.5, 1), ops.any(a > 1.5), ops.any(a > 0, 0, keepdims=True)), [F(4, 5)]),
    ("softmax", lambda a: (ops.softmax(a, -1), ops.softmax(a, 0), ops.log_softmax(a, 1)), [F(3, 7, 4)]),
    # matmul
    ("matmul", lambda a, b: (ops.matmul(a, b), a @ b), [F(5, 7), F(7, 3)]),
    ("matmul_batched", lambda a, b: ops.matmul(a, b), [F(2, 3, 4, 5), F(5, 6)]),
    ("matmul_broadcast_batch", lambda a, b: ops.matmul(a, b), [F(2, 1, 4, 5), F(3, 5, 2)]),
    ("matmul_vectors", lambda a, b: (ops.matmul(a[0], b), ops.matmul(b, a[:3, 1])), [F(4, 5), F(5, 3)]),
    ("matmul_transposed", lambda a, b: ops.matmul(a.T, b.swapaxes(0, 1)), [F(5, 4), F(3, 5)]),
    ("dense", lambda x, w, b: (ops.dense(x, w, b), ops.dense(x, w)), [F(2, 3, 6), F(4, 6), F(4)]),
    # convolution and pooling
    ("conv2d", lambda x, w, b: ops.conv2d(x, w, b, stride=2, padding=1), [F(2, 3, 9, 9), F(4, 3, 3, 3), F(4)]),
    ("conv2d_groups_dilation", lambda x, w: ops.conv2d(x, w, stride=1, padding=(2, 1), dilation=2, groups=2),
     [F(1, 4, 8, 7), F(6, 2, 3, 3)]),
    ("conv2d_same", lambda x, w: ops.conv2d(x, w, pad_mode="same", stride=2), [F(2, 3, 7, 8), F(5, 3, 3, 2)]),
    ("pools", lambda x: (ops.max_pool2d(x, 3, 2, 1), ops.avg_pool2d(x, 2), ops.max_pool2d(x, 2, ceil_mode=True),
                         ops.avg_pool2d(x, 3, 2, 1, count_include_pad=False)), [F(2, 3, 9, 8)]),
    # normalization
    ("batch_norm_eval", lambda x, rm, rv, w, b: ops.batch_norm(x, rm, rv, w, b, training=False),
     [F(2, 3, 4, 5), F(3), P(3), F(3), F(3)]),
    ("batch_norm_train", _batch_norm_train, [F(4, 3, 2, 5), F(3), P(3), F(3), F(3)]),
    ("layer_norm", lambda x, w, b: (ops.layer_norm(x, (4, 5), w, b), ops.layer_norm(x, 5, eps=1e-3)),
     [F(3, 4, 5), F(4, 5), F(4, 5)]),
    ("rms_norm", lambda x, w: ops.rms_norm(x, w), [F(3, 6), F(6)]),
    # views and indexing
    ("reshape_family", lambda a: (a.reshape(4, 6), ops.reshape(a, (-1,)), a.flatten(1), ops.unsqueeze(a, 1),
                                  ops.squeeze(a.reshape(1, 2, 1, 12)), a.view(6, 4) + 1), [F(2, 3, 4)]),
    ("permute_family", lambda a: (a.permute(2, 0, 1), ops.transpose(a, 0, 2), a.swapaxes(1, 2) * 2, a.T,
                                  ops.contiguous(a.permute(1, 0, 2))), [F(2, 3, 4)]),
    ("slice_views", lambda a: (a[1:, ::2], a[..., None], a[:, 1], a[::-1, 1:3], ops.narrow(a, 1, 1, 2) + 0,
                               a[-1], a[0:0]), [F(4, 5)]),
    ("split_chunk_broadcast", lambda a, b: (ops.split(a, 2, 1), ops.split(a, [1, 3], 1), ops.chunk(a, 2, 0),
                                            ops.broadcast_to(b, (4, 4)) + a), [F(4, 4), F(4)]),
    ("setitem", _setitem, [F(5, 4), F(5, 4)]),
    ("setitem_on_an_input", _mutate_input, [F(4, 3), F(2, 3)]),
    ("getitem_index_tensor", lambda a, idx: (a[idx], a[:, idx[:2]], a[idx, 1:]), [F(6, 5), I((3,), 5)]),
    ("index_put", _index_put, [F(6, 3), I((2,), 6), F(2, 3)]),
    # concat, gather, scatter
    ("concat_stack", lambda a, b: (ops.concat((a, b), 0), ops.cat([b, a, b], 0), ops.stack((a, a * 2), 1)),
     [F(2, 3), F(4, 3)]),
    ("gather", lambda a, idx: (ops.gather(a, idx, 0), ops.gather(a, idx, 1), ops.index_select(a, 1, idx[0])),
     [F(6, 6), I((2, 3), 6)]),
    ("gather_scatter_elements", lambda a, idx, src: (ops.gather_elements(a, 1, idx),
                                                     ops.scatter_add(a, 1, idx, src)),
     [F(4, 5), I((4, 3), 5), F(4, 3)]),
    ("index_add_embedding", lambda a, idx, src: (ops.index_add(a, 0, idx[0], src), ops.embedding(idx, a)),
     [F(5, 3), I((2, 4), 5), F(4, 3)]),
    # creation inside the function
    ("creation", _creation, [F(3, 4)]),
    # results that are inputs or views of inputs
    ("identity_and_views_out", lambda a, b: (a, b[1:], a * 1, (a.T, a)), [F(3, 3), F(4, 3)]),
]


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
@pytest.mark.parametrize("name, fn, specs", CASES, ids=[c[0] for c in CASES])
def test_jitted_equals_eager(name, fn, specs, dtype):
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    sets = [make_arrays(specs, rng) for _ in range(2)]
    jf = kiln.jit(fn)
    # the first call traces (eagerly); later calls replay the graph, on new values too
    for step, arrays in enumerate([sets[0], sets[1], sets[0]]):
        ins_e, ins_j = to_tensors(arrays, dtype), to_tensors(arrays, dtype)
        expected = fn(*ins_e)
        got = jf(*ins_j)
        assert_same(got, expected, f"{name} call {step}")
        assert_same(ins_j, ins_e, f"{name} call {step}: inputs after the call")
    info = jf.cache_info()
    assert (info.compiles, info.hits, info.misses, info.eager_calls) == (1, 2, 1, 0), info


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_layout_of_inputs_may_change_between_calls(dtype):
    """Contiguous, transposed and strided inputs all compute what eager does; contiguity is part of
    the cache key (Python may read it: test_jit_layout_guard.py), so the views share a second graph."""
    fn = lambda a, b: ops.matmul(a, b) + a.sum(1, keepdims=True) * b[0]  # noqa: E731
    jf = kiln.jit(fn)
    rng = np.random.default_rng(3)
    for layout in ("contiguous", "transposed", "strided", "contiguous"):
        a, b = rng.uniform(-1, 1, (4, 4)), rng.uniform(-1, 1, (4, 4))
        ka, kb = to_kiln(a, dtype, layout), to_kiln(b, dtype, layout)
        assert_same(jf(ka, kb), fn(ka, kb), layout)
    assert jf.cache_info().compiles == 2


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_random_ops_follow_the_seed(dtype):
    def fn(x):
        return (x + ops.rand(3, 4, dtype=dtype), ops.randn(3, 4, dtype=dtype) * x,
                ops.uniform((2, 2), -1.0, 3.0, dtype=dtype), ops.normal(5, 1.0, 2.0, dtype=dtype),
                ops.dropout(x, 0.5))

    x = T(np.ones((3, 4)), dtype)
    kiln.manual_seed(1234)
    expected = fn(x)
    jf = kiln.jit(fn)
    for call in range(3):  # the tracing call and two replays
        kiln.manual_seed(1234)
        assert_same(jf(x), expected, f"call {call}")
    # without reseeding, a replay draws new numbers, like eager calls do
    kiln.manual_seed(1234)
    e1, e2 = fn(x), fn(x)
    kiln.manual_seed(1234)
    j1, j2 = jf(x), jf(x)
    assert_same((j1, j2), (e1, e2))
    assert not np.array_equal(j1[0].asnumpy(), j2[0].asnumpy())
    assert jf.cache_info().compiles == 1


# ---- forms of kiln.jit ----------------------------------------------------------------------


def _f(a, b):
    return a * b + b.exp()


def test_jit_as_call_and_decorators():
    x, y = T(np.arange(6.0).reshape(2, 3), kiln.float32), T(np.ones((2, 3)), kiln.float32)
    expected = _f(x, y)

    @kiln.jit
    def f1(a, b):
        return a * b + b.exp()

    @kiln.jit()
    def f2(a, b):
        return a * b + b.exp()

    @kiln.jit(exec_order="dfs", recompile_limit=2)
    def f3(a, b):
        return a * b + b.exp()

    f4 = kiln.jit(_f)
    f5 = kiln.jit(_f, capture_mode="trace", jit_level="O0", backend="")
    f6 = kiln.jit(function=_f, backend="ms_backend")
    for jf in (f1, f2, f3, f4, f5, f6):
        assert isinstance(jf, JitFunction)
        for _ in range(2):
            assert_same(jf(x, y), expected)
        assert jf.cache_info().compiles == 1 and jf.cache_info().hits == 1
    assert f1.__name__ == "f1" and f4.__wrapped__ is _f and f4.__name__ == "_f"
    assert kiln.jit(f4).fn is _f  # jitting a jitted function wraps the original


def test_jit_on_a_method():
    class Scaler:
        def __init__(self, w):
            self.w = w

        @kiln.jit
        def apply(self, x, y=None):
            return x * self.w if y is None else x * self.w + y

    a, b = Scaler(T([1.0, 2.0, 3.0])), Scaler(T([-1.0, 0.5, 4.0]))
    x = T(np.arange(6.0).reshape(2, 3), kiln.float32)
    for _ in range(3):
        assert_same(a.apply(x), x * a.w)
        assert_same(b.apply(x), x * b.w)
        assert_same(a.apply(x, y=x), x * a.w + x)
    assert a.apply.cache_info().compiles == 2  # with and without y
    assert b.apply.cache_info().compiles == 1
    # the weight is captured live: an in-place update is seen by the next call
    a.w[...] = T([10.0, 20.0, 30.0])
    assert_same(a.apply(x), x * a.w)
    assert a.apply.cache_info().compiles == 2


def test_jit_on_a_method_does_not_keep_instances_alive():
    """The class-level jitted method must not hold every instance (and its graphs) forever."""
    class Holder:
        def __init__(self):
            self.w = T(np.ones(3, np.float32))

        @kiln.jit
        def apply(self, x):
            return x * self.w

    h = Holder()
    h.apply(T(np.ones(3, np.float32)))
    ref = weakref.ref(h)
    del h
    gc.collect()
    assert ref() is None, "an instance whose @kiln.jit method was called is never freed"


class _MLP(nn.Cell):
    def __init__(self, dtype=kiln.float32):
        super().__init__()
        self.fc1 = nn.Dense(6, 8, dtype=dtype)
        self.fc2 = nn.Dense(8, 3, dtype=dtype)

    def construct(self, x):
        return self.fc2(ops.relu(self.fc1(x)))


class _JitConstructNet(_MLP):
    @kiln.jit
    def construct(self, x):
        return self.fc2(ops.tanh(self.fc1(x)))


def _eager_construct(net, x):
    return net.fc2(ops.tanh(net.fc1(x)))


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_jit_on_a_cell_keeps_parameters_live(dtype):
    kiln.manual_seed(0)
    net = _MLP(dtype)
    jnet = kiln.jit(net)
    rng = np.random.default_rng(0)
    x = rnd(rng, 4, 6, dtype=dtype)
    assert_same(jnet(x), net(x))
    opt = nn.SGD(net.trainable_params(), learning_rate=0.5)
    loss = lambda x: (net(x) ** 2).sum()  # noqa: E731
    for _ in range(3):
        before = jnet(x).asnumpy().copy()
        opt(kiln.grad(loss, None, net.trainable_params())(x))
        after = jnet(x)
        assert not np.array_equal(before, after.asnumpy())
        assert_same(after, net(x))
    # other in-place updates: set_data, item assignment, fill_
    net.fc1.weight.set_data(T(rng.uniform(-1, 1, (8, 6)), dtype))
    assert_same(jnet(x), net(x))
    with kiln.no_grad():
        net.fc2.bias[1] = 5.0
    assert_same(jnet(x), net(x))
    with kiln.no_grad():
        net.fc2.bias.fill_(0.25)
    assert_same(jnet(x), net(x))
    info = jnet.cache_info()
    assert info.compiles == 1 and info.eager_calls == 0, info
    # the parameters appear in the graph as parameters, not as constants
    text = jnet.graph_str()
    assert text.count("= parameter") == 4 and "constant" not in text, text


def test_jit_on_a_cell_construct_method():
    kiln.manual_seed(1)
    net = _JitConstructNet()
    x = rnd(np.random.default_rng(1), 5, 6)
    for _ in range(2):
        assert_same(net(x), _eager_construct(net, x))
    net.fc2.weight.set_data(ops.ones(3, 8))
    assert_same(net(x), _eager_construct(net, x))
    assert net.construct.cache_info().compiles == 1


def test_cell_training_mode_is_part_of_the_key():
    kiln.manual_seed(2)
    bn, ref = nn.BatchNorm2d(3), nn.BatchNorm2d(3)
    jbn = kiln.jit(bn)
    rng = np.random.default_rng(2)
    for train in (True, False, True, False):
        bn.set_train(train)
        ref.set_train(train)
        x = rnd(rng, 2, 3, 4, 4)
        assert_same(jbn(x), ref(x), f"train={train}")
        assert_same([bn.moving_mean, bn.moving_variance], [ref.moving_mean, ref.moving_variance],
                    "moving statistics")
    info = jbn.cache_info()
    assert (info.compiles, info.hits) == (2, 2), info


def test_closure_tensors_are_live_and_python_numbers_are_guarded():
    w = T([1.0, 2.0, 3.0])
    k = 2.0
    jf = kiln.jit(lambda x: x * w + k)
    x = T([1.0, 1.0, 1.0])
    assert_same(jf(x), x * w + 2.0)
    w[...] = T([4.0, 5.0, 6.0])  # an in-place update of the captured tensor is seen
    assert_same(jf(x), x * w + 2.0)
    assert jf.cache_info().compiles == 1
    k = 100.0  # a Python number is a constant of the graph, guarded: a change recompiles
    assert_same(jf(x), x * w + 100.0)
    assert jf.cache_info().compiles == 2


def test_jitted_function_calling_jitted_functions():
    inner = kiln.jit(lambda a: a.exp() * 2)
    outer = kiln.jit(lambda a, b: inner(a) + inner(b).sum())
    rng = np.random.default_rng(4)
    for _ in range(3):
        a, b = rnd(rng, 3, 2), rnd(rng, 4)
        assert_same(outer(a, b), a.exp() * 2 + (b.exp() * 2).sum())
    assert outer.cache_info().compiles == 1
    assert "exp" in outer.graph_str()


# ---- nested containers ----------------------------------------------------------------------


def test_nested_containers_in_and_out():
    def fn(d, pair, scale=1.0, tag="x"):
        a, (b, c) = pair
        return {"sum": (d["x"] + a) * scale, "parts": [d["y"] * b, (c - 1, {"tag": tag, "t": c.T})],
                "none": None, "n": 3}

    jf = kiln.jit(fn)
    rng = np.random.default_rng(0)

    def args():
        x, y, a, b, c = (rnd(rng, 2, 3) for _ in range(5))
        return {"x": x, "y": y}, (a, [b, c])

    for _ in range(3):
        d, pair = args()
        got = jf(d, pair, scale=2.0)
        assert type(got) is dict and list(got) == ["sum", "parts", "none", "n"]
        assert type(got["parts"]) is list and type(got["parts"][1]) is tuple and got["parts"][1][1]["tag"] == "x"
        assert got["none"] is None and got["n"] == 3
        assert_same(got, fn(d, pair, scale=2.0))
    assert jf.cache_info().compiles == 1 and jf.cache_info().hits == 2
    # a different structure, key order or constant is a different signature
    d, pair = args()
    assert_same(jf({"y": d["y"], "x": d["x"]}, pair), fn({"y": d["y"], "x": d["x"]}, pair))
    assert_same(jf(d, (pair[0], (pair[1][0], pair[1][1]))), fn(d, (pair[0], (pair[1][0], pair[1][1]))))
    assert_same(jf(d, pair, tag="y"), fn(d, pair, tag="y"))
    assert jf.cache_info().compiles == 4


def test_tuple_list_outputs_keep_their_types():
    jf = kiln.jit(lambda a: (a + 1, [a * 2, a * 3]))
    x = T([1.0, 2.0])
    for _ in range(2):
        r = jf(x)
        assert type(r) is tuple and type(r[1]) is list
        assert_same(r, (x + 1, [x * 2, x * 3]))
    jl = kiln.jit(lambda a: [a, a + 1])
    for _ in range(2):
        assert type(jl(x)) is list
    jt = kiln.jit(lambda a: a.sum())
    for _ in range(2):
        assert isinstance(jt(x), kiln.Tensor) and jt(x).shape == ()


def test_outputs_are_fresh_tensors_between_calls():
    """A replay must not hand back memory that the next replay overwrites."""
    jf = kiln.jit(lambda a: (a * 2, (a * 2).exp()))
    r = [jf(T([float(i), 1.0])) for i in range(4)]
    for i, (a, b) in enumerate(r):
        np.testing.assert_array_equal(a.asnumpy(), [2.0 * i, 2.0])
        np.testing.assert_allclose(b.asnumpy(), np.exp([2.0 * i, 2.0]), rtol=1e-6)


# ---- cache and its key ----------------------------------------------------------------------


def test_non_tensor_arguments_are_part_of_the_key():
    def fn(x, n, mode="add", shape=(2, 3)):
        y = x * n
        return (y + 1 if mode == "add" else y - 1).reshape(shape)

    jf = kiln.jit(fn)
    x = T(np.arange(6.0), kiln.float32)
    calls = [(2,), (2,), (3,), (2.5,), (2,), (3,), (2, "sub"), (2, "sub"), (2, "add", (3, 2)), (2, "add", (3, 2))]
    seen = set()
    for i, extra in enumerate(calls):
        assert_same(jf(x, *extra), fn(x, *extra), f"call {i} {extra}")
        seen.add((type(extra[0]),) + extra)
    info = jf.cache_info()
    assert info.compiles == info.misses == len(seen) == 5, info
    assert info.hits == len(calls) - len(seen)
    # int and float arguments of equal value are different constants
    assert_same(jf(x, 2.0), fn(x, 2.0))
    assert jf.cache_info().compiles == 6


def test_cache_info_counts():
    jf = kiln.jit(lambda a, b: a @ b)
    info = jf.cache_info()
    assert (info.hits, info.misses, info.compiles, info.entries) == (0, 0, 0, 0)
    a, b = T(np.ones((2, 3)), kiln.float32), T(np.ones((3, 2)), kiln.float32)
    jf(a, b)
    jf(a, b)
    jf(a, b)
    jf(a.astype(kiln.float64), b.astype(kiln.float64))  # dtype: new signature
    jf(T(np.ones((4, 3)), kiln.float32), b)  # shape: new signature
    jf(a.astype(kiln.float64), b.astype(kiln.float64))
    info = jf.cache_info()
    assert (info.hits, info.misses, info.compiles, info.entries, info.eager_calls) == (3, 3, 3, 3, 0), info
    assert info.compile_seconds > 0
    assert "hits=3" in repr(info)


def test_requires_grad_and_grad_mode_are_part_of_the_key():
    jf = kiln.jit(lambda a: a * 3)
    x = T([1.0, 2.0])
    jf(x)
    with kiln.no_grad():
        jf(x)
        jf(x)
    jf(x)
    info = jf.cache_info()
    assert info.compiles == 2 and info.hits == 2, info


def test_recompile_limit_warns_once_and_runs_eagerly():
    def fn(a, b):
        return a * b + 1

    jf = kiln.jit(fn, recompile_limit=3, dynamic=False)  # exact shapes: each new one compiles
    rng = np.random.default_rng(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(1, 4):
            x = rnd(rng, n)
            assert_same(jf(x, x), fn(x, x))
        assert not caught
        for n in range(4, 8):  # the 4th new shape warns, then runs eagerly
            x = rnd(rng, n)
            assert_same(jf(x, x), fn(x, x))
        for n in range(1, 4):  # compiled signatures are still served from the cache
            x = rnd(rng, n)
            assert_same(jf(x, x), fn(x, x))
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1, msgs
    assert "recompile_limit=3" in msgs[0] and "argument 0" in msgs[0] and "shape" in msgs[0], msgs[0]
    info = jf.cache_info()
    assert (info.compiles, info.eager_calls, info.hits) == (3, 4, 3), info


def test_recompile_limit_names_a_changing_non_tensor_argument():
    jf = kiln.jit(lambda x, k: x * k, recompile_limit=2)
    x = T([1.0, 2.0])
    with pytest.warns(RuntimeWarning, match=r"argument 1 \(2 -> 3\)"):
        for k in range(1, 4):
            assert_same(jf(x, k), x * k)
    assert jf.cache_info().compiles == 2


# ---- IR text --------------------------------------------------------------------------------


def _lines_of(fn, *needles):
    src, first = inspect.getsourcelines(fn)
    return [first + i for i, line in enumerate(src) for n in needles if n in line]


def _ir_example(x, w):
    y = ops.matmul(x, w)
    z = ops.relu(y) * 2.0
    return z.sum(1)


def test_graph_str_names_ops_and_source_lines():
    jf = kiln.jit(_ir_example)
    x, w = T(np.ones((2, 3)), kiln.float32), T(np.ones((3, 4)), kiln.float32)
    with pytest.raises(RuntimeError):
        jf.graph_str()  # nothing compiled yet
    jf(x, w)
    text = jf.graph_str()
    assert text == jf.graph_str(x, w)
    for op in ("matmul", "relu", "mul", "sum"):
        assert op in text, text
    assert "float32[2, 3]" in text and "float32[2]" in text
    fname = os.path.basename(__file__)
    for line in _lines_of(_ir_example, "ops.matmul", "ops.relu", "z.sum"):
        assert f"{fname}:{line}" in text, (line, text)
    # graph_str with other arguments compiles that signature
    text64 = jf.graph_str(x.astype(kiln.float64), w.astype(kiln.float64))
    assert "float64[2, 3]" in text64 and jf.cache_info().compiles == 2


def test_dump_ir_env_prints_the_graph(monkeypatch, capfd):
    monkeypatch.setenv("KILN_DUMP_IR", "1")
    jf = kiln.jit(_ir_example)
    x, w = T(np.ones((2, 3)), kiln.float32), T(np.ones((3, 4)), kiln.float32)
    jf(x, w)
    err = capfd.readouterr().err
    assert "matmul" in err and "relu" in err and "_ir_example" in err, err
    jf(x, w)  # a cache hit compiles nothing and prints nothing
    assert capfd.readouterr().err == ""


def test_dump_ir_env_in_a_fresh_process():
    code = "import kiln\nfrom kiln import ops\nf = kiln.jit(lambda a: ops.exp(a) + 1)\nf(ops.ones(3))\n"
    env = dict(os.environ, KILN_DUMP_IR="1", PYTHONPATH=os.path.join(REPO, "python"))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "exp" in r.stderr and "add" in r.stderr, r.stderr
    env.pop("KILN_DUMP_IR")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "exp" not in r.stderr, r.stderr


# ---- execution order and memory plan ----------------------------------------------------------


def _branchy(x):
    a, b, c = x.exp(), x.sin(), x.cos()
    a2, b2, c2 = a * 2, b * 3, c * 4
    return a2 + b2 + c2


def _diamond_with_views(x):
    y = x.exp()
    yt = y.T  # a view kept alive long after y's last direct use
    z = (x * 2).tanh()
    w = z @ z
    for _ in range(4):
        w = (w * 0.5 + 1).sin()
    return yt + w, y[1:, :2] * 3, z.sum()


def _long_chain(x):
    for _ in range(30):
        x = (x * 1.01 + 0.5).tanh()
    return x


def _reuse_heavy(x, y):
    h = [x]
    for i in range(6):
        h.append(h[-1] @ y + h[max(0, i - 2)])
    return h[-1], h[3].sum(0)


@pytest.mark.parametrize("fn", [_branchy, _diamond_with_views, _long_chain, _reuse_heavy],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("order", ["bfs", "dfs"])
@pytest.mark.parametrize("poison", [False, True], ids=["plain", "poison"])
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_exec_order_and_memory_plan_give_eager_results(fn, order, poison, dtype):
    rng = np.random.default_rng(7)
    nin = len(inspect.signature(fn).parameters)
    jf = kiln.jit(fn, exec_order=order, debug_poison=poison)
    for _ in range(3):
        ins = [rnd(rng, 16, 16, dtype=dtype) for _ in range(nin)]
        assert_same(jf(*ins), fn(*ins))
    assert jf.cache_info().compiles == 1


def test_debug_poison_keeps_a_buffer_read_through_a_view_alive():
    """The buffer of exp(x) dies after the multiplication that reads it through the slice, not
    after the slice itself (the last direct use of exp(x))."""
    for fn in (lambda x: x.exp()[1:, :2] * 3, lambda x: x.exp().T + x * 2, lambda x: x.exp().reshape(16) * 2):
        jf = kiln.jit(fn, debug_poison=True)
        for v in (0.5, 1.5):
            x = T(np.full((4, 4), v), kiln.float32)
            assert_same(jf(x), fn(x))


def test_dfs_order_differs_on_a_branchy_graph():
    x = T(np.ones((32, 32)), kiln.float32)
    bfs, dfs = kiln.jit(_branchy), kiln.jit(_branchy, exec_order="dfs")
    ob, od = bfs.executable(x).order(), dfs.executable(x).order()
    assert ob != od, (ob, od)
    assert sorted(ob.split()) == sorted(od.split())
    # dfs finishes each branch before starting the next: it needs less memory here
    assert dfs.executable(x).arena_bytes <= bfs.executable(x).arena_bytes
    assert_same(bfs(x), dfs(x))


def test_memory_plan_reuses_buffers_on_a_long_chain():
    x = T(np.ones((64, 64)), kiln.float32)
    jf = kiln.jit(_long_chain)
    exe = jf.executable(x)
    nbytes = 64 * 64 * 4
    intermediates = 2 * 30 - 1  # every mul and add but the last tanh, which is the output
    assert exe.arena_bytes < intermediates * nbytes / 4, exe.arena_bytes
    assert exe.output_bytes == nbytes
    assert_same(jf(x), _long_chain(x))


def test_debug_poison_does_not_change_results_of_a_cell():
    kiln.manual_seed(3)
    net = _MLP(kiln.float64)
    x = rnd(np.random.default_rng(3), 7, 6, dtype=kiln.float64)
    plain, poisoned = kiln.jit(net), kiln.jit(net, debug_poison=True, exec_order="dfs")
    for _ in range(2):
        assert_same(poisoned(x), plain(x))
        assert_same(poisoned(x), net(x))


# ---- autodiff through jit ---------------------------------------------------------------------


def _loss3(x, w, b):
    return (ops.tanh(x @ w + b) ** 2).mean()


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_grad_of_a_jitted_function_equals_eager(dtype):
    rng = np.random.default_rng(5)
    jf = kiln.jit(_loss3)
    for grad_position in (0, (0, 1), (1, 2)):
        for _ in range(3):
            args = (rnd(rng, 4, 5, dtype=dtype), rnd(rng, 5, 3, dtype=dtype), rnd(rng, 3, dtype=dtype))
            v_e, g_e = kiln.value_and_grad(_loss3, grad_position)(*args)
            v_j, g_j = kiln.value_and_grad(jf, grad_position)(*args)
            assert_same(v_j, v_e, "value")
            assert_same(g_j, g_e, f"grads {grad_position}")
            assert_same(kiln.grad(jf, grad_position)(*args), g_e, f"grad {grad_position}")
    variant = jf._grad_variant(0, None, False)
    assert variant.cache_info().compiles == 1 and variant.cache_info().hits >= 2


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_grad_of_a_jitted_cell_over_weights_equals_eager(dtype):
    kiln.manual_seed(6)
    net = _MLP(dtype)
    jnet = kiln.jit(net)
    rng = np.random.default_rng(6)
    loss_e = lambda x: (net(x) ** 2).sum()  # noqa: E731
    loss_j = kiln.jit(loss_e)
    params = net.trainable_params()
    for _ in range(3):
        x = rnd(rng, 3, 6, dtype=dtype)
        v_e, (gx_e, gw_e) = kiln.value_and_grad(loss_e, 0, params)(x)
        v_j, (gx_j, gw_j) = kiln.value_and_grad(loss_j, 0, params)(x)
        assert_same((v_j, gx_j, gw_j), (v_e, gx_e, gw_e))
        # a jitted Cell differentiated with weights=cell.trainable_params() (non-scalar output)
        assert_same(kiln.value_and_grad(jnet, None, params)(x), kiln.value_and_grad(net, None, params)(x))
        assert_same(kiln.grad(jnet, None, net)(x), kiln.grad(net, None, net)(x))
        # the gradients follow parameter updates
        for p, g in zip(params, gw_e):
            p.set_data(p - 0.1 * g)


def test_grad_with_has_aux_through_jit():
    def fn(x, w):
        y = x @ w
        return y.sum(), y.max()

    jf = kiln.jit(fn)
    rng = np.random.default_rng(8)
    for _ in range(2):
        x, w = rnd(rng, 3, 4), rnd(rng, 4, 2)
        assert_same(kiln.value_and_grad(jf, (0, 1), has_aux=True)(x, w),
                    kiln.value_and_grad(fn, (0, 1), has_aux=True)(x, w))
        assert_same(kiln.grad(jf, 1, has_aux=True)(x, w), kiln.grad(fn, 1, has_aux=True)(x, w))


def test_eager_autograd_through_a_jitted_call():
    """A jitted function called on inputs that require grad, under an outer eager grad."""
    jf = kiln.jit(lambda a: (a.exp() * a).sum())
    x = T([0.5, -1.0, 2.0], kiln.float64)
    g_e = kiln.grad(lambda a: (a.exp() * a).sum())(x)
    for _ in range(2):
        assert_same(kiln.grad(lambda a: jf(a) * 1)(x), g_e)
    # also after the signature without requires_grad was compiled (and served by the fast path)
    jf(x), jf(x)
    assert_same(kiln.grad(lambda a: jf(a) * 1)(x), g_e)
    y = x.detach()
    y.requires_grad = True
    assert jf(y).requires_grad


# ---- a whole training step under jit ---------------------------------------------------------


class _TrainNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, pad_mode="pad", padding=1, has_bias=True)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Dense(4 * 6 * 6, 3)

    def construct(self, x):
        h = ops.relu(self.bn(self.conv(x)))
        return self.fc(h.reshape(h.shape[0], -1))


def _make_net(kind):
    kiln.manual_seed(11)
    if kind == "mlp":
        return nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4))
    net = _TrainNet()
    net.set_train(True)
    return net


def _train(kind, optimizer, jitted, steps=10):
    net = _make_net(kind)
    opt = optimizer(net.trainable_params())
    loss_fn = nn.MSELoss()
    rng = np.random.default_rng(12)
    if kind == "mlp":
        batches = [(rnd(rng, 5, 8), rnd(rng, 5, 4)) for _ in range(2)]
    else:
        batches = [(rnd(rng, 3, 2, 6, 6), rnd(rng, 3, 3)) for _ in range(2)]
    data = [batches[i % 2] for i in range(steps)]
    forward = lambda x, y: loss_fn(net(x), y)  # noqa: E731
    grad_fn = kiln.value_and_grad(forward, None, opt.parameters)

    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    if jitted:
        step = kiln.jit(step)
    params = net.get_parameters()
    ids = [id(p) for p in params]
    losses = [step(x, y).item() for x, y in data]
    assert [id(p) for p in net.get_parameters()] == ids  # updated in place, not replaced
    return losses, params, step


OPTIMIZERS = {
    "sgd": lambda p: nn.SGD(p, learning_rate=0.05),
    "sgd_momentum_nesterov": lambda p: nn.SGD(p, learning_rate=0.01, momentum=0.9, nesterov=True,
                                              weight_decay=1e-3),
    "adam": lambda p: nn.Adam(p, learning_rate=0.01, weight_decay=1e-4),
}


@pytest.mark.parametrize("kind", ["mlp", "conv_bn"])
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_jitted_training_step_matches_eager_losses(kind, opt_name):
    losses_e, params_e, _ = _train(kind, OPTIMIZERS[opt_name], jitted=False)
    losses_j, params_j, step = _train(kind, OPTIMIZERS[opt_name], jitted=True)
    assert losses_j == losses_e, np.max(np.abs(np.array(losses_j) - np.array(losses_e)))
    assert losses_e[8] < losses_e[0]  # it learns (the same batch at steps 0 and 8)
    # parameters (and BatchNorm's moving statistics) end up identical
    assert_same(list(params_j), list(params_e), "parameters after training")
    info = step.cache_info()
    assert info.compiles == 1 and info.hits == 9 and info.eager_calls == 0, info


def test_jitted_training_step_follows_a_learning_rate_schedule():
    """A per-step learning rate and global_step are optimizer state too: a replayed step must
    use the current step's rate (not the one read while tracing) and keep counting."""
    def run(jitted):
        kiln.manual_seed(0)
        net = nn.Dense(4, 2)
        opt = nn.SGD(net.trainable_params(), learning_rate=[0.1, 0.05, 0.01, 0.0])
        grad_fn = kiln.value_and_grad(lambda x, y: ((net(x) - y) ** 2).mean(), None, opt.parameters)

        def step(x, y):
            loss, grads = grad_fn(x, y)
            opt(grads)
            return loss

        step = kiln.jit(step) if jitted else step
        rng = np.random.default_rng(0)
        x, y = rnd(rng, 5, 4), rnd(rng, 5, 2)
        return [step(x, y).item() for _ in range(6)], opt.global_step, opt.get_lr()

    eager, jitted = run(False), run(True)
    assert jitted == eager, f"jitted {jitted} vs eager {eager}"


def test_jitted_training_step_graph_contains_forward_backward_and_update():
    _, _, step = _train("mlp", OPTIMIZERS["adam"], jitted=True, steps=2)
    text = step.graph_str()
    assert "linear" in text or "matmul" in text, text
    assert "adam_update" in text, text


# ---- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, accepted", [
    (dict(capture_mode="graph"), ["ast", "bytecode", "trace"]),
    (dict(jit_level="O3"), ["O0", "O1", "O2"]),
    (dict(backend="cuda"), ["ms_backend"]),
    (dict(exec_order="random"), ["bfs", "dfs"]),
    (dict(unknown_option=1), ["exec_order", "recompile_limit", "debug_poison"]),
    (dict(recompile_limit=0), []),
])
def test_invalid_arguments_raise_value_error_listing_accepted_values(kwargs, accepted):
    for make in (lambda: kiln.jit(_f, **kwargs), lambda: kiln.jit(**kwargs)):
        with pytest.raises(ValueError) as e:
            make()
        msg = str(e.value)
        for name in list(kwargs):
            assert name in msg or repr(kwargs[name]) in msg, msg
        for a in accepted:
            assert a in msg, msg


def test_jit_of_a_non_callable_raises_type_error():
    with pytest.raises(TypeError):
        kiln.jit(3)


def test_unsupported_argument_type_raises_type_error():
    class Unhashable:  # (NumPy arrays and sets are accepted, keyed by their contents: test_jit_pytree_types.py)
        __hash__ = None

    jf = kiln.jit(lambda x, extra: x)
    with pytest.raises(TypeError, match="jit"):
        jf(T([1.0]), [Unhashable()])


# ---- the plan --------------------------------------------------------------------------------


def test_plan_str_shows_order_memory_and_groups():
    def two_chains(x, y):  # traced breadth-first: both products, then both exps
        a, b = x * y, x + y
        c, d = a.exp(), b.exp()
        return c - d

    x, y = kiln.Tensor(np.arange(4.0, dtype=np.float32)), kiln.Tensor(np.ones(4, np.float32))
    bfs, dfs = kiln.jit(two_chains), kiln.jit(two_chains, exec_order="dfs")
    for jf in (bfs, dfs):
        assert_same(jf(x, y), two_chains(x, y))
    steps = [line.split(": ", 1)[1].split("(")[0] for line in bfs.plan_str().splitlines()[1:]]
    assert steps == ["%2 = mul", "%3 = add", "%4 = exp", "%5 = exp", "%6 = sub"]
    assert [line.split(": ", 1)[1].split("(")[0] for line in dfs.plan_str(x, y).splitlines()[1:]] == \
        ["%2 = mul", "%4 = exp", "%3 = add", "%5 = exp", "%6 = sub"]
    assert bfs.plan_str().startswith("plan: 5 steps, arena 128 bytes, outputs 16 bytes\n")
    assert "%4 @0 16B last 4" in bfs.plan_str() and "frees %4 %5" in bfs.plan_str()
    fused = kiln.jit(two_chains, jit_level="O1")
    fused(x, y)
    assert fused.plan_str().splitlines()[1:] == ["  0: %2 = fused(%0, %1) {subgraph 0}  %2 output"]
    with pytest.raises(RuntimeError, match="no graph compiled yet"):
        kiln.jit(two_chains).plan_str()


def test_dump_plan_prints_each_compiled_plan():
    code = ("import kiln, numpy as np\n"
            "f = kiln.jit(lambda a, b: a * b + a)\n"
            "x = kiln.Tensor(np.ones(3, np.float32))\n"
            "f(x, x * 2)\n")
    env = dict(os.environ, KILN_DUMP_PLAN="1", PYTHONPATH=os.path.join(REPO, "python"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "[kiln] plan: 2 steps" in out.stderr and "= mul(%0, %1)" in out.stderr, out.stderr
