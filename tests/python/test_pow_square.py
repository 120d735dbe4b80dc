"""x ** 2 is computed as x * x (as NumPy does): bitwise NumPy's x ** 2 for float32 and float64,
eagerly and in every compiled variant (fused or not), gradients included; other exponents still
go through pow."""
import numpy as np
import pytest

import kiln
from compiled_equal import assert_compiled_equal


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_square_is_bitwise_numpys(dtype):
    x = np.random.default_rng(1).standard_normal(4097).astype(dtype) * 37
    got = (kiln.Tensor(x) ** 2).asnumpy()
    assert np.array_equal(got, x ** 2) and np.array_equal(got, x * x)
    base = np.abs(x) + 0.5
    np.testing.assert_allclose((kiln.Tensor(base) ** 2.5).asnumpy(), base ** 2.5, rtol=1e-6 if dtype == np.float32 else 1e-13)


def sum_of_squares(x, y):
    return (x ** 2).sum() + ((x * y + 1) ** 2).mean() + (y ** 3).sum()


def test_compiled_squares_equal_eager_with_gradients():
    rng = np.random.default_rng(2)
    args = (kiln.Tensor(rng.standard_normal((6, 5)).astype(np.float32)),
            kiln.Tensor(rng.standard_normal((6, 5)).astype(np.float32)))
    assert_compiled_equal(sum_of_squares, args, grad=True)
