"""flip, roll, tril, triu, pad, one_hot, masked_fill, where with numbers, bmm, einsum, norm,
gather_nd, scatter, amin/amax, nonzero, unique and isin: NumPy's values over dtypes, shapes and
layouts, finite-difference gradients, clear errors, every compiled variant equal to eager (forward
and value_and_grad), symbolic sizes kept where the parts keep them, and PyTorch's values when torch
is importable."""
import math

import numpy as np
import pytest

import kiln
from kiln import ops
from compiled_equal import assert_compiled_equal, assert_never_compiled_silently
from conftest import check_grad

RNG = np.random.default_rng(7)
DTYPES = [np.float32, np.float64, np.int32, np.int64]


def T(a):
    return kiln.Tensor(np.asarray(a))


def transposed(a):
    """a as a non-contiguous kiln tensor (the transpose of a contiguous one)."""
    t = kiln.Tensor(np.ascontiguousarray(np.swapaxes(a, -1, -2)))
    t = t.swapaxes(-1, -2)
    assert not t.is_contiguous()
    return t


def values(shape, dtype):
    a = RNG.standard_normal(shape) * 4
    return a.astype(dtype)


# (name, kiln function, NumPy reference), each applied to one array
UNARY_TABLE = [
    ("flip_0", lambda x: ops.flip(x, 0), lambda a: np.flip(a, 0)),
    ("flip_all", lambda x: ops.flip(x, (0, -1)), lambda a: np.flip(a, (0, -1))),
    ("roll_dims", lambda x: ops.roll(x, (1, -5), (0, 1)), lambda a: np.roll(a, (1, -5), (0, 1))),
    ("roll_flat", lambda x: ops.roll(x, 7), lambda a: np.roll(a, 7)),
    ("tril", lambda x: ops.tril(x), np.tril),
    ("tril_-1", lambda x: ops.tril(x, -1), lambda a: np.tril(a, -1)),
    ("triu_2", lambda x: ops.triu(x, 2), lambda a: np.triu(a, 2)),
    ("triu_-3", lambda x: ops.triu(x, -3), lambda a: np.triu(a, -3)),
    ("pad_constant", lambda x: ops.pad(x, (1, 2, 0, 1), value=5), lambda a: np.pad(a, ((0, 1), (1, 2)),
                                                                                   constant_values=5)),
    ("pad_zero_default", lambda x: ops.pad(x, (2, 0)), lambda a: np.pad(a, ((0, 0), (2, 0)))),
    ("pad_reflect", lambda x: ops.pad(x, (2, 1, 1, 2), "reflect"), lambda a: np.pad(a, ((1, 2), (2, 1)), "reflect")),
    ("pad_replicate", lambda x: ops.pad(x, (3, 1, 2, 0), "replicate"), lambda a: np.pad(a, ((2, 0), (3, 1)), "edge")),
    ("pad_circular", lambda x: ops.pad(x, (1, 3), "circular"), lambda a: np.pad(a, ((0, 0), (1, 3)), "wrap")),
    ("pad_crop", lambda x: ops.pad(x, (-1, 2, 1, -2)), lambda a: np.pad(a[:-2, 1:], ((1, 0), (0, 2)))),
    ("amax_axes", lambda x: ops.amax(x, (0, 1)), lambda a: np.max(a, (0, 1))),
    ("amin_keep", lambda x: ops.amin(x, (1,), True), lambda a: np.min(a, (1,), keepdims=True)),
    ("masked_fill", lambda x: ops.masked_fill(x, T([True, False, False, True, False]), 3),
     lambda a: np.where([True, False, False, True, False], 3, a).astype(a.dtype)),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name,fn,ref", UNARY_TABLE, ids=[r[0] for r in UNARY_TABLE])
def test_matches_numpy_over_dtypes_and_layouts(name, fn, ref, dtype):
    a = values((4, 5), dtype)
    for x in (kiln.Tensor(a), transposed(a)):
        got = fn(x)
        want = ref(a)
        assert got.dtype.name == np.dtype(want.dtype).name, (got.dtype, want.dtype)
        np.testing.assert_array_equal(got.numpy(), want)


def test_batched_shapes_and_bool():
    a = values((2, 3, 4), np.float32)
    np.testing.assert_array_equal(ops.tril(T(a), 1).numpy(), np.tril(a, 1))
    np.testing.assert_array_equal(ops.triu(T(a)).numpy(), np.triu(a))
    b = a > 0
    np.testing.assert_array_equal(ops.flip(T(b), (1, 2)).numpy(), np.flip(b, (1, 2)))
    np.testing.assert_array_equal(ops.roll(T(b), -2, 2).numpy(), np.roll(b, -2, 2))
    np.testing.assert_array_equal(ops.pad(T(a), (1, 1, 1, 1, 1, 1), "replicate").numpy(), np.pad(a, 1, "edge"))
    np.testing.assert_array_equal(ops.flip(T(np.float32(3.0)), ()).numpy(), np.float32(3.0))


def test_tril_zeroes_nan_and_inf_outside_the_band():
    a = np.array([[1.0, np.nan], [np.inf, 2.0]], np.float32)
    np.testing.assert_array_equal(ops.tril(T(a)).numpy(), [[1.0, 0.0], [np.inf, 2.0]])
    np.testing.assert_array_equal(ops.triu(T(a)).numpy(), [[1.0, np.nan], [0.0, 2.0]])


def test_one_hot():
    idx = np.array([[0, 2, 1], [3, -1, 2]])
    got = ops.one_hot(T(idx), 3)
    want = np.array([[[1 if i == k else 0 for k in range(3)] for i in row] for row in idx])
    assert got.dtype is kiln.int64
    np.testing.assert_array_equal(got.numpy(), want)  # 3 and -1 are outside [0, 3): rows of off_value
    got = ops.one_hot(T(idx.astype(np.int32)), 4, 2.5, -1.0, axis=0)
    assert got.dtype is kiln.float32 and tuple(got.shape) == (4, 2, 3)
    want = np.where(np.arange(4)[:, None, None] == idx[None], 2.5, -1.0)
    np.testing.assert_array_equal(got.numpy(), want)
    got = ops.one_hot(T(idx), 3, T(np.float64(1.0)), T(np.float64(0.0)), 1)
    assert got.dtype is kiln.float64 and tuple(got.shape) == (2, 3, 3)


def test_masked_fill_broadcast_and_tensor_value():
    a = values((3, 4), np.float32)
    mask = np.array([[True], [False], [True]])
    got = ops.masked_fill(T(a), T(mask), T(np.float32(-7.0)))
    np.testing.assert_array_equal(got.numpy(), np.where(mask, np.float32(-7.0), a))


def test_where_with_python_numbers_promotes_like_numpy():
    cond = T(np.array([True, False, True]))
    i = T(np.array([1, 2, 3]))
    # a float beside an integer tensor is a float result, never truncated to the tensor's dtype
    for got in (ops.where(cond, 0.5, i), ops.where(ops.logical_not(cond), i, 0.5)):
        assert got.dtype is kiln.float32
    np.testing.assert_array_equal(ops.where(cond, 0.5, i).numpy(), [0.5, 2.0, 0.5])
    np.testing.assert_array_equal(ops.where(cond, i, 0.5).numpy(), [1.0, 0.5, 3.0])
    assert ops.where(cond, i, 7).dtype is kiln.int64
    assert ops.where(cond, T(np.array([1, 2, 3], np.int32)), 7).dtype is kiln.int32
    assert ops.where(cond, T(np.ones(3, np.float64)), 2).dtype is kiln.float64
    assert ops.where(cond, 1, 2.5).dtype is kiln.float32
    np.testing.assert_array_equal(ops.where(cond, True, False).numpy(), [True, False, True])
    assert ops.where(cond, cond, 3).dtype is kiln.int64
    assert ops.where(cond, 2**60 + 1, i).numpy()[0] == 2**60 + 1  # ints stay exact (no float on the way)
    assert ops.where(cond, np.float64(0.5), i).dtype is kiln.float64  # a NumPy scalar is not weak
    f64 = T(np.array([1.0, 2.0, 3.0]))
    assert ops.where(cond, 0.1, f64).numpy()[0] == 0.1 and ops.where(cond, f64, 0.1).numpy()[1] == 0.1  # one rounding
    with pytest.raises(ValueError, match="where: the number 1099511627776 is out of range for the tensor's dtype int32"):
        ops.where(cond, 2**40, T(np.array([1, 2, 3], np.int32)))


def test_bmm_and_einsum_match_numpy():
    a, b, c = values((2, 3, 4), np.float64), values((2, 4, 5), np.float64), values((5, 6), np.float64)
    np.testing.assert_allclose(ops.bmm(T(a), T(b)).numpy(), a @ b, rtol=1e-12)
    cases = [("bij,bjk->bik", (a, b)), ("bij,bjk,kl->bil", (a, b, c)), ("bij->jb", (a,)), ("ij,ij->", (a[0], a[1])),
             ("...ij,...jk", (a, b)), ("bij,kl->bijkl", (a, c)), ("i,j->ij", (a[0, 0], c[0])), ("bij,bjk", (a, b)),
             ("ijk", (a,)), ("...j->...", (a,)), ("bij,bkj->bik", (a, a)), (" b i j , b j k -> k i ", (a, b)),
             ("ij,jk->", (c, c.T)), ("bhqd,bhkd->bhqk", (values((2, 2, 3, 4), np.float64),
                                                          values((2, 2, 5, 4), np.float64)))]
    for eq, arrays in cases:
        np.testing.assert_allclose(ops.einsum(eq, *[T(x) for x in arrays]).numpy(), np.einsum(eq, *arrays),
                                   rtol=1e-12, atol=1e-12, err_msg=eq)
    np.testing.assert_allclose(ops.einsum("ij,jk", [T(c), T(c.T)]).numpy(), c @ c.T, rtol=1e-12)
    sq, bsq = values((3, 3), np.float64), values((2, 3, 3), np.float64)
    for eq, arrays in [("ii->i", (sq,)), ("ii", (sq,)), ("bii->b", (bsq,)), ("...ii->...i", (bsq,)),
                       ("ii,ij->j", (sq, values((3, 4), np.float64))), ("bij,bjj->bi", (bsq, bsq))]:
        np.testing.assert_allclose(ops.einsum(eq, *[T(x) for x in arrays]).numpy(), np.einsum(eq, *arrays),
                                   rtol=1e-12, atol=1e-12, err_msg=eq)
    sq[0, 1], sq[2, 0] = np.inf, np.nan  # off the diagonal: not part of the trace
    np.testing.assert_allclose(ops.einsum("ii", T(sq)).numpy(), np.trace(sq), rtol=1e-12)


@pytest.mark.parametrize("ord_", [None, 1, 2, 3, 0.5, 0, math.inf, -math.inf])
def test_vector_norms_match_numpy(ord_):
    a = values((3, 4), np.float64)
    np.testing.assert_allclose(ops.norm(T(a[0]), ord_).numpy(), np.linalg.norm(a[0], ord_), rtol=1e-12)
    np.testing.assert_allclose(ops.norm(T(a), ord_, dim=1).numpy(), np.linalg.norm(a, ord_, axis=1), rtol=1e-12)
    np.testing.assert_allclose(ops.norm(T(a), ord_, dim=-2, keepdim=True).numpy(),
                               np.linalg.norm(a, ord_, axis=-2, keepdims=True), rtol=1e-12)


@pytest.mark.parametrize("ord_", [None, "fro", 1, -1, math.inf, -math.inf])
def test_matrix_norms_match_numpy(ord_):
    a = values((2, 3, 4), np.float32)
    np.testing.assert_allclose(ops.norm(T(a), ord_, dim=(1, 2)).numpy(), np.linalg.norm(a, ord_, axis=(1, 2)),
                               rtol=1e-5)
    np.testing.assert_allclose(ops.norm(T(a[0]), ord_).numpy(), np.linalg.norm(a[0], ord_), rtol=1e-5)
    np.testing.assert_allclose(ops.norm(T(a)).numpy(), np.linalg.norm(a.ravel()), rtol=1e-5)


def test_gather_nd_matches_numpy_and_checks_bounds():
    a = values((2, 3, 4), np.float32)
    idx = np.array([[[0, 1], [1, -1]], [[1, 0], [0, 2]]])
    np.testing.assert_array_equal(ops.gather_nd(T(a), T(idx)).numpy(), a[idx[..., 0], idx[..., 1]])
    full = np.array([[1, 2, 3], [0, 0, -4]], np.int32)
    np.testing.assert_array_equal(ops.gather_nd(T(a), T(full)).numpy(), a[full[:, 0], full[:, 1], full[:, 2]])
    with pytest.raises(IndexError, match="gather_nd: an index in coordinate 1 is out of bounds for axis 1"):
        ops.gather_nd(T(a), T([[0, 3]]))
    with pytest.raises(IndexError, match="coordinate 0"):
        ops.gather_nd(T(a), T([[-3, 0]]))


def _scatter_reference(a, axis, idx, src):
    out = a.copy()
    for pos in np.ndindex(*idx.shape):
        target = list(pos)
        target[axis] = idx[pos]
        out[tuple(target)] = src[pos]
    return out


def test_scatter_matches_a_loop_and_refuses_repeated_positions():
    a = values((3, 4), np.float32)
    idx = np.array([[2, 0, 1, 1], [0, 1, 2, 0]])
    src = values((3, 5), np.float32)  # larger than index: its leading part is used
    for axis in (0, 1):
        i = idx if axis == 0 else np.array([[3, 0, 1], [2, 1, 0], [0, 2, 3]])
        got = ops.scatter(T(a), axis, T(i), T(src))
        np.testing.assert_array_equal(got.numpy(), _scatter_reference(a, axis, i, src))
    got = ops.scatter(T(a), 1, T(np.array([[1], [0], [-1]])), 9.0)
    np.testing.assert_array_equal(got.numpy(), _scatter_reference(a, 1, np.array([[1], [0], [3]]),
                                                                  np.full((3, 1), 9.0, np.float32)))
    with pytest.raises(ValueError, match="scatter: index names one position of input more than once"):
        ops.scatter(T(a), 1, T(np.array([[1, 1], [0, 2], [3, 2]])), T(src))


def test_nonzero_unique_isin_eagerly():
    a = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]], np.float32)
    np.testing.assert_array_equal(ops.nonzero(T(a)).numpy(), np.argwhere(a))
    assert ops.nonzero(T(a)).dtype is kiln.int64
    for got, want in zip(ops.nonzero(T(a), as_tuple=True), np.nonzero(a)):
        np.testing.assert_array_equal(got.numpy(), want)
    assert tuple(ops.nonzero(T(np.zeros((2, 2)))).shape) == (0, 2)
    v = np.array([3, 1, 3, 2, 1, 3])
    u, inv, cnt = ops.unique(T(v), return_inverse=True, return_counts=True)
    wu, winv, wcnt = np.unique(v, return_inverse=True, return_counts=True)
    for g, w in ((u, wu), (inv, winv), (cnt, wcnt)):
        np.testing.assert_array_equal(g.numpy(), w)
    np.testing.assert_array_equal(ops.unique(T(a)).numpy(), np.unique(a))
    np.testing.assert_array_equal(ops.isin(T(a), T([1.5, -1.0])).numpy(), np.isin(a, [1.5, -1.0]))
    np.testing.assert_array_equal(ops.isin(T(v), T([3]), invert=True).numpy(), np.isin(v, [3], invert=True))


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_value_dependent_sizes_are_never_compiled_silently(mode):
    """A graph's sizes are fixed at capture: nonzero / unique under kiln.jit either raise an error
    naming the op, or (ast mode) run the function eagerly with a warning naming it."""
    inputs = (T(np.array([1.0, -1.0, 2.0])), T(np.array([3.0, 3.0, -1.0, 5.0])))
    for op, fn in (("nonzero", lambda x: ops.nonzero(x > 0) + 1), ("unique", lambda x: ops.unique(x) * 2)):
        assert_never_compiled_silently(op, fn, mode, inputs)


