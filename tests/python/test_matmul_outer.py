"""matmul over one element (K == 1: an outer product per batch, as kiln.vmap's per-example weight
gradients gy x^T are) runs its own kernel: each output element written once, no GEMM per batch.
Checked against NumPy for the layouts that reach it (transposed and strided views, broadcast
batches, 1-D operands, float32 / float64 / float16, one and several threads), under kiln.jit with
matmul epilogues (O1), and through vmap(grad) per-example gradients against a loop."""
import os
import sys

import numpy as np
import pytest

import kiln
from kiln import ops

sys.path.insert(0, os.path.dirname(__file__))
from conformance import ENV, VARIANTS, environment  # noqa: E402


def rnd(seed, *shape, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    before = kiln.get_num_threads()
    kiln.set_num_threads(request.param)
    yield request.param
    kiln.set_num_threads(before)


CASES = [
    # (a shape, b shape, how a is laid out)
    ((5, 1), (1, 7), "contiguous"),
    ((64, 300, 1), (64, 1, 257), "contiguous"),       # large: split over the threads
    ((3, 4, 1), (1, 6), "contiguous"),                # b shared by every batch
    ((4, 1), (2, 3, 1, 5), "contiguous"),             # a shared, b batched twice
    ((2, 1, 4, 1), (1, 3, 1, 6), "contiguous"),       # both broadcast
    ((6, 1, 9), None, "transposed"),                  # a = x.permute(0, 2, 1): vmap's gy^T
]


@pytest.mark.parametrize("ashape,bshape,layout", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_outer_products_match_numpy(threads, ashape, bshape, layout, dtype):
    if layout == "transposed":
        base = rnd(1, *ashape, dtype=dtype)
        a = kiln.tensor(base).permute(0, 2, 1)
        an = base.transpose(0, 2, 1)
        bn = rnd(2, ashape[0], 1, 11, dtype=dtype)
    else:
        an, bn = rnd(1, *ashape, dtype=dtype), rnd(2, *bshape, dtype=dtype)
        a = kiln.tensor(an)
    got = ops.matmul(a, kiln.tensor(bn))
    want = np.matmul(an, bn)
    assert tuple(got.shape) == want.shape
    np.testing.assert_array_equal(got.numpy(), want)  # a * b exactly, as the GEMM gives it


def test_strided_operands_and_vectors(threads):
    big = rnd(3, 4, 1, 20)
    b = kiln.tensor(big)[:, :, ::2]                  # columns two elements apart
    a = kiln.tensor(rnd(4, 4, 6, 1))
    np.testing.assert_array_equal(ops.matmul(a, b).numpy(), np.matmul(a.numpy(), big[:, :, ::2]))
    u, v = rnd(5, 1), rnd(6, 1, 8)
    np.testing.assert_array_equal(ops.matmul(kiln.tensor(u), kiln.tensor(v)).numpy(), np.matmul(u, v))


def test_float16_and_special_values():
    a = np.array([[1.5], [-2.0], [np.inf], [0.0]], np.float16)
    b = np.array([[2.0, np.nan, -0.5, np.inf]], np.float16)
    got = ops.matmul(kiln.tensor(a), kiln.tensor(b)).numpy()
    with np.errstate(invalid="ignore"):  # inf * 0 is nan, as it should be
        want = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(got, want)


def test_outer_product_with_an_epilogue_compiled():
    """At O1 the elementwise ops after a matmul run on its output blocks (matmul_epilogue)."""
    def f(a, b, c):
        return ops.tanh(ops.matmul(a, b) * 0.5) + c

    args = [rnd(7, 8, 33, 1), rnd(8, 8, 1, 40), rnd(9, 40)]
    want = f(*(kiln.tensor(x) for x in args)).numpy()
    np.testing.assert_allclose(want, np.tanh(np.matmul(args[0], args[1]) * 0.5) + args[2], rtol=1e-6, atol=1e-6)
    with environment(ENV):
        for variant in VARIANTS:
            got = variant.wrap(f)(*(kiln.tensor(x) for x in args)).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=variant.name)


def test_per_example_weight_gradients_use_the_outer_product():
    w = kiln.tensor(rnd(10, 16, 8))
    x, y = kiln.tensor(rnd(11, 5, 8)), kiln.tensor(rnd(12, 5, 16))

    def loss(w, x, y):
        return ((ops.tanh(ops.dense(x, w)) - y) ** 2).mean()

    per_example = kiln.jit(kiln.vmap(kiln.grad(loss), in_axes=(None, 0, 0)))
    got = per_example(w, x, y).numpy()
    loop = np.stack([kiln.grad(loss)(w, x[i], y[i]).numpy() for i in range(5)])
    np.testing.assert_allclose(got, loop, rtol=1e-5, atol=1e-7)
    text = per_example.graph_str(w, x, y)
    assert "float32[5, 16, 8] = matmul(" in text, text
