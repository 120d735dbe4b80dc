"""One promotion rule for every spelling of a binary op with a Python scalar (issue 27 item 14):
kiln.ops.mul(2, t), 2 * t, t * 2 and ops.mul(t, 2) give one dtype (the scalar is weak, NumPy 2's
rule) and the same values, eagerly and inside every capture mode (so the branches of a cond
agree)."""
import operator

import numpy as np
import pytest

import kiln
from kiln import ops

PAIRS = [  # (kiln.ops function, Python operator)
    (ops.add, operator.add), (ops.sub, operator.sub), (ops.mul, operator.mul), (ops.div, operator.truediv),
    (ops.pow, operator.pow), (ops.maximum, None), (ops.minimum, None), (ops.eq, operator.eq),
    (ops.lt, operator.lt), (ops.ge, operator.ge),
]
DTYPES = [np.int32, np.int64, np.float16, np.float32, np.float64]
SCALARS = [2, 3.5, True]


def spellings(fn, op, scalar, t):
    out = {"ops(s, t)": fn(scalar, t), "ops(t, s)": fn(t, scalar)}
    if op is not None:
        out["s op t"], out["t op s"] = op(scalar, t), op(t, scalar)
    return out


@pytest.mark.parametrize("fn, op", PAIRS, ids=[f.__name__ for f, _ in PAIRS])
@pytest.mark.parametrize("dtype", DTYPES, ids=[d.__name__ for d in DTYPES])
@pytest.mark.parametrize("scalar", SCALARS, ids=repr)
def test_every_spelling_promotes_alike(fn, op, dtype, scalar):
    t = kiln.Tensor(np.array([1, 2, 3], dtype))
    got = spellings(fn, op, scalar, t)
    left = {k: v for k, v in got.items() if k.startswith("ops(s") or k.startswith("s ")}
    right = {k: v for k, v in got.items() if k not in left}
    for group in (left, right):
        dtypes = {k: v.dtype for k, v in group.items()}
        assert len(set(dtypes.values())) == 1, dtypes
        first = next(iter(group.values())).numpy()
        for v in group.values():
            np.testing.assert_array_equal(v.numpy(), first)
    # the scalar's side does not change the dtype either
    assert next(iter(left.values())).dtype == next(iter(right.values())).dtype


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_cond_branches_spelled_differently_agree(mode):
    def f(x, flag):
        if flag > 0:
            return ops.mul(2, x)
        return 2 * x

    t = kiln.Tensor(np.array([1, 2], np.int32))
    jf = kiln.jit(f, capture_mode=mode)
    for flag in (kiln.Tensor(1), kiln.Tensor(-1)):
        got, want = jf(t, flag), f(t, flag)
        assert got.dtype == want.dtype == kiln.int32
        np.testing.assert_array_equal(got.numpy(), want.numpy())
