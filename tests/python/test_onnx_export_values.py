"""ONNX export gives ONNX Runtime kiln's results (issue 28 item 3): every elementwise and
reduction op kiln exports, with hostile values (NaN, +-inf, +-0, empty tensors, integers),
through export -> onnx.checker.check_model(full_check=True) -> ONNX Runtime, compared with kiln
eager. Skips when onnx or onnxruntime is not installed."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import ops

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

HOSTILE = np.array([[0.0, -0.0, 1.5, -2.25], [np.nan, np.inf, -np.inf, 3.0]], np.float32)
POSITIVE = np.array([[0.5, 1.0, 2.0, 4.0], [np.inf, 0.0, 1e-30, np.nan]], np.float32)
INTEGERS = np.array([[7, -7, 3, 0], [1, 2, -5, 9]], np.int64)
EMPTY = np.zeros((2, 0), np.float32)


class Net(kiln.nn.Cell):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def construct(self, x):
        return self.fn(x)


def onnx_result(fn, x, tmp_path):
    path = str(tmp_path / "m.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = kiln.export(Net(fn), kiln.Tensor(x), file_name=path, file_format="ONNX")
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def check(fn, x, tmp_path):
    want = fn(kiln.Tensor(x)).numpy()
    got = onnx_result(fn, x, tmp_path)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)


UNARY = {"relu": ops.relu, "neg": ops.neg, "exp": ops.exp, "tanh": ops.tanh, "sigmoid": ops.sigmoid,
         "abs": ops.abs, "sign": ops.sign, "sin": ops.sin, "cos": ops.cos, "erf": ops.erf}
POSITIVE_ONLY = {"log": ops.log, "sqrt": ops.sqrt}
BINARY_WITH_SCALAR = {"add": lambda t: t + 1.5, "sub": lambda t: 2.0 - t, "mul": lambda t: t * -3.0,
                      "div": lambda t: t / 0.5, "pow": lambda t: ops.pow(t, 2.0),
                      "maximum": lambda t: ops.maximum(t, 0.5), "minimum": lambda t: ops.minimum(t, 0.5),
                      "eq": lambda t: t == 1.5, "lt": lambda t: t < 1.0, "ne": lambda t: t != 0.0}
REDUCE = {"sum": ops.sum, "mean": ops.mean, "max": ops.max, "min": ops.min, "prod": ops.prod}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("x", [HOSTILE, EMPTY], ids=["hostile", "empty"])
def test_unary(name, x, tmp_path):
    check(UNARY[name], x, tmp_path)


@pytest.mark.parametrize("name", sorted(POSITIVE_ONLY))
def test_unary_of_positive_values(name, tmp_path):
    check(POSITIVE_ONLY[name], POSITIVE, tmp_path)


@pytest.mark.parametrize("name", sorted(BINARY_WITH_SCALAR))
@pytest.mark.parametrize("x", [HOSTILE, EMPTY], ids=["hostile", "empty"])
def test_binary(name, x, tmp_path):
    check(BINARY_WITH_SCALAR[name], x, tmp_path)


@pytest.mark.parametrize("name", sorted(REDUCE))
@pytest.mark.parametrize("axis", [None, 0, 1, (), (0, 1)], ids=repr)
@pytest.mark.parametrize("keep_dims", [False, True])
def test_reductions(name, axis, keep_dims, tmp_path):
    check(lambda t: REDUCE[name](t, axis=axis, keepdims=keep_dims), HOSTILE, tmp_path)


@pytest.mark.parametrize("name", ["sum", "max", "min", "prod"])
def test_integer_reductions(name, tmp_path):
    check(lambda t: REDUCE[name](t, axis=1), INTEGERS, tmp_path)


def test_integer_true_division_gives_floats(tmp_path):
    check(lambda t: ops.div(t, 2), INTEGERS, tmp_path)


@pytest.mark.parametrize("ddof", [0, 1, 3, 4, 6])
def test_variance_past_the_count(ddof, tmp_path):
    x = np.array([[1.0, 2.0, 4.0], [3.0, 3.0, 3.0]], np.float32)
    check(lambda t: ops.var(t, axis=1, ddof=ddof), x, tmp_path)


def test_reshape_to_a_zero_size(tmp_path):
    check(lambda t: ops.reshape(t[:, :0], (0, 2)), HOSTILE, tmp_path)
