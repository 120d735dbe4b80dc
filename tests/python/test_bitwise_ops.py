"""Python's & | ^ ~ << >> on integer and bool tensors (kiln.ops.bitwise_and / bitwise_or /
bitwise_xor / invert / bitwise_left_shift / bitwise_right_shift): NumPy's values and dtypes for
int8, int32, int64 and bool, broadcasting, Python ints on either side, negative values, shift
counts of 0, the width - 1, the width, beyond it and negative; float inputs a TypeError naming the
op; every compiled variant (kiln.jit's capture modes x O0/O1 x kbk/sink, kiln.trace, and O1 with
generated C) equal to eager bit for bit."""
import io
import warnings

import numpy as np
import pytest

import kiln
from kiln import ops
from conformance import TRACE_VARIANTS, run_all_modes

INTS = [np.int8, np.int32, np.int64]
KILN_DTYPE = {"int8": kiln.int8, "int32": kiln.int32, "int64": kiln.int64, "bool": kiln.bool_}


def T(a):
    return kiln.Tensor(np.asarray(a))


def values(dtype):
    """Every sign, the extremes, and bit patterns with high and low bits set."""
    info = np.iinfo(dtype)
    return np.array([info.min, info.min + 1, -9, -8, -1, 0, 1, 5, 0x55, info.max - 1, info.max], dtype)


def counts(dtype):
    """Shift counts: 0, 1, width - 1, width, width + 1, 2 * width, beyond 64 where the dtype holds it,
    negative ones and the extremes."""
    info, width = np.iinfo(dtype), np.iinfo(dtype).bits
    c = [0, 1, width - 1, width, width + 1, 2 * width, 63, 64, 65, 100, info.max, -1, -width, -100, info.min]
    return np.array(sorted({v for v in c if info.min <= v <= info.max}), dtype)


def assert_same(got, want):
    """Equal values and NumPy's dtype."""
    assert got.dtype is KILN_DTYPE[np.dtype(want.dtype).name], (got.dtype, want.dtype)
    np.testing.assert_array_equal(got.numpy(), want)


# ---- values against NumPy ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", INTS, ids=lambda d: d.__name__)
def test_and_or_xor_not_match_numpy_for_every_integer_dtype(dtype):
    v = values(dtype)
    a, b = v[:, None], v[None, :]  # every pair, by broadcasting
    ta, tb = T(a), T(b)
    for op, fn, want in [("&", ops.bitwise_and, np.bitwise_and(a, b)), ("|", ops.bitwise_or, np.bitwise_or(a, b)),
                         ("^", ops.bitwise_xor, np.bitwise_xor(a, b))]:
        assert_same(fn(ta, tb), want)
        assert_same(eval(f"ta {op} tb"), want)
    assert_same(~T(v), np.invert(v))
    assert_same(ops.invert(T(v)), np.invert(v))
    assert_same(ops.bitwise_not(T(v)), np.invert(v))


@pytest.mark.parametrize("dtype", INTS, ids=lambda d: d.__name__)
def test_shifts_match_numpy_at_every_count(dtype):
    v, c = values(dtype)[:, None], counts(dtype)[None, :]
    assert_same(T(v) << T(c), np.left_shift(v, c))
    assert_same(T(v) >> T(c), np.right_shift(v, c))
    assert_same(ops.bitwise_left_shift(T(v), T(c)), np.left_shift(v, c))
    assert_same(ops.bitwise_right_shift(T(v), T(c)), np.right_shift(v, c))


def test_shift_edges_spelled_out():
    """The cases C leaves undefined, with NumPy's answers written down."""
    one, minus8 = T(np.array([1], np.int32)), T(np.array([-8], np.int32))
    assert (one << 40).numpy().tolist() == [0]  # at least the width: 0
    assert (minus8 >> 40).numpy().tolist() == [-1]  # a negative value keeps its sign
    assert (T(np.array([8], np.int32)) >> 40).numpy().tolist() == [0]
    assert (one << -1).numpy().tolist() == [0]  # a negative count is past the width
    assert (minus8 >> -1).numpy().tolist() == [-1]
    assert (minus8 >> 1).numpy().tolist() == [-4]  # arithmetic, as Python's -8 >> 1
    assert (one << 31).numpy().tolist() == [-2 ** 31]  # into the sign bit: wraps
    assert (T(np.array([-1], np.int64)) << 63).numpy().tolist() == [-2 ** 63]
    assert (T(np.array([1], np.int8)) << 7).numpy().tolist() == [-128]


