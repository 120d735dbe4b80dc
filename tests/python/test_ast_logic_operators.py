"""`and`, `or`, `not` and chained comparisons keep Python's meaning under capture (issue 27
item 3): `a and b` gives an operand (its dtype and shape), not an elementwise bool; the truth of a
tensor with several elements raises as eagerly; in an if / while / assert test they stay graph
ops. Every capture mode against eager, with values that take each path."""
import numpy as np
import pytest

import kiln

MODES = ("ast", "bytecode", "trace")


def T(values, dtype=None):
    return kiln.Tensor(np.array(values, dtype=dtype))


def and_(x, y):
    return x and y


def or_(x, y):
    return x or y


def three(x, y):
    return x and y and x + y


def in_condition(x, y):
    if x.sum() > 0 and y.max() < 10 or not (x.min() > -5):
        return x + y
    return x - y


def chained(x):
    if -1.0 < x.mean() < 4.0:
        return x * 2.0
    return x


def loop_condition(x):
    while x.sum() < 10 and not (x.max() > 6):
        x = x + 1.0
    return x


def run(fn, mode, *args):
    return fn(*args) if mode == "eager" else kiln.jit(fn, capture_mode=mode)(*args)


def same(got, want):
    assert type(got) is type(want)
    if isinstance(want, kiln.Tensor):
        assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    else:
        assert got == want


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fn", [and_, or_, three])
@pytest.mark.parametrize("left", [[3], [0], [2.5], [0.0]])
def test_operand_is_returned(fn, mode, left):
    jf = kiln.jit(fn, capture_mode=mode)
    for right in ([5], [0]):
        x, y = T(left), T(right)
        same(jf(x, y), fn(x, y))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fn", [and_, or_, lambda x, y: not x])
def test_ambiguous_truth_raises_as_eagerly(fn, mode):
    x, y = T(np.ones((2, 2))), T([5.0])
    with pytest.raises(ValueError, match="ambiguous"):
        fn(x, y)
    with pytest.raises(ValueError, match="ambiguous"):
        kiln.jit(fn, capture_mode=mode)(x, y)


@pytest.mark.parametrize("mode", MODES)
def test_ambiguous_truth_in_a_condition_raises(mode):
    def f(x, y):
        if x and y:
            return x
        return y

    with pytest.raises(ValueError, match="ambiguous"):
        kiln.jit(f, capture_mode=mode)(T(np.ones((2, 2))), T([1.0]))


@pytest.mark.parametrize("mode", MODES)
def test_not_of_a_tensor_has_its_truth(mode):
    for v in ([3.0], [0.0]):
        got = kiln.jit(lambda x: not x, capture_mode=mode)(T(v))
        assert bool(got) == (not T(v))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fn", [in_condition, chained, loop_condition])
def test_conditions(fn, mode):
    jf = kiln.jit(fn, capture_mode=mode)
    for x in ([1.0, 2.0], [-8.0, 1.0], [3.0, 4.0], [-0.5, 0.2]):
        args = (T(x, np.float32),) if fn is not in_condition else (T(x, np.float32), T([1.0, 20.0], np.float32))
        same(jf(*args), fn(*args))
