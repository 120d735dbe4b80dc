"""A scan whose body multiplies the step's row of xs by a weight (an RNN's x_t @ W): at O1 the
hoist_loop_projections pass computes every step's product as one GEMM before the loop. Compiled
results equal the Python loop (values, gradients against eager autograd and float64 central
differences) in every capture mode x O0/O1 x kbk/sink and under kiln.trace, forward and reverse,
with and without the hoistable pattern, with the weight also read outside the loop, xs a
non-contiguous view, one step; and the hoisted loop is bitwise the loop it replaces."""
import numpy as np
import pytest

import kiln
from kiln import ops

from conftest import check_grad, to_numpy
from loop_variants import JIT_IDS, JIT_VARIANTS, jitted, top_level_ops

STEPS, BATCH, INPUT, HIDDEN = 6, 3, 5, 6  # (a step's x_t @ w: 90 multiply-adds, past matmul's plain loop)


def rnn(h0, xs, w, u, b, reverse=False, hoistable=True):
    """tanh RNN; hoistable=False multiplies sin(x_t) by w, not the row itself: nothing to hoist."""
    def f(h, x):
        xw = ops.matmul(x if hoistable else x.sin(), w)
        h = (xw + ops.matmul(h, u) + b).tanh()
        return h, h.sum(1)
    return ops.scan(f, h0, xs, reverse=reverse)


def python_loop(h0, xs, w, u, b, reverse=False, hoistable=True):
    h, ys = h0, [None] * xs.shape[0]
    order = range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])
    for t in order:
        xw = ops.matmul(xs[t] if hoistable else xs[t].sin(), w)
        h = (xw + ops.matmul(h, u) + b).tanh()
        ys[t] = h.sum(1)
    return h, ops.stack(ys, 0)


def loss(fn, reverse, hoistable):
    def scalar(h0, xs, w, u, b):
        h, ys = fn(h0, xs, w, u, b, reverse, hoistable)
        return (h * h).sum() + (ys * ys.cos()).sum() + (w * w).sum()  # w read outside the loop too
    return scalar


def data(seed=0, steps=STEPS, dtype=np.float64):
    rng = np.random.default_rng(seed)

    def t(*shape, scale=0.5):
        return kiln.tensor((rng.standard_normal(shape) * scale).astype(dtype))
    return t(BATCH, HIDDEN), t(steps, BATCH, INPUT, scale=1.0), t(INPUT, HIDDEN), t(HIDDEN, HIDDEN), t(HIDDEN)


def assert_close(got, want, rtol=1e-12, atol=1e-12):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(to_numpy(g), to_numpy(w), rtol=rtol, atol=atol)


def main_graph(text):
    return text.split("\nsubgraph")[0]


def test_o1_computes_the_projection_before_the_loop():
    args = data()
    o1 = kiln.jit(lambda h0, xs, w, u, b: rnn(h0, xs, w, u, b), capture_mode="trace", jit_level="O1").graph_str(*args)
    assert top_level_ops(o1).count("matmul") == 1, o1
    assert "float64[6, 3, 6] = matmul(" in main_graph(o1), o1  # (steps, batch, hidden): every step's x_t @ w
    o0 = kiln.jit(lambda h0, xs, w, u, b: rnn(h0, xs, w, u, b), capture_mode="trace", jit_level="O0").graph_str(*args)
    assert "matmul" not in top_level_ops(o0), o0
    no = kiln.jit(lambda h0, xs, w, u, b: rnn(h0, xs, w, u, b, hoistable=False), capture_mode="trace",
                  jit_level="O1").graph_str(*args)
    assert "matmul" not in top_level_ops(no), no


@pytest.mark.parametrize("variant", JIT_VARIANTS, ids=JIT_IDS)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("hoistable", [True, False])
def test_values_equal_the_python_loop(variant, reverse, hoistable):
    args = data(1)
    fn = jitted(lambda h0, xs, w, u, b: rnn(h0, xs, w, u, b, reverse=reverse, hoistable=hoistable), variant)
    want = python_loop(*args, reverse=reverse, hoistable=hoistable)
    assert_close(fn(*args), want)
    assert_close(fn(*args), want)  # (the compiled graph's run)
    if variant[1] == "O1":  # the product of every step before the loop, where the pattern is there
        assert ("matmul" in top_level_ops(fn.graph_str(*args))) == hoistable


