"""Table-driven op tests: every op against a NumPy reference over dtypes, broadcasting shapes
and non-contiguous inputs."""
import math

import numpy as np
import pytest

import kiln
from kiln import ops

from conftest import (FLOATS, HALFS, INTS, LAYOUTS, NP_DTYPE, assert_close, dtype_name, from_numpy_strided,
                      make_rng, promote, rand_array, round_to, to_kiln, to_numpy, tol)

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


# ---- unary elementwise --------------------------------------------------------------------
# (name, kiln fn, NumPy fn, (low, high) input range, integer dtypes supported keeping their dtype)
UNARY = [
    ("neg", ops.neg, np.negative, (-3, 3), True),
    ("abs", ops.abs, np.abs, (-3, 3), True),
    ("sign", ops.sign, np.sign, (-3, 3), True),
    ("exp", ops.exp, np.exp, (-3, 3), False),
    ("log", ops.log, np.log, (0.1, 5), False),
    ("sqrt", ops.sqrt, np.sqrt, (0.1, 5), False),
    ("rsqrt", ops.rsqrt, lambda x: 1.0 / np.sqrt(x), (0.1, 5), False),
    ("sin", ops.sin, np.sin, (-4, 4), False),
    ("cos", ops.cos, np.cos, (-4, 4), False),
    ("tanh", ops.tanh, np.tanh, (-3, 3), False),
    ("sigmoid", ops.sigmoid, _sigmoid, (-5, 5), False),
    ("relu", ops.relu, lambda x: np.maximum(x, 0), (-3, 3), True),
    ("gelu", ops.gelu, _gelu, (-4, 4), False),
    ("gelu_tanh", lambda x: ops.gelu(x, approximate="tanh"),
     lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))), (-4, 4), False),
    ("silu", ops.silu, lambda x: x * _sigmoid(x), (-5, 5), False),
    ("erf", ops.erf, _erf, (-2.5, 2.5), False),
    ("square", ops.square, np.square, (-3, 3), True),
    ("reciprocal", ops.reciprocal, lambda x: 1.0 / x, (0.2, 4), False),
    ("clamp", lambda x: ops.clamp(x, -1, 1.5), lambda x: np.clip(x, -1, 1.5), (-3, 3), False),
    ("clamp_int", lambda x: ops.clamp(x, -1, 2), lambda x: np.clip(x, -1, 2), (-3, 3), True),
    ("clamp_int_min", lambda x: ops.clamp(x, min=0), lambda x: np.maximum(x, 0), (-3, 3), True),
    ("clamp_int_max", lambda x: ops.clamp(x, max=1), lambda x: np.minimum(x, 1), (-3, 3), True),
    ("clamp_min", lambda x: ops.clamp(x, min=0.5), lambda x: np.maximum(x, 0.5), (-3, 3), False),
    ("clamp_max", lambda x: ops.clamp(x, max=0.5), lambda x: np.minimum(x, 0.5), (-3, 3), False),
    ("floor", ops.floor, np.floor, (-3, 3), True),
    ("ceil", ops.ceil, np.ceil, (-3, 3), True),
    ("round", ops.round, np.round, (-3, 3), True),  # halves to even (np.round's rule)
    ("trunc", ops.trunc, np.trunc, (-3, 3), True),
    ("log1p", ops.log1p, np.log1p, (-0.9, 3), False),
    ("expm1", ops.expm1, np.expm1, (-3, 3), False),
    ("tan", ops.tan, np.tan, (-1.2, 1.2), False),
    ("asin", ops.asin, np.arcsin, (-0.9, 0.9), False),
    ("acos", ops.acos, np.arccos, (-0.9, 0.9), False),
    ("atan", ops.atan, np.arctan, (-3, 3), False),
    ("sinh", ops.sinh, np.sinh, (-3, 3), False),
    ("cosh", ops.cosh, np.cosh, (-3, 3), False),
    ("asinh", ops.asinh, np.arcsinh, (-3, 3), False),
    ("acosh", ops.acosh, np.arccosh, (1.1, 4), False),
    ("atanh", ops.atanh, np.arctanh, (-0.9, 0.9), False),
    ("log2", ops.log2, np.log2, (0.1, 5), False),
    ("log10", ops.log10, np.log10, (0.1, 5), False),
    ("exp2", ops.exp2, np.exp2, (-3, 3), False),
]
UNARY_IDS = [u[0] for u in UNARY]
HALF_UNARY = {"neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "gelu", "silu", "clamp", "floor", "round",
              "expm1", "atan", "sinh", "log2", "exp2"}


@pytest.mark.parametrize("dtype", FLOATS, ids=dtype_name)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", UNARY, ids=UNARY_IDS)
def test_unary_float(case, layout, dtype):
    name, kfn, nfn, (lo, hi), _ = case
    a = rand_array(make_rng(1), (3, 4), dtype, lo, hi)
    assert_close(kfn(to_kiln(a, dtype, layout)), nfn(a), dtype)


@pytest.mark.parametrize("case", UNARY, ids=UNARY_IDS)
def test_unary_shapes(case):
    name, kfn, nfn, (lo, hi), _ = case
    rng = make_rng(2)
    for shape in [(), (1,), (5,), (2, 3, 4), (0, 3)]:
        a = rand_array(rng, shape, kiln.float64, lo, hi)
        assert_close(kfn(kiln.Tensor(a)), nfn(a), kiln.float64)


@pytest.mark.parametrize("dtype", INTS, ids=dtype_name)
@pytest.mark.parametrize("case", UNARY, ids=UNARY_IDS)
def test_unary_int(case, dtype):
    name, kfn, nfn, (lo, hi), keeps_int = case
    a = rand_array(make_rng(3), (2, 5), dtype, max(lo, -3), min(hi, 3))
    if name in ("log", "sqrt", "rsqrt", "reciprocal", "log1p", "log2", "log10"):
        a = np.abs(a) + 1
    out = kfn(to_kiln(a, dtype))
    if keeps_int:
        assert_close(out, nfn(a).astype(NP_DTYPE[dtype]), dtype)
    else:  # integer inputs of float functions compute in float32
        assert out.dtype.is_floating_point, out.dtype
        with np.errstate(divide="ignore"):  # (atanh(+-1) is infinite)
            want = nfn(a.astype(np.float64))
        assert_close(out, want, out.dtype)


@pytest.mark.parametrize("dtype", HALFS, ids=dtype_name)
@pytest.mark.parametrize("case", [u for u in UNARY if u[0] in HALF_UNARY], ids=lambda u: u[0])
def test_unary_half(case, dtype):
    name, kfn, nfn, (lo, hi), _ = case
    a = rand_array(make_rng(4), (3, 5), dtype, lo, hi)
    out = kfn(to_kiln(a, dtype, "transposed"))
    assert out.dtype is dtype
    assert_close(out, nfn(a), dtype)


def test_logical_not():
    a = make_rng(5).random((3, 4)) < 0.5
    for layout in LAYOUTS:
        assert_close(ops.logical_not(to_kiln(a, kiln.bool, layout)), ~a, kiln.bool)
    x = np.array([0.0, -1.5, 2.0, 0.0])
    assert_close(ops.logical_not(kiln.Tensor(x)), x == 0, kiln.bool)
    assert_close(~kiln.Tensor(a), ~a, kiln.bool)


def test_clamp_tensor_bounds():
    rng = make_rng(6)
    x, lo, hi = rng.uniform(-3, 3, (2, 3)), rng.uniform(-2, 0, (3,)), rng.uniform(0, 2, (2, 1))
    assert_close(ops.clamp(kiln.Tensor(x), kiln.Tensor(lo), kiln.Tensor(hi)), np.minimum(np.maximum(x, lo), hi))
    assert_close(kiln.Tensor(x).clip(-1.0, 1.0), np.clip(x, -1, 1))


ALL_DTYPES = (kiln.bool, kiln.int8, kiln.int32, kiln.int64, kiln.float16, kiln.bfloat16, kiln.float32, kiln.float64)


@pytest.mark.parametrize("src", ALL_DTYPES, ids=dtype_name)
@pytest.mark.parametrize("dst", ALL_DTYPES, ids=dtype_name)
def test_cast(src, dst):
    if src is kiln.bool:
        a = np.array([[True, False, True], [False, False, True]])
    elif src.is_floating_point:
        a = round_to(np.array([[0.0, 1.0, -2.0], [3.0, 0.5, 7.0]]), src)
    else:
        a = np.array([[0, 1, -2], [3, 100, 7]], NP_DTYPE[src])
    if dst is kiln.bool:
        expected = a != 0
    elif not dst.is_floating_point and src.is_floating_point:
        expected = np.trunc(a).astype(NP_DTYPE[dst])  # toward zero, as C and NumPy do
    else:
        expected = a.astype(NP_DTYPE[dst])
    for layout in ("contiguous", "strided"):
        out = ops.cast(to_kiln(a, src, layout), dst)
        assert_close(out, expected, dst)
    assert to_kiln(a, src).astype(dst).dtype is dst


def test_cast_float_to_int_truncates():
    x = kiln.Tensor(np.array([-2.7, -0.5, 0.5, 2.7, 3.0]))
    assert_close(x.astype(kiln.int32), np.array([-2, 0, 0, 2, 3], np.int32), kiln.int32)
    assert_close(x.long(), np.array([-2, 0, 0, 2, 3], np.int64), kiln.int64)


# ---- binary elementwise -------------------------------------------------------------------
# (name, kiln fn, NumPy fn, kind) kind: arith | div | mod | float | pow | cmp | logical
BINARY = [
    ("add", ops.add, np.add, "arith"),
    ("sub", ops.sub, np.subtract, "arith"),
    ("mul", ops.mul, np.multiply, "arith"),
    ("div", ops.div, np.divide, "div"),
    ("pow", ops.pow, np.power, "pow"),
    ("maximum", ops.maximum, np.maximum, "arith"),
    ("minimum", ops.minimum, np.minimum, "arith"),
    ("eq", ops.eq, np.equal, "cmp"),
    ("ne", ops.ne, np.not_equal, "cmp"),
    ("lt", ops.lt, np.less, "cmp"),
    ("le", ops.le, np.less_equal, "cmp"),
    ("gt", ops.gt, np.greater, "cmp"),
    ("ge", ops.ge, np.greater_equal, "cmp"),
    ("logical_and", ops.logical_and, np.logical_and, "logical"),
    ("logical_or", ops.logical_or, np.logical_or, "logical"),
    ("fmod", ops.fmod, np.fmod, "mod"),
    ("atan2", ops.atan2, np.arctan2, "float"),
    ("hypot", ops.hypot, np.hypot, "float"),
    ("logaddexp", ops.logaddexp, np.logaddexp, "float"),
]
BINARY_IDS = [b[0] for b in BINARY]
BROADCAST_SHAPES = [((2, 3), (2, 3)), ((2, 3), (3,)), ((4, 1, 3), (2, 1)), ((), (2, 3)), ((2, 3), ()),
                    ((3, 1), (1, 4)), ((1,), (2, 1)), ((2, 1, 3), (1, 4, 1)), ((0, 3), (3,))]


def _binary_inputs(rng, kind, sa, sb, da, db):
    if kind == "cmp" or kind == "logical":  # few distinct values so ties happen
        a = rand_array(rng, sa, da, -2, 2)
        b = rand_array(rng, sb, db, -2, 2)
        if da.is_floating_point:
            a = np.round(a)
        if db.is_floating_point:
            b = np.round(b)
        return a, b
    if kind == "pow":
        a = rand_array(rng, sa, da, 0.5, 3) if da.is_floating_point else rand_array(rng, sa, da, 0, 4)
        b = rand_array(rng, sb, db, -2, 2) if db.is_floating_point else rand_array(rng, sb, db, 0, 3)
        return a, b
    a = rand_array(rng, sa, da, -3, 3)
    b = rand_array(rng, sb, db, -3, 3)
    if kind in ("div", "mod"):  # (nonzero divisors)
        b = np.where(b == 0, 1, b).astype(b.dtype) if not db.is_floating_point else \
            np.where(np.abs(b) < 0.25, 1.0, b)
    return a, b


