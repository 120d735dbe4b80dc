"""MindSpore's primitive classes, ops.Add()(x, y) and the like: each made once with its attributes
and called with tensors gives what the kiln.ops function (and NumPy) gives, eagerly and compiled."""
import numpy as np
import pytest

import kiln
from kiln import ops
from conformance import rand, run_all_modes


def a(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_elementwise_primitives_match_numpy():
    x, y = a(2, 3), a(2, 3, seed=1)
    tx, ty = kiln.Tensor(x), kiln.Tensor(y)
    cases = [(ops.Add(), np.add), (ops.Sub(), np.subtract), (ops.Mul(), np.multiply), (ops.RealDiv(), np.divide),
             (ops.Maximum(), np.maximum), (ops.Minimum(), np.minimum), (ops.Greater(), np.greater),
             (ops.LessEqual(), np.less_equal), (ops.Equal(), np.equal)]
    for prim, ref in cases:
        np.testing.assert_allclose(prim(tx, ty).asnumpy(), ref(x, y), rtol=1e-6, err_msg=prim.name)
    for prim, ref in [(ops.Exp(), np.exp), (ops.Abs(), np.abs), (ops.Neg(), np.negative), (ops.Tanh(), np.tanh),
                      (ops.Square(), np.square), (ops.ReLU(), lambda v: np.maximum(v, 0))]:
        np.testing.assert_allclose(prim(tx).asnumpy(), ref(x), rtol=1e-6, err_msg=prim.name)
    np.testing.assert_allclose(ops.Select()(tx > 0, tx, ty).asnumpy(), np.where(x > 0, x, y))
    assert repr(ops.MatMul(transpose_b=True)) == "Prim[MatMul]<transpose_a=False, transpose_b=True>"


def test_attribute_primitives_match_numpy():
    x, w = a(2, 3, 4), a(5, 4, seed=2)
    tx = kiln.Tensor(x)
    np.testing.assert_allclose(ops.MatMul(transpose_b=True)(kiln.Tensor(x[0]), kiln.Tensor(w)).asnumpy(),
                               x[0] @ w.T, rtol=1e-5)
    np.testing.assert_allclose(ops.BatchMatMul(transpose_a=True)(tx, tx).asnumpy(),
                               np.swapaxes(x, -2, -1) @ x, rtol=1e-5)
    np.testing.assert_allclose(ops.ReduceSum(keep_dims=True)(tx, 1).asnumpy(), x.sum(1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(ops.ReduceMean()(tx).asnumpy(), x.mean(), rtol=1e-5)
    np.testing.assert_allclose(ops.ReduceMax()(tx, (0, 2)).asnumpy(), x.max((0, 2)))
    np.testing.assert_allclose(ops.Transpose()(tx, (2, 0, 1)).asnumpy(), x.transpose(2, 0, 1))
    assert ops.Shape()(tx) == (2, 3, 4) and ops.Rank()(tx) == 3 and ops.Size()(tx) == 24
    np.testing.assert_allclose(ops.Reshape()(tx, (6, 4)).asnumpy(), x.reshape(6, 4))
    np.testing.assert_allclose(ops.Concat(axis=1)((tx, tx)).asnumpy(), np.concatenate([x, x], 1))
    np.testing.assert_allclose(ops.Stack(axis=0)([tx, tx]).asnumpy(), np.stack([x, x]))
    parts = ops.Split(axis=2, output_num=2)(tx)
    assert len(parts) == 2 and np.allclose(parts[1].asnumpy(), x[:, :, 2:])
    np.testing.assert_allclose(ops.Softmax(axis=1)(tx).asnumpy().sum(1), np.ones((2, 4)), rtol=1e-5)
    idx, val = ops.ArgMaxWithValue(axis=2)(tx)
    assert np.array_equal(idx.asnumpy(), x.argmax(2)) and np.allclose(val.asnumpy(), x.max(2))
    assert ops.Argmax(output_type=kiln.int32)(tx).dtype == kiln.int32
    assert ops.Cast()(tx, kiln.float16).dtype == kiln.float16
    np.testing.assert_allclose(ops.Fill()(kiln.float32, (2, 2), 3.5).asnumpy(), np.full((2, 2), 3.5))
    with pytest.raises(ValueError, match="Split"):
        ops.Split(axis=1, output_num=2)(tx)


def test_assign_primitives_update_a_parameter_in_place():
    p = kiln.Parameter(kiln.Tensor(np.zeros(3, np.float32)), name="p")
    ops.Assign()(p, kiln.Tensor(np.ones(3, np.float32)))
    ops.AssignAdd()(p, kiln.Tensor(np.full(3, 2.0, np.float32)))
    assert p.asnumpy().tolist() == [3.0, 3.0, 3.0]


def test_primitives_compiled_agree_with_eager():
    add, mm, rsum, sm = ops.Add(), ops.MatMul(transpose_b=True), ops.ReduceSum(keep_dims=False), ops.Softmax(-1)

    def f(x, w):
        return rsum(sm(add(mm(x, w), 1.0)), 1), ops.Shape()(x)

    run_all_modes(f, (rand(2, 3), rand(4, 3, seed=1)), (rand(2, 3, seed=2), rand(4, 3, seed=3)))
