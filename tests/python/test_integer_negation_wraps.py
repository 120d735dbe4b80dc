"""abs and neg of the smallest integer wrap as NumPy's do (abs(-2**63) is -2**63) instead of
overflowing: signed overflow is undefined in C, and the UBSan build of the bad-input sweep
stopped on ops.abs(-2**63) (issue 28). Eager and every compiled variant."""
import numpy as np
import pytest

import kiln
from kiln import ops

CASES = [(np.int64, kiln.int64), (np.int32, kiln.int32), (np.int8, kiln.int8)]


def f_abs(x):
    return ops.abs(x) + 0


def f_neg(x):
    return ops.neg(x) * 1


@pytest.mark.parametrize("np_t, kt", CASES)
@pytest.mark.parametrize("fn, ref", [(f_abs, np.abs), (f_neg, np.negative)])
def test_smallest_integer(np_t, kt, fn, ref):
    info = np.iinfo(np_t)
    a = np.array([info.min, info.min + 1, -1, 0, 1, info.max], np_t)
    with np.errstate(over="ignore"):
        want = ref(a)
    x = kiln.tensor(a, kt)
    np.testing.assert_array_equal(fn(x).asnumpy(), want)
    for mode in ("ast", "bytecode", "trace"):
        for level in ("O0", "O1"):
            for backend in ("kbk", "sink"):
                got = kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)(x).asnumpy()
                np.testing.assert_array_equal(got, want, err_msg=f"{mode} {level} {backend}")


def f_square_add(x):
    return ops.square(x) + x


@pytest.mark.parametrize("np_t, kt", CASES[:2])
def test_integer_arithmetic_wraps_as_numpy(np_t, kt):
    """square and add past the largest integer wrap (ops.square(2**63 - 1) was signed overflow)."""
    info = np.iinfo(np_t)
    a = np.array([info.min, info.max, info.max // 2 + 1, -3, 0, 5], np_t)
    with np.errstate(over="ignore"):
        want = np.square(a) + a
    x = kiln.tensor(a, kt)
    np.testing.assert_array_equal(f_square_add(x).asnumpy(), want)
    for mode in ("ast", "trace"):
        for level in ("O0", "O1"):
            got = kiln.jit(f_square_add, capture_mode=mode, jit_level=level)(x).asnumpy()
            np.testing.assert_array_equal(got, want, err_msg=f"{mode} {level}")