def test_bad_arguments_raise_clear_errors():
    x = T(values((3, 4), np.float32))
    cases = [
        (lambda: ops.flip(x, (0, 0)), ValueError, "flip: dims"),
        (lambda: ops.flip(x, 2), (IndexError, ValueError), "flip"),
        (lambda: ops.roll(x, (1, 2), 0), ValueError, "roll: 2 shifts for 1 dims"),
        (lambda: ops.roll(x, 1.5, 0), TypeError, "roll: shifts"),
        (lambda: ops.tril(T([1.0, 2.0])), ValueError, "tril: input must have at least 2 dimensions"),
        (lambda: ops.triu(x, 0.5), TypeError, "triu: diagonal"),
        (lambda: ops.pad(x, (1,)), TypeError, "pad: padding must be a tuple of ints of even length"),
        (lambda: ops.pad(x, (1, 1, 1, 1, 1, 1)), ValueError, "pad: padding"),
        (lambda: ops.pad(x, (4, 0), "reflect"), ValueError, "pad: reflect padding"),
        (lambda: ops.pad(x, (1, 1), "wrap"), ValueError, "pad: mode must be one of"),
        (lambda: ops.pad(x, (1, 1), "reflect", 2.0), ValueError, "pad: value is for mode 'constant' only"),
        (lambda: ops.pad(x, (-3, -2)), ValueError, "pad: negative padding"),
        (lambda: ops.one_hot(x, 3), TypeError, "one_hot: indices must be an integer tensor"),
        (lambda: ops.one_hot(T([1]), -1), ValueError, "one_hot: depth"),
        (lambda: ops.masked_fill(x, x, 1.0), TypeError, "masked_fill: mask must be bool"),
        (lambda: ops.masked_fill(x, T([True, False]), 1.0), ValueError, "masked_fill: mask of shape \\[2\\]"),
        (lambda: ops.masked_fill(T([1, 2]), T([True, False]), 0.5), TypeError, "masked_fill: a float value"),
        (lambda: ops.bmm(x, x), ValueError, "bmm: expected \\(B, N, M\\) and \\(B, M, P\\)"),
        (lambda: ops.einsum("ij,jk->ik", x, x), ValueError, "einsum: 'ij,jk->ik': subscript 'j' is 4"),
        (lambda: ops.einsum("ii->i", T(np.ones((3, 4)))), ValueError,
         "einsum: 'ii->i': subscript 'i' repeats over axes of sizes 3 and 4"),
        (lambda: ops.einsum("ij->ik", x), ValueError, "einsum: output subscripts \\['k'\\]"),
        (lambda: ops.einsum("ij,j", x), ValueError, "einsum: 'ij,j' has 2 operands, 1 given"),
        (lambda: ops.einsum("i2", x), ValueError, "einsum: .*subscripts must be letters"),
        (lambda: ops.einsum("ijk", x), ValueError, "einsum: 'ijk' names 3 dimensions"),
        (lambda: ops.norm(x, 2, dim=(0, 1)), NotImplementedError, "norm: matrix ord=2 needs singular values"),
        (lambda: ops.norm(T([1, 2])), TypeError, "norm: input must be floating point"),
        (lambda: ops.norm(x, "nuc", dim=1), ValueError, "norm: unsupported ord 'nuc'"),
        (lambda: ops.gather_nd(x, T([[0, 0, 0]])), ValueError, "gather_nd: the last axis of indices"),
        (lambda: ops.gather_nd(x, x), TypeError, "gather_nd: indices must be int32 or int64"),
        (lambda: ops.scatter(x, 0, T([0, 1]), x), ValueError, "scatter: index \\(shape \\[2\\]\\)"),
        (lambda: ops.scatter(x, 0, T([[0, 1, 2, 0, 1]]), x), ValueError, "scatter: src \\(shape \\[3, 4\\]\\)"),
        (lambda: ops.unique(x, dim=0), NotImplementedError, "unique: dim=0 is not supported"),
    ]
    for call, exc, message in cases:
        with pytest.raises(exc, match=message):
            call()


