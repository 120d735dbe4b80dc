"""ONNX export of the ops beyond elementwise and reductions (issue 28 item 3): convolution,
pooling, normalizations, attention, linear, shape and indexing ops, creation ops, softmax, casts,
arg reductions and control flow, with hostile values (NaN, +-inf, +-0, empty batches) where the op
takes them, through export -> onnx.checker.check_model(full_check=True) -> ONNX Runtime, against
kiln eager. The exported main graph holds no Identity node that copies a value a node makes.
Skips when onnx or onnxruntime is not installed."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn, ops

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


class Net(nn.Cell):
    def __init__(self, fn, cells=()):
        super().__init__()
        self.fn = fn
        self.parts = nn.CellList(list(cells))

    def construct(self, *xs):
        return self.fn(*xs)


def export_and_run(net, xs, tmp_path):
    path = str(tmp_path / "m.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = kiln.export(net, *[kiln.Tensor(x) for x in xs], file_name=path, file_format="ONNX")
    onnx.checker.check_model(model, full_check=True)
    identities = [n for n in model.graph.node if n.op_type == "Identity"]
    inputs = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    assert all(n.input[0] in inputs or n.input[0] in {o.name for o in model.graph.output} for n in identities), \
        [(n.input[0], n.output[0]) for n in identities]
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feed = {i.name: x for i, x in zip(session.get_inputs(), xs)}
    return session.run(None, feed)


def check(net, *xs, tmp_path, rtol=1e-5, atol=1e-5):
    net.set_train(False)
    want = net(*[kiln.Tensor(x) for x in xs])
    want = [w.numpy() for w in (want if isinstance(want, (tuple, list)) else [want])]
    got = export_and_run(net, xs, tmp_path)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)


def img(n=2, c=3, h=8, w=8, seed=0, hostile=False):
    x = np.random.default_rng(seed).standard_normal((n, c, h, w)).astype(np.float32)
    if hostile and x.size:
        x[0, 0, 0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    return x


@pytest.mark.parametrize("hostile", [False, True])
def test_conv_pool_batchnorm_chain(hostile, tmp_path):
    conv, bn = nn.Conv2d(3, 4, 3, stride=1, pad_mode="pad", padding=1, has_bias=True), nn.BatchNorm2d(4)
    conv2 = nn.Conv2d(4, 4, 3, stride=2, pad_mode="valid", group=2, has_bias=False)
    maxp, avgp = nn.MaxPool2d(2, 2), nn.AvgPool2d(2, 1)

    def f(x):
        y = ops.relu(bn(conv(x)))
        return maxp(y), avgp(conv2(y))

    check(Net(f, [conv, bn, conv2, maxp, avgp]), img(hostile=hostile), tmp_path=tmp_path)


def test_conv_of_an_empty_batch(tmp_path):
    conv = nn.Conv2d(3, 2, 1, has_bias=True)
    check(Net(lambda x: conv(x), [conv]), img(n=0), tmp_path=tmp_path)


def test_dense_layer_norm_rms_norm_softmax(tmp_path):
    dense, ln, rms = nn.Dense(6, 5), nn.LayerNorm((5,)), nn.RMSNorm(5)

    def f(x):
        h = dense(x)
        return ln(h), rms(h), ops.softmax(h, -1), ops.log_softmax(h, 0), ops.gelu(h), ops.silu(h)

    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    x[0, 0] = np.inf  # a row of inf and NaN: ONNX Runtime must give kiln's NaN too
    check(Net(f, [dense, ln, rms]), x, tmp_path=tmp_path)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_attention(kv_heads, tmp_path):
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 4, 5, 8)).astype(np.float32)
    k = rng.standard_normal((2, kv_heads, 7, 8)).astype(np.float32)
    v = rng.standard_normal((2, kv_heads, 7, 8)).astype(np.float32)
    check(Net(lambda a, b, c: ops.scaled_dot_product_attention(a, b, c)), q, k, v, tmp_path=tmp_path, rtol=1e-4)


def test_shape_indexing_and_creation_ops(tmp_path):
    def f(x):
        y = x.reshape(3, 8).transpose(1, 0)
        z = ops.concat([y[::2], y[1::2] * 2.0], 1)
        idx = kiln.Tensor(np.array([2, 0, 1], np.int64))
        g = ops.gather(z, idx, 1)
        filled = ops.full((2, 3), -0.0) + ops.arange(3).astype(kiln.float32) + ops.eye(2, 3)
        c = ops.clamp(x, -1.0, 1.0).astype(kiln.int32).astype(kiln.float32)
        return g, filled, c, ops.argmax(x, 1), ops.argmin(x, 0), ops.broadcast_to(x[:, :1], 6, 4), x.var(1), x.std(0)

    x = np.random.default_rng(3).standard_normal((6, 4)).astype(np.float32)
    x[2, 1] = np.nan
    check(Net(f), x, tmp_path=tmp_path)


def test_if_and_while_on_tensors(tmp_path):
    def f(x):
        def body(i, acc):
            return i + 1, acc * 0.5 + x

        n, acc = ops.while_loop(lambda i, acc: i < 3, body, (kiln.Tensor(0), x))
        return ops.cond(acc.sum() > 0, lambda: acc * 2.0, lambda: acc - 1.0), n

    for seed in (0, 5):
        x = np.random.default_rng(seed).standard_normal((2, 3)).astype(np.float32)
        check(Net(f), x, tmp_path=tmp_path)


def test_outputs_are_named_by_the_node_that_makes_them(tmp_path):
    dense = nn.Dense(4, 3)
    path = str(tmp_path / "m.onnx")
    model = kiln.export(Net(lambda x: (dense(x), ops.relu(x)), [dense]), kiln.Tensor(np.ones((2, 4), np.float32)),
                        file_name=path, file_format="ONNX", output_names=["logits", "act"])
    assert not [n for n in model.graph.node if n.op_type == "Identity"]
    made = {o for n in model.graph.node for o in n.output}
    assert {"logits", "act"} <= made


def test_an_output_that_is_an_input_keeps_its_copy(tmp_path):
    path = str(tmp_path / "m.onnx")
    model = kiln.export(Net(lambda x: (x, x * 2.0)), kiln.Tensor(np.ones(3, np.float32)), file_name=path,
                        file_format="ONNX")
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    a, b = session.run(None, {session.get_inputs()[0].name: np.arange(3, dtype=np.float32)})
    assert a.tolist() == [0.0, 1.0, 2.0] and b.tolist() == [0.0, 2.0, 4.0]


def test_remaining_exported_ops(tmp_path):
    def f(x, y):
        idx = kiln.Tensor(np.array([[0, 2], [1, 0], [2, 2]], np.int64))
        lin = ops.linspace(-1.0, 1.0, 5) * 2.0
        logic = ops.logical_or(ops.logical_and(x > 0, y < 0), ops.logical_not(x == y))
        return (ops.rsqrt(ops.abs(x) + 0.5), ops.where(x > y, x, y), logic, ops.gather_elements(x, 1, idx),
                ops.matmul(x, y.transpose(1, 0)), lin, ops.pow(ops.abs(x), y), ops.sign(x), ops.minimum(x, y))

    x, y = np.random.default_rng(4).standard_normal((2, 3, 3)).astype(np.float32)
    x[0, 0], y[1, 1] = np.nan, -np.inf
    check(Net(f), x, y, tmp_path=tmp_path)
