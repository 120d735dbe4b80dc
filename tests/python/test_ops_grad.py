"""Finite-difference gradient checks (central differences, float64, small shapes) through
kiln.grad for every differentiable op, and the autograd API around them."""
import numpy as np
import pytest

import kiln
from kiln import ops

from conftest import check_grad, make_rng, to_numpy


def away(rng, shape, low=0.2, high=2.0):
    """Values with |x| in [low, high] and random sign: away from kinks at 0."""
    return rng.uniform(low, high, shape) * rng.choice([-1.0, 1.0], shape)


def distinct(rng, shape, scale=0.3):
    """Values at least `scale` apart: no ties for max/min/pools."""
    n = int(np.prod(shape, dtype=np.int64))
    return (rng.permutation(n).astype(np.float64) * scale - n * scale / 2).reshape(shape)


def pos(rng, shape, low=0.5, high=2.0):
    return rng.uniform(low, high, shape)


def sym(rng, shape, r=2.0):
    return rng.uniform(-r, r, shape)


def T(a, dtype=kiln.int64):
    return kiln.Tensor(np.asarray(a), dtype)


# (id, fn over tensors, rng -> args)
UNARY_GRAD = [
    ("neg", ops.neg, lambda r: [sym(r, (2, 3))]),
    ("abs", ops.abs, lambda r: [away(r, (2, 3))]),
    ("exp", ops.exp, lambda r: [sym(r, (2, 3))]),
    ("log", ops.log, lambda r: [pos(r, (2, 3))]),
    ("sqrt", ops.sqrt, lambda r: [pos(r, (2, 3))]),
    ("rsqrt", ops.rsqrt, lambda r: [pos(r, (2, 3))]),
    ("sin", ops.sin, lambda r: [sym(r, (2, 3), 3)]),
    ("cos", ops.cos, lambda r: [sym(r, (2, 3), 3)]),
    ("tanh", ops.tanh, lambda r: [sym(r, (2, 3))]),
    ("sigmoid", ops.sigmoid, lambda r: [sym(r, (2, 3), 4)]),
    ("relu", ops.relu, lambda r: [away(r, (2, 3))]),
    ("gelu", ops.gelu, lambda r: [sym(r, (2, 3), 3)]),
    ("gelu_tanh", lambda x: ops.gelu(x, approximate="tanh"), lambda r: [sym(r, (2, 3), 3)]),
    ("silu", ops.silu, lambda r: [sym(r, (2, 3), 4)]),
    ("erf", ops.erf, lambda r: [sym(r, (2, 3))]),
    ("clamp", lambda x: ops.clamp(x, -1.0, 1.0), lambda r: [np.array([[-1.8, -0.5, 0.3], [0.9, 1.4, -0.2]])]),
    ("clamp_min", lambda x: ops.clamp(x, min=0.1), lambda r: [np.array([-1.0, 0.5, 2.0])]),
    ("square", ops.square, lambda r: [sym(r, (3,))]),
    ("reciprocal", ops.reciprocal, lambda r: [away(r, (3,), 0.5)]),
    ("pow_scalar", lambda x: x ** 3, lambda r: [sym(r, (2, 3))]),
    ("pow_half", lambda x: x ** 0.5, lambda r: [pos(r, (2, 3))]),
    ("rpow", lambda x: 2.0 ** x, lambda r: [sym(r, (2, 3))]),
    ("rdiv", lambda x: 3.0 / x, lambda r: [away(r, (2, 3), 0.5)]),
    ("rsub", lambda x: 1.0 - x, lambda r: [sym(r, (2, 3))]),
    ("scalar_ops", lambda x: (x * 2.0 + 1.0) / 4.0 - 0.5, lambda r: [sym(r, (2, 3))]),
    ("contiguous", lambda x: x.T.contiguous() * 1.0, lambda r: [sym(r, (2, 3))]),
    ("softmax", lambda x: ops.softmax(x, -1), lambda r: [sym(r, (2, 4))]),
    ("softmax_axis0", lambda x: ops.softmax(x, 0), lambda r: [sym(r, (3, 2, 2))]),
    ("log_softmax", lambda x: ops.log_softmax(x, 1), lambda r: [sym(r, (2, 4))]),
    ("log_softmax_axis0", lambda x: ops.log_softmax(x, 0), lambda r: [sym(r, (3, 2))]),
    ("log1p", ops.log1p, lambda r: [sym(r, (2, 3), 0.9)]),
    ("expm1", ops.expm1, lambda r: [sym(r, (2, 3))]),
    ("tan", ops.tan, lambda r: [sym(r, (2, 3), 1.2)]),
    ("asin", ops.asin, lambda r: [sym(r, (2, 3), 0.9)]),
    ("acos", ops.acos, lambda r: [sym(r, (2, 3), 0.9)]),
    ("atan", ops.atan, lambda r: [sym(r, (2, 3), 3)]),
    ("sinh", ops.sinh, lambda r: [sym(r, (2, 3))]),
    ("cosh", ops.cosh, lambda r: [sym(r, (2, 3))]),
    ("asinh", ops.asinh, lambda r: [sym(r, (2, 3), 3)]),
    ("acosh", ops.acosh, lambda r: [pos(r, (2, 3), 1.2, 4.0)]),
    ("atanh", ops.atanh, lambda r: [sym(r, (2, 3), 0.9)]),
    ("log2", ops.log2, lambda r: [pos(r, (2, 3))]),
    ("log10", ops.log10, lambda r: [pos(r, (2, 3))]),
    ("exp2", ops.exp2, lambda r: [sym(r, (2, 3))]),
    # piecewise constant: 0 away from the steps (alone, and beside a smooth term)
    ("floor_alone", ops.floor, lambda r: [np.array([[-1.7, -0.3, 0.2], [0.6, 1.4, 2.8]])]),
    ("floor", lambda x: ops.floor(x) + x * 0.5, lambda r: [np.array([[-1.7, -0.3, 0.2], [0.6, 1.4, 2.8]])]),
    ("ceil", lambda x: ops.ceil(x) * x, lambda r: [np.array([[-1.7, -0.3, 0.2], [0.6, 1.4, 2.8]])]),
    ("round", lambda x: ops.round(x) * x, lambda r: [np.array([[-1.7, -0.3, 0.2], [0.6, 1.4, 2.8]])]),
    ("trunc", lambda x: ops.trunc(x) - x, lambda r: [np.array([[-1.7, -0.3, 0.2], [0.6, 1.4, 2.8]])]),
    ("cumsum", lambda x: ops.cumsum(x, 1), lambda r: [sym(r, (3, 4))]),
    ("cumsum_axis0", lambda x: ops.cumsum(x, 0), lambda r: [sym(r, (3, 4))]),
    ("cumprod", lambda x: ops.cumprod(x, 1), lambda r: [sym(r, (3, 4))]),
    # zeros: none, one, two in a line (the gradient at the first zero is not 0, after it is)
    ("cumprod_zeros", lambda x: ops.cumprod(x, 1),
     lambda r: [np.array([[0.5, 0.0, 2.0, 1.5, -1.0], [0.0, 1.2, 0.0, 2.0, 0.7], [1.1, -0.8, 0.9, 1.3, 0.0]])]),
    ("cumprod_zeros_axis0", lambda x: ops.cumprod(x, 0), lambda r: [np.array([[0.5, 0.0], [0.0, 2.0], [1.5, 3.0]])]),
    ("sort", lambda x: ops.sort(x, 1)[0], lambda r: [distinct(r, (3, 4))]),
    ("sort_descending_axis0", lambda x: ops.sort(x, 0, descending=True)[0], lambda r: [distinct(r, (3, 4))]),
]