def _binary_expected(nfn, kind, a, b, da, db):
    """(values, dtype) NumPy computes for kiln's result dtype."""
    if kind in ("cmp", "logical"):
        return nfn(a.astype(np.float64), b.astype(np.float64)), kiln.bool
    res = promote(da, db)
    if kind == "float" and not res.is_floating_point:  # float-valued ops of integers give float32
        res = kiln.float32
    if kind == "div" and not res.is_floating_point:
        res = kiln.float32
    if res.is_floating_point:
        return nfn(a.astype(np.float64), b.astype(np.float64)), res
    if res is kiln.bool:
        return nfn(a, b), res
    return nfn(a.astype(NP_DTYPE[res]), b.astype(NP_DTYPE[res])), res


def _binary_dtypes(kind):
    if kind in ("cmp", "logical"):
        return FLOATS + INTS + (kiln.bool,)
    if kind == "pow":
        return FLOATS + INTS
    if kind == "div":
        return FLOATS + INTS
    return FLOATS + INTS


@pytest.mark.parametrize("case", BINARY, ids=BINARY_IDS)
def test_binary_dtypes(case):
    name, kfn, nfn, kind = case
    rng = make_rng(10)
    for dt in _binary_dtypes(kind):
        for sa, sb in [((2, 3), (2, 3)), ((2, 3), (3,))]:
            a, b = _binary_inputs(rng, kind, sa, sb, dt, dt)
            expected, rdt = _binary_expected(nfn, kind, a, b, dt, dt)
            assert_close(kfn(to_kiln(a, dt), to_kiln(b, dt)), expected, rdt)


@pytest.mark.parametrize("case", [b for b in BINARY if b[3] in ("arith", "cmp", "logical")], ids=lambda b: b[0])
def test_binary_bool(case):
    name, kfn, nfn, kind = case
    if name == "sub":
        pytest.skip("bool subtraction is rejected (see test_errors)")
    rng = make_rng(11)
    a, b = rng.random((2, 3)) < 0.5, rng.random((3,)) < 0.5
    out = kfn(kiln.Tensor(a), kiln.Tensor(b))
    assert_close(out, nfn(a, b).astype(np.bool_), kiln.bool)


@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=lambda s: f"{s[0]}&{s[1]}")
@pytest.mark.parametrize("case", BINARY, ids=BINARY_IDS)
def test_binary_broadcast(case, shapes):
    name, kfn, nfn, kind = case
    rng = make_rng(12)
    for dt in FLOATS:
        a, b = _binary_inputs(rng, kind, shapes[0], shapes[1], dt, dt)
        expected, rdt = _binary_expected(nfn, kind, a, b, dt, dt)
        assert_close(kfn(kiln.Tensor(a, dt), kiln.Tensor(b, dt)), expected, rdt)


@pytest.mark.parametrize("layouts", [("transposed", "strided"), ("strided", "transposed"),
                                     ("strided", "strided"), ("transposed", "contiguous")], ids="-".join)
@pytest.mark.parametrize("case", BINARY, ids=BINARY_IDS)
def test_binary_layouts(case, layouts):
    name, kfn, nfn, kind = case
    rng = make_rng(13)
    for dt in (kiln.float64, kiln.int32):
        for sa, sb in [((3, 4), (3, 4)), ((2, 3, 4), (3, 4)), ((3, 4), (3, 1))]:
            a, b = _binary_inputs(rng, kind, sa, sb, dt, dt)
            expected, rdt = _binary_expected(nfn, kind, a, b, dt, dt)
            assert_close(kfn(to_kiln(a, dt, layouts[0]), to_kiln(b, dt, layouts[1])), expected, rdt)


@pytest.mark.parametrize("dtype", HALFS, ids=dtype_name)
@pytest.mark.parametrize("case", [b for b in BINARY if b[0] in ("add", "sub", "mul", "div", "maximum", "lt", "pow")],
                         ids=lambda b: b[0])
def test_binary_half(case, dtype):
    name, kfn, nfn, kind = case
    a, b = _binary_inputs(make_rng(14), kind, (3, 4), (4,), dtype, dtype)
    expected, rdt = _binary_expected(nfn, kind, a, b, dtype, dtype)
    assert_close(kfn(to_kiln(a, dtype, "transposed"), to_kiln(b, dtype)), expected, rdt)


PROMOTIONS = [
    (kiln.int32, kiln.float32, kiln.float32), (kiln.int32, kiln.int64, kiln.int64),
    (kiln.float16, kiln.float32, kiln.float32), (kiln.float32, kiln.float64, kiln.float64),
    (kiln.bool, kiln.int32, kiln.int32), (kiln.bool, kiln.float64, kiln.float64),
    (kiln.int64, kiln.float16, kiln.float16), (kiln.int8, kiln.int32, kiln.int32),
    (kiln.bfloat16, kiln.float32, kiln.float32), (kiln.float16, kiln.bfloat16, kiln.float32),
    (kiln.int64, kiln.float32, kiln.float32), (kiln.bool, kiln.bool, kiln.bool),
]


@pytest.mark.parametrize("da,db,expected", PROMOTIONS, ids=lambda d: dtype_name(d))
def test_type_promotion(da, db, expected):
    rng = make_rng(15)
    a, b = rand_array(rng, (2, 3), da, 0, 3), rand_array(rng, (3,), db, 0, 3)
    for x, y in ((a, b), (b, a)):
        dx, dy = (da, db) if x is a else (db, da)
        out = kiln.Tensor(x, dx) + kiln.Tensor(y, dy)
        assert out.dtype is expected, (dx, dy, out.dtype)
        ref = x.astype(np.float64) + y.astype(np.float64)
        if expected is kiln.bool:
            ref = np.logical_or(x, y)
        assert_close(out, ref, expected)
        assert (kiln.Tensor(x, dx) * kiln.Tensor(y, dy)).dtype is expected


def test_where():
    rng = make_rng(16)
    cond = rng.random((2, 3)) < 0.5
    for dt in FLOATS + INTS:
        x, y = rand_array(rng, (2, 3), dt), rand_array(rng, (3,), dt)
        for layout in LAYOUTS:
            out = ops.where(to_kiln(cond, kiln.bool, layout), to_kiln(x, dt, layout), kiln.Tensor(y, dt))
            assert_close(out, np.where(cond, x, y), dt)
    # broadcasting across all three, a scalar branch, a non-bool condition
    c = rng.random((4, 1, 3)) < 0.5
    x, y = rng.standard_normal((2, 1)), rng.standard_normal(())
    assert_close(ops.where(kiln.Tensor(c), kiln.Tensor(x), kiln.Tensor(y)), np.where(c, x, y), kiln.float64)
    yt = kiln.Tensor(np.array([1.0, 2.0, 3.0], np.float32))
    assert_close(ops.where(kiln.Tensor(cond), 0.5, yt), np.where(cond, 0.5, [1, 2, 3]), kiln.float32)
    ci = np.array([0, 2, -1])
    assert_close(ops.where(kiln.Tensor(ci), yt, yt * 10), np.where(ci != 0, [1, 2, 3], [10, 20, 30]))


# ---- Python operators and weak scalars ------------------------------------------------------

OPERATORS = [
    ("+", lambda a, b: a + b), ("-", lambda a, b: a - b), ("*", lambda a, b: a * b),
    ("/", lambda a, b: a / b), ("**", lambda a, b: a ** b),
]


def _weak_dtype(tdtype, scalar, op):
    """NumPy 2's result dtype for `tensor OP python scalar` (kiln: float defaults to float32)."""
    if op == "/":
        return tdtype if tdtype.is_floating_point else kiln.float32
    if isinstance(scalar, float):
        return tdtype if tdtype.is_floating_point else kiln.float32
    if tdtype is kiln.bool:
        return kiln.int64
    return tdtype


@pytest.mark.parametrize("scalar", [2, 2.5, -1, 0.5], ids=repr)
@pytest.mark.parametrize("tdtype", (kiln.float32, kiln.float64, kiln.float16, kiln.int32, kiln.int64),
                         ids=dtype_name)
@pytest.mark.parametrize("op", OPERATORS, ids=lambda o: o[0])
def test_operators_with_scalars(op, tdtype, scalar):
    sym, f = op
    a = np.array([[1, 2, 3], [4, 1, 2]], NP_DTYPE[tdtype])
    t = kiln.Tensor(a, tdtype)
    ref_scalar = np.float64(scalar) if isinstance(scalar, float) or sym == "/" else np.int64(scalar)
    if sym == "**" and not isinstance(scalar, float) and scalar < 0 and not tdtype.is_floating_point:
        return  # integers to negative integer powers: undefined
    expected_dtype = _weak_dtype(tdtype, scalar, sym)
    # tensor OP scalar
    out = f(t, scalar)
    assert out.dtype is expected_dtype, f"tensor({tdtype}) {sym} {scalar!r} -> {out.dtype}"
    ref = f(a.astype(np.float64), ref_scalar) if expected_dtype.is_floating_point else f(a, ref_scalar)
    assert_close(out, np.asarray(ref).astype(NP_DTYPE[expected_dtype]), expected_dtype, check_dtype=False)
    # scalar OP tensor
    if sym == "**" and not isinstance(scalar, float) and not tdtype.is_floating_point and a.min() < 0:
        return
    out = f(scalar, t)
    assert out.dtype is expected_dtype, f"{scalar!r} {sym} tensor({tdtype}) -> {out.dtype}"
    ref = f(ref_scalar, a.astype(np.float64)) if expected_dtype.is_floating_point else f(ref_scalar, a)
    assert_close(out, np.asarray(ref).astype(NP_DTYPE[expected_dtype]), expected_dtype, check_dtype=False)


def test_weak_scalar_rules():
    f32 = kiln.Tensor(np.ones(3, np.float32))
    i32 = kiln.Tensor(np.ones(3, np.int32))
    i64 = kiln.Tensor(np.ones(3, np.int64))
    f16 = kiln.Tensor(np.ones(3, np.float16))
    assert (f32 * 2.0).dtype is kiln.float32
    assert (2.0 * f32).dtype is kiln.float32
    assert (f32 + 1).dtype is kiln.float32
    assert (i32 * 2.5).dtype is kiln.float32
    assert (2.5 * i32).dtype is kiln.float32
    assert (i32 + 1).dtype is kiln.int32
    assert (1 + i32).dtype is kiln.int32
    assert (i64 * 3).dtype is kiln.int64
    assert (f16 * 2.0).dtype is kiln.float16
    assert (f16 + 1).dtype is kiln.float16
    assert (i32 / 2).dtype is kiln.float32
    assert (2 ** i32).dtype is kiln.int32
    assert (i32 ** 2).dtype is kiln.int32
    assert (-f32).dtype is kiln.float32 and (-i32).dtype is kiln.int32
    np.testing.assert_allclose(to_numpy(i32 * 2.5), [2.5, 2.5, 2.5])


def test_matmul_operator_and_unary_minus():
    rng = make_rng(17)
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((3, 4))
    assert_close(kiln.Tensor(a) @ kiln.Tensor(b), a @ b, kiln.float64)
    assert_close(-kiln.Tensor(a), -a, kiln.float64)
    assert_close(abs(kiln.Tensor(a)), np.abs(a), kiln.float64)
    assert_close(+kiln.Tensor(a), a, kiln.float64)


@pytest.mark.parametrize("scalar", [1, 1.5, -2])
def test_comparison_operators(scalar):
    a = np.array([[1.0, 1.5, -2.0], [3.0, -1.0, 0.0]])
    t = kiln.Tensor(a, kiln.float32)
    pairs = [(t < scalar, a < scalar), (t <= scalar, a <= scalar), (t > scalar, a > scalar),
             (t >= scalar, a >= scalar), (t == scalar, a == scalar), (t != scalar, a != scalar),
             (scalar < t, scalar < a), (scalar <= t, scalar <= a), (scalar > t, scalar > a),
             (scalar >= t, scalar >= a), (scalar == t, scalar == a), (scalar != t, scalar != a)]
    for got, exp in pairs:
        assert_close(got, exp, kiln.bool)
    u = kiln.Tensor(np.array([1.5, 1.5, 0.0]))
    assert_close(t == u, a == [1.5, 1.5, 0.0], kiln.bool)
    assert_close(t < u, a < [1.5, 1.5, 0.0], kiln.bool)


