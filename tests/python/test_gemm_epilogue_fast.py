"""GEMM epilogues applied in one pass over each block of the product (matmul_epilogue's fast path:
every step's inner loop on chunks of each row): user code with a product followed by bias, residual,
scaling and activation steps, compiled in every capture mode at O0 and O1, kernel by kernel and
sunk, gives eager's bits exactly (float32 and float64) for every step op, chains of one to four
steps, bias rows, full residuals, scalars and columns as operands, non-contiguous inputs and odd
shapes; gradients through the fused graphs equal eager's and finite differences; explain() names
the fused node."""
import numpy as np
import pytest

import kiln
from kiln import ops

from conftest import tol


def add_relu(x, w, b):  # add, relu; a bias row
    return ops.relu(ops.matmul(x, w) + b)


def sub_gelu(x, w, r):  # sub with the product second, gelu; a full residual
    return ops.gelu(r - ops.matmul(x, w))


def mul_silu(x, w, s):  # mul by a scalar tensor, silu
    return ops.silu(ops.matmul(x, w) * s)


def div_sigmoid(x, w, c):  # div by a column, sigmoid
    return ops.sigmoid(ops.matmul(x, w) / c)


def maximum_tanh(x, w, r):  # maximum, tanh
    return ops.tanh(ops.maximum(ops.matmul(x, w), r))


def minimum_neg(x, w, r):  # minimum with the product second, neg
    return -ops.minimum(r, ops.matmul(x, w))


def dense_four_steps(x, w, b, r):  # a linear with bias, then gelu, * r, + b, tanh
    return ops.tanh(ops.gelu(ops.dense(x, ops.swapaxes(w, 0, 1), b)) * r + b)


def transposed_inputs(x, w, r):  # non-contiguous operands of the product and of a step
    return ops.relu(ops.matmul(ops.swapaxes(x, 0, 1), w) + ops.swapaxes(r, 0, 1))


def operands(f, M, N, K):
    """The argument shapes of f for an (M, K) @ (K, N) product."""
    return {
        add_relu: [(M, K), (K, N), (N,)],
        sub_gelu: [(M, K), (K, N), (M, N)],
        mul_silu: [(M, K), (K, N), ()],
        div_sigmoid: [(M, K), (K, N), (M, 1)],
        maximum_tanh: [(M, K), (K, N), (M, N)],
        minimum_neg: [(M, K), (K, N), (1, N)],
        dense_four_steps: [(M, K), (K, N), (N,), (M, N)],
        transposed_inputs: [(K, M), (K, N), (N, M)],
    }[f]


FUNCS = [add_relu, sub_gelu, mul_silu, div_sigmoid, maximum_tanh, minimum_neg, dense_four_steps, transposed_inputs]
STEPS = {add_relu: 2, sub_gelu: 2, mul_silu: 2, div_sigmoid: 2, maximum_tanh: 2, minimum_neg: 2,
         dense_four_steps: 4, transposed_inputs: 2}
MODES = ["ast", "bytecode", "trace"]
SHAPES = [(17, 129, 3), (1, 3, 17), (129, 17, 1), (3, 1, 129)]


def args_for(f, shape, dtype, seed):
    rng = np.random.default_rng(seed)
    out = []
    for s in operands(f, *shape):
        a = rng.uniform(-2, 2, s)
        if f is div_sigmoid and s == (shape[0], 1):
            a = np.where(np.abs(a) < 0.25, 0.5, a)  # no divisor near 0
        out.append(kiln.Tensor(a, dtype))
    return out


def fused_nodes(jf):
    return jf.graph_str().split("subgraph")[0].count("= matmul_epilogue(")


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("backend", ["", "sink"], ids=["kbk", "sink"])
@pytest.mark.parametrize("level", ["O0", "O1"])
@pytest.mark.parametrize("mode", MODES)
def test_every_step_bitwise_equal_to_eager(mode, level, backend, dtype):
    for i, f in enumerate(FUNCS):
        args = args_for(f, (17, 129, 3), dtype, i)
        eager = f(*args).asnumpy()
        jf = kiln.jit(f, capture_mode=mode, jit_level=level, backend=backend)
        for _ in range(2):
            np.testing.assert_array_equal(jf(*args).asnumpy(), eager, err_msg=f.__name__)
        assert fused_nodes(jf) == (level == "O1"), (f.__name__, jf.graph_str())
        if level == "O1":
            text = jf.graph_str().split("subgraph")[0]
            attrs = text.split("= matmul_epilogue(")[1].split("{")[1].split("}")[0]
            ints = [int(v) for v in attrs.split(",")]  # base (0 matmul, 1 linear), its inputs, steps, ...
            assert ints[0] == (f is dense_four_steps) and ints[2] == STEPS[f], (f.__name__, attrs)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k in SHAPES])
