"""Reductions over a middle axis (the column path: rows of the reduced axis taken 8, 4, 2 or 1 at a
time, like the sum over repeated key/value heads in attention's backward) against NumPy, for every
reduced length from 1 to 19 and every column-path reduction."""
import numpy as np
import pytest

import kiln
from kiln import ops

from conftest import assert_close, make_rng

REDUCTIONS = [("sum", ops.sum, np.sum), ("prod", ops.prod, np.prod), ("max", ops.max, np.max),
              ("min", ops.min, np.min), ("mean", ops.mean, np.mean), ("var", ops.var, np.var)]


@pytest.mark.parametrize("name,kf,nf", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_middle_axis_every_length(name, kf, nf, dtype):
    rng = make_rng(95)
    for r in range(1, 20):
        a = rng.uniform(0.5, 1.5, (3, r, 37)).astype(dtype)
        for x in (a, a[:, :, ::2]):  # contiguous rows, and rows with a stride
            got = kf(kiln.Tensor(np.ascontiguousarray(x)) if x is a else kiln.Tensor(a)[:, :, ::2], 1)
            exp = nf(x.astype(np.float64), axis=1)
            kd = kiln.float32 if dtype == np.float32 else kiln.float64
            assert_close(got, exp, kd, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)


def test_sum_over_repeated_heads_int64():
    rng = make_rng(96)
    a = rng.integers(-50, 50, (2, 3, 4, 5, 33))
    for axis in (1, 2, 3):
        assert_close(ops.sum(kiln.Tensor(a), axis), a.sum(axis=axis), kiln.int64)
