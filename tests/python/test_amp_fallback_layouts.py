"""The fp32-compute fallback of 16-bit products and softmax (src/ops/lowp_pass.c): a 16-bit operand
is widened to float32 in one pass keeping its layout (a transposed or permuted view stays one BLAS
takes transposed, as a float32 tensor would), and the float32 result is rounded once in one pass.
So a fallback product is bit for bit the float32 product of the widened operands rounded once,
for every layout (contiguous, transposed, permuted batches as attention's q @ kᵀ, sliced and
broadcast views, products split over threads); it is within the documented tolerance of NumPy's;
the bfloat16 hardware path (where the CPU has it) agrees with it; softmax and its gradient in 16
bits are float32's on the widened values, rounded once; and every kiln.jit variant gives eager's
results, forward and gradients, on both paths."""
import numpy as np
import pytest

import kiln
from kiln import ops
from kiln._optable import OP
from kiln.ops._util import apply
from compiled_equal import assert_compiled_equal

HARDWARE = kiln._C.gemm_bf16_info()["hardware"]
NO_HARDWARE = "no bfloat16 hardware path: the CPU has no avx512_bf16, or oneDNN's instruction set is capped below it"
TOL = {"bfloat16": 2e-2, "float16": 4e-3}  # docs/guide/mixed_precision.md: one product
DTYPES = ["bfloat16", "float16"]


def swap(x):
    return ops.swapaxes(x, -1, -2)


# name: (fn, operand shapes); every product is past the tiny-product loop, "split" past a split over
# threads (262144 multiply-adds)
CASES = {
    "nn": (lambda a, b: ops.matmul(a, b), [(40, 96), (96, 72)]),
    "tn": (lambda a, b: ops.matmul(a.T, b), [(96, 40), (96, 72)]),
    "nt": (lambda a, b: ops.matmul(a, b.T), [(40, 96), (72, 96)]),
    "tt": (lambda a, b: ops.matmul(a.T, b.T), [(96, 40), (72, 96)]),
    "split_tn": (lambda g, x: ops.matmul(g.T, x), [(256, 128), (256, 96)]),
    "scores": (lambda q, k: ops.matmul(q, swap(k)), [(1, 2, 96, 32), (1, 2, 40, 32)]),
    "heads": (lambda q, k: ops.matmul(ops.permute(q, (0, 2, 1, 3)), swap(ops.permute(k, (0, 2, 1, 3)))),
              [(2, 24, 3, 16), (2, 20, 3, 16)]),
    "sliced": (lambda a, b: ops.matmul(a[:, ::2], b), [(40, 192), (96, 72)]),
    "broadcast": (lambda a, b: ops.matmul(a, b), [(3, 24, 32), (32, 20)]),
    "linear": (lambda x, w: ops.dense(x, w), [(2, 33, 70), (48, 70)]),
    "linear_bias": (lambda x, w, b: ops.dense(x, w, b), [(64, 128), (96, 128), (96,)]),
    "linear_swapped_x": (lambda x, w: ops.dense(swap(x), w), [(2, 70, 33), (48, 70)]),
    # batches split over threads (each batch's result rounded as its GEMM finishes), and products
    # over one element (K = 1: outer products, rounded row block by row block)
    "batches_split": (lambda a, b: ops.matmul(a, b), [(4, 96, 128), (4, 128, 96)]),
    "outer": (lambda a, b: ops.matmul(a, b), [(3, 40, 1), (3, 1, 72)]),
}
COMPILED = ["tn", "scores", "linear_bias"]


def low_args(name, dtype, seed):
    rng = np.random.default_rng(seed)
    return [kiln.tensor(rng.standard_normal(s).astype(np.float32)).astype(getattr(kiln, dtype)) for s in CASES[name][1]]


def bits(t):
    return t.astype(kiln.float32).numpy().view(np.uint32)


def as64(t):
    return np.asarray(t.astype(kiln.float32).numpy(), np.float64)


