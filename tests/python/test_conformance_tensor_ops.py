"""Conformance: tensor operators and methods as Python spells them -- %, //, ** and reflected
operators with Python scalars, in-place operators and methods, integer and boolean tensors, dtype
promotion with Python scalars, indexing and views -- compiled agree with eager (values and dtypes)."""
import functools

import numpy as np

import pytest

import kiln
from conformance import Call, rand, run_all_modes, t


def ints(*values):
    return kiln.Tensor(np.array(values, np.int64))


def test_mod_floordiv_pow_with_negative_values():
    def f(x, y):
        return x % y, x // y, x % 2.5, -7.0 // y, x ** 2, 2 ** y

    run_all_modes(f, (t(5.5, -5.5, 3.0), t(2.0, 2.0, -2.0)), (t(-1.0, 7.0, 0.5), t(3.0, -3.0, 0.25)))


def test_integer_tensor_arithmetic():
    def f(a, b):
        return a % b, a // b, a * 3 - b, (a + b) / 2, -a, abs(a - 10)

    run_all_modes(f, (ints(7, -7, 9), ints(2, 2, -4)), (ints(-3, 5, 8), ints(3, -2, 5)))


def test_dtype_promotion_with_python_scalars():
    def f(x, i, b):
        return (kiln.ops.mul(2, x), i * 2.5, i + 1, b & (i > 0), x + True, i * x)

    run_all_modes(f, (t(1.5, 2.0), ints(1, -2), kiln.Tensor(np.array([True, False]))),
                  (t(-1.5, 0.5), ints(3, 4), kiln.Tensor(np.array([True, True]))))


def test_in_place_operators_and_methods():
    def f(x, y):
        z = x * 1
        z += y
        z *= 2
        z -= 1
        z.add_(y)
        z.mul_(0.5)
        return z, x

    run_all_modes(f, (rand(3), rand(3, seed=1)), (rand(3, seed=2), rand(3, seed=3)), (rand(5), rand(5, seed=1)))


def test_indexing_views_and_setitem_on_a_local():
    def f(x):
        y = x.clone() if hasattr(x, "clone") else x * 1
        y[0] = y[1] * 2
        y[:, 1] = -1.0
        return y, x[1:, ::2], x[..., -1], x.transpose(1, 0)[0], x.reshape(-1)[::3]

    run_all_modes(f, (rand(3, 4),), (rand(3, 4, seed=1),), (rand(5, 4),))


def test_comparisons_and_where_with_scalars():
    def f(x):
        m = (x > 0) == (x < 1)
        return kiln.ops.where(m, x, 0.0), m, (x != 0.5).sum(), x.max(axis=0), x.argmax(axis=-1)

    run_all_modes(f, (rand(2, 3),), (rand(2, 3, seed=1),), (rand(4, 3),))


def _logged(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        out = fn(*args)
        return out
    return wrapper


@_logged
def _helper(x, y):
    return x // y, x % y


def test_new_ops_through_a_decorated_helper_into_a_mutated_list():
    """This stop's additions (//, %, in-place methods, topk, tile, a primitive) used from a
    functools.wraps-decorated helper, with results appended to the caller's list in place."""
    add = kiln.ops.Add()

    def f(x, y, out):
        q, r = _helper(x, y)
        z = x * 1
        z.add_(r, alpha=0.5)
        v, i = kiln.ops.topk(z, 2)
        out.append(add(q, kiln.ops.tile(v.sum(-1, keepdims=True), (1, 3))))
        out[0] = i
        return z, len(out)

    run_all_modes(f, Call((t(5.5, -5.5, 3.0), t(2.0, 2.0, -2.0), [None])),
                  Call((t(-1.0, 7.0, 0.5), t(3.0, -3.0, 0.25), [None, None])))


def test_bool_xor_and_integer_negative_power():
    """bool ^ bool (and with a Python bool) is a logical xor in every mode; an integer tensor to a
    negative Python int power is refused eagerly and compiled (NumPy and PyTorch refuse it: the
    result is not an integer); ^ between integer tensors is the bitwise xor (test_bitwise_ops.py)."""
    def xor(x, y):
        m, n = x > 0, y > 0
        return m ^ n, m ^ True, False ^ n, (m ^ n).sum()

    run_all_modes(xor, (t(1.0, -1.0, 2.0), t(1.0, 1.0, -2.0)), (t(-1.0, -1.0, 3.0), t(0.5, -1.0, 2.0)))
    run_all_modes(lambda a: a ** -1, (ints(2, 3, 4),), raises=True)
    run_all_modes(lambda a: a ^ (a >> 1), (ints(2, 3, 4),))
    assert (ints(2, 3, 4) ^ (ints(2, 3, 4) >> 1)).asnumpy().tolist() == [3, 2, 6]
    with pytest.raises(ValueError, match=r"pow: an integer tensor \(int64 \(3,\)\) to a negative integer power"):
        ints(2, 3, 4) ** -2
    assert (ints(2, 3, 4) ** 0).asnumpy().tolist() == [1, 1, 1]


def test_several_index_tensors_compile_and_check_bounds_in_the_graph():
    """x[rows, cols] and x[rows, cols] = v with index tensors (picking each row's target: the NLL
    pattern) agree with eager in every mode, compile into the graph (no read of the indices sending
    the call eager), and an out-of-range index still raises IndexError when the graph runs."""
    x = kiln.Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))

    def pick(x, rows, cols):
        return x[rows, cols] * 2.0, -x[rows, cols].sum()

    def put(x, rows, cols):
        y = x * 1.0
        y[rows, cols] = -1.0
        return y

    good = (x, ints(0, 2, -1), ints(1, -4, 3))
    run_all_modes(pick, good, (x, ints(1, 1, 0), ints(0, 3, -1)))
    run_all_modes(put, good, (x, ints(1, 1, 0), ints(0, 3, -1)))
    for mode in ("ast", "bytecode", "trace"):
        for fn in (pick, put):
            jf = kiln.jit(fn, capture_mode=mode)
            jf(*good)
            jf(*good)
            info = jf.cache_info()
            # (bytecode entries live with the code: run_all_modes may have compiled them already)
            assert info.compiles <= 1 and info.hits >= 1 and info.eager_calls == 0, (mode, fn.__name__, info)
            for bad in (ints(0, 5, 1), ints(0, -5, 1)):
                with pytest.raises(IndexError, match="out of range"):
                    jf(x, ints(0, 1, 1), bad)
    with pytest.raises(IndexError, match="out of bounds for axis 1 with size 4"):
        pick(x, ints(0, 1), ints(0, 7))


def test_adding_a_zero_keeps_the_sign_of_zero_as_eager():
    """-0.0 + 0.0 is +0.0 (IEEE), so x + 0.0 is not x: O1's simplification once dropped the add and
    handed out -0.0 (seen as 1/result: -inf instead of inf). x + -0.0 and x - 0.0 are x."""
    zeros = kiln.ops.zeros((3,))

    def f(x):
        return (1.0 / (x + 0.0), 1.0 / (0.0 + x), 1.0 / (x - (-0.0)), 1.0 / (x + zeros), 1.0 / (x + -0.0),
                1.0 / (x - 0.0), 1.0 / (x * 1.0), 1.0 / (x + kiln.ops.zeros_like(x)))

    from conformance import TRACE_VARIANTS, VARIANTS
    run_all_modes(f, (t(-0.0, 0.0, 1.0),), (t(0.0, -0.0, -2.0),), (t(-0.0, -0.0, -0.0),),
                  variants=VARIANTS + TRACE_VARIANTS)