@pytest.mark.parametrize("mode,backend", [("bytecode", ""), ("trace", "sink"), ("ast", "")])
def test_odd_shapes_bitwise_equal_to_eager(shape, mode, backend):
    for dtype in (kiln.float32, kiln.float64):
        for i, f in enumerate(FUNCS):
            args = args_for(f, shape, dtype, 100 + i)
            eager = f(*args).asnumpy()
            jf = kiln.jit(f, capture_mode=mode, jit_level="O1", backend=backend)
            np.testing.assert_array_equal(jf(*args).asnumpy(), eager, err_msg=f"{f.__name__} {shape} {dtype}")
            np.testing.assert_array_equal(jf(*args).asnumpy(), eager, err_msg=f"{f.__name__} {shape} {dtype}")
            assert fused_nodes(jf) == 1, jf.graph_str()


def numpy_reference(f, args):
    """f computed by NumPy in float64 (erf from math: NumPy has none)."""
    import math
    a = [np.asarray(t.asnumpy(), np.float64) for t in args]
    erf = np.vectorize(math.erf)
    gelu = lambda v: 0.5 * v * (1 + erf(v / math.sqrt(2)))  # noqa: E731
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    if f is add_relu:
        return np.maximum(a[0] @ a[1] + a[2], 0)
    if f is sub_gelu:
        return gelu(a[2] - a[0] @ a[1])
    if f is mul_silu:
        p = a[0] @ a[1] * a[2]
        return p * sig(p)
    if f is div_sigmoid:
        return sig(a[0] @ a[1] / a[2])
    if f is maximum_tanh:
        return np.tanh(np.maximum(a[0] @ a[1], a[2]))
    if f is minimum_neg:
        return -np.minimum(a[2], a[0] @ a[1])
    if f is dense_four_steps:
        return np.tanh(gelu(a[0] @ a[1] + a[2]) * a[3] + a[2])
    return np.maximum(a[0].T @ a[1] + a[2].T, 0)


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64], ids=["float32", "float64"])
def test_values_equal_numpy(dtype):
    for i, f in enumerate(FUNCS):
        args = args_for(f, (33, 70, 20), dtype, 200 + i)
        got = kiln.jit(f, jit_level="O1")(*args).asnumpy()
        np.testing.assert_allclose(got, numpy_reference(f, args), **tol(dtype, 20), err_msg=f.__name__)


def test_large_split_products_bitwise_equal_to_eager():
    """Products the GEMM splits over the threads by rows and by columns, each thread running the
    steps on its block."""
    rng = np.random.default_rng(9)
    for M, N, K in [(600, 96, 300), (96, 900, 300)]:
        x, w = kiln.Tensor(rng.standard_normal((M, K)), kiln.float32), kiln.Tensor(rng.standard_normal((N, K)), kiln.float32)
        b, r = kiln.Tensor(rng.standard_normal(N), kiln.float32), kiln.Tensor(rng.standard_normal((M, N)), kiln.float32)
        args = [x, ops.swapaxes(w, 0, 1), b, r]
        jf = kiln.jit(dense_four_steps, jit_level="O1")
        np.testing.assert_array_equal(jf(*args).asnumpy(), dense_four_steps(*args).asnumpy())
        assert fused_nodes(jf) == 1


def test_explain_names_the_fused_node():
    args = args_for(dense_four_steps, (5, 6, 7), kiln.float32, 1)
    for level, fused in (("O1", True), ("O0", False)):
        jf = kiln.jit(dense_four_steps, jit_level=level)
        jf(*args)
        assert ("matmul_epilogue" in str(jf.explain())) == fused, str(jf.explain())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("f", [add_relu, mul_silu, minimum_neg, dense_four_steps, transposed_inputs],
                         ids=lambda f: f.__name__)
def test_gradients_equal_eager_and_finite_differences(f, mode):
    args = args_for(f, (9, 11, 5), kiln.float64, 300)
    pos = tuple(range(len(args)))
    loss = lambda *a: ops.sum(f(*a) * f(*a))  # noqa: E731 (every gradient matters)
    v0, g0 = kiln.value_and_grad(loss, pos)(*args)
    v1, g1 = kiln.jit(kiln.value_and_grad(loss, pos), capture_mode=mode, jit_level="O1")(*args)
    np.testing.assert_allclose(v1.asnumpy(), v0.asnumpy(), rtol=1e-12)
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-10, atol=1e-12)
    # finite differences on a few elements of each argument
    rng = np.random.default_rng(4)
    base = [t.asnumpy().copy() for t in args]
    for k, g in enumerate(g0):
        flat = base[k].reshape(-1)
        for idx in rng.choice(flat.size, size=min(3, flat.size), replace=False):
            e = 1e-6
            up, dn = [b.copy() for b in base], [b.copy() for b in base]
            up[k].reshape(-1)[idx] += e
            dn[k].reshape(-1)[idx] -= e
            fd = (loss(*[kiln.Tensor(u) for u in up]).asnumpy() - loss(*[kiln.Tensor(d) for d in dn]).asnumpy()) / (2 * e)
            np.testing.assert_allclose(np.asarray(g1[k].asnumpy()).reshape(-1)[idx], fd, rtol=1e-5, atol=1e-6)
