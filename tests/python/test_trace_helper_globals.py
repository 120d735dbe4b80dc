"""kiln.trace keeps the tensors the function reached when it traced: a global rebound to another
tensor between calls is a TraceMismatchError, also when only a helper the traced function calls
reads it (it used to replay the old tensor silently). Every variant of kiln.trace."""
import numpy as np
import pytest

import kiln
from kiln import TraceMismatchError, trace

W = kiln.Tensor(np.full(3, 2.0, np.float32))


def scale(a):
    return a * W


def outer(x, v):
    return scale(x) * v


def nested_helper(x):
    return outer(x, x) + 1


VARIANTS = [dict(symbolic=s, opt_level=lv) for s in (False, True) for lv in (0, 2)]


@pytest.mark.parametrize("options", VARIANTS, ids=lambda o: f"symbolic={o['symbolic']}-O{o['opt_level']}")
@pytest.mark.parametrize("fn,args", [(outer, 2), (nested_helper, 1)], ids=["helper", "helper-of-helper"])
def test_global_rebound_in_a_helper_is_a_mismatch(options, fn, args):
    global W
    old = W
    t = trace(fn, **options)
    x = [kiln.Tensor(np.arange(3, dtype=np.float32) + k) for k in range(args)]
    try:
        for _ in range(3):
            np.testing.assert_array_equal(t(*x).asnumpy(), fn(*x).asnumpy())
        W = kiln.Tensor(np.full(3, 5.0, np.float32))
        with pytest.raises(TraceMismatchError, match="global 'W' .*read by scale.* different tensor"):
            t(*x)
    finally:
        W = old


def test_a_helper_global_updated_in_place_is_read_again():
    t = trace(outer)
    x, v = kiln.Tensor(np.ones(3, np.float32)), kiln.Tensor(np.ones(3, np.float32))
    t(x, v)
    t(x, v)
    old = W.asnumpy().copy()
    try:
        W[...] = 7.0  # the same tensor, a new value: the graph reads it
        np.testing.assert_array_equal(t(x, v).asnumpy(), np.full(3, 7.0, np.float32))
    finally:
        W[...] = kiln.Tensor(old)