def test_bool_operators():
    a = np.array([True, False, True, False])
    b = np.array([True, True, False, False])
    ta, tb = kiln.Tensor(a), kiln.Tensor(b)
    assert_close(ta & tb, a & b, kiln.bool)
    assert_close(ta | tb, a | b, kiln.bool)
    assert_close(~ta, ~a, kiln.bool)
    assert_close(ta & True, a & True, kiln.bool)
    assert_close(False | ta, a | False, kiln.bool)
    assert_close(True & ta, a, kiln.bool)
    assert_close((kiln.Tensor([1.0, 2.0, 3.0]) > 1.5) & (kiln.Tensor([1.0, 2.0, 3.0]) < 2.5), [False, True, False])


# ---- reductions ---------------------------------------------------------------------------
AXES = [None, 0, 1, -1, (0, 2), (-1, 0), (0, 1, 2), ()]


def _np_reduce(name, a, axis, keepdims, ddof=0):
    f = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}
    if name in f:
        return f[name](a, axis=axis, keepdims=keepdims)
    if name in ("var", "std"):
        return getattr(np, name)(a, axis=axis, keepdims=keepdims, ddof=ddof)
    raise KeyError(name)


REDUCTIONS = [("sum", ops.sum), ("mean", ops.mean), ("max", ops.max), ("min", ops.min), ("prod", ops.prod),
              ("var", ops.var), ("std", ops.std)]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=repr)
@pytest.mark.parametrize("case", REDUCTIONS, ids=lambda c: c[0])
def test_reduction_float(case, axis, keepdims):
    name, kfn = case
    rng = make_rng(20)
    for dt in FLOATS:
        a = rand_array(rng, (2, 3, 4), dt, 0.5, 1.5 if name == "prod" else 3)
        for layout in LAYOUTS:
            out = kfn(to_kiln(a, dt, layout), axis, keepdims)
            assert_close(out, _np_reduce(name, a, axis, keepdims), dt)


@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize("name", ["var", "std"])
def test_var_std_ddof(name, ddof):
    a = make_rng(21).standard_normal((3, 5))
    kfn = getattr(ops, name)
    for axis in (None, 0, 1):
        assert_close(kfn(kiln.Tensor(a), axis, ddof=ddof), _np_reduce(name, a, axis, False, ddof), kiln.float64)
    assert_close(getattr(kiln.Tensor(a), name)(1, keepdims=True, ddof=ddof),
                 _np_reduce(name, a, 1, True, ddof), kiln.float64)
    assert_close(kfn(kiln.Tensor(a), dim=0, unbiased=True), _np_reduce(name, a, 0, False, 1), kiln.float64)


@pytest.mark.parametrize("axis", [None, 0, -1, (0, 1)], ids=repr)
@pytest.mark.parametrize("name", ["sum", "prod", "max", "min", "mean"])
def test_reduction_int_bool(name, axis):
    rng = make_rng(22)
    for dt in INTS + (kiln.int8,):
        a = rand_array(rng, (3, 4), dt, -3, 3)
        out = getattr(ops, name)(to_kiln(a, dt, "transposed"), axis)
        exp = _np_reduce(name, a.astype(np.int64) if name in ("sum", "prod") else a, axis, False)
        if name in ("sum", "prod"):
            assert_close(out, exp, kiln.int64)
        elif name == "mean":
            assert out.dtype.is_floating_point
            assert_close(out, exp, out.dtype)
        else:
            assert_close(out, exp, dt)
    b = rng.random((3, 4)) < 0.5
    tb = kiln.Tensor(b)
    if name == "sum":
        assert_close(ops.sum(tb, axis), np.sum(b, axis=axis), kiln.int64)
    elif name in ("max", "min"):
        assert_close(getattr(ops, name)(tb, axis), _np_reduce(name, b, axis, False), kiln.bool)


def test_all_any():
    rng = make_rng(23)
    a = rng.random((3, 4)) < 0.7
    for axis in (None, 0, 1):
        assert_close(ops.all(kiln.Tensor(a), axis), np.all(a, axis=axis), kiln.bool)
        assert_close(ops.any(kiln.Tensor(a), axis), np.any(a, axis=axis), kiln.bool)
    f = np.array([[0.0, 1.0], [2.0, 3.0]])
    assert_close(kiln.Tensor(f).all(1), np.all(f, axis=1), kiln.bool)
    assert_close(kiln.Tensor(f).any(0), np.any(f, axis=0), kiln.bool)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1], ids=repr)
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_argmin(name, axis, keepdims):
    rng = make_rng(24)
    nfn = getattr(np, name)
    for dt in FLOATS + INTS:
        a = rand_array(rng, (3, 4, 5), dt, -50, 50)
        for layout in LAYOUTS:
            out = getattr(ops, name)(to_kiln(a, dt, layout), axis, keepdims)
            assert_close(out, nfn(a, axis=axis, keepdims=keepdims), kiln.int64)
    ties = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]])  # first occurrence wins
    assert_close(getattr(ops, name)(kiln.Tensor(ties), 1), nfn(ties, axis=1), kiln.int64)


@pytest.mark.parametrize("dtype", HALFS, ids=dtype_name)
@pytest.mark.parametrize("name", ["sum", "mean", "max", "min", "var"])
def test_reduction_half(name, dtype):
    a = rand_array(make_rng(25), (4, 6), dtype, 0, 2)
    for axis in (None, 1):
        out = getattr(ops, name)(to_kiln(a, dtype, "transposed"), axis)
        assert out.dtype is dtype
        assert_close(out, _np_reduce(name, a, axis, False), dtype, rtol=2e-2, atol=5e-2)


def test_reduction_empty_and_scalar():
    z = np.zeros((0, 3))
    assert_close(ops.sum(kiln.Tensor(z), 0), np.zeros(3), kiln.float64)
    assert_close(ops.prod(kiln.Tensor(z), 0), np.ones(3), kiln.float64)
    s = kiln.Tensor(np.array(2.5))
    assert_close(s.sum(), 2.5, kiln.float64)
    assert_close(s.max(), 2.5, kiln.float64)
    assert_close(s.argmax(), np.int64(0), kiln.int64)


def test_reduction_large_exact():
    a = np.arange(100_000, dtype=np.float64)
    assert_close(ops.sum(kiln.Tensor(a)), a.sum(), kiln.float64)
    a32 = make_rng(26).random(200_003).astype(np.float32)
    np.testing.assert_allclose(ops.sum(kiln.Tensor(a32)).item(), a32.astype(np.float64).sum(), rtol=1e-5)
    np.testing.assert_allclose(ops.mean(kiln.Tensor(a32)).item(), a32.astype(np.float64).mean(), rtol=1e-5)


# ---- softmax ------------------------------------------------------------------------------