# ---- gradients ---------------------------------------------------------------------------------

GRAD_TABLE = [
    ("flip", lambda x: ops.flip(x, (0, 1))),
    ("roll", lambda x: ops.roll(x, (2, -1), (1, 0))),
    ("tril", lambda x: ops.tril(x, 1)),
    ("triu", lambda x: ops.triu(x, -1)),
    ("pad_constant", lambda x: ops.pad(x, (1, 2, 2, 0), value=1.5)),
    ("pad_reflect", lambda x: ops.pad(x, (2, 2, 1, 1), "reflect")),
    ("pad_replicate", lambda x: ops.pad(x, (3, 1), "replicate")),
    ("pad_circular", lambda x: ops.pad(x, (1, 2, 2, 1), "circular")),
    ("masked_fill", lambda x: ops.masked_fill(x, x > 0.5, 2.0)),
    ("where_number", lambda x: ops.where(x > 0, x * x, 0.25)),
    ("norm_2", lambda x: ops.norm(x, dim=1)),
    ("norm_1", lambda x: ops.norm(x, 1, dim=0)),
    ("norm_3", lambda x: ops.norm(ops.reshape(x, -1), 3)),
    ("norm_inf", lambda x: ops.norm(x, math.inf, dim=1)),
    ("norm_fro", lambda x: ops.norm(x, "fro")),
    ("norm_matrix_1", lambda x: ops.norm(x, 1, dim=(0, 1))),
    ("einsum", lambda x: ops.einsum("ij,kj->ik", x, x * 2.0)),
    ("einsum_diagonal", lambda x: ops.einsum("ii,ij->j", x[:, :4], x)),
    ("bmm", lambda x: ops.bmm(ops.reshape(x, 1, 4, 5), ops.reshape(x, 1, 5, 4))),
    ("gather_nd", lambda x: ops.gather_nd(x, T([[1, 2], [3, -1], [1, 2]]))),
    ("amax", lambda x: ops.amax(x, (0, 1))),
]


