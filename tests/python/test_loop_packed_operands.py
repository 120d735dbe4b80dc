"""A loop's gradient reads a weight the loop multiplies by transposed (dh = dgates @ U^T for
h @ U, dx = dgates @ W^T for x_t @ W): while_grad hands its backward body such a weight laid out
transposed, copied once per loop (src/runtime/control_flow.c, pack_transposed), so each step's
GEMM reads a contiguous matrix instead of packing a strided one. kiln._C.loop_packed_operands()
counts the weights packed. Gradients equal eager autograd's and central differences in every
capture mode x O0/O1 x kbk/sink and under kiln.trace, forward and reverse, stored and recomputed
residuals; a weight the backward also reads untransposed, a one-step loop and a weight given as a
strided view are not packed, and the caller's weight is never written."""
import numpy as np
import pytest

import kiln
from kiln import _C, ops

from conftest import check_grad, to_numpy
from loop_variants import JIT_IDS, JIT_VARIANTS, jitted

STEPS, BATCH, INPUT, HIDDEN = 7, 3, 5, 6


def rnn(h0, xs, w, u, b, reverse=False, both_ways=False):
    """tanh RNN; both_ways also adds (u * u).sum(0), so the backward reads u itself too (u's
    gradient, 2 u g, beside dh's dgates @ u^T)."""
    def f(h, x):
        pre = ops.matmul(x, w) + ops.matmul(h, u) + b
        if both_ways:
            pre = pre + (u * u).sum(0)
        h = pre.tanh()
        return h, h.sum(1)
    return ops.scan(f, h0, xs, reverse=reverse)


def python_loop(h0, xs, w, u, b, reverse=False, both_ways=False):
    h, ys = h0, [None] * xs.shape[0]
    order = range(xs.shape[0] - 1, -1, -1) if reverse else range(xs.shape[0])
    for t in order:
        pre = ops.matmul(xs[t], w) + ops.matmul(h, u) + b
        if both_ways:
            pre = pre + (u * u).sum(0)
        h = pre.tanh()
        ys[t] = h.sum(1)
    return h, ops.stack(ys, 0)


def loss(fn, reverse=False, both_ways=False):
    def scalar(h0, xs, w, u, b):
        h, ys = fn(h0, xs, w, u, b, reverse, both_ways)
        return (h * h).sum() + (ys * ys.cos()).sum()
    return scalar


def data(seed=0, steps=STEPS, dtype=np.float64):
    rng = np.random.default_rng(seed)

    def t(*shape, scale=0.5):
        return kiln.tensor((rng.standard_normal(shape) * scale).astype(dtype))
    return t(BATCH, HIDDEN), t(steps, BATCH, INPUT, scale=1.0), t(INPUT, HIDDEN), t(HIDDEN, HIDDEN), t(HIDDEN)


def assert_close(got, want, rtol=1e-10, atol=1e-12):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(to_numpy(g), to_numpy(w), rtol=rtol, atol=atol)


def packed_by(fn, *args):
    """fn(*args) and how many weights loop gradients packed while it ran."""
    before = _C.loop_packed_operands()
    out = fn(*args)
    return out, _C.loop_packed_operands() - before


@pytest.mark.parametrize("variant", JIT_VARIANTS, ids=JIT_IDS)
@pytest.mark.parametrize("reverse", [False, True])
def test_gradients_equal_eager_autograd_and_both_weights_are_packed(variant, reverse):
    args = data(1)
    want = kiln.grad(loss(python_loop, reverse), (0, 1, 2, 3, 4))(*args)
    got = kiln.grad(jitted(loss(rnn, reverse), variant), (0, 1, 2, 3, 4))
    for _ in range(2):  # (the first call compiles)
        out, packed = packed_by(got, *args)
        assert_close(out, want)
        assert packed == 2  # u for dh, w for dxs


def test_a_weight_read_only_forward_of_xs_is_packed_only_where_xs_needs_a_gradient():
    """No gradient for xs: nothing reads w transposed in the backward (w's own gradient is one
    stacked product after the loop), so u alone is packed."""
    args = data(2)
    fn = kiln.jit(loss(rnn), capture_mode="trace", jit_level="O1")
    want = kiln.grad(loss(python_loop), (0, 2, 3, 4))(*args)
    out, packed = packed_by(kiln.grad(fn, (0, 2, 3, 4)), *args)
    assert_close(out, want)
    assert packed == 1