@pytest.mark.parametrize("case", UNARY_GRAD, ids=lambda c: c[0])
def test_unary_grad(case):
    name, fn, make = case
    check_grad(fn, *make(make_rng(1)))


@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid", "mul"])
def test_grad_non_contiguous_input(name):
    """Gradients reach a leaf used through a transposed / strided view."""
    rng = make_rng(2)
    a = sym(rng, (4, 3))
    f = getattr(ops, name) if name != "mul" else (lambda v: v * v)
    check_grad(lambda x: f(x.T), a)
    check_grad(lambda x: f(x[::2, ::-1]), a)
    check_grad(lambda x: f(x[1:, ::2].T), a)


BCAST = [((2, 3), (3,)), ((4, 1, 3), (2, 1)), ((), (2, 3)), ((2, 3), ()), ((3, 1), (1, 4)), ((2, 3), (2, 3))]

BINARY_GRAD = [
    ("add", ops.add, sym, sym),
    ("sub", ops.sub, sym, sym),
    ("mul", ops.mul, sym, sym),
    ("div", ops.div, sym, lambda r, s: away(r, s, 0.5)),
    ("pow", ops.pow, pos, sym),
    ("operators", lambda a, b: (a + b) * a - b / (a * a + 1.0), sym, sym),
    ("fmod", ops.fmod, sym, lambda r, s: away(r, s, 0.7)),
    ("atan2", ops.atan2, sym, lambda r, s: away(r, s, 0.3)),
    ("hypot", ops.hypot, lambda r, s: away(r, s, 0.3), sym),
    ("logaddexp", ops.logaddexp, sym, sym),
]


