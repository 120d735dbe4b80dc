"""Epilogue fusion into matmul and linear at O1 and O2 (the fuse_matmul_epilogue pass): jitted bias and
residual adds, scaling and activations after a product equal eager execution, forward and through
value_and_grad (gradients unaffected: an intermediate a gradient rule needs is never folded);
the optimized graphs show matmul_epilogue nodes, O0 graphs none; the op runs eagerly too."""
import numpy as np
import pytest

import kiln
from kiln import nn, ops
from kiln._C import apply
from kiln._optable import OP

from conftest import tol


def rnd(rng, *shape, dtype=kiln.float32):
    return kiln.Tensor(rng.uniform(-1.5, 1.5, size=shape), dtype)


def dense_relu_residual(x, w, b, r):
    return ops.relu(ops.dense(x, w, b)) + r


def scaled_scores(q, k):
    return ops.softmax(ops.matmul(q, ops.swapaxes(k, -1, -2)) / 8.0, -1)


def gelu_after_bias(x, w, b):
    return ops.gelu(ops.matmul(x, w) + b)


def residual_sub(x, w, r):
    return r - ops.tanh(ops.matmul(x, w)) * r


CASES = [
    ("dense+relu+residual", dense_relu_residual, [(2, 70, 48), (96, 48), (96,), (2, 70, 96)]),
    ("scores/scale", scaled_scores, [(2, 4, 40, 16), (2, 4, 40, 16)]),
    ("matmul+bias+gelu", gelu_after_bias, [(300, 64), (64, 130), (130,)]),
    ("residual-tanh*r", residual_sub, [(3, 50, 20), (20, 60), (3, 1, 60)]),
]


def epilogues(fn):
    return fn.graph_str().split("subgraph")[0].count("= matmul_epilogue(")


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name,f,shapes", CASES, ids=[c[0] for c in CASES])
def test_forward_equals_eager(name, f, shapes, dtype):
    rng = np.random.default_rng(len(name))
    args = [rnd(rng, *s, dtype=dtype) for s in shapes]
    eager = f(*args).asnumpy()
    j1, j0 = kiln.jit(f, jit_level="O1"), kiln.jit(f, jit_level="O0")
    j2 = kiln.jit(f, jit_level="O2")  # runs every pass of O1 (it once lacked this one, issue 17)
    for _ in range(2):
        np.testing.assert_allclose(j1(*args).asnumpy(), eager, **tol(dtype, 2))
        np.testing.assert_allclose(j2(*args).asnumpy(), eager, **tol(dtype, 2))
    j0(*args)
    assert epilogues(j1) == 1, j1.graph_str()
    assert epilogues(j2) == 1, j2.graph_str()
    assert epilogues(j0) == 0


@pytest.mark.parametrize("name,f,shapes", CASES, ids=[c[0] for c in CASES])
def test_gradients_equal_eager(name, f, shapes):
    rng = np.random.default_rng(10 + len(name))
    args = [rnd(rng, *s) for s in shapes]
    positions = tuple(range(len(args)))
    loss = lambda *a: ops.sum(f(*a) * f(*a))  # noqa: E731 (a nonlinear loss: every gradient matters)
    v0, g0 = kiln.value_and_grad(loss, positions)(*args)
    v1, g1 = kiln.value_and_grad(kiln.jit(loss, jit_level="O1"), positions)(*args)
    np.testing.assert_allclose(v1.asnumpy(), v0.asnumpy(), **tol(kiln.float32, 5))
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), **tol(kiln.float32, 5))


def test_backward_graph_folds_gradient_sums():
    """x feeds three projections: the backward sums their input gradients, matmul + matmul +
    matmul, and those sums become an epilogue of the first product."""
    class Proj(nn.Cell):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = (nn.Dense(32, 32, has_bias=False) for _ in range(3))

        def construct(self, x):
            return ops.sum(ops.tanh(self.a(x)) * self.b(x) + self.c(x))

    kiln.manual_seed(3)
    net = Proj()
    x = kiln.Tensor(np.random.default_rng(5).standard_normal((16, 32)).astype(np.float32))
    weights = net.trainable_params()
    v0, g0 = kiln.value_and_grad(net, 0, weights)(x)
    jf = kiln.jit(net, jit_level="O1")
    v1, g1 = kiln.value_and_grad(jf, 0, weights)(x)
    np.testing.assert_allclose(v1.asnumpy(), v0.asnumpy(), **tol(kiln.float32, 5))
    (gx1, gw1), (gx0, gw0) = g1, g0  # (gradient of x, gradients of the weights)
    assert len(gw1) == len(gw0) == 3
    for a, b in zip((gx1,) + tuple(gw1), (gx0,) + tuple(gw0)):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), **tol(kiln.float32, 5))
    text = jf._grad_variant(0, weights, False).graph_str()
    assert "= matmul_epilogue(" in text, text


def test_eager_op_matches_unfused_ops_exactly():
    """The op with an eager kernel: bias, relu and a residual on a batched product split over the
    threads, bitwise equal to the separate ops (each step runs the op's own kernel)."""
    rng = np.random.default_rng(7)
    a, b, bias, res = rnd(rng, 3, 70, 200), rnd(rng, 200, 90), rnd(rng, 90), rnd(rng, 3, 70, 90)
    # steps: add(p, bias) [code 0], relu(p) [code 6], mul(res, p) [code 2, product second]
    out = apply(OP.matmul_epilogue, [a, b, bias, res], [0, 2, 3, 0, 2, 0, 6, -1, 0, 2, 3, 1])
    ref = res * ops.relu(ops.matmul(a, b) + bias)
    np.testing.assert_array_equal(out.asnumpy(), ref.asnumpy())
    x, w, wb, r2 = rnd(rng, 2, 300, 128), rnd(rng, 256, 128), rnd(rng, 256), rnd(rng, 2, 1, 256)
    out = apply(OP.matmul_epilogue, [x, w, wb, r2], [1, 3, 2, 1, 3, 1, 7, -1, 0])  # gelu(r2 - linear)
    np.testing.assert_array_equal(out.asnumpy(), ops.gelu(r2 - ops.dense(x, w, wb)).asnumpy())


def test_eager_op_errors():
    a, b = kiln.Tensor(np.ones((3, 4), np.float32)), kiln.Tensor(np.ones((4, 5), np.float32))
    with pytest.raises(ValueError, match=r"matmul_epilogue step 0 \(add\).*\(3, 5\) and \(3, 6\)"):
        apply(OP.matmul_epilogue, [a, b, kiln.Tensor(np.ones((3, 6), np.float32))], [0, 2, 1, 0, 2, 0])
    with pytest.raises(ValueError, match="matmul_epilogue: malformed"):
        apply(OP.matmul_epilogue, [a, b], [0, 2, 1, 6])
    ai, bi = kiln.Tensor(np.ones((3, 4), np.int64)), kiln.Tensor(np.ones((4, 5), np.int64))
    with pytest.raises(TypeError, match="float32 or float64"):
        apply(OP.matmul_epilogue, [ai, bi], [0, 2, 0])
