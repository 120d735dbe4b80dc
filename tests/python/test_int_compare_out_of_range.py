"""Comparing an integer tensor with a Python int its dtype cannot hold answers by value, as NumPy 2
does (int8 == 300 is all False, int8 < 300 all True), through the operators (either side) and the
ops functions, eagerly and in every compiled variant. Arithmetic with such an int still raises."""
import numpy as np
import pytest

import kiln
from kiln import ops

from conformance import run_all_modes

DTYPES = (np.int8, np.int32, np.int64)
OPERATORS = {
    "==": lambda a, v: a == v, "!=": lambda a, v: a != v, "<": lambda a, v: a < v,
    "<=": lambda a, v: a <= v, ">": lambda a, v: a > v, ">=": lambda a, v: a >= v,
    "v==": lambda a, v: v == a, "v<": lambda a, v: v < a, "v>=": lambda a, v: v >= a,
}
FUNCTIONS = ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")


def values(dt):
    info = np.iinfo(dt)
    return (int(info.max) + 1, int(info.min) - 1, 300, -300, 2 ** 70, -(2 ** 70), 5)


def tensor(dt):
    info = np.iinfo(dt)
    return np.array([[1, -2, info.max], [info.min, 0, 7]], dt)


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", sorted(OPERATORS))
def test_operators_by_value(dt, name):
    n = tensor(dt)
    for v in values(dt):
        got = OPERATORS[name](kiln.Tensor(n), v).asnumpy()
        assert got.dtype == np.bool_ and got.shape == n.shape
        np.testing.assert_array_equal(got, OPERATORS[name](n, v), err_msg=f"{name} {v}")


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", FUNCTIONS)
def test_functions_by_value(dt, name):
    n = tensor(dt)
    ref = getattr(np, name)
    for v in values(dt):
        np.testing.assert_array_equal(getattr(ops, name)(kiln.Tensor(n), v).asnumpy(), ref(n, v))
        np.testing.assert_array_equal(getattr(ops, name)(v, kiln.Tensor(n)).asnumpy(), ref(v, n))


def test_arithmetic_still_raises():
    a = kiln.Tensor(np.array([1, 2], np.int8))
    with pytest.raises(OverflowError, match="300 out of bounds for int8"):
        a + 300


def masked_count(x, limit):
    """Counts through a mask built from out-of-range comparisons, as a script clipping labels would."""
    keep = (x < limit) & (x != -limit)
    return ops.where(keep, x, ops.zeros_like(x)).sum() + (x == limit).sum()


def test_compiled_equal_eager():
    x = kiln.Tensor(np.array([[3, -7, 127], [-128, 0, 9]], np.int8))
    run_all_modes(masked_count, (x, 300), (x, 1000), (x, 5))
