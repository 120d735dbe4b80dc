"""ONNX export of the composite array ops, losses and activations (docs/ops-array-and-losses.md):
export -> onnx.checker -> ONNX Runtime gives kiln's eager values; the ones holding a check op or an
op without an ONNX form (scatter, gather_nd, cross_entropy with class indices) refuse clearly.
Skips when onnx or onnxruntime is not installed."""
import math

import numpy as np
import pytest

import kiln
from kiln import ops
import onnx_runtime

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

X = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
IDX = kiln.Tensor(np.array([[0, 2], [1, 0], [2, 1]]))


def export(fn, path):
    onnx_runtime.export_checked(onnx_runtime.FnCell(fn), [X], path)


EXPORTED = {
    "flip": lambda x: ops.flip(x, (0, 1)),
    "roll": lambda x: ops.roll(x, (1, -1), (0, 1)),
    "tril": lambda x: ops.tril(x, 1) + ops.triu(x, 2),
    "pad": lambda x: ops.pad(x, (1, 2, 1, 0), value=2.0) + ops.pad(x, (2, 1, 0, 1), "replicate"),
    "pad_reflect_circular": lambda x: ops.pad(x, (1, 1), "reflect") + ops.pad(x, (1, 1), "circular"),
    "one_hot": lambda x: ops.one_hot((x > 0).astype(kiln.int64), 3, 1.0, 0.0),
    "masked_fill_where": lambda x: ops.masked_fill(x, x > 0, 0.5) + ops.where(x < 0, 1.0, x),
    "einsum_bmm": lambda x: ops.einsum("ij,kj->ik", x, x) + ops.bmm(x[None], x.T[None])[0],
    "norm": lambda x: ops.norm(x, dim=1) + ops.norm(x, math.inf, dim=1) + ops.norm(x, 1, dim=(0, 1)),
    "isin": lambda x: ops.isin(x, kiln.Tensor(X[0])),
    "losses": lambda x: (ops.mse_loss(x, x * 0.5) + ops.cross_entropy(x, ops.softmax(x * 2, 1))
                         + ops.binary_cross_entropy_with_logits(x * 30, ops.sigmoid(x))
                         + ops.kl_div(ops.log_softmax(x, 1), ops.softmax(x, 0), "batchmean")
                         + ops.smooth_l1_loss(x, x * 0.1, 0.5) + ops.l1_loss(x, x * x)),
    "activations": lambda x: (ops.softplus(x * 30) + ops.mish(x) + ops.elu(x) + ops.selu(x) + ops.hardswish(x)
                              + ops.hardsigmoid(x) + ops.leaky_relu(x)
                              + ops.prelu(x, kiln.Tensor(np.float32([0.1, 0.2, 0.3, 0.4])))),
}


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_onnx_runtime_gives_eager_values(name, tmp_path):
    fn = EXPORTED[name]
    path = str(tmp_path / "m.onnx")
    export(fn, path)
    got = onnx_runtime.run(path, [X])[0]
    want = fn(kiln.Tensor(X)).numpy()
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn,op", [
    (lambda x: ops.scatter(x, 1, IDX[:, :1], 7.0), "scatter_add_elements"),
    (lambda x: ops.gather_nd(x, IDX), "check"),
    (lambda x: ops.cross_entropy(x, IDX[:, 0]), "class_labels"),
], ids=["scatter", "gather_nd", "cross_entropy_indices"])
def test_ops_without_an_onnx_form_refuse_clearly(fn, op, tmp_path):
    from kiln.jit.onnx_export import OnnxExportError

    with pytest.raises(OnnxExportError, match=f"the op '{op}' has no ONNX form"):
        export(fn, str(tmp_path / "m.onnx"))