def test_bool_tensors_keep_the_logical_meaning():
    p, q = np.array([True, True, False, False]), np.array([True, False, True, False])
    for got, want in [(T(p) & T(q), p & q), (T(p) | T(q), p | q), (T(p) ^ T(q), p ^ q), (~T(p), ~p),
                      (ops.bitwise_and(T(p), T(q)), p & q), (ops.bitwise_or(T(p), T(q)), p | q),
                      (ops.bitwise_xor(T(p), T(q)), p ^ q), (ops.invert(T(p)), ~p),
                      (T(p) & True, p & True), (False | T(q), False | q)]:
        assert_same(got, want)
    # shifts of bools compute in int8, as NumPy's
    assert_same(T(p) << T(q), np.left_shift(p, q))
    assert_same(T(p) >> T(q), np.right_shift(p, q))


def test_mixed_dtypes_promote_as_numpy():
    i8, i32, i64 = np.array([-3, 7], np.int8), np.array([5, -100000], np.int32), np.array([2 ** 40, -1], np.int64)
    b = np.array([True, False])
    for x, y in [(i8, i32), (i32, i64), (i8, i64), (b, i8), (i32, b)]:
        assert_same(T(x) & T(y), np.bitwise_and(x, y))
        assert_same(T(x) | T(y), np.bitwise_or(x, y))
        assert_same(T(x) ^ T(y), np.bitwise_xor(x, y))
        assert_same(T(x) << T(y), np.left_shift(x, y))
        assert_same(T(x) >> T(y), np.right_shift(x, y))


@pytest.mark.parametrize("dtype", INTS, ids=lambda d: d.__name__)
def test_python_ints_on_either_side_keep_the_tensors_dtype(dtype):
    v = values(dtype)
    x = T(v)
    small = np.array([0, 1, 3, 7], dtype)
    cases = [(x & 6, v & dtype(6)), (6 & x, dtype(6) & v), (x | -16, v | dtype(-16)), (-16 | x, dtype(-16) | v),
             (x ^ 0x55, v ^ dtype(0x55)), (0x55 ^ x, dtype(0x55) ^ v), (x << 3, np.left_shift(v, dtype(3))),
             (x >> 3, np.right_shift(v, dtype(3))), (x >> 100, np.right_shift(v, dtype(100))),
             (1 << T(small), np.left_shift(dtype(1), small)), (-64 >> T(small), np.right_shift(dtype(-64), small)),
             (ops.bitwise_and(6, x), dtype(6) & v), (ops.bitwise_left_shift(x, 2), np.left_shift(v, dtype(2))),
             (ops.bitwise_right_shift(-100, T(small)), np.right_shift(dtype(-100), small))]
    for got, want in cases:
        assert_same(got, np.asarray(want, dtype))
    # a Python int next to a bool tensor is an int64, as NumPy's
    m = np.array([True, False])
    assert_same(T(m) & 1, m & 1)
    assert_same(3 ^ T(m), 3 ^ m)


def test_broadcasting_and_tensor_methods():
    a = np.arange(-12, 12, dtype=np.int32).reshape(2, 3, 4)
    b = np.array([1, 2, 4, 8], np.int32)
    c = np.array([[0], [1], [5]], np.int32)
    x = T(a)
    assert_same(x.bitwise_and(T(b)), a & b)
    assert_same(x.bitwise_or(T(b)), a | b)
    assert_same(x.bitwise_xor(T(c)), a ^ c)
    assert_same(x.bitwise_left_shift(T(c)), a << c)
    assert_same(x.bitwise_right_shift(T(c)), a >> c)
    assert_same(x.invert(), ~a)
    assert_same(x.bitwise_not(), ~a)
    assert_same(ops.left_shift(x, T(c)), a << c)  # NumPy's names
    assert_same(ops.right_shift(x, T(c)), a >> c)


def test_augmented_assignments_and_in_place_methods():
    a = np.array([12, -7, 5, 0], np.int64)
    x = T(a)
    y = x
    x &= 6
    x |= T(np.array([1, 0, 0, 1], np.int64))
    x ^= 3
    x <<= 2
    x >>= 1
    np.testing.assert_array_equal(x.numpy(), ((((a & 6) | [1, 0, 0, 1]) ^ 3) << 2) >> 1)
    np.testing.assert_array_equal(y.numpy(), a)  # as `+=`: a new tensor bound to the name
    z = T(a)
    for method, want in [("bitwise_and_", a & 5), ("bitwise_or_", (a & 5) | 8), ("bitwise_xor_", ((a & 5) | 8) ^ 1),
                         ("bitwise_left_shift_", (((a & 5) | 8) ^ 1) << 1),
                         ("bitwise_right_shift_", ((((a & 5) | 8) ^ 1) << 1) >> 2)]:
        arg = {"bitwise_and_": 5, "bitwise_or_": 8, "bitwise_xor_": 1, "bitwise_left_shift_": 1,
               "bitwise_right_shift_": 2}[method]
        assert getattr(z, method)(arg) is z
        np.testing.assert_array_equal(z.numpy(), want)
    assert z.bitwise_not_() is z
    np.testing.assert_array_equal(z.numpy(), ~(((((a & 5) | 8) ^ 1) << 1) >> 2))


