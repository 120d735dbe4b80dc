"""argmax / argmin with an axis out of range: an IndexError naming the function, before the axis
is used (it was shifted into a mask first: undefined behaviour that UBSan reports, issue 28)."""
import numpy as np
import pytest

import kiln
from kiln import ops


@pytest.mark.parametrize("fn", [ops.argmax, ops.argmin])
@pytest.mark.parametrize("axis", [2, 99, -3, -99, 64, 2**40, -2**63])
def test_out_of_range_axis_raises(fn, axis):
    x = kiln.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    with pytest.raises(IndexError, match=f"{fn.__name__}: axis .* is out of range"):
        fn(x, axis=axis)


@pytest.mark.parametrize("fn, ref", [(ops.argmax, np.argmax), (ops.argmin, np.argmin)])
def test_in_range_axes_match_numpy(fn, ref):
    a = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    for axis in (0, 1, 2, -1, -3):
        np.testing.assert_array_equal(fn(kiln.tensor(a), axis=axis).asnumpy(), ref(a, axis=axis))
    np.testing.assert_array_equal(fn(kiln.tensor(a)).asnumpy(), ref(a))
