"""A Python int beside an integer tensor takes the tensor's dtype (NumPy 2's weak scalars), and
must fit it: int8_tensor + 300 raises OverflowError as NumPy does, instead of wrapping to 44 (or
shifting by 3 for << 259) without a word -- eagerly and in every compiled variant."""
import warnings

import numpy as np
import pytest

import kiln
from kiln import ops

VARIANTS = [None] + [(m, lv, b) for m in ("ast", "bytecode", "trace") for lv in ("O0", "O1") for b in ("kbk", "sink")]
IDS = ["eager"] + ["-".join(v) for v in VARIANTS[1:]]


def adds_300(x):
    return x + 300


def shifts_259(x):
    return x << 259


def compares_to_minus_200(x):
    return x == -200


def reflected(x):
    return 2 ** 40 - x


def in_range(x):
    return (x + 127) * 1 - (-128 - x) + (x << 3) + ops.bitwise_and(x, 100)


def compiled(fn, variant):
    if variant is None:
        return fn
    mode, level, backend = variant
    return kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
@pytest.mark.parametrize("fn,dtype,value", [(adds_300, np.int8, 300), (shifts_259, np.int8, 259),
                                            (reflected, np.int32, 2 ** 40)])
def test_an_int_that_does_not_fit_raises(variant, fn, dtype, value):
    x = kiln.tensor(np.array([1, -2, 3], dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(OverflowError, match=f"Python integer {value} out of bounds for {np.dtype(dtype).name}"):
            compiled(fn, variant)(x)


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_a_comparison_with_an_int_that_does_not_fit_answers_by_value(variant):
    """NumPy 2: int8 == -200 is all False (arithmetic raises, a comparison has an answer)."""
    a = np.array([1, -2, 3], np.int8)
    got = compiled(compares_to_minus_200, variant)(kiln.tensor(a))
    np.testing.assert_array_equal(got.numpy(), a == -200)


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_ints_that_fit_keep_the_tensor_dtype(variant, dtype):
    a = np.array([1, -2, 3, 0], dtype)
    got = compiled(in_range, variant)(kiln.tensor(a))
    with np.errstate(over="ignore"):
        expected = (a + dtype(127)) * dtype(1) - (dtype(-128) - a) + (a << dtype(3)) + (a & dtype(100))
    assert got.dtype == kiln.tensor(a).dtype
    np.testing.assert_array_equal(got.numpy(), expected)


def test_bool_tensors_and_python_ints_give_int64():
    b = kiln.tensor(np.array([True, False]))
    assert (b + 300).dtype == kiln.int64
    np.testing.assert_array_equal((b + 300).numpy(), [301, 300])
