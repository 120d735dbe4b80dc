"""The gradient of a compiled loop whose trip count is known (kiln.ops.scan, fori_loop with int
bounds) stores each step's residuals when they fit kiln.set_context(loop_residual_budget=MB), and
recomputes them from each step's carry otherwise. Both strategies, forced each way, against eager
autograd of the Python loop and central differences in float64: pytree carries, reverse scans,
nonlinear bodies, captured weights (40 of them needing gradients), every kiln.jit variant and
kiln.trace; explain() names the strategy each loop gradient took."""
import collections
import contextlib
import re
import types

import numpy as np
import pytest

import kiln
from kiln import ops

from conftest import to_numpy
from loop_variants import JIT_IDS, JIT_VARIANTS, assert_one_node, jitted

STORE, RECOMPUTE = 4096, 0  # budgets in megabytes: every residual fits, none does
STRATEGIES = {"stored": STORE, "recomputed": RECOMPUTE}
State = collections.namedtuple("State", "h c")
STEPS, BATCH, INPUT, HIDDEN = 5, 2, 3, 4


@contextlib.contextmanager
def residual_budget(mb):
    was = kiln.get_context("loop_residual_budget")
    kiln.set_context(loop_residual_budget=mb)
    try:
        yield
    finally:
        kiln.set_context(loop_residual_budget=was)


def cell(w, u, b, named=False):
    """An LSTM-like step over an (h, c) carry (a namedtuple when named), y a dict."""
    def f(state, x):
        h, c = state
        gates = ops.matmul(x, w) + ops.matmul(h, u) + b
        i, g, o = gates[:, :HIDDEN], gates[:, HIDDEN:2 * HIDDEN], gates[:, 2 * HIDDEN:]
        c = c * 0.9 + i.sigmoid() * g.tanh()
        h = o.sigmoid() * c.tanh()
        return State(h, c) if named else (h, c), {"h": h, "e": (h * c).exp().sum()}
    return f


def seq_loss(h0, c0, xs, w, u, b, reverse=False, named=False):
    state, ys = ops.scan(cell(w, u, b, named), State(h0, c0) if named else (h0, c0), xs, reverse=reverse)
    assert isinstance(state, State) == named
    return (state[0] * state[1]).sum() + (ys["h"] * ys["h"]).sum() + ys["e"].sum()


def seq_loop_loss(h0, c0, xs, w, u, b, reverse=False):
    state, total = (h0, c0), None
    order = range(STEPS - 1, -1, -1) if reverse else range(STEPS)
    for t in order:
        state, y = cell(w, u, b)(state, xs[t])
        term = (y["h"] * y["h"]).sum() + y["e"]
        total = term if total is None else total + term
    return (state[0] * state[1]).sum() + total


def reverse_seq_loss(h0, c0, xs, w, u, b):
    return seq_loss(h0, c0, xs, w, u, b, reverse=True)


def seq_data(seed):
    rng = np.random.default_rng(seed)
    shapes = [(BATCH, HIDDEN), (BATCH, HIDDEN), (STEPS, BATCH, INPUT), (INPUT, 3 * HIDDEN), (HIDDEN, 3 * HIDDEN),
              (3 * HIDDEN,)]
    return [kiln.tensor(rng.standard_normal(s) * 0.5) for s in shapes]


def fori_loss(h, w, v):
    def body(i, carry):
        a, b = carry["a"], carry["b"]
        a = (a * w).sin() + (b * v).exp() * 0.1 + i * 0.01
        b = (a + b).sigmoid() * b.cos()
        return {"a": a, "b": b}
    out = ops.fori_loop(1, 7, body, {"a": h, "b": h * 2})
    return (out["a"] * out["b"]).sum() + out["a"].sum()


def fori_loop_loss(h, w, v):
    carry = {"a": h, "b": h * 2}
    for i in range(1, 7):
        a, b = carry["a"], carry["b"]
        a = (a * w).sin() + (b * v).exp() * 0.1 + kiln.tensor(np.array(i, dtype=np.int64)) * 0.01
        carry = {"a": a, "b": (a + b).sigmoid() * b.cos()}
    return (carry["a"] * carry["b"]).sum() + carry["a"].sum()


def fori_data(seed):
    rng = np.random.default_rng(seed)
    return [kiln.tensor(rng.standard_normal(3)), kiln.tensor(rng.uniform(0.5, 1.5, 3)),
            kiln.tensor(rng.uniform(-0.5, 0.5, 3))]


