"""Python's // and % on tensors (kiln.ops.floor_divide / remainder, MindSpore's floor_div /
floor_mod): NumPy's results over float and integer dtypes, broadcasting, Python scalars on either
side, NaN, infinities, zero divisors and the most negative integer; remainder's gradient against
finite differences; every compiled variant (fused C included) equal to eager."""
import numpy as np
import pytest

import kiln
from kiln import ops
from conformance import run_all_modes

A = np.array([[5.5, -5.5, 3.0, -7.0], [1.0, 0.0, -0.0, 1e20], [np.nan, np.inf, -np.inf, -5.0]])
B = np.array([[2.0, 2.0, -2.0, 2.0], [0.1, 3.0, -3.0, 7.0], [1.0, 2.0, 2.0, np.inf]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_floats_match_numpy(dtype):
    a, b = A.astype(dtype), B.astype(dtype)
    with np.errstate(all="ignore"):
        want_q, want_r = np.floor_divide(a, b), np.remainder(a, b)
    got_q, got_r = (kiln.Tensor(a) // kiln.Tensor(b)).numpy(), (kiln.Tensor(a) % kiln.Tensor(b)).numpy()
    np.testing.assert_array_equal(got_q, want_q)
    np.testing.assert_array_equal(got_r, want_r)
    assert np.array_equal(np.signbit(got_q), np.signbit(want_q))  # -0.0 where NumPy has it


def test_zero_divisors_of_floats_give_numpys_inf_and_nan():
    a = np.array([1.0, -1.0, 0.0], np.float32)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal((kiln.Tensor(a) // 0.0).numpy(), np.floor_divide(a, np.float32(0)))
        np.testing.assert_array_equal((kiln.Tensor(a) % 0.0).numpy(), np.remainder(a, np.float32(0)))


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_integers_match_numpy(dtype):
    info = np.iinfo(dtype)
    a = np.array([7, -7, 9, -9, info.min, info.max, 0, 5], dtype)
    b = np.array([2, 2, -4, -4, -1, -1, 3, 0], dtype)
    with np.errstate(all="ignore"):
        want_q, want_r = np.floor_divide(a, b), np.remainder(a, b)
    q, r = kiln.Tensor(a) // kiln.Tensor(b), kiln.Tensor(a) % kiln.Tensor(b)
    assert q.dtype.name == np.dtype(dtype).name and r.dtype.name == np.dtype(dtype).name
    np.testing.assert_array_equal(q.numpy(), want_q)
    np.testing.assert_array_equal(r.numpy(), want_r)


def test_scalars_on_either_side_and_broadcasting():
    x = kiln.Tensor(np.array([[7, -7], [3, -3]], np.int32))
    np.testing.assert_array_equal((x // 2).numpy(), np.array([[3, -4], [1, -2]]))
    np.testing.assert_array_equal((17 % x).numpy(), 17 % np.array([[7, -7], [3, -3]]))
    assert (x // 2).dtype == kiln.int32 and (x % 2.5).dtype == kiln.float32
    np.testing.assert_allclose((x % 2.5).numpy(), np.remainder(np.array([[7, -7], [3, -3]], np.float32), 2.5))
    y = kiln.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3) - 2)
    np.testing.assert_array_equal(ops.floor_div(y, kiln.Tensor(np.array([1.5, -2.0, 4.0], np.float32))).numpy(),
                                  np.floor_divide(y.numpy(), np.array([1.5, -2.0, 4.0], np.float32)))
    z = y * 1
    z //= 2
    z %= 1.5
    np.testing.assert_allclose(z.numpy(), np.remainder(np.floor_divide(y.numpy(), 2), 1.5))


def test_remainder_gradient_by_finite_differences():
    a = np.array([5.3, -2.7, 0.4, 7.9], np.float64)
    b = np.array([2.1, 1.3, -0.9, 2.5], np.float64)
    ga, gb = kiln.grad(lambda x, y: (ops.remainder(x, y) * kiln.Tensor(np.arange(1.0, 5.0))).sum(), (0, 1))(
        kiln.Tensor(a), kiln.Tensor(b))
    w, eps = np.arange(1.0, 5.0), 1e-6
    f = lambda x, y: (np.remainder(x, y) * w).sum()  # noqa: E731
    num_a = [(f(a + eps * e, b) - f(a - eps * e, b)) / (2 * eps) for e in np.eye(4)]
    num_b = [(f(a, b + eps * e) - f(a, b - eps * e)) / (2 * eps) for e in np.eye(4)]
    np.testing.assert_allclose(ga.numpy(), num_a, rtol=1e-5)
    np.testing.assert_allclose(gb.numpy(), num_b, rtol=1e-5)


def test_compiled_variants_agree_with_eager():
    def f(x, y, i):
        return (x // y) * 0.5 + x % y, (x * 3.0) // 0.7, i // 3, i % -3, (x - 1.0) % 2.0

    xs = kiln.Tensor(np.linspace(-6, 6, 12, dtype=np.float32).reshape(3, 4))
    ys = kiln.Tensor(np.array([1.5, -2.0, 0.3, 4.0], np.float32))
    ints = kiln.Tensor(np.arange(-6, 6, dtype=np.int64))
    run_all_modes(f, (xs, ys, ints), (xs * -1.3, ys, ints * 7))


def divmods(a, b):
    q, r = divmod(a, b)
    q2, r2 = divmod(a, 3)  # a Python number on the right
    q3, r3 = divmod(7.5, b)  # and on the left (Tensor.__rdivmod__)
    return q, r, q2 + r2, q3 * r3


def test_divmod_is_floor_divide_and_remainder_in_every_variant():
    a, b = kiln.Tensor(A[:2].astype(np.float32)), kiln.Tensor(B[:2].astype(np.float32))
    q, r = divmod(a, b)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(q.numpy(), np.floor_divide(A[:2].astype(np.float32), B[:2].astype(np.float32)))
        np.testing.assert_array_equal(r.numpy(), np.remainder(A[:2].astype(np.float32), B[:2].astype(np.float32)))
        np.testing.assert_array_equal(divmod(7.5, b)[1].numpy(), np.remainder(np.float32(7.5), B[:2].astype(np.float32)))
    run_all_modes(divmods, (a, b))