def test_mindspore_primitives():
    from kiln.ops import primitives as P
    x, y = T(np.array([6, -3], np.int32)), T(np.array([3, 1], np.int32))
    np.testing.assert_array_equal(P.BitwiseAnd()(x, y).numpy(), [2, 1])
    np.testing.assert_array_equal(P.BitwiseOr()(x, y).numpy(), [7, -3])
    np.testing.assert_array_equal(P.BitwiseXor()(x, y).numpy(), [5, -4])
    np.testing.assert_array_equal(P.Invert()(x).numpy(), [-7, 2])
    np.testing.assert_array_equal(P.LeftShift()(x, y).numpy(), [48, -6])
    np.testing.assert_array_equal(P.RightShift()(x, y).numpy(), [0, -2])


# ---- bad input ----------------------------------------------------------------------------------

FLOAT = np.array([1.5, 2.0], np.float32)
INT = np.array([1, 2], np.int32)


@pytest.mark.parametrize("call,op,dtypes", [
    (lambda: T(FLOAT) & T(INT), "bitwise_and", "float32 and int32"),
    (lambda: T(INT) | T(FLOAT), "bitwise_or", "int32 and float32"),
    (lambda: T(FLOAT) ^ 1, "bitwise_xor", "float32 and float32"),
    (lambda: ~T(FLOAT), "bitwise_not", "float32"),
    (lambda: T(FLOAT) << 1, "left_shift", "float32"),
    (lambda: 8 >> T(FLOAT), "right_shift", "float32"),
    (lambda: T(np.array([True])) & T(FLOAT), "bitwise_and", "bool and float32"),
    (lambda: ops.bitwise_and(T(FLOAT.astype(np.float64)), 3), "bitwise_and", "float64"),
    (lambda: ops.invert(T(FLOAT)), "bitwise_not", "float32"),
    (lambda: ops.bitwise_left_shift(T(INT), 1.0), "left_shift", "int32 and float32"),
], ids=["and", "or", "xor-scalar", "not", "lshift", "rshift-reflected", "bool-and-float", "ops-and", "ops-invert",
        "float-count"])
def test_float_inputs_raise_type_error_naming_the_op(call, op, dtypes):
    with pytest.raises(TypeError, match=f"{op}: not supported for {dtypes}"):
        call()


def test_float_inputs_raise_under_every_compiled_variant():
    def f(x, i):
        return (i & 3) + (x << 1)

    run_all_modes(f, (T(FLOAT), T(INT)), raises=True)


# ---- every compiled variant equal to eager --------------------------------------------------------

def masks_and_shifts(a, b, m, c8):
    """The operators as user code writes them: bit fields, masks, hashing, in-place forms."""
    low = a & 0xFF
    field = (a >> 4) & 0xF
    mixed = (a ^ (b << 3)) | ~b
    h = a * 31
    h ^= h >> 7
    h <<= 1
    h &= b
    flags = (m & (a > 0)) | ~m ^ (b < 0)
    count = T(np.array([0, 7, 8, 9, -1, 100], np.int8))  # int8: 0, width - 1, width, beyond, negative
    edge = (c8 << count, c8 >> count)
    return low, field, mixed, h, flags, 1 << (b & 31), -1024 >> (b & 63), edge, ops.invert(c8), c8 ^ 0x55


def _call(seed):
    r = np.random.default_rng(seed)
    a = r.integers(-2 ** 40, 2 ** 40, size=(3, 4), dtype=np.int64)
    b = r.integers(-2 ** 31, 2 ** 31 - 1, size=(4,), dtype=np.int64).astype(np.int32)
    m = r.random((3, 4)) > 0.5
    c8 = np.array([-128, -1, 1, 127, 85, -86], np.int8)
    return T(a), T(b), T(m), T(c8)


def test_compiled_variants_equal_eager():
    run_all_modes(masks_and_shifts, _call(0), _call(1), _call(0))


def test_kiln_trace_equals_eager():
    run_all_modes(masks_and_shifts, _call(0), _call(1), _call(0), variants=TRACE_VARIANTS)


def bits_of_any_length(a, b):
    return ((a >> 3) & b) ^ ~(a << (b & 7)), (a | 1) >> 2


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_symbolic_sizes_one_compile_over_many_lengths(mode):
    """dynamic=True: every size a symbol (the ops' broadcast / same size rules), each length right."""
    jf = kiln.jit(bits_of_any_length, capture_mode=mode, dynamic=True)
    r = np.random.default_rng(5)
    for n in (3, 7, 12):
        a = r.integers(-2 ** 20, 2 ** 20, (n, 4), dtype=np.int64)
        b = r.integers(0, 40, (4,), dtype=np.int64)
        for got, want in zip(jf(T(a), T(b)), bits_of_any_length(T(a), T(b))):
            assert_same(got, want.numpy())
        np.testing.assert_array_equal(jf(T(a), T(b))[0].numpy(), ((a >> 3) & b) ^ ~(a << (b & 7)))
    assert jf.cache_info().compiles == 1