@pytest.mark.parametrize("shapes", BCAST, ids=lambda s: f"{s[0]}&{s[1]}")
@pytest.mark.parametrize("case", BINARY_GRAD, ids=lambda c: c[0])
def test_binary_grad(case, shapes):
    name, fn, ga, gb = case
    rng = make_rng(3)
    check_grad(fn, ga(rng, shapes[0]), gb(rng, shapes[1]))


@pytest.mark.parametrize("shapes", BCAST, ids=lambda s: f"{s[0]}&{s[1]}")
@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum_grad(name, shapes):
    rng = make_rng(4)
    a = sym(rng, shapes[0])
    b = sym(rng, shapes[1])
    shift = np.where(np.abs(np.broadcast_to(a, np.broadcast_shapes(a.shape, b.shape)) - b) < 0.1, 0.3, 0.0)
    if shift.any():  # keep the two apart (no tie: the gradient there is a convention)
        a = a + 0.0
        b = (b + shift.max())
    check_grad(getattr(ops, name), a, b)


def test_where_grad():
    rng = make_rng(5)
    cond = T(rng.random((2, 3)) < 0.5, kiln.bool)
    check_grad(lambda x, y: ops.where(cond, x, y), sym(rng, (2, 3)), sym(rng, (3,)), argnums=(0, 1))
    check_grad(lambda x, y: ops.where(cond, x, y), sym(rng, (2, 1)), sym(rng, ()), argnums=(0, 1))


def test_cast_grad():
    x = kiln.Tensor(np.array([1.0, 2.0, 3.0]))
    g = kiln.grad(lambda v: (ops.cast(v, kiln.float32) * kiln.Tensor(np.array([1.0, 2.0, 3.0], np.float32))).sum())(x)
    assert g.dtype is kiln.float64
    np.testing.assert_allclose(to_numpy(g), [1.0, 2.0, 3.0])
    check_grad(lambda v: ops.cast(v, kiln.float64) * v, np.array([0.5, -1.0]))


REDUCE_AXES = [None, 0, 1, -1, (0, 2), ()]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", REDUCE_AXES, ids=repr)
@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "prod", "var", "std"])
def test_reduction_grad(name, axis, keepdims):
    if name == "std" and axis == ():
        pytest.skip("std of single elements is 0, where sqrt has no derivative")
    rng = make_rng(6)
    if name in ("max", "min"):
        a = distinct(rng, (2, 3, 4))
    elif name == "prod":
        a = away(rng, (2, 3, 4), 0.5, 1.5)
    else:
        a = sym(rng, (2, 3, 4))
    check_grad(lambda x: getattr(ops, name)(x, axis, keepdims), a)


@pytest.mark.parametrize("ddof", [0, 1])
def test_var_std_ddof_grad(ddof):
    a = sym(make_rng(7), (3, 4))
    check_grad(lambda x: ops.var(x, 1, ddof=ddof), a)
    check_grad(lambda x: ops.std(x, 0, ddof=ddof), a)


def test_max_grad_on_non_contiguous():
    a = distinct(make_rng(8), (4, 3))
    check_grad(lambda x: ops.max(x.T, 1), a)
    check_grad(lambda x: ops.min(x[::-1], 0, True), a)


