"""kiln.export(file_format="ONNX", dynamic_axes=...) (issue 28 item 3): a model exported at one
size runs in ONNX Runtime at others, with kiln's results at each: the requested input dimensions
become named ONNX dimensions and every size that follows from them (reshape targets, slice bounds,
a variance's count, control flow) is computed in the graph. Dimensions that cannot vary are refused
naming why. Skips when onnx or onnxruntime is not installed."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn, ops
from kiln.jit.onnx_export import OnnxExportError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def export(net, xs, tmp_path, **kwargs):
    path = str(tmp_path / "m.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = kiln.export(net, *[kiln.Tensor(x) for x in xs], file_name=path, file_format="ONNX", **kwargs)
    onnx.checker.check_model(model, full_check=True)
    return model, ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def agree(net, session, xs):
    got = session.run(None, {i.name: x for i, x in zip(session.get_inputs(), xs)})
    want = net(*[kiln.Tensor(x) for x in xs])
    want = [w.numpy() for w in (want if isinstance(want, (tuple, list)) else [want])]
    for g, w in zip(got, want):
        assert g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, equal_nan=True)


def rnd(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class Head(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(8, 6)

    def construct(self, x):
        h = self.dense(x).reshape(x.shape[0], 2, 3)
        return ops.softmax(h, -1).sum(1), h[:, :, :2] * 2, x.var(0), x[:-1] + x[1:] * 2


def test_batch_axis_varies(tmp_path):
    net = Head()
    model, session = export(net, [rnd(4, 8)], tmp_path, dynamic_axes={"x": {0: "batch"}})
    assert dims(model.graph.input[0]) == ["batch", 8]
    assert [dims(o) for o in model.graph.output] == [["batch", 3], ["batch", 2, 2], [8], ["batch-1", 8]]
    for n in (2, 4, 7, 33):
        agree(net, session, [rnd(n, 8, seed=n)])


class ConvNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, pad_mode="pad", padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc = nn.Dense(4 * 4 * 4, 5)

    def construct(self, x):
        y = self.pool(ops.relu(self.conv(x)))
        return self.fc(y.reshape(x.shape[0], -1))


def test_convolution_network_batch_axis(tmp_path):
    net = ConvNet().set_train(False)
    model, session = export(net, [rnd(2, 3, 8, 8)], tmp_path, dynamic_axes={"x": [0]})
    assert dims(model.graph.input[0]) == ["x_dim0", 3, 8, 8]
    for n in (1, 3, 6):
        agree(net, session, [rnd(n, 3, 8, 8, seed=n)])


def test_attention_over_a_varying_sequence_length(tmp_path):
    def f(q, k, v):
        return ops.scaled_dot_product_attention(q, k, v) * 2.0

    net = nn.Cell()
    net.construct = f
    axes = {"q": {2: "L"}, "k": {2: "S"}, "v": {2: "S"}}
    _, session = export(net, [rnd(1, 2, 5, 4), rnd(1, 2, 6, 4, seed=1), rnd(1, 2, 6, 4, seed=2)], tmp_path,
                        dynamic_axes=axes, arg_names=["q", "k", "v"])
    for lq, lk in ((3, 9), (8, 2), (5, 6)):
        agree(net, session, [rnd(1, 2, lq, 4, seed=lq), rnd(1, 2, lk, 4, seed=lk), rnd(1, 2, lk, 4, seed=lk + 1)])


def test_control_flow_with_a_varying_batch(tmp_path):
    def f(x):
        def body(i, acc):
            return i + 1, acc * 0.5 + x

        _, acc = ops.while_loop(lambda i, acc: i < 2, body, (kiln.Tensor(0), x))
        return ops.cond(acc.sum() > 0, lambda: acc * 2.0, lambda: acc - 1.0)

    net = nn.Cell()
    net.construct = f
    _, session = export(net, [rnd(3, 2)], tmp_path, dynamic_axes={"x": {0: "n"}})
    for n, sign in ((2, 1.0), (5, -1.0), (9, 1.0)):
        agree(net, session, [np.abs(rnd(n, 2, seed=n)) * sign])


def test_output_dimension_names_and_mark_dynamic_default(tmp_path):
    net = Head()
    model, _ = export(net, [rnd(4, 8)], tmp_path, dynamic_axes={"x": {0: "N"}, "output0": {0: "rows"}})
    assert dims(model.graph.output[0]) == ["rows", 3] and dims(model.graph.output[1]) == ["N", 2, 2]
    x = kiln.Tensor(rnd(3, 8))
    kiln.mark_dynamic(x, 0)
    path = str(tmp_path / "marked.onnx")
    model = kiln.export(net, x, file_name=path, file_format="ONNX")
    assert dims(model.graph.input[0]) == ["x_dim0", 8]
    agree(net, ort.InferenceSession(path, providers=["CPUExecutionProvider"]), [rnd(6, 8)])


def test_dimensions_that_cannot_vary_are_refused(tmp_path):
    net = Head()
    with pytest.raises(OnnxExportError, match="dimension 1 of input 'x'.*cannot vary"):
        export(net, [rnd(4, 8)], tmp_path, dynamic_axes={"x": [1]})  # the weight fixes it
    with pytest.raises(OnnxExportError, match="size 1 at the export.*size of 2 or more"):
        export(net, [rnd(1, 8)], tmp_path, dynamic_axes={"x": [0]})
    with pytest.raises(OnnxExportError, match="output2.*does not vary"):
        export(net, [rnd(4, 8)], tmp_path, dynamic_axes={"x": [0], "output2": [0]})
    with pytest.raises(ValueError, match="neither an input"):
        export(net, [rnd(4, 8)], tmp_path, dynamic_axes={"y": [0]})
    with pytest.raises(ValueError, match="axis 5, out of range"):
        export(net, [rnd(4, 8)], tmp_path, dynamic_axes={"x": [5]})

    def made_from_a_python_list(x):
        return x + ops.stack([x[i] for i in range(x.shape[0])], 0)  # Python's range fixes the size

    other = nn.Cell()
    other.construct = made_from_a_python_list
    with pytest.raises(OnnxExportError, match="cannot vary"):
        export(other, [rnd(4, 8)], tmp_path, dynamic_axes={"x": [0]})


def test_creation_ops_of_an_input_size_vary(tmp_path):
    """full and arange given x.shape[0] follow the batch in the exported file."""
    def made_from_a_size(x):
        return x + ops.full((x.shape[0], 8), 1.5) + ops.arange(x.shape[0]).astype(kiln.float32).reshape(-1, 1)

    net = nn.Cell()
    net.construct = made_from_a_size
    model, session = export(net, [rnd(4, 8)], tmp_path, dynamic_axes={"x": [0]})
    for n in (2, 3, 7):
        agree(net, session, [rnd(n, 8)])