@pytest.mark.parametrize("name,fn", GRAD_TABLE, ids=[g[0] for g in GRAD_TABLE])
def test_gradients_match_finite_differences(name, fn):
    # distinct values away from 0 and 0.5: no ties for max, no kinks of |x| or of masks
    a = (RNG.permutation(20).reshape(4, 5) * 0.13 + 0.07) * RNG.choice([-1.0, 1.0], (4, 5))
    a[np.abs(a - 0.5) < 0.05] += 0.1
    check_grad(fn, a)


def test_scatter_gradient_reaches_input_and_src():
    idx = T(np.array([[2, 0, 1], [0, 1, 2]]))
    check_grad(lambda x, s: ops.scatter(x, 0, idx, s), values((3, 3), np.float64), values((2, 4), np.float64))


def test_norm_gradient_at_zero_is_zero():
    g = kiln.grad(lambda v: ops.norm(v) + ops.norm(v, 3))(T(np.zeros(3, np.float32)))
    np.testing.assert_array_equal(g.numpy(), np.zeros(3))


# ---- compiled ----------------------------------------------------------------------------------


def _shape_ops(x):
    return (ops.flip(x, 1), ops.roll(x, (1, 3), (0, 1)), ops.tril(x, -1) + ops.triu(x, 1),
            ops.pad(x, (1, 2, 1, 0), "reflect"), ops.pad(x, (2, 1), "replicate") * 2.0, ops.pad(x, (1, 1), value=-1.0),
            ops.pad(x, (1, 2), "circular"), ops.masked_fill(x, x > 0, 0.0), ops.where(x > 0, 1.0, x),
            ops.amax(x, (0, 1)), x.repeat_interleave(2, 0))