MATMUL_SHAPES = [((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((2, 3), (3, 4)), ((2, 2, 3), (3, 4)),
                 ((2, 1, 2, 3), (3, 3, 2)), ((3,), (2, 3, 4)), ((4, 2, 3), (4, 3, 2)), ((2, 2, 3), (1, 3, 2))]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=lambda s: f"{s[0]}@{s[1]}")
def test_matmul_grad(shapes):
    rng = make_rng(9)
    check_grad(ops.matmul, sym(rng, shapes[0]), sym(rng, shapes[1]))


def test_matmul_grad_transposed_operands():
    rng = make_rng(10)
    check_grad(lambda a, b: a.T @ b.T, sym(rng, (3, 2)), sym(rng, (4, 3)))


@pytest.mark.parametrize("xshape", [(4, 5), (2, 3, 5), (5,)], ids=str)
def test_dense_grad(xshape):
    rng = make_rng(11)
    check_grad(ops.dense, sym(rng, xshape), sym(rng, (3, 5)), sym(rng, (3,)))
    check_grad(lambda x, w: ops.linear(x, w), sym(rng, xshape), sym(rng, (2, 5)))


CONV_GRAD = [
    ((2, 2, 5, 5), (3, 2, 3, 3), dict()),
    ((1, 2, 6, 5), (2, 2, 3, 2), dict(stride=2, padding=1)),
    ((1, 2, 6, 6), (2, 2, 3, 3), dict(stride=(2, 1), padding=(0, 1, 2, 1))),
    ((1, 2, 7, 7), (2, 2, 3, 3), dict(dilation=2, padding=1)),
    ((1, 4, 5, 5), (4, 2, 3, 3), dict(groups=2, padding=1)),
    ((1, 3, 5, 4), (3, 1, 2, 2), dict(groups=3)),
    ((1, 2, 6, 6), (3, 2, 3, 3), dict(pad_mode="same", stride=2)),
    ((1, 2, 5, 5), (3, 2, 2, 2), dict(pad_mode="same")),
    ((1, 2, 6, 6), (2, 2, 3, 3), dict(pad_mode="valid", stride=2, dilation=(1, 2))),
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", CONV_GRAD, ids=lambda c: f"{c[0]}*{c[1]}-{c[2]}")
def test_conv2d_grad(case, bias):
    xs, ws, kw = case
    rng = make_rng(12)
    x, w, b = sym(rng, xs), sym(rng, ws), sym(rng, (ws[0],))
    if bias:
        check_grad(lambda x_, w_, b_: ops.conv2d(x_, w_, b_, **kw), x, w, b)
    else:
        check_grad(lambda x_, w_: ops.conv2d(x_, w_, **kw), x, w)


def test_conv2d_grad_non_contiguous():
    rng = make_rng(13)
    x, w = sym(rng, (1, 2, 5, 6)), sym(rng, (3, 2, 2, 3))
    check_grad(lambda x_, w_: ops.conv2d(x_.swapaxes(2, 3), w_.swapaxes(2, 3), padding=1), x, w)


POOL_GRAD = [
    ((1, 2, 4, 4), dict(kernel_size=2)),
    ((1, 2, 5, 5), dict(kernel_size=3, stride=2, padding=1)),
    ((2, 1, 5, 6), dict(kernel_size=(2, 3), stride=(1, 2))),
    ((1, 2, 6, 6), dict(kernel_size=3, stride=2, ceil_mode=True)),
    ((1, 1, 5, 5), dict(kernel_size=2, stride=1)),  # overlapping windows
]


@pytest.mark.parametrize("case", POOL_GRAD + [((1, 2, 7, 7), dict(kernel_size=2, dilation=2, stride=2))],
                         ids=lambda c: f"{c[0]}-{c[1]}")
def test_max_pool2d_grad(case):
    xs, kw = case
    check_grad(lambda x: ops.max_pool2d(x, **kw), distinct(make_rng(14), xs, 0.1))


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("case", POOL_GRAD, ids=lambda c: f"{c[0]}-{c[1]}")
def test_avg_pool2d_grad(case, count_include_pad):
    xs, kw = case
    check_grad(lambda x: ops.avg_pool2d(x, count_include_pad=count_include_pad, **kw), sym(make_rng(15), xs))


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("xshape", [(4, 3, 2, 2), (5, 3)], ids=str)
def test_batch_norm_grad(xshape, training):
    rng = make_rng(16)
    c = xshape[1]
    rm0, rv0 = sym(rng, (c,), 0.5), pos(rng, (c,))

    def f(x, g, b):
        rm, rv = kiln.Tensor(rm0), kiln.Tensor(rv0)  # fresh running stats each call
        return ops.batch_norm(x, rm, rv, g, b, training=training, eps=1e-3)

    check_grad(f, sym(rng, xshape), pos(rng, (c,)), sym(rng, (c,)), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("xshape,ns", [((3, 5), 5), ((2, 3, 4), (4,)), ((2, 3, 4), (3, 4))], ids=str)
def test_layer_norm_grad(xshape, ns):
    rng = make_rng(17)
    nshape = (ns,) if isinstance(ns, int) else ns
    check_grad(lambda x, w, b: ops.layer_norm(x, ns, w, b), sym(rng, xshape), pos(rng, nshape), sym(rng, nshape),
               rtol=1e-4)
    check_grad(lambda x: ops.layer_norm(x, ns), sym(rng, xshape), rtol=1e-4)


@pytest.mark.parametrize("xshape,wshape", [((3, 5), (5,)), ((2, 3, 4), (3, 4))], ids=str)
def test_rms_norm_grad(xshape, wshape):
    rng = make_rng(18)
    check_grad(lambda x, w: ops.rms_norm(x, w), sym(rng, xshape), pos(rng, wshape), rtol=1e-4)


# ---- movement ----------------------------------------------------------------------------
MOVEMENT_GRAD = [
    ("reshape", lambda x: x.reshape(4, 6) * 1.0, (2, 3, 4)),
    ("reshape_transposed", lambda x: x.T.reshape(-1), (2, 3)),
    ("flatten", lambda x: ops.flatten(x, 1), (2, 3, 4)),
    ("transpose", lambda x: ops.transpose(x, (2, 0, 1)), (2, 3, 4)),
    ("swapaxes", lambda x: x.swapaxes(0, 2), (2, 3, 4)),
    ("squeeze", lambda x: x.squeeze(1), (2, 1, 3)),
    ("unsqueeze", lambda x: x.unsqueeze(0), (2, 3)),
    ("expand", lambda x: x.expand(4, 2, 3), (2, 1)),
    ("broadcast_to", lambda x: ops.broadcast_to(x, (2, 3, 4)), (3, 1)),
    ("narrow", lambda x: ops.narrow(x, 1, 1, 2), (2, 4)),
    ("getitem_int", lambda x: x[1], (3, 4)),
    ("getitem_slices", lambda x: x[::2, 1:-1], (4, 5)),
    ("getitem_neg_step", lambda x: x[::-1, ::-2], (3, 5)),
    ("getitem_none_ellipsis", lambda x: x[None, ..., 1], (2, 3, 4)),
    ("getitem_tensor", lambda x: x[T([2, 0, 2])], (3, 4)),
    ("getitem_tensor_axis1", lambda x: x[:, T([[1, 1], [0, 3]])], (2, 4)),
    ("getitem_two_tensors", lambda x: x[T([0, 2, 2]), T([1, 1, 0])], (3, 2)),
    ("getitem_mask", lambda x: x[T([True, False, True], kiln.bool)], (3, 2)),
    ("getitem_mask_full", lambda x: x[kiln.Tensor(np.array([[True, False], [False, True]]))], (2, 2)),
]


@pytest.mark.parametrize("case", MOVEMENT_GRAD, ids=lambda c: c[0])
def test_movement_grad(case):
    name, fn, shape = case
    check_grad(fn, sym(make_rng(19), shape))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_stack_split_grad(axis):
    rng = make_rng(20)
    check_grad(lambda a, b, c: ops.concat([a, b, c], axis), sym(rng, (2, 3)), sym(rng, (2, 3)), sym(rng, (2, 3)))
    check_grad(lambda a, b: ops.stack([a, b], axis), sym(rng, (2, 3)), sym(rng, (2, 3)))
    check_grad(lambda a: ops.split(a, [1, 2, 1], axis if axis != 0 else 1), sym(rng, (3, 4)))
    check_grad(lambda a: ops.split(a, 2, axis), sym(rng, (4, 4)))
    check_grad(lambda a: ops.split(a, 2, 0)[1] * 2.0, sym(rng, (4, 3)))  # unused pieces get zeros
    check_grad(lambda a, b: ops.concat([a, b.T], 0), sym(rng, (2, 3)), sym(rng, (3, 1)))


def test_gather_family_grad():
    rng = make_rng(21)
    idx = T([[0, 2], [2, 2]])
    check_grad(lambda x: ops.gather(x, idx, 0), sym(rng, (3, 4)))
    check_grad(lambda x: ops.gather(x, T([-1, 0, 0]), 1), sym(rng, (2, 3)))
    check_grad(lambda x: ops.index_select(x, 1, T(np.array([3, 3, 0], np.int32), kiln.int32)), sym(rng, (2, 4)))
    check_grad(lambda w: ops.embedding(T([[1, 4, 1], [0, 1, 2]]), w), sym(rng, (5, 3)))
    check_grad(lambda x: ops.gather_elements(x, 1, T([[0, 0, 2], [1, 2, 2]])), sym(rng, (2, 3)))
    rows = T([2, 0, 2])
    check_grad(lambda x, s: ops.index_add(x, 0, rows, s), sym(rng, (3, 4)), sym(rng, (3, 4)))
    check_grad(lambda x, s: ops.index_add(x, 1, T([1, -1]), s), sym(rng, (2, 3)), sym(rng, (2, 2)))
    sidx = T([[0, 1, 1], [1, 1, 0]])
    check_grad(lambda x, s: ops.scatter_add(x, 0, sidx, s), sym(rng, (2, 3)), sym(rng, (2, 3)))


SETITEM_GRAD = [
    ("slice", lambda y, v: y.__setitem__((slice(None), slice(None, None, 2)), v), (3, 4), (3, 2)),
    ("int", lambda y, v: y.__setitem__(1, v), (3, 4), (4,)),
    ("broadcast", lambda y, v: y.__setitem__((slice(1, None),), v), (3, 4), (4,)),
    ("neg_step", lambda y, v: y.__setitem__((slice(None, None, -2), 0), v), (3, 4), (2,)),
    ("tensor", lambda y, v: y.__setitem__(T([2, 0]), v), (3, 4), (2, 4)),
    ("tensor_axis1", lambda y, v: y.__setitem__((slice(None), T([3, 1])), v), (3, 4), (3, 2)),
    ("mask", lambda y, v: y.__setitem__(T([True, False, True], kiln.bool), v), (3, 4), (2, 4)),
]


@pytest.mark.parametrize("case", SETITEM_GRAD, ids=lambda c: c[0])
def test_setitem_grad(case):
    name, assign, xs, vs = case

    def f(x, v):
        y = x * 2.0  # a non-leaf written in place; grads flow to x (unwritten part) and v
        assign(y, v * 3.0)
        return y * y

    rng = make_rng(22)
    check_grad(f, sym(rng, xs), sym(rng, vs))


def test_dropout_grad_is_mask():
    kiln.manual_seed(3)
    x = kiln.Tensor(np.linspace(0.5, 2.0, 64))
    y, g = kiln.value_and_grad(lambda v: ops.dropout(v, 0.25).sum())(x)
    kiln.manual_seed(3)
    mask = to_numpy(ops.dropout(kiln.Tensor(np.ones(64)), 0.25))
    assert set(np.unique(mask)) <= {0.0, 1 / 0.75}
    np.testing.assert_allclose(to_numpy(g), mask, rtol=1e-12)
    np.testing.assert_allclose(y.item(), (np.linspace(0.5, 2.0, 64) * mask).sum(), rtol=1e-12)


def test_composite_network_grad():
    rng = make_rng(23)

    def net(x, w1, b1, w2):
        h = ops.conv2d(x, w1, b1, padding=1)
        h = ops.relu(ops.max_pool2d(h, 2))
        h = ops.layer_norm(ops.flatten(h, 1), h.shape[1] * h.shape[2] * h.shape[3])
        return ops.log_softmax(ops.dense(h, w2), -1)

    check_grad(net, sym(rng, (2, 1, 4, 4)), sym(rng, (2, 1, 3, 3)), sym(rng, (2,)), sym(rng, (3, 8)), rtol=1e-4,
               atol=1e-6)


# ---- autograd API --------------------------------------------------------------------------


def test_grad_position_forms():
    a, b, c = (kiln.Tensor(np.array([1.0, 2.0])), kiln.Tensor(np.array([3.0, 4.0])),
               kiln.Tensor(np.array([5.0, 6.0])))

    def f(x, y, z):
        return (x * y * z).sum()

    g0 = kiln.grad(f)(a, b, c)
    np.testing.assert_allclose(to_numpy(g0), [15.0, 24.0])
    g1 = kiln.grad(f, grad_position=1)(a, b, c)
    np.testing.assert_allclose(to_numpy(g1), [5.0, 12.0])
    gs = kiln.grad(f, grad_position=(0, 2))(a, b, c)
    assert isinstance(gs, tuple) and len(gs) == 2
    np.testing.assert_allclose(to_numpy(gs[0]), [15.0, 24.0])
    np.testing.assert_allclose(to_numpy(gs[1]), [3.0, 8.0])
    g_neg = kiln.grad(f, grad_position=-1)(a, b, c)
    np.testing.assert_allclose(to_numpy(g_neg), [3.0, 8.0])
    v, g = kiln.value_and_grad(f, grad_position=(1,))(a, b, c)
    assert v.item() == 1 * 3 * 5 + 2 * 4 * 6
    assert isinstance(g, tuple) and len(g) == 1
    np.testing.assert_allclose(to_numpy(g[0]), [5.0, 12.0])
    # inputs are not modified and get no gradient state
    assert not a.requires_grad and a.grad is None


def test_grad_non_scalar_output_uses_ones():
    x = kiln.Tensor(np.array([1.0, 2.0, 3.0]))
    g = kiln.grad(lambda v: v * v)(x)
    np.testing.assert_allclose(to_numpy(g), [2.0, 4.0, 6.0])


def test_grad_unused_input_is_zeros():
    x, y = kiln.Tensor(np.array([1.0, 2.0])), kiln.Tensor(np.array([3.0]))
    gx, gy = kiln.grad(lambda a, b: (a * 2.0).sum(), grad_position=(0, 1))(x, y)
    np.testing.assert_allclose(to_numpy(gy), [0.0])
    assert gy.shape == (1,)
    g = kiln.grad(lambda a: kiln.Tensor(np.array(1.0)))(x)
    np.testing.assert_allclose(to_numpy(g), [0.0, 0.0])


def test_weights():
    from kiln.nn import Parameter

    w = Parameter(kiln.Tensor(np.array([[1.0, 2.0], [3.0, 4.0]])), name="w")
    b = Parameter(kiln.Tensor(np.array([0.5, -0.5])), name="b")
    x = kiln.Tensor(np.array([1.0, -1.0]))

    def f(inp):
        return ((w @ inp + b) ** 2).sum()

    gw, gb = kiln.grad(f, grad_position=None, weights=[w, b])(x)
    h = np.array([[1.0, 2.0], [3.0, 4.0]]) @ [1.0, -1.0] + [0.5, -0.5]
    np.testing.assert_allclose(to_numpy(gb), 2 * h)
    np.testing.assert_allclose(to_numpy(gw), np.outer(2 * h, [1.0, -1.0]))
    (gx,), (gw2, gb2) = kiln.grad(f, grad_position=(0,), weights=[w, b])(x)
    np.testing.assert_allclose(to_numpy(gx), np.array([[1.0, 2.0], [3.0, 4.0]]).T @ (2 * h))
    np.testing.assert_allclose(to_numpy(gw2), to_numpy(gw))
    v, gw_only = kiln.value_and_grad(f, None, w)(x)
    np.testing.assert_allclose(v.item(), (h ** 2).sum())
    np.testing.assert_allclose(to_numpy(gw_only), to_numpy(gw))


def test_has_aux():
    x = kiln.Tensor(np.array([1.0, 2.0]))

    def f(v):
        y = (v * v).sum()
        return y, v * 10.0

    g, aux = kiln.grad(f, has_aux=True)(x)
    np.testing.assert_allclose(to_numpy(g), [2.0, 4.0])
    assert isinstance(aux, tuple) and len(aux) == 1  # MindSpore: the other outputs, always as a tuple
    np.testing.assert_allclose(to_numpy(aux[0]), [10.0, 20.0])
    (value, aux2), g2 = kiln.value_and_grad(f, has_aux=True)(x)
    assert value.item() == 5.0
    np.testing.assert_allclose(to_numpy(aux2), [10.0, 20.0])
    np.testing.assert_allclose(to_numpy(g2), [2.0, 4.0])

    def f3(v):  # aux does not contribute to the gradient
        return (v * 3.0).sum(), (v ** 2).sum(), "label"

    g3, aux3 = kiln.grad(f3, has_aux=True)(x)
    np.testing.assert_allclose(to_numpy(g3), [3.0, 3.0])
    assert aux3[1] == "label"


def test_no_grad_and_stop_gradient():
    x = kiln.Tensor(np.array([1.0, 2.0]))

    def f(v):
        with kiln.no_grad():
            c = v * 5.0
        assert not c.requires_grad
        return (v * c).sum()

    np.testing.assert_allclose(to_numpy(kiln.grad(f)(x)), [5.0, 10.0])

    def g(v):
        return (v * ops.stop_gradient(v * v)).sum() + (v.detach() * v).sum()

    np.testing.assert_allclose(to_numpy(kiln.grad(g)(x)), [1.0 + 1.0, 4.0 + 2.0])

    @kiln.no_grad()
    def h(v):
        return v * 2.0

    leaf = kiln.Tensor(np.array([1.0]))
    leaf.requires_grad = True
    assert not h(leaf).requires_grad
    assert kiln.is_grad_enabled()
    prev = kiln.set_grad_enabled(False)
    try:
        assert not (leaf * 2.0).requires_grad
    finally:
        kiln.set_grad_enabled(prev)
    assert (leaf * 2.0).requires_grad


def test_backward_accumulates():
    x = kiln.Tensor(np.array([1.0, 2.0, 3.0]))
    x.requires_grad = True
    assert x.is_leaf and x.grad is None
    (x * x).sum().backward()
    np.testing.assert_allclose(to_numpy(x.grad), [2.0, 4.0, 6.0])
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(to_numpy(x.grad), [5.0, 7.0, 9.0])
    y = x * 2.0
    assert not y.is_leaf
    y.backward(kiln.Tensor(np.array([1.0, 0.0, -1.0])))
    np.testing.assert_allclose(to_numpy(x.grad), [7.0, 7.0, 7.0])
    x.grad = None
    (x ** 2).mean().backward()
    np.testing.assert_allclose(to_numpy(x.grad), [2 / 3, 4 / 3, 2.0])


def test_backward_through_shared_subgraph():
    x = kiln.Tensor(np.array([0.5, -1.0]))
    x.requires_grad = True
    y = ops.tanh(x)
    z = (y * y + y * 3.0).sum()
    z.backward()
    t = np.tanh([0.5, -1.0])
    np.testing.assert_allclose(to_numpy(x.grad), (2 * t + 3) * (1 - t * t), rtol=1e-12)


def test_grad_float32_input():
    x = kiln.Tensor(np.array([1.0, 2.0], np.float32))
    g = kiln.grad(lambda v: (ops.exp(v) * v).sum())(x)
    assert g.dtype is kiln.float32
    e = np.exp([1.0, 2.0])
    np.testing.assert_allclose(to_numpy(g), e + e * [1.0, 2.0], rtol=1e-6)


def test_higher_order_grad():
    x = kiln.Tensor(np.array([1.0, 2.0, -3.0]))

    def f(v):
        return (v ** 3).sum()

    def df(v):
        return kiln.grad(f)(v).sum()  # sum of 3 v^2

    np.testing.assert_allclose(to_numpy(kiln.grad(f)(x)), 3 * np.array([1.0, 4.0, 9.0]))
    np.testing.assert_allclose(to_numpy(kiln.grad(df)(x)), 6 * np.array([1.0, 2.0, -3.0]))
    d3 = kiln.grad(lambda v: kiln.grad(df)(v).sum())(x)
    np.testing.assert_allclose(to_numpy(d3), [6.0, 6.0, 6.0])


def test_higher_order_grad_through_low_level_api():
    x = kiln.Tensor(np.array([1.0, 2.0]))
    x.requires_grad = True
    y = (x ** 3).sum()
    (g,) = kiln._C.grad([y], [x], None, True)
    assert g.requires_grad
    (gg,) = kiln._C.grad([g.sum()], [x])
    np.testing.assert_allclose(to_numpy(gg), [6.0, 12.0])
