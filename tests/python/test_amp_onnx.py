"""ONNX export of mixed-precision (amp) graphs: kiln.export(auto_mixed_precision(net, level, dtype),
file_format="ONNX") writes amp's casts as ONNX Cast nodes and its 16-bit values with ONNX's FLOAT16 /
BFLOAT16 tensor types (the exporter's onnx.checker pass included). float16 models run in ONNX
Runtime against kiln's values; ONNX Runtime's CPU kernels mostly lack bfloat16 (no Relu, Softmax,
... for it), so a bfloat16 model runs in ONNX's reference evaluator where ONNX Runtime cannot."""
import numpy as np
import pytest

import kiln
from kiln import models, nn

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx.reference import ReferenceEvaluator  # noqa: E402

rng = np.random.default_rng(7)
INPUTS = {
    "mlp": (kiln.Tensor(rng.standard_normal((8, 16)).astype(np.float32)),),
    "attention": (kiln.Tensor(rng.standard_normal((1, 8, 32)).astype(np.float32)),
                  kiln.Tensor(np.arange(8, dtype=np.int64).reshape(1, 8))),
    "block": (kiln.Tensor(rng.standard_normal((1, 4, 8, 8)).astype(np.float32)),),
}
LOW = {"bfloat16": (kiln.bfloat16, onnx.TensorProto.BFLOAT16), "float16": (kiln.float16, onnx.TensorProto.FLOAT16)}
# the relative error of the largest magnitude against kiln's result (mixed_precision.md's per-product
# tolerances; ONNX computes the 16-bit products with its own summation order)
TOL = {"bfloat16": 2e-2, "float16": 4e-3}


def _model(name):
    kiln.manual_seed(0)
    net = {"mlp": lambda: nn.SequentialCell([nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 4)]),
           "attention": lambda: models.LlamaAttention(32, 4, 2, rope_theta=500000.0),
           "block": lambda: models.BasicBlock(4)}[name]()
    net.set_train(False)
    return net


def _run(path, model, feeds):
    """(outputs, which runtime): ONNX Runtime, or ONNX's reference evaluator where ONNX Runtime has
    no kernel for a bfloat16 node."""
    try:
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime's own exception types
        if "NOT_IMPLEMENTED" not in str(e) or not _has_bf16(model):
            raise
        return ReferenceEvaluator(model).run(None, feeds), "reference"
    return session.run(None, feeds), "onnxruntime"


def _has_bf16(model):
    types = [i.type.tensor_type.elem_type for i in list(model.graph.input) + list(model.graph.output)]
    types += [t.data_type for t in model.graph.initializer]
    types += [a.i for n in model.graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"]
    return onnx.TensorProto.BFLOAT16 in types


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
@pytest.mark.parametrize("name", ["mlp", "attention", "block"])
def test_amp_export_writes_casts_and_runs(tmp_path, name, level, low):
    dtype, onnx_type = LOW[low]
    net = kiln.amp.auto_mixed_precision(_model(name), level, dtype=dtype)
    args = INPUTS[name]
    expected = net(*args)
    path = str(tmp_path / "m.onnx")
    kiln.export(net, *args, file_name=path, file_format="ONNX")
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)  # types inferred through every node
    casts_to = [a.i for n in model.graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"]
    assert onnx_type in casts_to, casts_to  # amp's casts to the low dtype
    out_type = model.graph.output[0].type.tensor_type.elem_type
    assert out_type == (onnx_type if expected.dtype == dtype else onnx.TensorProto.FLOAT)
    if level != "O3":
        assert onnx.TensorProto.FLOAT in casts_to  # and back to float32 (accumulations, the outputs)
    feeds = {i.name: a.asnumpy() for i, a in zip(model.graph.input, args)}
    outs, runtime = _run(path, model, feeds)
    if low == "float16":
        assert runtime == "onnxruntime"
    got = np.asarray(outs[0]).astype(np.float32)
    ref = expected.astype(kiln.float32).asnumpy()
    assert got.shape == ref.shape
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err <= TOL[low], (runtime, err)


def test_bfloat16_initializers_hold_kiln_bits(tmp_path):
    """A bfloat16 parameter (amp O3 keeps the cast of a float32 parameter in the graph; a
    bfloat16 Parameter is written as it is) is written as ONNX bfloat16 with the same bits."""
    import ml_dtypes

    net = nn.Dense(4, 3)
    net.to_float(kiln.bfloat16)
    w = kiln.Tensor(np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)).astype(kiln.bfloat16)
    x = kiln.Tensor(np.ones((2, 4), np.float32))

    class Scale(nn.Cell):
        def construct(self, a):
            return kiln.ops.matmul(a.astype(kiln.bfloat16), w.T)

    path = str(tmp_path / "w.onnx")
    kiln.export(Scale(), x, file_name=path, file_format="ONNX")
    model = onnx.load(path)
    inits = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.BFLOAT16]
    assert inits, [t.data_type for t in model.graph.initializer]
    stored = onnx.numpy_helper.to_array(inits[0]).astype(np.float32)
    assert np.array_equal(np.sort(stored.ravel()), np.sort(w.asnumpy().ravel()))
    got = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: x.asnumpy()})[0]
    assert got.dtype == ml_dtypes.bfloat16
    assert np.allclose(got.astype(np.float32), Scale()(x).astype(kiln.float32).asnumpy(), rtol=1e-2)
