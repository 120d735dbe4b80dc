"""A NumPy scalar or array on the left of an operator with a kiln tensor gives a kiln Tensor (the
tensor's reflected operator runs, as PyTorch's tensors make NumPy defer), with NumPy 2's result
dtype and values -- eagerly, and in every compiled variant, where it is now a graph op instead of
a value read into NumPy."""
import operator
import warnings

import numpy as np
import pytest

import kiln

VARIANTS = [None] + [(m, lv, b) for m in ("ast", "bytecode", "trace") for lv in ("O0", "O1") for b in ("kbk", "sink")]
IDS = ["eager"] + ["-".join(v) for v in VARIANTS[1:]]
OPS = [operator.add, operator.sub, operator.mul, operator.truediv, operator.pow]


def left_operands(x):
    return [op(np.float32(2.0), x) for op in OPS] + [np.arange(3, dtype=np.float32) - x, np.float64(0.5) * x]


def int_left_operands(i):
    return [np.int32(6) & i, np.int32(6) | i, np.int32(3) - i, np.int64(7) // i]


def compiled(fn, variant):
    if variant is None:
        return fn
    mode, level, backend = variant
    return kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_numpy_scalars_and_arrays_first_give_tensors(variant):
    a = np.array([1.0, 2.0, 4.0], np.float32)
    i = np.array([1, 2, 3], np.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = compiled(left_operands, variant)(kiln.tensor(a)) + compiled(int_left_operands, variant)(kiln.tensor(i))
    expected = left_operands(a) + int_left_operands(i)
    for k, (g, e) in enumerate(zip(got, expected)):
        assert isinstance(g, kiln.Tensor), (k, type(g))
        assert g.numpy().dtype == e.dtype, (k, g.numpy().dtype, e.dtype)
        np.testing.assert_allclose(g.numpy(), e, rtol=1e-6, err_msg=str(k))