@pytest.fixture
def fallback():
    kiln._C.gemm_bf16_force(0)
    yield
    kiln._C.gemm_bf16_force(-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", CASES)
def test_fallback_is_the_float32_product_rounded_once(name, dtype, fallback):
    fn = CASES[name][0]
    args = low_args(name, dtype, 1)
    got = fn(*args)
    assert got.dtype is getattr(kiln, dtype)
    wide = fn(*[a.astype(kiln.float32) for a in args])
    np.testing.assert_array_equal(bits(got), bits(wide.astype(getattr(kiln, dtype))), err_msg=name)
    # and NumPy's product of the same values, within the documented tolerance of one product
    np_args = [as64(a) for a in args]
    ref = {"nn": lambda a, b: a @ b, "tn": lambda a, b: a.T @ b, "nt": lambda a, b: a @ b.T,
           "tt": lambda a, b: a.T @ b.T, "split_tn": lambda g, x: g.T @ x,
           "scores": lambda q, k: q @ np.swapaxes(k, -1, -2),
           "heads": lambda q, k: np.transpose(q, (0, 2, 1, 3)) @ np.swapaxes(np.transpose(k, (0, 2, 1, 3)), -1, -2),
           "sliced": lambda a, b: a[:, ::2] @ b, "broadcast": lambda a, b: a @ b,
           "linear": lambda x, w: x @ w.T, "linear_bias": lambda x, w, b: x @ w.T + b,
           "linear_swapped_x": lambda x, w: np.swapaxes(x, -1, -2) @ w.T,
           "batches_split": lambda a, b: a @ b, "outer": lambda a, b: a @ b}[name](*np_args)
    err = np.abs(as64(got) - ref).max() / np.abs(ref).max()
    assert err <= TOL[dtype], (name, dtype, err)


@pytest.mark.skipif(not HARDWARE, reason=NO_HARDWARE)
@pytest.mark.parametrize("name", CASES)
def test_the_hardware_path_agrees(name):
    """Both paths sum in float32 and round once; their orders of summation differ, so a result may
    round to a neighbouring bfloat16: within 1% of the largest magnitude."""
    fn = CASES[name][0]
    args = low_args(name, "bfloat16", 2)
    out = {}
    for how in (1, 0):
        kiln._C.gemm_bf16_force(how)
        try:
            out[how] = as64(fn(*args))
        finally:
            kiln._C.gemm_bf16_force(-1)
    np.testing.assert_allclose(out[1], out[0], rtol=0, atol=1e-2 * np.abs(out[0]).max(), err_msg=name)


def softmax_ref(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


# rows grouped per buffer (257 long), one slice per buffer along a middle axis, a slice longer than a
# buffer (src/ops/reduce.c: SM_LOWP_GROUP), the first axis, a tiny tensor (one thread)
SOFTMAX_SHAPES = [((2, 300, 257), -1), ((4, 64, 129), 1), ((2, 20000), -1), ((64, 3, 50), 0), ((3, 7), -1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", SOFTMAX_SHAPES)
def test_softmax_is_float32_on_the_widened_values(dtype, shape, axis):
    rng = np.random.default_rng(3)
    low = getattr(kiln, dtype)
    x = kiln.tensor((3 * rng.standard_normal(shape)).astype(np.float32)).astype(low)
    c = kiln.tensor(rng.standard_normal(shape).astype(np.float32)).astype(low)
    y = ops.softmax(x, axis)
    assert y.dtype is low
    np.testing.assert_array_equal(bits(y), bits(ops.softmax(x.astype(kiln.float32), axis).astype(low)))
    assert np.abs(as64(y) - softmax_ref(as64(x), axis)).max() <= TOL[dtype]
    # the gradient: softmax_backward in 16 bits against NumPy's y * (g - sum(g * y))
    _, g = kiln.value_and_grad(lambda a: (ops.softmax(a, axis) * c).astype(kiln.float32).sum(), 0)(x)
    yr = softmax_ref(as64(x), axis)
    want = yr * (as64(c) - (as64(c) * yr).sum(axis, keepdims=True))
    assert g.dtype is low
    assert np.abs(as64(g) - want).max() <= TOL[dtype] * np.abs(want).max()
    # softmax_backward itself: float32's on the widened (grad, y), rounded once, bit for bit
    ax = axis % len(shape)
    back = apply(OP.softmax_backward, (c, y), (ax,), ())
    wide = apply(OP.softmax_backward, (c.astype(kiln.float32), y.astype(kiln.float32)), (ax,), ())
    assert back.dtype is low
    np.testing.assert_array_equal(bits(back), bits(wide.astype(low)))


@pytest.mark.parametrize("path", ["fallback", "hardware"])
@pytest.mark.parametrize("name", COMPILED)
def test_compiled_equals_eager(name, path):
    if path == "hardware" and not HARDWARE:
        pytest.skip(NO_HARDWARE)
    fn = CASES[name][0]
    args = low_args(name, "bfloat16", 4)
    kiln._C.gemm_bf16_force(1 if path == "hardware" else 0)
    try:
        assert_compiled_equal(lambda *a: ops.softmax(fn(*a), -1), args)
        assert_compiled_equal(lambda *a: ops.softmax(fn(*a), -1).astype(kiln.float32).sum(), args, grad=True)
    finally:
        kiln._C.gemm_bf16_force(-1)