def _products(x, idx):
    return (ops.einsum("ij,kj->ik", x, x), ops.einsum("bi,bj->bij", x, x), ops.einsum("ii->i", x[:, :4]), ops.bmm(ops.reshape(x, 2, 2, 5), ops.reshape(x, 2, 5, 2)),
            ops.norm(x, dim=1), ops.norm(x, 1), ops.norm(x, math.inf, dim=0), ops.norm(x, "fro"),
            ops.gather_nd(x, idx), ops.one_hot(idx[:, 0], 4, 1.0, 0.0), ops.isin(idx, T([0, 3])))


def test_compiled_variants_equal_eager():
    x1, x2 = T(values((4, 5), np.float32)), T(values((4, 5), np.float32))
    i1, i2 = T(np.array([[0, 1], [3, -1]])), T(np.array([[2, 3], [1, 0]]))
    assert_compiled_equal(_shape_ops, (x1,), (x2,))
    assert_compiled_equal(_products, (x1, i1), (x2, i2))
    assert_compiled_equal(lambda x, i: ops.scatter(x, 1, i, x * 3.0), (x1, i1), (x2, i2))


def test_compiled_gradients_equal_eager():
    x1, x2 = T(values((4, 5), np.float32)), T(values((4, 5), np.float32))

    def loss(x):
        y = ops.pad(ops.flip(ops.tril(x), 0), (1, 1, 1, 1), "reflect")
        z = ops.einsum("ij,ik->jk", ops.roll(x, 2, 1), ops.masked_fill(x, x > 1.0, 0.5))
        return (y * y).sum() + z.sum() + ops.norm(x, dim=1).sum() + ops.gather_nd(x, T([[1, 2], [0, 0]])).sum()

    assert_compiled_equal(loss, (x1,), (x2,), grad=True)
    assert_compiled_equal(lambda x, s: ops.scatter(x, 0, T([[1, 0, 3, 2, 0]]), s).sum() * 2.0,
                          (x1, x2), (x2, x1), grad=True)


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_compiled_graphs_check_bounds_and_repeated_positions(mode):
    x = T(values((3, 4), np.float32))
    g = kiln.jit(lambda x, i: ops.gather_nd(x, i) * 2.0, capture_mode=mode)
    np.testing.assert_array_equal(g(x, T([[1, 1]])).numpy(), x.numpy()[1:2, 1] * 2)
    with pytest.raises(IndexError, match="gather_nd: an index in coordinate 1 is out of bounds"):
        g(x, T([[1, 4]]))
    s = kiln.jit(lambda x, i: ops.scatter(x, 1, i, 5.0), capture_mode=mode)
    np.testing.assert_array_equal(s(x, T([[0], [1], [2]])).numpy(),
                                  _scatter_reference(x.numpy(), 1, np.array([[0], [1], [2]]), np.full((3, 1), 5.0)))
    with pytest.raises(ValueError, match="scatter: index names one position of input more than once"):
        s(x, T([[0, 0], [1, 2], [3, 2]]))
    assert g.cache_info().eager_calls == 0 and s.cache_info().eager_calls == 0