def _np_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _np_log_softmax(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax(name, axis):
    nfn = _np_softmax if name == "softmax" else _np_log_softmax
    rng = make_rng(30)
    for dt in FLOATS:
        a = rand_array(rng, (2, 3, 5), dt, -4, 4)
        for layout in LAYOUTS:
            assert_close(getattr(ops, name)(to_kiln(a, dt, layout), axis), nfn(a, axis), dt)
    big = rng.standard_normal((2, 4)) * 10 + 1000.0  # stable for large logits
    assert_close(getattr(ops, name)(kiln.Tensor(big), axis % 2), nfn(big, axis % 2), kiln.float64)
    assert_close(getattr(ops, name)(kiln.Tensor(-big), axis % 2), nfn(-big, axis % 2), kiln.float64)


@pytest.mark.parametrize("dtype", HALFS, ids=dtype_name)
def test_softmax_half(dtype):
    a = rand_array(make_rng(31), (3, 8), dtype, -3, 3)
    assert_close(ops.softmax(kiln.Tensor(a, dtype)), _np_softmax(a, -1), dtype)
    assert_close(ops.log_softmax(kiln.Tensor(a, dtype)), _np_log_softmax(a, -1), dtype, rtol=2e-2, atol=5e-2)


def test_softmax_method_and_dim():
    a = make_rng(32).standard_normal((3, 4))
    assert_close(kiln.Tensor(a).softmax(0), _np_softmax(a, 0))
    assert_close(ops.softmax(kiln.Tensor(a), dim=0), _np_softmax(a, 0))
    assert_close(kiln.Tensor(a).log_softmax(), _np_log_softmax(a, -1))


# ---- matmul and dense -----------------------------------------------------------------------
MATMUL_SHAPES = [((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((2, 3), (3, 4)), ((1, 1), (1, 1)),
                 ((5, 2, 3), (5, 3, 4)), ((2, 2, 3), (3, 4)), ((3,), (2, 3, 4)), ((2, 3, 4), (4,)),
                 ((2, 1, 2, 3), (3, 3, 4)), ((4, 1, 3), (1, 3, 2)), ((2, 0), (0, 3)), ((17, 33), (33, 9))]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=lambda s: f"{s[0]}@{s[1]}")
def test_matmul(shapes):
    rng = make_rng(40)
    for dt in FLOATS:
        a, b = rand_array(rng, shapes[0], dt), rand_array(rng, shapes[1], dt)
        exp = np.matmul(a, b)
        for la, lb in [("contiguous", "contiguous"), ("transposed", "transposed"), ("strided", "transposed"),
                       ("transposed", "strided")]:
            assert_close(ops.matmul(to_kiln(a, dt, la), to_kiln(b, dt, lb)), exp, dt, rtol=tol(dt)["rtol"] * 5)
        assert_close(to_kiln(a, dt) @ to_kiln(b, dt), exp, dt, rtol=tol(dt)["rtol"] * 5)


def test_matmul_int_and_half():
    rng = make_rng(41)
    for dt in INTS:
        a, b = rand_array(rng, (3, 4), dt, -5, 5), rand_array(rng, (2, 4, 2), dt, -5, 5)
        assert_close(ops.matmul(kiln.Tensor(a, dt), kiln.Tensor(b, dt)), np.matmul(a, b), dt)
    for dt in HALFS:
        a, b = rand_array(rng, (3, 8), dt, -1, 1), rand_array(rng, (8, 5), dt, -1, 1)
        assert_close(ops.matmul(to_kiln(a, dt, "transposed"), kiln.Tensor(b, dt)), a @ b, dt, rtol=3e-2, atol=6e-2)
    a32, b64 = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((3, 2))
    assert_close(ops.matmul(kiln.Tensor(a32), kiln.Tensor(b64)), a32.astype(np.float64) @ b64, kiln.float64,
                 rtol=1e-6)


def test_matmul_large_blocked():
    rng = make_rng(42)
    a, b = rng.standard_normal((130, 257)).astype(np.float32), rng.standard_normal((257, 70)).astype(np.float32)
    exp = a.astype(np.float64) @ b.astype(np.float64)
    assert_close(kiln.Tensor(a) @ kiln.Tensor(b), exp, kiln.float32, rtol=1e-4, atol=1e-4)
    assert_close(to_kiln(a, layout="transposed") @ to_kiln(b, layout="transposed"), exp, kiln.float32,
                 rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("xshape", [(4, 5), (2, 3, 5), (5,)], ids=str)
def test_dense(xshape, bias):
    rng = make_rng(43)
    for dt in FLOATS:
        x, w, b = rand_array(rng, xshape, dt), rand_array(rng, (3, 5), dt), rand_array(rng, (3,), dt)
        exp = x @ w.T + (b if bias else 0)
        for layout in ("contiguous", "transposed", "strided"):
            out = ops.dense(to_kiln(x, dt, layout), to_kiln(w, dt, layout), to_kiln(b, dt) if bias else None)
            assert_close(out, exp, dt, rtol=tol(dt)["rtol"] * 5)
        assert_close(ops.linear(kiln.Tensor(x, dt), kiln.Tensor(w, dt), kiln.Tensor(b, dt) if bias else None), exp,
                     dt, rtol=tol(dt)["rtol"] * 5)


# ---- convolution --------------------------------------------------------------------------


def same_pads(size, k, stride, dilation):
    keff = (k - 1) * dilation + 1
    out = -(-size // stride)
    total = max(0, (out - 1) * stride + keff - size)
    return total // 2, total - total // 2


def conv2d_ref(x, w, b=None, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """Direct NCHW convolution in float64; pads = (top, bottom, left, right)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (dh, dw) = stride, dilation
    pt, pb, pl, pr = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, ho, wo))
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, i, j])
    if b is not None:
        out += b.reshape(1, -1, 1, 1)
    return out


# (x shape, w shape, kwargs)
CONV_CASES = [
    ((2, 3, 7, 6), (4, 3, 3, 3), dict()),
    ((1, 3, 7, 6), (4, 3, 3, 3), dict(padding=1)),
    ((2, 2, 8, 7), (3, 2, 3, 2), dict(stride=2, padding=1)),
    ((1, 2, 9, 9), (2, 2, 3, 3), dict(stride=(2, 1), padding=(1, 2))),
    ((1, 2, 9, 8), (2, 2, 3, 3), dict(padding=(0, 1, 2, 1))),
    ((1, 2, 9, 9), (3, 2, 3, 3), dict(dilation=2, padding=2)),
    ((1, 2, 10, 9), (3, 2, 2, 3), dict(dilation=(2, 3))),
    ((2, 4, 6, 6), (6, 2, 3, 3), dict(groups=2, padding=1)),
    ((1, 6, 6, 5), (6, 1, 3, 3), dict(groups=6, padding=1)),  # depthwise
    ((1, 3, 7, 7), (5, 3, 3, 3), dict(pad_mode="same")),
    ((1, 3, 8, 7), (5, 3, 4, 2), dict(pad_mode="same", stride=2)),
    ((1, 3, 9, 9), (2, 3, 3, 3), dict(pad_mode="same", dilation=2)),
    ((1, 3, 7, 7), (5, 3, 3, 3), dict(pad_mode="valid", stride=2)),
    ((2, 3, 5, 5), (4, 3, 1, 1), dict()),
    ((1, 1, 4, 4), (1, 1, 4, 4), dict()),
    ((1, 4, 8, 8), (4, 2, 3, 3), dict(groups=2, stride=2, dilation=2, padding=2)),
]


def _conv_pads(xshape, wshape, kw):
    mode = kw.get("pad_mode", "pad")
    st = kw.get("stride", 1)
    st = (st, st) if isinstance(st, int) else st
    dl = kw.get("dilation", 1)
    dl = (dl, dl) if isinstance(dl, int) else dl
    if mode == "valid":
        return (0, 0, 0, 0), st, dl
    if mode == "same":
        return same_pads(xshape[2], wshape[2], st[0], dl[0]) + same_pads(xshape[3], wshape[3], st[1], dl[1]), st, dl
    p = kw.get("padding", 0)
    if isinstance(p, int):
        p = (p,) * 4
    elif len(p) == 2:
        p = (p[0], p[0], p[1], p[1])
    return tuple(p), st, dl


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}*{c[1]}-{c[2]}")
def test_conv2d(case, bias):
    xs, ws, kw = case
    rng = make_rng(50)
    pads, st, dl = _conv_pads(xs, ws, kw)
    for dt in FLOATS:
        x, w, b = rand_array(rng, xs, dt), rand_array(rng, ws, dt), rand_array(rng, (ws[0],), dt)
        exp = conv2d_ref(x, w, b if bias else None, st, pads, dl, kw.get("groups", 1))
        for layout in ("contiguous", "strided", "transposed"):
            out = ops.conv2d(to_kiln(x, dt, layout), to_kiln(w, dt, layout), to_kiln(b, dt) if bias else None, **kw)
            assert_close(out, exp, dt, rtol=tol(dt)["rtol"] * 5, atol=tol(dt)["atol"] * 10)
    if kw.get("pad_mode") == "same" and st == (1, 1):
        assert out.shape[2:] == xs[2:]


@pytest.mark.parametrize("dtype", HALFS, ids=dtype_name)
def test_conv2d_half(dtype):
    rng = make_rng(51)
    x, w, b = rand_array(rng, (1, 3, 6, 6), dtype, -1, 1), rand_array(rng, (4, 3, 3, 3), dtype, -1, 1), \
        rand_array(rng, (4,), dtype, -1, 1)
    out = ops.conv2d(kiln.Tensor(x, dtype), kiln.Tensor(w, dtype), kiln.Tensor(b, dtype), padding=1)
    assert out.dtype is dtype
    assert_close(out, conv2d_ref(x, w, b, pads=(1, 1, 1, 1)), dtype, rtol=3e-2, atol=8e-2)


def test_conv2d_large_channels():
    rng = make_rng(52)
    x, w = rng.standard_normal((2, 32, 12, 12)).astype(np.float32), rng.standard_normal((16, 32, 3, 3)).astype(
        np.float32)
    exp = conv2d_ref(x, w, None, (1, 1), (1, 1, 1, 1))
    assert_close(ops.conv2d(kiln.Tensor(x), kiln.Tensor(w), padding=1), exp, kiln.float32, rtol=1e-4, atol=1e-4)


# ---- pooling -------------------------------------------------------------------------------


def _pool_out(size, k, s, p0, p1, d, ceil_mode):
    eff = d * (k - 1) + 1
    num = size + p0 + p1 - eff
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= size + p0:  # the last window must start inside the input or left pad
        out -= 1
    return out


def pool2d_ref(x, kernel, stride=None, pads=(0, 0, 0, 0), dilation=(1, 1), ceil_mode=False, mode="max",
               count_include_pad=True):
    n, c, h, w = x.shape
    (kh, kw), (dh, dw) = kernel, dilation
    sh, sw = stride or kernel
    pt, pb, pl, pr = pads
    ho, wo = _pool_out(h, kh, sh, pt, pb, dh, ceil_mode), _pool_out(w, kw, sw, pl, pr, dw, ceil_mode)
    out = np.zeros((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            h0, w0 = i * sh - pt, j * sw - pl
            if mode == "max":
                rows = [h0 + a * dh for a in range(kh) if 0 <= h0 + a * dh < h]
                cols = [w0 + b * dw for b in range(kw) if 0 <= w0 + b * dw < w]
                out[:, :, i, j] = x[:, :, rows][:, :, :, cols].max(axis=(2, 3))
            else:
                h1, w1 = min(h0 + kh, h + pb), min(w0 + kw, w + pr)
                pool_size = (h1 - h0) * (w1 - w0)
                hs, ws, he, we = max(h0, 0), max(w0, 0), min(h1, h), min(w1, w)
                total = x[:, :, hs:he, ws:we].sum(axis=(2, 3))
                out[:, :, i, j] = total / (pool_size if count_include_pad else (he - hs) * (we - ws))
    return out


def _pool_args(kw):
    k = kw["kernel_size"]
    k = (k, k) if isinstance(k, int) else k
    s = kw.get("stride")
    s = k if s is None else ((s, s) if isinstance(s, int) else s)
    p = kw.get("padding", 0)
    p = (p,) * 4 if isinstance(p, int) else (p[0], p[0], p[1], p[1])
    d = kw.get("dilation", 1)
    d = (d, d) if isinstance(d, int) else d
    return k, s, p, d


POOL_CASES = [
    ((2, 3, 6, 6), dict(kernel_size=2)),
    ((1, 2, 7, 5), dict(kernel_size=3, stride=2)),
    ((1, 2, 7, 7), dict(kernel_size=3, stride=2, padding=1)),
    ((1, 2, 8, 6), dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0))),
    ((1, 2, 7, 7), dict(kernel_size=3, stride=2, ceil_mode=True)),
    ((1, 2, 8, 8), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ((1, 1, 5, 5), dict(kernel_size=5)),
    ((2, 2, 9, 9), dict(kernel_size=2, stride=3)),
]


@pytest.mark.parametrize("case", POOL_CASES + [((1, 2, 9, 9), dict(kernel_size=3, stride=2, dilation=2)),
                                               ((1, 2, 9, 8), dict(kernel_size=2, dilation=(2, 3), padding=1))],
                         ids=lambda c: f"{c[0]}-{c[1]}")
def test_max_pool2d(case):
    xs, kw = case
    k, s, p, d = _pool_args(kw)
    rng = make_rng(60)
    for dt in FLOATS:
        x = rand_array(rng, xs, dt, -5, 5)
        exp = pool2d_ref(x, k, s, p, d, kw.get("ceil_mode", False), "max")
        for layout in LAYOUTS:
            assert_close(ops.max_pool2d(to_kiln(x, dt, layout), **kw), exp, dt)


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_avg_pool2d(case, count_include_pad):
    xs, kw = case
    k, s, p, d = _pool_args(kw)
    rng = make_rng(61)
    for dt in FLOATS:
        x = rand_array(rng, xs, dt, -5, 5)
        exp = pool2d_ref(x, k, s, p, d, kw.get("ceil_mode", False), "avg", count_include_pad)
        for layout in LAYOUTS:
            out = ops.avg_pool2d(to_kiln(x, dt, layout), count_include_pad=count_include_pad, **kw)
            assert_close(out, exp, dt)


@pytest.mark.parametrize("dtype", HALFS + INTS[:0], ids=dtype_name)
def test_pool_half(dtype):
    x = rand_array(make_rng(62), (1, 2, 6, 6), dtype, -2, 2)
    out = ops.max_pool2d(kiln.Tensor(x, dtype), 2)
    assert out.dtype is dtype
    assert_close(out, pool2d_ref(x, (2, 2)), dtype)
    out = ops.avg_pool2d(kiln.Tensor(x, dtype), 3, 1, 1)
    assert_close(out, pool2d_ref(x, (3, 3), (1, 1), (1, 1, 1, 1), mode="avg"), dtype)


# ---- normalization -------------------------------------------------------------------------


def batch_norm_ref(x, rm, rv, g, b, training, momentum, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    if training:
        mean, var = x.mean(axis=axes), x.var(axis=axes)
        n = x.size // x.shape[1]
        rm = (1 - momentum) * rm + momentum * mean
        rv = (1 - momentum) * rv + momentum * var * n / (n - 1)
    else:
        mean, var = rm, rv
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * g.reshape(shape) + b.reshape(shape)
    return y, rm, rv


@pytest.mark.parametrize("xshape", [(4, 3, 5, 2), (6, 3), (2, 3, 7)], ids=str)
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm(training, xshape):
    rng = make_rng(70)
    for dt in FLOATS:
        c = xshape[1]
        x = rand_array(rng, xshape, dt, -2, 3)
        g, b = rand_array(rng, (c,), dt, 0.5, 1.5), rand_array(rng, (c,), dt)
        rm0, rv0 = rand_array(rng, (c,), dt, -0.5, 0.5), rand_array(rng, (c,), dt, 0.5, 2)
        for layout in ("contiguous", "strided"):
            rm, rv = kiln.Tensor(rm0, dt), kiln.Tensor(rv0, dt)
            y = ops.batch_norm(to_kiln(x, dt, layout), rm, rv, kiln.Tensor(g, dt), kiln.Tensor(b, dt),
                               training=training, momentum=0.2, eps=1e-3)
            ey, erm, erv = batch_norm_ref(x, rm0, rv0, g, b, training, 0.2, 1e-3)
            assert_close(y, ey, dt, rtol=tol(dt)["rtol"] * 10, atol=tol(dt)["atol"] * 10)
            assert_close(rm, erm, dt)
            assert_close(rv, erv, dt)


def test_batch_norm_running_stats_accumulate():
    rng = make_rng(71)
    rm, rv = kiln.ops.zeros(3, dtype=kiln.float64), kiln.ops.ones(3, dtype=kiln.float64)
    erm, erv = np.zeros(3), np.ones(3)
    g, b = np.ones(3), np.zeros(3)
    for _ in range(3):
        x = rng.standard_normal((5, 3, 2, 2)) * 2 + 1
        ops.batch_norm(kiln.Tensor(x), rm, rv, kiln.Tensor(g), kiln.Tensor(b), training=True)
        _, erm, erv = batch_norm_ref(x, erm, erv, g, b, True, 0.1, 1e-5)
    assert_close(rm, erm, kiln.float64)
    assert_close(rv, erv, kiln.float64)


def layer_norm_ref(x, nd, w, b, eps):
    axes = tuple(range(x.ndim - nd, x.ndim))
    mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("xshape,normalized", [((4, 6), 6), ((2, 3, 5), (5,)), ((2, 3, 5), (3, 5)), ((7,), 7)],
                         ids=str)
def test_layer_norm(xshape, normalized, affine):
    rng = make_rng(72)
    ns = (normalized,) if isinstance(normalized, int) else normalized
    for dt in FLOATS:
        x = rand_array(rng, xshape, dt, -3, 3)
        w, b = rand_array(rng, ns, dt, 0.5, 1.5), rand_array(rng, ns, dt)
        exp = layer_norm_ref(x, len(ns), w if affine else None, b if affine else None, 1e-5)
        for layout in LAYOUTS:
            out = ops.layer_norm(to_kiln(x, dt, layout), normalized, kiln.Tensor(w, dt) if affine else None,
                                 kiln.Tensor(b, dt) if affine else None)
            assert_close(out, exp, dt, rtol=tol(dt)["rtol"] * 10, atol=tol(dt)["atol"] * 10)


@pytest.mark.parametrize("xshape,wshape", [((4, 6), (6,)), ((2, 3, 5), (5,)), ((2, 3, 5), (3, 5))], ids=str)
def test_rms_norm(xshape, wshape):
    rng = make_rng(73)
    for dt in FLOATS:
        x, w = rand_array(rng, xshape, dt, -3, 3), rand_array(rng, wshape, dt, 0.5, 1.5)
        axes = tuple(range(x.ndim - len(wshape), x.ndim))
        exp = x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + 1e-6) * w
        for layout in LAYOUTS:
            assert_close(ops.rms_norm(to_kiln(x, dt, layout), kiln.Tensor(w, dt)), exp, dt,
                         rtol=tol(dt)["rtol"] * 10, atol=tol(dt)["atol"] * 10)


@pytest.mark.parametrize("dtype", HALFS, ids=dtype_name)
def test_norm_half(dtype):
    rng = make_rng(74)
    x, w = rand_array(rng, (3, 8), dtype, -2, 2), rand_array(rng, (8,), dtype, 0.5, 1.5)
    b = rand_array(rng, (8,), dtype)
    out = ops.layer_norm(kiln.Tensor(x, dtype), 8, kiln.Tensor(w, dtype), kiln.Tensor(b, dtype))
    assert out.dtype is dtype
    assert_close(out, layer_norm_ref(x, 1, w, b, 1e-5), dtype, rtol=3e-2, atol=6e-2)
    out = ops.rms_norm(kiln.Tensor(x, dtype), kiln.Tensor(w, dtype))
    assert_close(out, x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6) * w, dtype, rtol=3e-2, atol=6e-2)


# ---- shapes and movement -------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_reshape(layout):
    a = np.arange(24.0).reshape(2, 3, 4)
    t = to_kiln(a, kiln.float64, layout)
    for shape in [(24,), (4, 6), (2, -1), (-1, 2, 3), (1, 24, 1), (2, 3, 4)]:
        assert_close(t.reshape(shape), a.reshape(shape))
        assert_close(ops.reshape(t, *shape), a.reshape(shape))
    assert_close(t.flatten(), a.reshape(-1))
    assert_close(t.flatten(1), a.reshape(2, 12))
    assert_close(kiln.Tensor(np.float64(3.0)).reshape(1, 1), np.full((1, 1), 3.0))
    assert_close(t.view(6, 4), a.reshape(6, 4))


def test_reshape_view_shares_storage():
    t = kiln.Tensor(np.arange(6.0))
    v = t.reshape(2, 3)
    assert v._shares_storage(t)
    v[1, 1] = 100.0
    assert t[4].item() == 100.0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_transpose_permute(layout):
    a = np.arange(24).reshape(2, 3, 4)
    t = to_kiln(a, kiln.int64, layout)
    assert_close(t.transpose(), a.transpose())
    assert_close(t.T, a.T)
    assert_close(ops.transpose(t, (1, 2, 0)), a.transpose(1, 2, 0))
    assert_close(ops.transpose(t, 0, 2), np.swapaxes(a, 0, 2))
    assert_close(t.permute(2, 0, 1), a.transpose(2, 0, 1))
    assert_close(t.swapaxes(-1, 0), np.swapaxes(a, -1, 0))
    assert_close(t.permute(2, 0, 1).contiguous(), a.transpose(2, 0, 1))
    assert t.permute(2, 0, 1).contiguous().is_contiguous()


def test_squeeze_unsqueeze_expand():
    a = np.arange(6.0).reshape(1, 3, 1, 2)
    t = kiln.Tensor(a)
    assert_close(t.squeeze(), a.squeeze())
    assert_close(t.squeeze(0), a.squeeze(0))
    assert_close(t.squeeze((0, 2)), a.squeeze((0, 2)))
    assert_close(t.unsqueeze(-1), a[..., None])
    assert_close(ops.expand_dims(t, 1), np.expand_dims(a, 1))
    assert_close(t.expand(2, 3, 4, 2), np.broadcast_to(a, (2, 3, 4, 2)))
    assert_close(ops.broadcast_to(kiln.Tensor(np.arange(3.0)), (2, 3)), np.broadcast_to(np.arange(3.0), (2, 3)))
    assert_close(t.expand(-1, -1, 5, -1), np.broadcast_to(a, (1, 3, 5, 2)))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    rng = make_rng(80)
    for dt in FLOATS + INTS + (kiln.bool, kiln.float16):
        parts = [rand_array(rng, s, dt) for s in ([(2, 3, 4)] * 3)]
        shapes = []
        for k, p in enumerate(parts):  # different lengths along the axis
            sl = [slice(None)] * 3
            sl[axis] = slice(0, k + 1)
            shapes.append(p[tuple(sl)])
        tensors = [to_kiln(p, dt, LAYOUTS[k % 3]) for k, p in enumerate(shapes)]
        assert_close(ops.concat(tensors, axis), np.concatenate(shapes, axis), dt)
        assert_close(ops.cat(tensors, dim=axis), np.concatenate(shapes, axis), dt)
    one = np.arange(3.0)
    assert_close(ops.concat([kiln.Tensor(one)]), one)
    assert_close(ops.concat([kiln.Tensor(np.zeros((0, 2))), kiln.Tensor(np.ones((2, 2)))]), np.ones((2, 2)))


def test_concat_mixed_dtypes():
    a, b = np.ones((2, 2), np.int32), np.full((1, 2), 0.5, np.float32)
    out = ops.concat([kiln.Tensor(a), kiln.Tensor(b)])
    assert out.dtype is kiln.float32
    assert_close(out, np.concatenate([a, b]).astype(np.float32))


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_stack(axis):
    rng = make_rng(81)
    parts = [rng.standard_normal((2, 3)) for _ in range(4)]
    tensors = [to_kiln(p, kiln.float64, LAYOUTS[k % 3]) for k, p in enumerate(parts)]
    assert_close(ops.stack(tensors, axis), np.stack(parts, axis))


def test_split_chunk_narrow():
    a = np.arange(40.0).reshape(4, 10)
    t = to_kiln(a, layout="transposed")
    for got, exp in zip(ops.split(t, 3, 1), np.split(a, [3, 6, 9], 1)):
        assert_close(got, exp)
    parts = t.split([1, 3], axis=0)
    assert len(parts) == 2
    assert_close(parts[0], a[:1])
    assert_close(parts[1], a[1:])
    for got, exp in zip(ops.split(t, [2, 0, 8], dim=-1), np.split(a, [2, 2], 1)):
        assert_close(got, exp)
    for got, exp in zip(ops.chunk(t, 3, 1), np.array_split(a, [4, 8], 1)):
        assert_close(got, exp)
    assert_close(ops.narrow(t, 1, 2, 5), a[:, 2:7])


# ---- gather family -------------------------------------------------------------------------


@pytest.mark.parametrize("idx_dtype", INTS, ids=dtype_name)
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_gather(axis, idx_dtype):
    rng = make_rng(90)
    for dt in FLOATS + INTS + (kiln.bool, kiln.bfloat16):
        a = rand_array(rng, (3, 4, 5), dt)
        n = a.shape[axis]
        for ishape in [(2,), (2, 3), ()]:
            idx = rng.integers(-n, n, size=ishape)
            for layout in ("contiguous", "strided"):
                out = ops.gather(to_kiln(a, dt, layout), kiln.Tensor(idx.astype(NP_DTYPE[idx_dtype])), axis)
                assert_close(out, np.take(a, idx, axis), dt)


def test_index_select_and_embedding():
    rng = make_rng(91)
    a = rng.standard_normal((5, 3))
    idx = np.array([4, 0, 0, 2])
    assert_close(ops.index_select(to_kiln(a, layout="transposed"), 0, kiln.Tensor(idx)), a[idx])
    assert_close(kiln.Tensor(a).index_select(1, kiln.Tensor(np.array([2, 0], np.int32))), a[:, [2, 0]])
    ids = np.array([[1, 4, 4], [0, 2, 3]])
    assert_close(ops.embedding(kiln.Tensor(ids), kiln.Tensor(a)), a[ids])
    assert_close(kiln.Tensor(a).gather(kiln.Tensor(ids), 0), a[ids])


def test_gather_elements_scatter_add_index_add():
    rng = make_rng(92)
    a = rng.standard_normal((3, 4))
    idx = rng.integers(0, 3, size=(2, 4))
    assert_close(ops.gather_elements(kiln.Tensor(a), 0, kiln.Tensor(idx)), np.take_along_axis(a, idx, 0))
    idx1 = rng.integers(-4, 4, size=(3, 6))
    assert_close(ops.gather_elements(to_kiln(a, layout="strided"), 1, kiln.Tensor(idx1)),
                 np.take_along_axis(a, idx1 % 4, 1))
    src = rng.standard_normal((2, 4))
    exp = a.copy()
    np.add.at(exp, (idx, np.arange(4)[None, :].repeat(2, 0)), src)
    assert_close(ops.scatter_add(kiln.Tensor(a), 0, kiln.Tensor(idx), kiln.Tensor(src)), exp)
    rows = np.array([2, 0, 2])
    s2 = rng.standard_normal((3, 4))
    exp = a.copy()
    np.add.at(exp, rows, s2)
    assert_close(ops.index_add(kiln.Tensor(a), 0, kiln.Tensor(rows), kiln.Tensor(s2)), exp)
    cols = np.array([-1, 1])
    s3 = rng.standard_normal((3, 2))
    exp = a.copy()
    np.add.at(exp, (slice(None), cols % 4), s3)
    assert_close(ops.index_add(to_kiln(a, layout="transposed"), 1, kiln.Tensor(cols), kiln.Tensor(s3)), exp)


# ---- indexing ------------------------------------------------------------------------------
A3 = np.arange(60.0).reshape(3, 4, 5)


def _idx(*k):
    return k if len(k) != 1 else k[0]


INDEX_KEYS = [
    ("int", lambda T: 1), ("neg_int", lambda T: -1), ("int_int", lambda T: (2, -3)), ("int3", lambda T: (0, 1, 2)),
    ("slice", lambda T: slice(1, 3)), ("slice_step", lambda T: (slice(None), slice(None, None, 2))),
    ("slice_neg_step", lambda T: (slice(None, None, -1), slice(3, 0, -2))), ("slice_neg", lambda T: slice(-2, None)),
    ("slice_empty", lambda T: slice(2, 1)), ("slice_out_of_range", lambda T: (slice(-10, 10), slice(1, 100, 3))),
    ("none", lambda T: None), ("none_mid", lambda T: (slice(None), None, 1)), ("ellipsis", lambda T: Ellipsis),
    ("ellipsis_int", lambda T: (Ellipsis, 2)), ("int_ellipsis_none", lambda T: (1, Ellipsis, None)),
    ("ellipsis_mid", lambda T: (0, Ellipsis, slice(None, None, -2))),
    ("tensor1d", lambda T: T([2, 0, 0])), ("tensor_neg", lambda T: T([-1, -3])),
    ("tensor2d", lambda T: T([[0, 1], [2, 2]])), ("tensor_axis1", lambda T: (slice(None), T([3, 0]))),
    ("tensor_int32", lambda T: (Ellipsis, T(np.array([4, 1], np.int32)))),
    ("tensor_and_slice", lambda T: (T([1, 2]), slice(None, None, 2))),
    ("two_tensors", lambda T: (T([0, 2]), T([1, 3]))),
    ("two_tensors_bcast", lambda T: (T([[0], [2]]), slice(None), T([1, 4, 0]))),
    ("tensors_adjacent", lambda T: (slice(1, None), T([0, 3]), T([4, 4]))),
    ("mask", lambda T: T(np.array([True, False, True]))),
    ("mask_axis2", lambda T: (Ellipsis, T(np.array([False, True, True, False, True])))),
    ("mask_full", lambda T: T(A3 > 30)),
    ("mask_2d", lambda T: (T(A3[:, :, 0] > 20))),
    ("list", lambda T: [2, 1]),
    ("int_tensor_scalar", lambda T: T(np.int64(1))),
]


def _np_key(k):
    if isinstance(k, tuple):
        return tuple(_np_key(x) for x in k)
    if isinstance(k, kiln.Tensor):
        return to_numpy(k)
    return k


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", INDEX_KEYS, ids=lambda c: c[0])
def test_getitem(case, layout):
    name, make = case
    key = make(kiln.Tensor)
    t = to_kiln(A3, kiln.float64, layout)
    assert_close(t[key], A3[_np_key(key)], kiln.float64)
    ti = to_kiln(A3.astype(np.int32), kiln.int32, layout)
    assert_close(ti[key], A3.astype(np.int32)[_np_key(key)], kiln.int32)


def test_getitem_basic_is_view():
    t = kiln.Tensor(A3.copy())
    v = t[1, ::2, 1:4]
    assert v._shares_storage(t)
    t[1, 0, 1] = -5.0
    assert v[0, 0].item() == -5.0
    assert t[0, 0, 0].item() == 0.0
    assert isinstance(t[0, 0, 0].item(), float)


SET_KEYS = [
    ("int", lambda T: 1, ()), ("slice_step", lambda T: (slice(None), slice(None, None, 2)), ()),
    ("neg_step", lambda T: (slice(None, None, -2), 1), ()), ("ellipsis", lambda T: (Ellipsis, -1), ()),
    ("none", lambda T: (None, 0), ()), ("scalar_elem", lambda T: (2, 3, 4), ()),
    ("bcast_row", lambda T: (slice(None), 1), (5,)), ("bcast_col", lambda T: 0, (4, 1)),
    ("tensor", lambda T: T([2, 0]), ()), ("tensor_axis1", lambda T: (slice(None), T([-1, 1])), (5,)),
    ("tensor_axis2", lambda T: (Ellipsis, T([0, 4])), (3, 4, 2)),
    ("mask", lambda T: T(np.array([True, False, True])), (4, 5)),
    ("mask_full", lambda T: T(A3 > 30), ()),
    ("full", lambda T: Ellipsis, (3, 4, 5)),
]


@pytest.mark.parametrize("value_kind", ["scalar", "tensor"])
@pytest.mark.parametrize("case", SET_KEYS, ids=lambda c: c[0])
def test_setitem(case, value_kind):
    name, make, vshape = case
    key = make(kiln.Tensor)
    expected = A3.copy()
    if value_kind == "scalar":
        value, nvalue = -7.5, -7.5
    else:
        nvalue = np.arange(np.prod(vshape, dtype=int), dtype=np.float64).reshape(vshape) + 1000
        target_shape = expected[_np_key(key)].shape
        nvalue = np.broadcast_to(nvalue, target_shape) if vshape == () else nvalue
        value = kiln.Tensor(np.ascontiguousarray(nvalue))
    expected[_np_key(key)] = nvalue
    for layout in ("contiguous", "strided"):
        t = to_kiln(A3, kiln.float64, layout)
        t[key] = value
        assert_close(t, expected, kiln.float64)


def test_setitem_view_writes_base_and_dtype_conversion():
    base = kiln.Tensor(np.zeros((3, 4), np.float32))
    v = base[:, 1:3]
    v[...] = 2  # python int into a float32 view
    exp = np.zeros((3, 4), np.float32)
    exp[:, 1:3] = 2
    assert_close(base, exp, kiln.float32)
    base[0] = kiln.Tensor(np.array([1, 2, 3, 4], np.int64))  # cast on assignment
    exp[0] = [1, 2, 3, 4]
    assert_close(base, exp, kiln.float32)
    ti = kiln.Tensor(np.zeros(4, np.int32))
    ti[1:3] = 7
    assert_close(ti, [0, 7, 7, 0], kiln.int32)
    t = kiln.Tensor(np.zeros(4))
    t.fill_(3.0)
    assert_close(t, np.full(4, 3.0))
    t.zero_()
    assert_close(t, np.zeros(4))


# ---- creation ------------------------------------------------------------------------------


def test_zeros_ones_full():
    assert_close(ops.zeros(2, 3), np.zeros((2, 3)), kiln.float32)
    assert_close(ops.zeros((2, 3), dtype=kiln.int32), np.zeros((2, 3)), kiln.int32)
    assert_close(ops.ones(4), np.ones(4), kiln.float32)
    assert_close(ops.ones((), dtype=kiln.float64), np.ones(()), kiln.float64)
    assert_close(ops.ones(2, 2, dtype=kiln.bool), np.ones((2, 2), bool), kiln.bool)
    assert_close(ops.full((2, 3), 1.5), np.full((2, 3), 1.5), kiln.float32)
    assert_close(ops.full((2,), 7), np.full(2, 7), kiln.int64)
    assert_close(ops.full((2,), True), np.full(2, True), kiln.bool)
    assert_close(ops.full(3, -2.0, kiln.float16), np.full(3, -2.0), kiln.float16)
    assert_close(ops.full((2, 0), 1.0), np.ones((2, 0)), kiln.float32)
    x = kiln.Tensor(np.zeros((2, 3), np.int32))
    assert_close(ops.zeros_like(x), np.zeros((2, 3)), kiln.int32)
    assert_close(ops.ones_like(x, dtype=kiln.float64), np.ones((2, 3)), kiln.float64)
    assert_close(ops.full_like(x, 5), np.full((2, 3), 5), kiln.int32)


def test_arange_linspace_eye():
    assert_close(ops.arange(5), np.arange(5), kiln.int64)
    assert_close(ops.arange(2, 11, 3), np.arange(2, 11, 3), kiln.int64)
    assert_close(ops.arange(5, 0, -2), np.arange(5, 0, -2), kiln.int64)
    assert_close(ops.arange(0.0, 1.0, 0.25), np.arange(0.0, 1.0, 0.25), kiln.float32)
    assert_close(ops.arange(0, 1, 0.1, dtype=kiln.float64), np.arange(0, 1, 0.1), kiln.float64)
    assert_close(ops.arange(3, dtype=kiln.float32), np.arange(3.0), kiln.float32)
    assert_close(ops.arange(4, 2), np.arange(4, 2), kiln.int64)
    assert_close(ops.linspace(0, 1, 5), np.linspace(0, 1, 5), kiln.float32)
    assert_close(ops.linspace(-3, 7, 11, dtype=kiln.float64), np.linspace(-3, 7, 11), kiln.float64)
    assert_close(ops.linspace(2, 2, 1), np.linspace(2, 2, 1), kiln.float32)
    assert_close(ops.linspace(0, 1, 0), np.linspace(0, 1, 0), kiln.float32)
    assert_close(ops.linspace(1, 0, 7, dtype=kiln.float64), np.linspace(1, 0, 7), kiln.float64)
    assert_close(ops.eye(3), np.eye(3), kiln.float32)
    assert_close(ops.eye(2, 4, dtype=kiln.int32), np.eye(2, 4), kiln.int32)
    assert_close(ops.eye(4, 2, dtype=kiln.float64), np.eye(4, 2), kiln.float64)


@pytest.mark.parametrize("name", ["rand", "randn"])
def test_random_determinism(name):
    f = getattr(ops, name)
    kiln.manual_seed(123)
    a = to_numpy(f(4, 5))
    b = to_numpy(f(4, 5))
    kiln.manual_seed(123)
    a2 = to_numpy(f(4, 5))
    b2 = to_numpy(f(4, 5))
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)
    assert not np.array_equal(a, b)
    kiln.manual_seed(124)
    assert not np.array_equal(a, to_numpy(f(4, 5)))
    kiln.manual_seed(7)
    d = f(3, dtype=kiln.float64)
    assert d.dtype is kiln.float64 and d.shape == (3,)
    assert f(2, 3).dtype is kiln.float32


def test_random_distributions():
    kiln.manual_seed(0)
    u = to_numpy(ops.rand(20000))
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.02 and abs(u.std() - math.sqrt(1 / 12)) < 0.02
    n = to_numpy(ops.randn(20000, dtype=kiln.float64))
    assert abs(n.mean()) < 0.05 and abs(n.std() - 1.0) < 0.05
    v = to_numpy(ops.uniform((10000,), -3.0, -1.0))
    assert v.min() >= -3.0 and v.max() < -1.0 and abs(v.mean() + 2.0) < 0.05
    g = to_numpy(ops.normal((10000,), 5.0, 0.5))
    assert abs(g.mean() - 5.0) < 0.05 and abs(g.std() - 0.5) < 0.05


def test_random_thread_independent():
    kiln.manual_seed(99)
    n = kiln.get_num_threads()
    a = to_numpy(ops.randn(100_000))
    try:
        kiln.set_num_threads(1)
        kiln.manual_seed(99)
        b = to_numpy(ops.randn(100_000))
    finally:
        kiln.set_num_threads(n)
    np.testing.assert_array_equal(a, b)


# ---- Tensor basics ------------------------------------------------------------------------


def test_tensor_attributes():
    t = kiln.Tensor(np.zeros((2, 3, 4), np.float32))
    assert t.shape == (2, 3, 4) and t.dtype is kiln.float32 and t.ndim == 3 and t.size == 24 and len(t) == 2
    assert t.numel() == 24 and t.dim() == 3
    s = kiln.Tensor(1.5)
    assert s.shape == () and s.ndim == 0 and s.size == 1
    with pytest.raises(TypeError):
        len(s)
    r = repr(kiln.Tensor(np.array([1.0, 2.0])))
    assert "shape=[2]" in r and "float64" in r and "1." in r and "2." in r
    assert "1" in str(kiln.Tensor([1, 2]))


def test_tensor_default_dtypes():
    assert kiln.Tensor(1.5).dtype is kiln.float32
    assert kiln.Tensor(3).dtype is kiln.int64
    assert kiln.Tensor(True).dtype is kiln.bool
    assert kiln.Tensor([1.0, 2.0]).dtype is kiln.float32
    assert kiln.Tensor([1, 2]).dtype is kiln.int64
    assert kiln.Tensor([[True], [False]]).dtype is kiln.bool
    assert kiln.Tensor([1, 2.5]).dtype is kiln.float32
    assert kiln.Tensor(np.zeros(2, np.float64)).dtype is kiln.float64
    assert kiln.Tensor(np.zeros(2, np.int32)).dtype is kiln.int32
    assert kiln.Tensor([1, 2], kiln.float64).dtype is kiln.float64
    assert kiln.Tensor(2.5, dtype=kiln.int32).item() == 2
    assert_close(kiln.Tensor([[1, 2], [3, 4]]), np.array([[1, 2], [3, 4]]), kiln.int64)
    assert_close(kiln.Tensor(2.5), np.float32(2.5), kiln.float32)
    assert kiln.Tensor(3).item() == 3 and isinstance(kiln.Tensor(3).item(), int)
    assert kiln.tensor([1.0]).dtype is kiln.float32


def test_tensor_from_numpy_scalar_keeps_dtype():
    assert kiln.Tensor(np.float64(2.5)).dtype is kiln.float64
    assert kiln.Tensor(np.float32(2.5)).dtype is kiln.float32
    assert kiln.Tensor(np.int32(2)).dtype is kiln.int32
    assert kiln.Tensor(np.array(2.5)).dtype is kiln.float64


def test_tensor_copies_its_input():
    a = np.arange(4.0)
    t = kiln.Tensor(a)
    a[0] = 100.0
    assert t[0].item() == 0.0
    u = kiln.Tensor(t)
    t[1] = 50.0
    assert u[1].item() == 1.0


def test_asnumpy_zero_copy():
    t = kiln.Tensor(np.arange(6.0).reshape(2, 3))
    a = t.asnumpy()
    a[1, 2] = -1.0
    assert t[1, 2].item() == -1.0
    t[0, 0] = 42.0
    assert a[0, 0] == 42.0
    assert np.shares_memory(a, t.numpy())


def test_from_numpy_shares_memory():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = kiln.from_numpy(a)
    assert t.dtype is kiln.float32 and t.shape == (2, 3)
    a[0, 1] = 9.0
    assert t[0, 1].item() == 9.0
    t[1, 1] = -3.0
    assert a[1, 1] == -3.0
    for dt in (np.int32, np.int64, np.float64, np.float16, np.bool_, np.int8):
        b = np.ones((2, 2), dt)
        assert to_numpy(kiln.from_numpy(b)).dtype == b.dtype
    s = from_numpy_strided(np.arange(12.0).reshape(3, 4))
    assert not s.is_contiguous()
    assert_close(s, np.arange(12.0).reshape(3, 4))
    assert_close(s * 2, np.arange(12.0).reshape(3, 4) * 2)


@pytest.mark.parametrize("layout", ["transposed", "strided"])
def test_buffer_protocol_non_contiguous(layout):
    a = np.arange(12.0).reshape(3, 4)
    t = to_kiln(a, kiln.float64, layout)
    assert not t.is_contiguous()
    n = np.asarray(t)
    np.testing.assert_array_equal(n, a)
    n[0, 1] = -1.0  # a view of the tensor, not a copy
    assert t[0, 1].item() == -1.0
    m = memoryview(t)
    assert m.shape == (3, 4) and m.format == "d"
    np.testing.assert_array_equal(np.array(m), n)
    neg = kiln.Tensor(a)[::-1, ::-2]
    np.testing.assert_array_equal(np.asarray(neg), a[::-1, ::-2])
    b16 = kiln.Tensor(a, kiln.bfloat16).T
    np.testing.assert_array_equal(b16.asnumpy(), a.T)


def test_item_bool_float_int():
    assert kiln.Tensor(np.array([2.5])).item() == 2.5
    assert float(kiln.Tensor(np.float32(1.5))) == 1.5
    assert int(kiln.Tensor(np.int32(-4))) == -4
    assert bool(kiln.Tensor(np.array([True]))) is True
    assert [1, 2, 3][kiln.Tensor(np.int64(1))] == 2
    assert kiln.Tensor([[1.0, 2.0], [3.0, 4.0]]).tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert [r.tolist() for r in kiln.Tensor([[1, 2], [3, 4]])] == [[1, 2], [3, 4]]


def test_methods_match_functions():
    a = make_rng(100).uniform(0.5, 2.0, (2, 3))
    t = kiln.Tensor(a)
    for name in ("exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "relu", "abs", "neg"):
        assert_close(getattr(t, name)(), to_numpy(getattr(ops, name)(t)))
    assert_close(t.pow(2), a ** 2)
    assert_close(t.maximum(kiln.Tensor(1.0, kiln.float64)), np.maximum(a, 1.0))
    assert_close(t.sum(axis=1), a.sum(1))
    assert_close(t.mean(dim=0, keepdim=True), a.mean(0, keepdims=True))
    assert_close(t.square(), a * a)
    assert_close(t.double(), a)
    assert t.float().dtype is kiln.float32 and t.half().dtype is kiln.float16 and t.int().dtype is kiln.int32


# ---- classifying: bool results for every dtype and layout -----------------------------------
CLASSIFY = [("isnan", ops.isnan, np.isnan), ("isinf", ops.isinf, np.isinf), ("isfinite", ops.isfinite, np.isfinite)]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
@pytest.mark.parametrize("case", CLASSIFY, ids=lambda c: c[0])
def test_classify(case, dtype):
    name, kfn, nfn = case
    a = rand_array(make_rng(7), (3, 4), dtype, -3, 3)
    if dtype.is_floating_point:
        a[0, :3] = [np.nan, np.inf, -np.inf]
    for layout in LAYOUTS:
        assert_close(kfn(to_kiln(a, dtype, layout)), nfn(a.astype(np.float64)), kiln.bool)
    assert_close(getattr(to_kiln(a, dtype), name)(), nfn(a.astype(np.float64)), kiln.bool)


# ---- along one axis: scans and sorting --------------------------------------------------------
def _sorted_reference(a, axis, descending):
    """(values, indices) of a stable sort along axis, NaN the largest (NumPy's order ascending)."""
    moved = np.moveaxis(np.asarray(a), axis, -1)
    idx = np.empty(moved.shape, np.int64)
    for pos in np.ndindex(moved.shape[:-1]):
        row = [v.item() for v in moved[pos]]

        def key(i):
            v = row[i]
            nan = v != v
            return (not nan, 0 if nan else -v) if descending else (nan, 0 if nan else v)

        idx[pos] = sorted(range(len(row)), key=key)
    idx = np.moveaxis(idx, -1, axis)
    return np.take_along_axis(np.asarray(a), idx, axis), idx


def _cum_dtype(a):
    return a.dtype if np.issubdtype(a.dtype, np.floating) else np.int64


# (id, kiln fn (x, axis), NumPy fn (a, axis))
ALONG = [
    ("cumsum", lambda x, ax: ops.cumsum(x, ax), lambda a, ax: np.cumsum(a, ax, dtype=_cum_dtype(a))),
    ("cumsum_dim", lambda x, ax: x.cumsum(dim=ax), lambda a, ax: np.cumsum(a, ax, dtype=_cum_dtype(a))),
    ("cumprod", lambda x, ax: ops.cumprod(x, ax), lambda a, ax: np.cumprod(a, ax, dtype=_cum_dtype(a))),
    ("sort_values", lambda x, ax: ops.sort(x, ax)[0], lambda a, ax: _sorted_reference(a, ax, False)[0]),
    ("sort_indices", lambda x, ax: ops.sort(x, ax)[1], lambda a, ax: _sorted_reference(a, ax, False)[1]),
    ("sort_descending", lambda x, ax: x.sort(ax, descending=True)[0], lambda a, ax: _sorted_reference(a, ax, True)[0]),
    ("argsort_descending", lambda x, ax: ops.argsort(x, ax, True), lambda a, ax: _sorted_reference(a, ax, True)[1]),
    ("argsort", lambda x, ax: x.argsort(dim=ax), lambda a, ax: _sorted_reference(a, ax, False)[1]),
]


@pytest.mark.parametrize("dtype", (kiln.bool, kiln.int8) + INTS + HALFS + FLOATS, ids=dtype_name)
@pytest.mark.parametrize("case", ALONG, ids=lambda c: c[0])
def test_along_axis_dtypes_and_layouts(case, dtype):
    name, kfn, nfn = case
    a = rand_array(make_rng(8), (3, 4, 5), dtype, -2, 2)
    if dtype.is_floating_point:  # ties, NaN and infinities (their order is part of the result)
        a = np.round(a * 2) / 2
        a[0, 1, :3] = [np.nan, np.inf, -np.inf]
    a = a.astype(NP_DTYPE[dtype])
    for axis in (0, 1, -1):
        want = nfn(a, axis)
        for layout in LAYOUTS:
            out = kfn(to_kiln(a, dtype, layout), axis)
            assert_close(out, want, None if not out.dtype.is_floating_point else out.dtype)
            assert out.dtype is (kiln.int64 if np.asarray(want).dtype.kind in "iub" and name.startswith(("cum", "arg"))
                                 or "indices" in name else dtype)


@pytest.mark.parametrize("case", ALONG, ids=lambda c: c[0])
def test_along_axis_shapes(case):
    name, kfn, nfn = case
    rng = make_rng(9)
    for shape, axis in [((), 0), ((), -1), ((1,), 0), ((7,), 0), ((0, 3), 0), ((0, 3), 1), ((2, 1, 3), 1)]:
        a = rand_array(rng, shape, kiln.float64, -2, 2)
        want = nfn(a.reshape(a.shape or (1,)), axis).reshape(shape)
        assert_close(kfn(kiln.Tensor(a), axis), want)


@pytest.mark.parametrize("level,backend", [(lv, b) for lv in ("O0", "O1", "O2") for b in ("kbk", "sink")])
@pytest.mark.parametrize("case", ALONG, ids=lambda c: c[0])
def test_along_axis_compiled(case, level, backend):
    name, kfn, nfn = case
    a = np.round(rand_array(make_rng(10), (3, 5), kiln.float32, -2, 2) * 2) / 2
    a[1, 2] = np.nan
    jf = kiln.jit(lambda x: kfn(x * 1.0, 1), capture_mode="trace", jit_level=level, backend=backend)
    x = kiln.Tensor(a, kiln.float32)
    jf(x)
    assert_close(jf(x), nfn(a.astype(np.float32), 1))
    assert jf.cache_info().hits >= 1


def test_along_axis_bad_axes():
    x = kiln.Tensor(np.zeros((2, 3), np.float32))
    for f in (ops.cumsum, ops.cumprod, ops.sort, ops.argsort):
        with pytest.raises(IndexError, match=f"{f.__name__}: axis 2 is out of range"):
            f(x, 2)
    with pytest.raises(TypeError, match="cumsum: give axis or dim, not both"):
        ops.cumsum(x, 0, dim=1)


# ---- NaN and ±inf (issue 18) ---------------------------------------------------------------
# Every elementwise op and reduction of the tables above on NaN, ±inf, ±0 and large values:
# eager, jitted at O1 (the op fused with a scaling into generated C) and sunk. NaN propagates
# through relu, clamp, maximum / minimum, max / min, argmax, softmax and max_pool as in PyTorch
# (NumPy's np.maximum, np.max, np.argmax propagate it too; np.fmax would not).
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -2.0, 0.5, -0.25, 3.0, 1e30, -1e30])
SPECIAL_MODES = ("eager", "O1", "sink")
# where NumPy's reference differs from PyTorch, PyTorch's rule:
SPECIAL_REF = {
    "sign": lambda x: np.where(np.isnan(x), 0.0, np.sign(x)),  # torch.sign(nan) is 0 (NumPy: nan)
    # torch.relu is clamp_min(x, 0): -0.0 stays -0.0 (NumPy's vectorized maximum gives 0.0)
    "relu": lambda x: np.where(x < 0, 0.0, x),
}
# ops whose zero results must keep the sign PyTorch gives (relu(-0.0) = -0.0, abs(-0.0) = 0.0)
SIGNED_ZEROS = {"neg", "abs", "relu", "clamp"}


def _special_call(mode, kfn, arrays, dtype, fused=True):
    """kfn on arrays as dtype tensors: eager, or jitted (mode O1: kernel by kernel, sink) after
    scaling each input by 2 (so the op is fused with the scaling into generated C, where an op
    alone would run its kernel; `fused`: check that it was). Returns (result, the inputs kfn saw
    as NumPy arrays)."""
    ts = [kiln.Tensor(a, dtype) for a in arrays]
    if mode == "eager":
        return kfn(*ts), arrays
    if len(arrays) == 1:
        def f(x):
            return kfn(x * 2.0)
    else:
        def f(x, y):
            return kfn(x * 2.0, y * 2.0)
    jf = kiln.jit(f, capture_mode="trace", jit_level="O1", backend="sink" if mode == "sink" else "kbk")
    jf(*ts)
    out = jf(*ts)
    assert jf.cache_info().hits >= 1, jf.cache_info()
    if fused:
        assert "= fused(" in jf.graph_str(*ts), jf.graph_str(*ts)
    return out, [(a.astype(NP_DTYPE[dtype]) * 2).astype(a.dtype) for a in arrays]


def _special_modes():
    return [(m, d) for m in SPECIAL_MODES for d in (FLOATS if m == "eager" else (kiln.float32,))]


def _check_special(name, out, expected, dtype):
    with np.errstate(all="ignore"):
        assert_close(out, expected, dtype, check_dtype=out.dtype.is_floating_point)
    if name in SIGNED_ZEROS:
        got, want = to_numpy(out), np.asarray(expected)
        zero = want == 0
        np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]), err_msg=f"{name}: sign of zero")


@pytest.mark.parametrize("mode,dtype", _special_modes(), ids=lambda v: v if isinstance(v, str) else dtype_name(v))
@pytest.mark.parametrize("case", UNARY, ids=UNARY_IDS)
def test_unary_special_values(case, mode, dtype):
    name, kfn, nfn, _, _ = case
    a = SPECIAL.reshape(3, 4)
    out, seen = _special_call(mode, kfn, [a], dtype)
    x = seen[0].astype(NP_DTYPE[dtype])  # in the op's dtype: 1e30 squared overflows float32
    with np.errstate(all="ignore"):
        expected = SPECIAL_REF.get(name, nfn)(x)
    _check_special(name, out, expected, dtype)


@pytest.mark.parametrize("mode,dtype", _special_modes(), ids=lambda v: v if isinstance(v, str) else dtype_name(v))
@pytest.mark.parametrize("case", BINARY, ids=BINARY_IDS)
def test_binary_special_values(case, mode, dtype):
    name, kfn, nfn, kind = case
    a, b = np.meshgrid(SPECIAL, SPECIAL, indexing="ij")  # every pair
    out, (x, y) = _special_call(mode, kfn, [a, b], dtype)
    with np.errstate(all="ignore"):
        expected = nfn(x.astype(NP_DTYPE[dtype]), y.astype(NP_DTYPE[dtype]))
    _check_special(name, out, expected, dtype)


@pytest.mark.parametrize("mode,dtype", _special_modes(), ids=lambda v: v if isinstance(v, str) else dtype_name(v))
@pytest.mark.parametrize("case", CLASSIFY, ids=lambda c: c[0])
def test_classify_special_values(case, mode, dtype):
    name, kfn, nfn = case
    out, seen = _special_call(mode, kfn, [SPECIAL.reshape(3, 4)], dtype)
    with np.errstate(all="ignore"):
        assert_close(out, nfn(seen[0].astype(NP_DTYPE[dtype])), kiln.bool)


def _special_rows():
    """(4, 3, 5): rows (last axis) holding a NaN, +inf, -inf, both infinities, only -inf, only
    +inf, ±0 and plain values; the other axes mix them too."""
    rng = make_rng(70)
    a = rng.uniform(-3, 3, (4, 3, 5))
    a[0, 0, 2] = np.nan
    a[0, 1, :] = -np.inf
    a[0, 2, 4] = np.inf
    a[1, 0, 0] = np.inf
    a[1, 0, 3] = -np.inf
    a[1, 1, :] = np.inf
    a[1, 2, [1, 3]] = [0.0, -0.0]
    a[2, 0, 4] = np.nan
    a[2, 0, 1] = np.inf
    a[2, 1, 0] = -np.inf
    a[3, 2, :] = np.nan
    return a


SPECIAL_REDUCTIONS = REDUCTIONS + [("argmax", ops.argmax), ("argmin", ops.argmin)]
# argmax / argmin take one axis (or none)
SPECIAL_REDUCTION_AXES = [(case, axis) for case in SPECIAL_REDUCTIONS for axis in (None, 0, 1, -1, (0, 2))
                          if not (case[0].startswith("arg") and isinstance(axis, tuple))]


@pytest.mark.parametrize("mode,dtype", _special_modes(), ids=lambda v: v if isinstance(v, str) else dtype_name(v))
@pytest.mark.parametrize("case,axis", SPECIAL_REDUCTION_AXES,
                         ids=lambda v: v[0] if isinstance(v, tuple) and v and isinstance(v[0], str) else repr(v))
def test_reduction_special_values(case, axis, mode, dtype):
    name, kfn = case
    # sum, mean, max and min over the last axis alone are fused (row kernels); the others run
    # their kernels
    out, (x,) = _special_call(mode, lambda t: kfn(t, axis), [_special_rows()], dtype,
                              fused=axis == -1 and name in ("sum", "mean", "max", "min"))
    x = round_to(x, dtype).astype(np.float64)
    with np.errstate(all="ignore"):
        if name.startswith("arg"):  # the first NaN wins, as in NumPy and PyTorch
            expected = getattr(np, name)(x, axis=axis)
        else:
            expected = _np_reduce(name, x, axis, False)
    assert_close(out, expected, out.dtype, rtol=1e-5 if dtype is kiln.float32 else None)


@pytest.mark.parametrize("mode,dtype", _special_modes(), ids=lambda v: v if isinstance(v, str) else dtype_name(v))
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_special_values(name, axis, mode, dtype):
    # rows with a NaN, an +inf or only -inf are NaN throughout (PyTorch too); -inf entries of
    # other rows get probability 0
    nfn = _np_softmax if name == "softmax" else _np_log_softmax
    out, (x,) = _special_call(mode, lambda t: getattr(ops, name)(t, axis), [_special_rows()], dtype, fused=axis == -1)
    with np.errstate(all="ignore"):
        expected = nfn(round_to(x, dtype).astype(np.float64), axis)
    assert_close(out, expected, dtype)


@pytest.mark.parametrize("mode", SPECIAL_MODES)
def test_max_pool2d_special_values(mode):
    # a NaN anywhere in a window makes that output NaN, as in PyTorch
    x = make_rng(71).uniform(-5, 5, (1, 2, 6, 6))
    x[0, 0, 1, 1], x[0, 0, 4, 5], x[0, 1, 0, 3], x[0, 1, 5, 0] = np.nan, np.inf, -np.inf, np.nan
    x[0, 1, 2:4, 2:4] = -np.inf
    out, (seen,) = _special_call(mode, lambda t: ops.max_pool2d(t, 3, 2, 1), [x], kiln.float32, fused=False)
    seen = round_to(seen, kiln.float32).astype(np.float64)
    with np.errstate(all="ignore"):
        assert_close(out, pool2d_ref(seen, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False, "max"), kiln.float32)


# the reproducers of issue 18, item 4: relu hid NaN (a NaN loss became 0)
def test_relu_of_nan_is_nan():
    assert math.isnan(ops.relu(kiln.Tensor([math.nan])).item())
    jf = kiln.jit(lambda x: ops.relu(x * 1.5) + 1.0, capture_mode="trace", jit_level="O1")
    x = kiln.Tensor([math.nan, -1.0, 2.0])
    jf(x)
    assert "= fused(" in jf.graph_str(x)
    np.testing.assert_array_equal(to_numpy(jf(x)), [np.nan, 1.0, 4.0])


def test_relu_gradient_at_nan_is_passed_on():
    # PyTorch's threshold_backward: the gradient is zeroed where relu(x) <= 0, so NaN passes it
    x = kiln.Tensor([math.nan, -1.0, 0.0, -0.0, 2.0])
    g = kiln.grad(lambda t: ops.relu(t).sum())(x)
    np.testing.assert_array_equal(to_numpy(g), [1.0, 0.0, 0.0, 0.0, 1.0])


def test_maximum_minimum_gradients_at_nan():
    # PyTorch: the loser's gradient is zeroed (a tie halves it); with a NaN neither loses
    a, b = kiln.Tensor([math.nan, 1.0, 2.0, 3.0]), kiln.Tensor([2.0, math.nan, 2.0, 1.0])
    for f, want_a, want_b in [(ops.maximum, [1, 1, 0.5, 1], [1, 1, 0.5, 0]),
                              (ops.minimum, [1, 1, 0.5, 0], [1, 1, 0.5, 1])]:
        ga, gb = kiln.grad(lambda x, y: f(x, y).sum(), grad_position=(0, 1))(a, b)
        np.testing.assert_array_equal(to_numpy(ga), want_a)
        np.testing.assert_array_equal(to_numpy(gb), want_b)


@pytest.mark.parametrize("jit_level", [None, "O0", "O1", "O2"])
def test_dense_relu_keeps_nan(jit_level):
    # at O1 the relu is a matmul epilogue: applied to each block as the GEMM finishes it
    net = kiln.nn.Dense(4, 3, activation="relu")
    x = np.ones((2, 4), np.float32)
    x[1, 2] = np.nan
    xt = kiln.Tensor(x)
    f = net if jit_level is None else kiln.jit(net, jit_level=jit_level)
    f(xt)
    out = to_numpy(f(xt))
    assert np.isnan(out[1]).all() and not np.isnan(out[0]).any(), out
    if jit_level == "O1":
        assert "matmul_epilogue(" in f.graph_str(xt), f.graph_str(xt)


@pytest.mark.parametrize("act", ["relu", "clamp"])
@pytest.mark.parametrize("infer_boost", ["off", "on"])
def test_conv_relu_and_clamp_epilogues_keep_nan(act, infer_boost):
    # oneDNN's relu and clip post-ops are max/min instructions that turn NaN into the bound:
    # conv2d_fused applies these through kiln's kernel
    from kiln.ops import nn_functional as F
    rng = make_rng(72)
    x = rng.standard_normal((1, 16, 6, 6)).astype(np.float32)
    x[0, 3, 2, 2] = np.nan
    w = (rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    activation = ops.relu if act == "relu" else (lambda t: ops.clamp(t, -0.5, 0.5))

    def f(x, w, b):
        return activation(F.conv2d(x, w, b, padding=1))

    args = [kiln.Tensor(v) for v in (x, w, b)]
    eager = to_numpy(f(*args))
    assert np.isnan(eager).sum() == 16 * 9  # the NaN's 3x3 neighbourhood in every channel
    jf = kiln.jit(f, jit_level="O1", infer_boost=infer_boost)
    jf(*args)
    got = to_numpy(jf(*args))
    assert "conv2d_fused(" in jf.graph_str(*args)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(eager))
    np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4, equal_nan=True)


def test_maximum_max_and_clamp_keep_nan():
    x = kiln.Tensor([1.0, math.nan, 3.0])
    assert np.isnan(to_numpy(ops.maximum(x, kiln.Tensor([0.0, 0.0, 0.0]))))[1]
    assert np.isnan(to_numpy(ops.minimum(kiln.Tensor([0.0, 0.0, 0.0]), x)))[1]
    assert math.isnan(ops.max(x).item()) and math.isnan(ops.min(x).item())
    assert ops.argmax(x).item() == 1 and ops.argmin(x).item() == 1
    assert math.isnan(ops.clamp(x, 0.0, 2.0)[1].item())
    # min > max: every value becomes max, as torch.clamp (NaN stays NaN)
    np.testing.assert_array_equal(to_numpy(ops.clamp(x, 2.0, 1.0)), [1.0, np.nan, 1.0])