def assert_grads(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(to_numpy(g), to_numpy(w), rtol=1e-10, atol=1e-12)


def fresh(fn):
    """fn over a copy of its code object: capture_mode="bytecode" keeps compiled graphs with the code
    object (shared by every kiln.jit of it), and each test here compiles its own under its budget."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def loop_gradients(fn):
    """The strategies explain() reports for fn's loop gradients (fn compiled, not run eagerly; a
    loop met in several compiled graphs, e.g. bytecode pieces compiled per call signature, once)."""
    report = fn.explain()
    assert report.fallback is None, str(report)
    return sorted({g["strategy"] for g in report.loop_gradients})


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("variant", JIT_VARIANTS, ids=JIT_IDS)
def test_scan_gradient_each_strategy_equals_the_python_loops(variant, strategy):
    args = seq_data(1)
    for reverse in (False, True):
        want = kiln.grad(lambda *a: seq_loop_loss(*a, reverse=reverse), (0, 1, 2, 3, 4, 5))(*args)
        with residual_budget(STRATEGIES[strategy]):
            fn = jitted(fresh(seq_loss if not reverse else reverse_seq_loss), variant)
            grad = kiln.grad(fn, (0, 1, 2, 3, 4, 5))
            assert_grads(grad(*args), want)
            assert_grads(grad(*args), want)  # (a second run: bytecode compiles the one-graph gradient now)
        assert loop_gradients(fn) == [strategy]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("variant", JIT_VARIANTS, ids=JIT_IDS)
def test_fori_loop_gradient_each_strategy_equals_the_python_loops(variant, strategy):
    args = fori_data(2)
    want = kiln.grad(fori_loop_loss, (0, 1, 2))(*args)
    with residual_budget(STRATEGIES[strategy]):
        fn = jitted(fresh(fori_loss), variant)
        got = kiln.grad(fn, (0, 1, 2))(*args)
    assert_grads(got, want)
    assert loop_gradients(fn) == [strategy]


def central_differences(fn, args, eps=1e-6):
    """d fn / d args by central differences in float64 (fn returns a 0-d tensor)."""
    arrays = [to_numpy(a).astype(np.float64) for a in args]
    grads = []
    for k, a in enumerate(arrays):
        g = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            vals = []
            for sign in (1, -1):
                b = a.copy()
                b[i] += sign * eps
                call = [kiln.tensor(b) if j == k else kiln.tensor(arrays[j]) for j in range(len(arrays))]
                vals.append(float(to_numpy(fn(*call))))
            g[i] = (vals[0] - vals[1]) / (2 * eps)
        grads.append(g)
    return grads


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_central_differences_in_float64(strategy):
    cases = [(seq_loss, seq_data(0), "trace"), (reverse_seq_loss, seq_data(1), "ast"), (fori_loss, fori_data(3), "bytecode")]
    for loss, args, mode in cases:
        with residual_budget(STRATEGIES[strategy]):
            fn = kiln.jit(fresh(loss), capture_mode=mode)
            got = kiln.grad(fn, tuple(range(len(args))))(*args)
        assert fn.explain().fallback is None
        assert loop_gradients(fn) == [strategy]
        for g, w in zip(got, central_differences(fn, args)):
            np.testing.assert_allclose(to_numpy(g), w, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("mode", ["ast", "trace"])
def test_a_namedtuple_carry(mode, strategy):
    args = seq_data(7)
    want = kiln.grad(seq_loop_loss, (0, 1, 3))(*args)
    with residual_budget(STRATEGIES[strategy]):
        fn = kiln.jit(lambda h0, c0, xs, w, u, b: seq_loss(h0, c0, xs, w, u, b, named=True), capture_mode=mode)
        assert_grads(kiln.grad(fn, (0, 1, 3))(*args), want)
    assert loop_gradients(fn) == [strategy]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_kiln_trace_of_the_gradient(strategy):
    args = seq_data(4)
    want = kiln.grad(lambda *a: seq_loop_loss(*a, reverse=True), (0, 3, 4, 5))(*args)
    with residual_budget(STRATEGIES[strategy]):
        gtr = kiln.trace(lambda *a: kiln.grad(lambda *b: seq_loss(*b, reverse=True), (0, 3, 4, 5))(*a))
        for _ in range(3):
            assert_grads(gtr(*args), want)
    text = gtr.graph_str()
    assert_one_node(text, "while", "while_grad")
    main = text.split("\nsubgraph")[0]
    attrs = re.search(r"= while_grad\(.*\) \{([-0-9, ]*)\}", main).group(1).split(", ")
    assert (int(attrs[5]) > 0) == (strategy == "stored"), main  # (NRES: stored residuals per step)


def test_the_budget_decides_by_trip_count_times_residual_bytes():
    args = seq_data(5)
    with residual_budget(STORE):
        fn = kiln.jit(seq_loss, capture_mode="trace")
        kiln.grad(fn, (3,))(*args)
    (info,) = fn.explain().loop_gradients
    assert info["strategy"] == "stored" and info["trips"] == STEPS and info["bytes_per_step"] > 0
    total_mb = info["bytes_per_step"] * STEPS / (1 << 20)
    with residual_budget(total_mb * 0.99):  # just short of it
        fn2 = kiln.jit(seq_loss, capture_mode="trace")
        assert_grads(kiln.grad(fn2, (3,))(*args), kiln.grad(seq_loop_loss, (3,))(*args))
    assert loop_gradients(fn2) == ["recomputed"]
    with residual_budget(total_mb * 1.01):
        fn3 = kiln.jit(seq_loss, capture_mode="trace")
        assert_grads(kiln.grad(fn3, (3,))(*args), kiln.grad(seq_loop_loss, (3,))(*args))
    assert loop_gradients(fn3) == ["stored"]
    text = str(fn3.explain())
    assert "loop gradient 1: residuals stored" in text, text


def test_an_unknown_trip_count_recomputes():
    h, w, v = fori_data(6)

    def loss(h, w, n):  # tensor bounds: the count is read at run time
        return ops.fori_loop(0, n, lambda i, a: (a * w).sin() + 0.5, h).sum()

    n = kiln.tensor(np.array(4, dtype=np.int64))
    with residual_budget(STORE):
        fn = kiln.jit(loss, capture_mode="trace")
        got = kiln.grad(fn, (0, 1))(h, w, n)
    assert_grads(got, kiln.grad(loss, (0, 1))(h, w, n))
    assert loop_gradients(fn) == ["recomputed"]
    assert "trip count unknown" in str(fn.explain())


def test_the_budget_setting_is_checked():
    for bad in (-1, "1GB", True, None):
        with pytest.raises(ValueError, match="loop_residual_budget"):
            kiln.set_context(loop_residual_budget=bad)
    with residual_budget(12.5):
        assert kiln.get_context("loop_residual_budget") == 12.5


def tanh_chain(h, w):
    """tanh's backward reads its output, which is also the next carry: one value both stored as a
    residual and carried."""
    h = ops.fori_loop(0, 4, lambda i, h: (h * w).tanh(), h)
    return (h * h).sum()


def tanh_chain_loop(h, w):
    for _ in range(4):
        h = (h * w).tanh()
    return (h * h).sum()


@pytest.mark.parametrize("variant", JIT_VARIANTS, ids=JIT_IDS)
def test_a_residual_that_is_also_the_next_carry(variant):
    h, w = kiln.tensor(np.array([0.3, -0.2, 0.9])), kiln.tensor(np.array([1.1, 0.9, -1.3]))
    want = kiln.grad(tanh_chain_loop, (0, 1))(h, w)
    with residual_budget(STORE):
        grad = kiln.grad(jitted(fresh(tanh_chain), variant), (0, 1))
        for _ in range(2):
            assert_grads(grad(h, w), want)


def nested(h, xs, w):
    """A fori_loop in a scan's body: the inner loop's gradient is built inside the outer one's."""
    def step(c, x):
        inner = ops.fori_loop(0, 3, lambda i, a: (a * w + x).sin(), c)
        return inner * 0.5 + c.tanh(), inner.sum()
    c, ys = ops.scan(step, h, xs)
    return (c * c).sum() + (ys * ys).sum()


def nested_loop(h, xs, w):
    c, total = h, None
    for t in range(xs.shape[0]):
        a = c
        for _ in range(3):
            a = (a * w + xs[t]).sin()
        c, y = a * 0.5 + c.tanh(), a.sum()
        total = y * y if total is None else total + y * y
    return (c * c).sum() + total


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_a_loop_in_a_loop_body(mode, strategy):
    rng = np.random.default_rng(8)
    h, xs, w = (kiln.tensor(rng.standard_normal(2)), kiln.tensor(rng.standard_normal((3, 2)) * 0.3),
                kiln.tensor(rng.uniform(0.5, 1.5, 2)))
    want = kiln.grad(nested_loop, (0, 1, 2))(h, xs, w)
    with residual_budget(STRATEGIES[strategy]):
        fn = kiln.jit(fresh(nested), capture_mode=mode)
        grad = kiln.grad(fn, (0, 1, 2))
        for _ in range(2):
            assert_grads(grad(h, xs, w), want)
    assert loop_gradients(fn) == [strategy]
