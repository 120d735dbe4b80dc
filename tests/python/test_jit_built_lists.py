"""kiln.jit on functions that build a list from the lists passed in (a + b), change it and reduce it:
every call must use its own tensors, and `+=` on a list passed in must reach the caller, as eager."""
import warnings

import numpy as np
import pytest

import kiln

MODES = [("ast", "O0"), ("ast", "O1"), ("bytecode", "O0"), ("bytecode", "O1"), ("trace", "O0"), ("trace", "O1")]


def _call(jf, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return jf(*args)


def _t(v):
    return kiln.Tensor([v, -v])


@pytest.mark.parametrize("mode,level", MODES)
def test_sum_of_concatenated_then_appended_list(mode, level):
    def total(x, a, b):
        items = a + b
        items.append(x)
        return sum(items)

    jf = kiln.jit(total, capture_mode=mode, jit_level=level)
    for k in range(3):
        x, a, b = _t(10.0), [_t(float(k))], [_t(2.0 * k), _t(1.0)]
        np.testing.assert_allclose(_call(jf, x, a, b).asnumpy(), total(x, a, b).asnumpy())
        assert len(a) == 1 and len(b) == 2


@pytest.mark.parametrize("mode,level", MODES)
def test_in_place_add_on_a_list_passed_in(mode, level):
    def extend(x, history):
        history += [x * 2.0]
        return x + 1.0

    jf = kiln.jit(extend, capture_mode=mode, jit_level=level)
    got, want = [], []
    for k in range(3):
        x = _t(float(k))
        np.testing.assert_allclose(_call(jf, x, got).asnumpy(), extend(x, want).asnumpy())
    assert len(got) == 3
    np.testing.assert_allclose([t.asnumpy() for t in got], [t.asnumpy() for t in want])
