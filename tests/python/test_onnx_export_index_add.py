"""ONNX export of index_add (ScatterND with reduction="add", the axis moved first), which a
compiled recurrent layer's output buffer is written with: any axis, 0-d / 1-D / 2-D indices,
negative indices, a source broadcast to the selection and repeated indices, through
export -> onnx.checker -> ONNX Runtime against kiln eager. Skips without onnx / onnxruntime."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn, ops

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


class Net(nn.Cell):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def construct(self, x, src):
        return self.fn(x, src)


CASES = {  # name: (axis, index, source shape)
    "axis0_1d": (0, [2, 0], (2, 4, 2)),
    "axis0_0d": (0, 1, (4, 2)),
    "axis1_2d_negative": (1, [[0, -1], [2, 0]], (3, 2, 2, 2)),
    "axis2_repeated": (2, [1, 1, 0], (3, 4, 3)),
    "axis1_broadcast_source": (1, [3, 1], (1, 2, 1)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_index_add_exports_and_runs_as_kiln(case, tmp_path):
    axis, index, src_shape = CASES[case]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 2 if axis != 2 else 3)).astype(np.float32)
    src = rng.standard_normal(src_shape).astype(np.float32)
    idx = kiln.Tensor(np.asarray(index, np.int64))
    net = Net(lambda a, s: ops.index_add(a, axis, idx, s))
    want = net(kiln.Tensor(x), kiln.Tensor(src)).numpy()
    path = str(tmp_path / "m.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = kiln.export(net, kiln.Tensor(x), kiln.Tensor(src), file_name=path, file_format="ONNX")
    onnx.checker.check_model(model, full_check=True)
    assert any(n.op_type == "ScatterND" for n in model.graph.node)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = session.run(None, {i.name: v for i, v in zip(session.get_inputs(), (x, src))})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # NumPy: the source broadcast to the selection, added at each index (repeats add up)
    index = np.asarray(index)
    selection = x.shape[:axis] + index.shape + x.shape[axis + 1:]
    moved = np.moveaxis(np.broadcast_to(src, selection), list(range(axis, axis + index.ndim)),
                        list(range(index.ndim)))
    expected = x.copy()
    np.add.at(np.moveaxis(expected, axis, 0), index % x.shape[axis], moved)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