@pytest.mark.parametrize("variant", JIT_VARIANTS, ids=JIT_IDS)
@pytest.mark.parametrize("reverse", [False, True])
def test_gradients_equal_eager_autograd(variant, reverse):
    args = data(2)
    fn = jitted(loss(rnn, reverse, True), variant)
    want = kiln.grad(loss(python_loop, reverse, True), (0, 1, 2, 3, 4))(*args)
    got = kiln.grad(fn, (0, 1, 2, 3, 4))
    assert_close(got(*args), want, rtol=1e-10, atol=1e-12)
    assert_close(got(*args), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("level", ["O0", "O1"])
@pytest.mark.parametrize("reverse", [False, True])
def test_gradients_match_central_differences(level, reverse):
    np_args = [to_numpy(a) for a in data(3, steps=3)]
    fn = kiln.jit(lambda h0, xs, w, u, b: rnn(h0, xs, w, u, b, reverse=reverse), capture_mode="trace", jit_level=level)
    check_grad(fn, *np_args, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("reverse", [False, True])
def test_hoisted_loop_is_the_loop_it_replaces(reverse):
    """float32, a linear cell (no transcendental that O1 may compute another way): O1 with the
    projection hoisted gives O0's values and gradients to float32 rounding. Not bit for bit: one
    stacked product and the per-step ones are the same sums, but a BLAS may order a row's sum by
    where the row falls in its blocking (OpenBLAS's Haswell and Prescott kernels do, oneDNN's and
    OpenBLAS's SkylakeX ones did not where this was checked)."""
    def same(a, b):
        np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=2e-6, atol=1e-7)

    def linear(h0, xs, w, u, b):
        def f(h, x):
            h = ops.matmul(x, w) + ops.matmul(h, u)
            return h, h
        return ops.scan(f, h0, xs, reverse=reverse)

    rng = np.random.default_rng(5)  # 40 steps, batch 33, input 17, hidden 70 (odd sizes)
    args = [kiln.tensor((rng.standard_normal(s) * 0.1).astype(np.float32))
            for s in [(33, 70), (40, 33, 17), (17, 70), (70, 70), (70,)]]
    o0 = kiln.jit(linear, capture_mode="trace", jit_level="O0")
    o1 = kiln.jit(linear, capture_mode="trace", jit_level="O1")
    assert "matmul" in top_level_ops(o1.graph_str(*args))
    for a, b in zip(o1(*args), o0(*args)):
        same(a, b)

    def scalar(jf):
        return lambda *a: (lambda h, ys: h.sum() + (ys * ys).sum())(*jf(*a))
    for a, b in zip(kiln.grad(kiln.jit(scalar(linear), capture_mode="trace", jit_level="O1"), (0, 2, 3))(*args),
                    kiln.grad(kiln.jit(scalar(linear), capture_mode="trace", jit_level="O0"), (0, 2, 3))(*args)):
        same(a, b)


def test_tiny_step_products_stay_in_the_loop_bitwise():
    """A step's product of at most 64 multiply-adds runs matmul's plain loop, the stacked one BLAS:
    not hoisted (the sums would differ in the last bit), and O1 still equals O0 exactly."""
    def linear(h0, xs, w, u):
        return ops.scan(lambda h, x: ((ops.matmul(x, w) + ops.matmul(h, u)),) * 2, h0, xs)

    rng = np.random.default_rng(9)
    args = [kiln.tensor(rng.standard_normal(s)) for s in [(2, 3), (7, 2, 4), (4, 3), (3, 3)]]
    o1 = kiln.jit(linear, capture_mode="trace", jit_level="O1")
    assert "matmul" not in top_level_ops(o1.graph_str(*args))
    for a, b in zip(o1(*args), kiln.jit(linear, capture_mode="trace", jit_level="O0")(*args)):
        assert np.array_equal(to_numpy(a), to_numpy(b))


def test_non_contiguous_xs_and_one_step():
    h0, xs, w, u, b = data(4, steps=2 * STEPS)
    strided = xs.permute(0, 1, 2)[::2]  # every other step: a view with a step of 2 rows
    transposed = kiln.tensor(np.ascontiguousarray(to_numpy(xs)[:STEPS].transpose(1, 0, 2))).permute(1, 0, 2)
    one = xs[:1]
    for x in (strided, transposed, one):
        for level in ("O0", "O1"):
            fn = kiln.jit(lambda h0, xs, w, u, b: rnn(h0, xs, w, u, b), capture_mode="trace", jit_level=level)
            assert_close(fn(h0, x, w, u, b), python_loop(h0, x, w, u, b))
            g = kiln.grad(kiln.jit(loss(rnn, False, True), capture_mode="trace", jit_level=level), (0, 1, 2, 3, 4))
            want = kiln.grad(loss(python_loop, False, True), (0, 1, 2, 3, 4))(h0, x, w, u, b)
            assert_close(g(h0, x, w, u, b), want, rtol=1e-10, atol=1e-12)


def test_zero_steps_is_refused_eagerly_and_compiled():
    h0, xs, w, u, b = data(5)
    empty = xs[:0]
    with pytest.raises(ValueError, match="length 0"):
        rnn(h0, empty, w, u, b)
    with pytest.raises(ValueError, match="length 0"):
        kiln.jit(lambda h0, xs, w, u, b: rnn(h0, xs, w, u, b), capture_mode="trace", jit_level="O1")(h0, empty, w, u, b)


def test_two_projections_and_a_weight_shared_with_the_carry_update():
    """Two scanned arrays, each times its own weight, one weight also used on the carry: both
    products hoisted, the carry's product stays in the loop."""
    def two(h0, xs, zs, w, v):
        def f(h, xz):
            x, z = xz
            h = (ops.matmul(x, w) + ops.matmul(z, v) + ops.matmul(h, v[:HIDDEN])).sin()
            return h, h
        return ops.scan(f, h0, (xs, zs))

    def two_loop(h0, xs, zs, w, v):
        h, ys = h0, []
        for t in range(xs.shape[0]):
            h = (ops.matmul(xs[t], w) + ops.matmul(zs[t], v) + ops.matmul(h, v[:HIDDEN])).sin()
            ys.append(h)
        return h, ops.stack(ys, 0)

    rng = np.random.default_rng(6)
    args = [kiln.tensor(rng.standard_normal(s) * 0.5) for s in
            [(BATCH, HIDDEN), (STEPS, BATCH, INPUT), (STEPS, BATCH, HIDDEN + 2), (INPUT, HIDDEN), (HIDDEN + 2, HIDDEN)]]
    fn = kiln.jit(two, capture_mode="trace", jit_level="O1")
    assert top_level_ops(fn.graph_str(*args)).count("matmul") == 2
    assert_close(fn(*args), two_loop(*args))
    scalar = lambda f: lambda *a: (lambda h, ys: (h * h).sum() + ys.sin().sum())(*f(*a))  # noqa: E731
    got = kiln.grad(kiln.jit(scalar(two), capture_mode="trace", jit_level="O1"), (0, 1, 2, 3, 4))(*args)
    want = kiln.grad(scalar(two_loop), (0, 1, 2, 3, 4))(*args)
    assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_kiln_trace_of_the_hoisted_scan_and_its_gradient():
    args = data(7)
    tr = kiln.trace(lambda h0, xs, w, u, b: rnn(h0, xs, w, u, b, reverse=True))
    want = python_loop(*args, reverse=True)
    for _ in range(3):
        assert_close(tr(*args), want)
    gtr = kiln.trace(lambda h0, xs, w, u, b: kiln.grad(loss(rnn, False, True), (0, 1, 2, 3, 4))(h0, xs, w, u, b))
    want = kiln.grad(loss(python_loop, False, True), (0, 1, 2, 3, 4))(*args)
    for _ in range(3):
        assert_close(gtr(*args), want, rtol=1e-10, atol=1e-12)


def test_projection_over_the_residual_budget_stays_in_the_loop():
    args = data(8)
    was = kiln.get_context("loop_residual_budget")
    kiln.set_context(loop_residual_budget=0)
    try:
        fn = kiln.jit(lambda h0, xs, w, u, b: rnn(h0, xs, w, u, b), capture_mode="trace", jit_level="O1")
        assert "matmul" not in top_level_ops(fn.graph_str(*args))
        assert_close(fn(*args), python_loop(*args))
    finally:
        kiln.set_context(loop_residual_budget=was)