DYNAMIC = [
    ("pad", lambda x: ops.pad(x, (1, 2, 1, 1), value=2.0), lambda a: np.pad(a, ((1, 1), (1, 2)), constant_values=2)),
    ("pad_replicate", lambda x: ops.pad(x, (1, 2, 2, 0), "replicate"), lambda a: np.pad(a, ((2, 0), (1, 2)), "edge")),
    ("pad_circular", lambda x: ops.pad(x, (1, 0, 1, 1), "circular"), lambda a: np.pad(a, ((1, 1), (1, 0)), "wrap")),
    ("masked_fill", lambda x: ops.masked_fill(x, x > 0, 1.0), lambda a: np.where(a > 0, np.float32(1), a)),
    ("norm", lambda x: ops.norm(x, dim=1), lambda a: np.linalg.norm(a, axis=1)),
    ("einsum", lambda x: ops.einsum("ij,kj->ik", x, x), lambda a: a @ a.T),
    ("one_hot", lambda x: ops.one_hot((x > 0).astype(kiln.int64), 2), lambda a: np.eye(2, dtype=np.int64)[(a > 0) * 1]),
    ("isin", lambda x: ops.isin(ops.cast(x > 0, kiln.int64), T([1, 3])), lambda a: np.isin((a > 0) * 1, [1, 3])),
    ("where", lambda x: ops.where(x > 0, 1.5, x), lambda a: np.where(a > 0, np.float32(1.5), a)),
    ("scatter", lambda x: ops.scatter(x, 1, ops.cast(ops.amax(x, 1, True) > 9.0, kiln.int64), -1.0),
     lambda a: _scatter_reference(a, 1, (a.max(1, keepdims=True) > 9.0) * 1, np.full((len(a), 1), -1.0, np.float32))),
]