@pytest.mark.parametrize("level", ["O0", "O1"])
@pytest.mark.parametrize("reverse", [False, True])
def test_gradients_match_central_differences(level, reverse):
    np_args = [to_numpy(a) for a in data(3, steps=3)]
    fn = kiln.jit(lambda h0, xs, w, u, b: rnn(h0, xs, w, u, b, reverse=reverse), capture_mode="trace", jit_level=level)
    check_grad(fn, *np_args, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("budget, packs", [(1024, 2), (0, 0)])
def test_stored_and_recomputed_residuals(budget, packs):
    """Stored residuals; and recomputed ones, whose backward body recomputes the step, reading both
    weights untransposed (h @ u, x_t @ w): nothing packed."""
    args = data(4)
    was = kiln.get_context("loop_residual_budget")
    kiln.set_context(loop_residual_budget=budget)
    try:
        fn = kiln.jit(loss(rnn), capture_mode="trace", jit_level="O1")
        want = kiln.grad(loss(python_loop), (0, 1, 2, 3, 4))(*args)
        out, packed = packed_by(kiln.grad(fn, (0, 1, 2, 3, 4)), *args)
        assert_close(out, want)
        assert packed == packs
    finally:
        kiln.set_context(loop_residual_budget=was)


def test_a_weight_also_read_untransposed_is_not_packed():
    args = data(5)
    fn = kiln.jit(loss(rnn, both_ways=True), capture_mode="trace", jit_level="O1")
    want = kiln.grad(loss(python_loop, both_ways=True), (0, 1, 2, 3, 4))(*args)
    out, packed = packed_by(kiln.grad(fn, (0, 1, 2, 3, 4)), *args)
    assert_close(out, want)
    assert packed == 1  # w (for dxs); u is read transposed (dh) and as it is (u's gradient)


def test_one_step_packs_nothing():
    h0, xs, w, u, b = data(6)
    one = xs[:1]
    fn = kiln.jit(loss(rnn), capture_mode="trace", jit_level="O1")
    want = kiln.grad(loss(python_loop), (0, 1, 2, 3, 4))(h0, one, w, u, b)
    out, packed = packed_by(kiln.grad(fn, (0, 1, 2, 3, 4)), h0, one, w, u, b)
    assert_close(out, want)
    assert packed == 0


def test_a_strided_weight_is_not_packed_and_no_weight_is_written():
    """u given as a transposed view (strides (1, n)) is left as it is; the contiguous w is packed,
    into a copy: the caller's tensors keep their values."""
    h0, xs, w, u, b = data(7)
    u_view = kiln.tensor(np.ascontiguousarray(to_numpy(u).T)).permute(1, 0)
    assert not u_view.is_contiguous()
    kept = [to_numpy(t) for t in (w, u_view)]
    fn = kiln.jit(loss(rnn), capture_mode="trace", jit_level="O0")
    want = kiln.grad(loss(python_loop), (0, 1, 2, 3, 4))(h0, xs, w, u, b)
    for _ in range(2):
        out, packed = packed_by(kiln.grad(fn, (0, 1, 2, 3, 4)), h0, xs, w, u_view, b)
        assert_close(out, want)
        assert packed == 1
    for before, t in zip(kept, (w, u_view)):
        assert np.array_equal(before, to_numpy(t))


def test_float32_lstm_cell_against_eager():
    """The benchmark's cell (bench/bench_scan.py) at a small size, float32: the packed GEMMs may
    round differently from eager's transposed ones, within float32 rounding."""
    rng = np.random.default_rng(8)
    hidden = 8

    def t(*shape):
        return kiln.tensor((rng.standard_normal(shape) * 0.3).astype(np.float32))

    def cell(carry, x, w, u, b):
        h, c = carry
        gates = ops.matmul(x, w) + ops.matmul(h, u) + b
        i, f, g, o = (gates[:, k * hidden:(k + 1) * hidden] for k in range(4))
        c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        h = o.sigmoid() * c.tanh()
        return (h, c), h

    def scanned(xs, h0, c0, w, u, b):
        (h, c), ys = ops.scan(lambda carry, x: cell(carry, x, w, u, b), (h0, c0), xs)
        return ys.sum() + c.sum()

    def loop(xs, h0, c0, w, u, b):
        carry, total = (h0, c0), None
        for k in range(xs.shape[0]):
            carry, y = cell(carry, xs[k], w, u, b)
            total = y.sum() if total is None else total + y.sum()
        return total + carry[1].sum()

    args = (t(20, 4, 5), t(4, hidden), t(4, hidden), t(5, 4 * hidden), t(hidden, 4 * hidden), t(4 * hidden))
    fn = kiln.jit(scanned, capture_mode="trace", jit_level="O1")
    want = kiln.grad(loop, (1, 2, 3, 4, 5))(*args)
    out, packed = packed_by(kiln.grad(fn, (1, 2, 3, 4, 5)), *args)
    assert packed == 1  # u (xs needs no gradient)
    assert_close(out, want, rtol=1e-5, atol=1e-6)


def test_kiln_trace_of_the_gradient():
    """kiln.trace records the gradient (the loop nodes run as they are recorded, their bodies
    compiled for the call; a call may record again to verify) and replays it: packed on every
    call, each run of the loop's gradient packing both weights."""
    args = data(9)
    want = kiln.grad(loss(python_loop, True), (0, 1, 2, 3, 4))(*args)
    tr = kiln.trace(lambda h0, xs, w, u, b: kiln.grad(loss(rnn, True), (0, 1, 2, 3, 4))(h0, xs, w, u, b))
    for _ in range(3):
        out, packed = packed_by(tr, *args)
        assert_close(out, want)
        assert packed >= 2 and packed % 2 == 0