def fused_with_floats(x, i, c):
    """Bitwise results feeding float arithmetic O1 fuses into generated C, and back."""
    scale = ((i & 12) << 1).float() * x + 1.0
    bits = ((i >> c) ^ 5) | (i << c)
    sel = ops.where((i & 1) == 1, x * 2.0, -x)
    return scale, bits, sel, (~i).float() * 0.5 - x


@pytest.mark.parametrize("backend", ["kbk", "sink"])
def test_o1_with_generated_c_equals_eager_bit_for_bit(backend, monkeypatch):
    monkeypatch.delenv("KILN_DISABLE_CODEGEN", raising=False)  # the generated C, not the interpreted path
    r = np.random.default_rng(3)
    counts32 = T(np.array([0, 1, 31, 32, 33, -1, 5, 40], np.int32))
    args = [(T(r.standard_normal(8).astype(np.float32)),
             T(r.integers(-2 ** 31, 2 ** 31 - 1, 8, dtype=np.int64).astype(np.int32)), counts32) for _ in range(2)]
    jf = kiln.jit(fused_with_floats, capture_mode="ast", jit_level="O1", backend=backend)
    for x, i, c in args + args:
        want, got = fused_with_floats(x, i, c), jf(x, i, c)
        for g, w in zip(got, want):
            assert g.dtype is w.dtype
            np.testing.assert_array_equal(g.numpy(), w.numpy())
    assert "fused" in jf.graph_str()  # the float part did run as a generated kernel
    if backend == "sink":
        assert jf._last.executable.native


# ---- gradients through functions that use integer bit tricks ----------------------------------

def test_gradients_flow_around_integer_masks():
    idx = T(np.arange(6, dtype=np.int32))

    def f(x):
        keep = ((idx >> 1) & 1) == 0  # pairs kept, pairs dropped
        return (x * x * keep.float()).sum()

    x = np.linspace(-1.0, 1.0, 6)
    g = kiln.grad(f)(T(x))
    want = 2 * x * (((np.arange(6) >> 1) & 1) == 0)
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-12)
    v = np.arange(1.0, 7.0)
    _, tangent = kiln.jvp(f, (T(x),), (T(v),))
    np.testing.assert_allclose(float(tangent.numpy()), (want * v).sum(), rtol=1e-12)


def test_bitwise_ops_have_no_gradient_rule():
    """Integer results: no reverse rule, so no forward rule is missing either (test_jvp_rules)."""
    names = {"bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "left_shift", "right_shift"}
    assert names <= {row[0] for row in kiln._C.op_table()}
    assert not names & set(kiln._C.jvp_rules_missing())
    assert not names & set(kiln._C.jvp_rule_ops())


# ---- export -------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "left_shift",
                                "right_shift"])
def test_onnx_export_refuses_naming_the_op(op, tmp_path):
    """opset 17 has no integer bitwise operators (BitShift takes unsigned types only)."""
    pytest.importorskip("onnx")
    from kiln.jit.onnx_export import OnnxExportError
    from onnx_runtime import FnCell

    fns = {"bitwise_and": lambda i: i & 6, "bitwise_or": lambda i: i | 6, "bitwise_xor": lambda i: i ^ 6,
           "bitwise_not": lambda i: ~i, "left_shift": lambda i: i << 2, "right_shift": lambda i: i >> 2}
    with pytest.raises(OnnxExportError, match=f"the op '{op}' has no ONNX form"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kiln.export(FnCell(fns[op]), T(np.arange(4, dtype=np.int32)), file_name=str(tmp_path / "m.onnx"),
                    file_format="ONNX")


def test_a_dumped_model_keeps_the_bitwise_ops():
    """kiln.trace's dump names ops in the model file: a loaded model computes the same bits."""
    def hash_bits(i, c):
        h = (i ^ (i >> 7)) << 1
        return (h & c) | ~(i >> c), 1 << c

    i, c = T(np.array([[-5, 1 << 40, 77], [3, -1, 0]], np.int64)), T(np.array([0, 63, 70], np.int64))
    t = kiln.trace(hash_bits, capture_as_const=True)
    want = t(i, c)
    buf = io.BytesIO()
    t.dump(buf, optimize_for_inference=False)
    got = kiln.load(buf.getvalue())(i, c)
    for g, w in zip(got, want):
        assert_same(g, w.numpy())
    np.testing.assert_array_equal(want[1].numpy(), np.left_shift(np.int64(1), c.numpy()))