@pytest.mark.parametrize("name,fn,ref", DYNAMIC, ids=[d[0] for d in DYNAMIC])
def test_dynamic_shapes_compile_once(name, fn, ref):
    f = kiln.jit(fn, dynamic=True)
    for n in (3, 5, 8):
        a = values((n, 6), np.float32)
        np.testing.assert_allclose(f(T(a)).numpy(), ref(a), rtol=1e-5, atol=1e-5)
    assert f.cache_info().compiles == 1, f.cache_info()


def test_torch_agrees():
    torch = pytest.importorskip("torch")
    a = values((2, 3, 5), np.float32)
    t, x = torch.tensor(a), T(a)
    pairs = [
        (ops.flip(x, (0, 2)), torch.flip(t, (0, 2))),
        (ops.roll(x, (2, -1), (2, 0)), torch.roll(t, (2, -1), (2, 0))),
        (ops.roll(x, 4), torch.roll(t, 4)),
        (ops.tril(x, 1), torch.tril(t, 1)), (ops.triu(x, -1), torch.triu(t, -1)),
        (ops.pad(x, (1, 2, 0, 1), value=3.0), torch.nn.functional.pad(t, (1, 2, 0, 1), value=3.0)),
        (ops.pad(x, (2, 1, 1, 1), "reflect"), torch.nn.functional.pad(t, (2, 1, 1, 1), "reflect")),
        (ops.pad(x, (2, 1, 1, 1), "replicate"), torch.nn.functional.pad(t, (2, 1, 1, 1), "replicate")),
        (ops.pad(x, (2, 1, 1, 1), "circular"), torch.nn.functional.pad(t, (2, 1, 1, 1), "circular")),
        (ops.einsum("bij,bkj->bik", x, x), torch.einsum("bij,bkj->bik", t, t)),
        (ops.norm(x, 3, dim=2), torch.linalg.norm(t, 3, dim=2)),
        (ops.norm(x, "fro", dim=(1, 2)), torch.linalg.norm(t, "fro", dim=(1, 2))),
        (ops.scatter(x, 2, T(np.array([[[4, 0]] * 3] * 2)), 1.0),
         t.scatter(2, torch.tensor(np.array([[[4, 0]] * 3] * 2)), 1.0)),
        (ops.one_hot(T([0, 2, 1]), 3), torch.nn.functional.one_hot(torch.tensor([0, 2, 1]), 3)),
        (ops.masked_fill(x, x > 0, -1.0), t.masked_fill(t > 0, -1.0)),
    ]
    for got, want in pairs:
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_tensor_methods_call_the_functions():
    a = values((3, 4), np.float32)
    x = T(a)
    np.testing.assert_array_equal(x.flip(0).numpy(), np.flip(a, 0))
    np.testing.assert_array_equal(x.flip(0, 1).numpy(), np.flip(a, (0, 1)))
    np.testing.assert_array_equal(x.roll(1, 1).numpy(), np.roll(a, 1, 1))
    np.testing.assert_array_equal(x.tril(1).numpy(), np.tril(a, 1))
    np.testing.assert_array_equal(x.triu().numpy(), np.triu(a))
    np.testing.assert_array_equal(x.masked_fill(x > 0, 0.0).numpy(), np.where(a > 0, 0, a))
    idx = T(np.array([[1], [0], [3]]))
    np.testing.assert_array_equal(x.scatter(1, idx, value=2.0).numpy(), ops.scatter(x, 1, idx, 2.0).numpy())
    np.testing.assert_array_equal(x.scatter(1, idx, x * 3).numpy(), ops.scatter(x, 1, idx, x * 3).numpy())
    with pytest.raises(TypeError, match="Tensor.scatter: give exactly one of src and value"):
        x.scatter(1, idx)
    np.testing.assert_allclose(x.norm(dim=1).numpy(), np.linalg.norm(a, axis=1), rtol=1e-6)
    np.testing.assert_array_equal(x.nonzero().numpy(), np.argwhere(a))
    np.testing.assert_array_equal(T(np.array([2, 1, 2])).unique().numpy(), [1, 2])
    assert_compiled_equal(lambda t: (t.flip(1).tril(-1) + t.roll(2, 0).triu(), t.masked_fill(t < 0, 1.0),
                                     t.scatter(1, idx, value=0.0), t.norm(dim=0)), (x,), (T(values((3, 4), np.float32)),))


