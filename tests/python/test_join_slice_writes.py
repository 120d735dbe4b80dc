"""Gradients of several slices of one tensor (split, chunk, unbind, basic indexing, q/k/v cut from
one projection) are summed canvases of zeros; the join_slice_writes pass of O1 turns disjoint ones
into one concat or one set of writes. Every compiled variant must give eager's values and gradients,
and the O1 graph must hold the concat instead of full + slice_assign + add chains."""
import numpy as np
import pytest

import kiln
from kiln import ops

from compiled_equal import assert_compiled_equal


def t(*shape, seed=0):
    return kiln.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def split_three(x):
    a, b, c = ops.split(x, 4, axis=-1)
    return (a * b + ops.tanh(c)).sum()


def chunk_rows(x):
    p, q = ops.chunk(x, 2, axis=0)
    return (p * 2.0 - q * q).sum()


def unbind_middle(x):
    parts = ops.unbind(x, 1)
    return sum((k + 1.0) * p.exp() for k, p in enumerate(parts)).mean()


def uneven_indexing(x):  # pieces of different lengths, one slice not read (zeros stay)
    return (x[:, :2] * x[:, 5:7]).sum() + x[:, 3:5].sin().sum()


def overlapping(x):  # boxes that overlap: summed, not joined
    return (x[:, 0:3] * x[:, 2:5]).sum()


def qkv(x, w):
    q, k, v = ops.split(ops.matmul(x, w), 6, axis=-1)
    s = ops.softmax(ops.matmul(q, k.swapaxes(-1, -2)) * 0.4, axis=-1)
    return ops.matmul(s, v).sum()


CASES = [
    (split_three, (t(5, 12),)),
    (chunk_rows, (t(6, 3, seed=1),)),
    (unbind_middle, (t(2, 4, 3, seed=2),)),
    (uneven_indexing, (t(3, 8, seed=3),)),
    (overlapping, (t(2, 6, seed=4),)),
    (qkv, (t(4, 8, seed=5), t(8, 18, seed=6))),
]


@pytest.mark.parametrize("fn,args", CASES, ids=[c[0].__name__ for c in CASES])
def test_compiled_gradients_equal_eager(fn, args):
    assert_compiled_equal(fn, args, grad=True)


@pytest.mark.parametrize("fn,args", CASES, ids=[c[0].__name__ for c in CASES])
def test_gradients_match_finite_differences(fn, args):
    x64 = [kiln.Tensor(a.asnumpy().astype(np.float64), kiln.float64) for a in args]
    g = kiln.jit(kiln.grad(fn), capture_mode="trace", jit_level="O1")(*x64).asnumpy()
    base = x64[0].asnumpy()
    want = np.zeros_like(base)
    for i in np.ndindex(base.shape):
        hi, lo = base.copy(), base.copy()
        hi[i] += 1e-6
        lo[i] -= 1e-6
        f = lambda v: fn(kiln.Tensor(v, kiln.float64), *x64[1:]).asnumpy()  # noqa: E731
        want[i] = (f(hi) - f(lo)) / 2e-6
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn,args,joined", [
    (split_three, (t(5, 12),), "concat"),
    (chunk_rows, (t(6, 3, seed=1),), "concat"),
    (uneven_indexing, (t(3, 8, seed=3),), "slice_assign"),
])
def test_o1_graph_joins_the_pieces(fn, args, joined):
    for mode in ("trace", "ast", "bytecode"):
        f = kiln.jit(kiln.grad(fn), capture_mode=mode, jit_level="O1")
        f(*args)
        text = f.graph_str(*args)
        assert joined in text, text
        assert text.count("full()") <= 1, text  # one canvas of zeros at most
        shape = "float32[%s]" % ", ".join(map(str, args[0].shape))
        body = text.split("subgraph")[0].splitlines()
        assert not [line for line in body if " = add(" in line and shape in line], text  # no canvases summed

def test_overlapping_boxes_stay_summed():
    x = t(2, 6, seed=4)
    f = kiln.jit(kiln.grad(overlapping), capture_mode="trace", jit_level="O1")
    f(x)
    assert "concat" not in f.graph_str(x)