def test_numbers_are_rounded_once_to_the_tensor_dtype():
    """A Python number given to masked_fill, one_hot or scatter is made in the result's dtype
    directly: float64's 0.1 stays 0.1 (not float32's), an int stays exact."""
    f64 = T(np.array([1.0, 2.0]))
    mask = T(np.array([True, False]))
    assert ops.masked_fill(f64, mask, 0.1).numpy()[0] == 0.1
    assert ops.masked_fill(T(np.array([1, 2])), mask, 2**60 + 1).numpy()[0] == 2**60 + 1
    assert ops.one_hot(T([0, 1]), 2, T(np.float64(1.0)), 0.1).numpy()[0, 1] == 0.1
    assert ops.scatter(T(np.zeros((1, 3))), 1, T([[2]]), 0.1).numpy()[0, 2] == 0.1
    assert ops.pad(T(np.array([1, 2])), (1, 0), value=2**60 + 1).numpy()[0] == 2**60 + 1
    assert ops.pad(T(np.array([1.0])), (0, 1), value=0.1).numpy()[1] == 0.1
    with pytest.raises(TypeError, match="pad: a float value 0.5 for a tensor of dtype int64"):
        ops.pad(T(np.array([1, 2])), (1, 1), value=0.5)
    with pytest.raises(TypeError, match="scatter: a float src 0.5 for a tensor of dtype int64"):
        ops.scatter(T(np.zeros((1, 3), np.int64)), 1, T([[2]]), 0.5)
    with pytest.raises(ValueError, match="masked_fill: the number 1099511627776 is out of range"):
        ops.masked_fill(T(np.array([1, 2], np.int32)), mask, 2**40)
