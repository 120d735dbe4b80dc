"""A compiled loop recorded for a gradient runs forward once: its `while` node stores each step's
residuals as it runs (extra outputs only its `while_grad` reads), and the gradient reads them
without running the loop again. Checked by the runtime's count of loop-body runs, against eager
autograd of the Python loop and central differences in float64, in every kiln.jit variant and
kiln.trace; and a loop whose gradient nobody takes (no_grad, inputs needing none) stays the plain
loop, with no residual outputs. A weight read as x_t @ w gets its gradient from one matmul over
every step's rows after the loop (ops.def STACK), within the residual budget."""
import re
import types

import numpy as np
import pytest

import kiln
from kiln import _C, ops

from conftest import to_numpy
from loop_variants import JIT_IDS, JIT_VARIANTS, jitted

STEPS, BATCH, INPUT, HIDDEN = 6, 2, 3, 4


def lstm_step(w, u, b):
    def f(carry, x):
        h, c = carry
        gates = ops.matmul(x, w) + ops.matmul(h, u) + b
        i, g, o = gates[:, :HIDDEN], gates[:, HIDDEN:2 * HIDDEN], gates[:, 2 * HIDDEN:]
        c = c * 0.8 + i.sigmoid() * g.tanh()
        h = o.sigmoid() * c.tanh()
        return (h, c), h * h
    return f


def scan_loss(h0, c0, xs, w, u, b):
    (h, c), ys = ops.scan(lstm_step(w, u, b), (h0, c0), xs)
    return ys.sum() + (h * c).sum()


def python_loss(h0, c0, xs, w, u, b):
    carry, total = (h0, c0), None
    for t in range(xs.shape[0]):
        carry, y = lstm_step(w, u, b)(carry, xs[t])
        total = y.sum() if total is None else total + y.sum()
    return total + (carry[0] * carry[1]).sum()


def data(seed):
    rng = np.random.default_rng(seed)
    shapes = [(BATCH, HIDDEN), (BATCH, HIDDEN), (STEPS, BATCH, INPUT), (INPUT, 3 * HIDDEN), (HIDDEN, 3 * HIDDEN),
              (3 * HIDDEN,)]
    return [kiln.tensor(rng.standard_normal(s) * 0.5) for s in shapes]


def fresh(fn):
    """fn over a copy of its code object (capture_mode="bytecode" keeps graphs with the code object)."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def body_runs(call):
    """(call's result, how many loop bodies ran forward during it)."""
    before = _C.loop_body_runs()
    out = call()
    return out, _C.loop_body_runs() - before


def assert_close(got, want, rtol=1e-10, atol=1e-12):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(to_numpy(g), to_numpy(w), rtol=rtol, atol=atol)


def while_attrs(graph_text):
    """The int attrs of each top-level `while` node of a graph's text (ops.def: cond, body, nout,
    backward, trips, nres, res_bytes) and its output count."""
    main = graph_text.split("\nsubgraph")[0]
    found = []
    for line in main.splitlines():
        m = re.search(r"^\s*(.*?) = while\(.*\) \{([-0-9, ]*)\}", line)
        if m:
            found.append(([int(v) for v in m.group(2).split(", ")], m.group(1).count("%")))
    return found


@pytest.fixture(autouse=True)
def stored_residuals():
    was = kiln.get_context("loop_residual_budget")
    kiln.set_context(loop_residual_budget=4096)
    yield
    kiln.set_context(loop_residual_budget=was)


@pytest.mark.parametrize("variant", JIT_VARIANTS, ids=JIT_IDS)
def test_the_gradient_runs_the_loop_forward_once(variant):
    args = data(1)
    wrt = (0, 1, 2, 3, 4, 5)
    want = kiln.grad(python_loss, wrt)(*args)
    fn = jitted(fresh(scan_loss), variant)
    grad = kiln.grad(fn, wrt)
    for _ in range(2):  # compiled (bytecode compiles its one-graph gradient on the second call)
        assert_close(grad(*args), want)
    got, runs = body_runs(lambda: grad(*args))
    assert_close(got, want)
    assert runs == STEPS, f"{runs} loop-body runs for {STEPS} steps: the gradient ran the loop again"
    (info,) = {(g["strategy"], g["single_forward"]) for g in fn.explain().loop_gradients}
    assert info == ("stored", True)
    assert "residuals stored by the loop itself" in str(fn.explain())


def test_kiln_trace_of_the_gradient_runs_the_loop_forward_once():
    args = data(2)
    wrt = (0, 3, 4, 5)
    want = kiln.grad(python_loss, wrt)(*args)
    traced = kiln.trace(lambda *a: kiln.grad(scan_loss, wrt)(*a))
    assert_close(traced(*args), want)
    got, runs = body_runs(lambda: traced(*args))
    assert_close(got, want)
    assert runs == STEPS
    ((attrs, nout),) = while_attrs(traced.graph_str())
    # NRES residual buffers after the 4 loop values (the step counter, the ys buffer, h, c)
    assert attrs[5] > 0 and nout == attrs[2] == 4 + attrs[5]


def central_differences(fn, args, eps=1e-6):
    arrays = [to_numpy(a).astype(np.float64) for a in args]
    grads = []
    for k, a in enumerate(arrays):
        g = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            vals = []
            for sign in (1, -1):
                b = a.copy()
                b[i] += sign * eps
                vals.append(float(to_numpy(fn(*[kiln.tensor(b) if j == k else kiln.tensor(arrays[j])
                                                for j in range(len(arrays))]))))
            g[i] = (vals[0] - vals[1]) / (2 * eps)
        grads.append(g)
    return grads


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_central_differences_in_float64(mode):
    args = data(3)
    fn = kiln.jit(fresh(scan_loss), capture_mode=mode)
    got = kiln.grad(fn, tuple(range(6)))(*args)
    for g, w in zip(got, central_differences(python_loss, args)):
        np.testing.assert_allclose(to_numpy(g), w, rtol=1e-6, atol=1e-8)


def fori_loss(h, w):
    h = ops.fori_loop(0, 5, lambda i, h: (h * w).tanh() + 0.1, h)
    return (h * h).sum()


def fori_python(h, w):
    for i in range(5):
        h = (h * w).tanh() + 0.1
    return (h * h).sum()


@pytest.mark.parametrize("variant", JIT_VARIANTS, ids=JIT_IDS)
def test_fori_loop_gradient_runs_forward_once(variant):
    h, w = kiln.tensor(np.array([0.3, -0.2, 0.9])), kiln.tensor(np.array([1.1, 0.9, -1.3]))
    want = kiln.grad(fori_python, (0, 1))(h, w)
    grad = kiln.grad(jitted(fresh(fori_loss), variant), (0, 1))
    for _ in range(2):
        assert_close(grad(h, w), want)
    got, runs = body_runs(lambda: grad(h, w))
    assert_close(got, want)
    assert runs == 5


@pytest.mark.parametrize("variant", JIT_VARIANTS, ids=JIT_IDS)
def test_no_gradient_no_residuals(variant):
    """Inputs needing no gradient, or no_grad around a call on inputs that do: the plain loop."""
    args = data(4)
    want = python_loss(*args)
    fn = jitted(fresh(scan_loss), variant)
    for _ in range(2):
        np.testing.assert_allclose(to_numpy(fn(*args)), to_numpy(want), rtol=1e-10)
    got, runs = body_runs(lambda: fn(*args))
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), rtol=1e-10)
    assert runs == STEPS
    needing = [a.detach().requires_grad_() for a in args]
    with kiln.no_grad():
        got = fn(*needing)
    np.testing.assert_allclose(to_numpy(got), to_numpy(want), rtol=1e-10)
    assert not got.requires_grad
    for text in fn_graph_texts(fn, args) + fn_graph_texts(fn, needing, no_grad=True):
        for attrs, _ in while_attrs(text):
            assert len(attrs) < 6 or attrs[5] == 0, text  # NRES: no residual buffers
    assert fn.explain().loop_gradients == []


def fn_graph_texts(fn, args, no_grad=False):
    if fn.options.capture_mode == "bytecode":
        return [e.graph_text for entries in fn._entries.exact.values() for e in entries]
    if no_grad:
        with kiln.no_grad():
            return [fn.graph_str(*args)]
    return [fn.graph_str(*args)]


def test_the_recomputing_gradient_still_reruns_the_loop():
    """loop_residual_budget=0: nothing stored, each step's backward recomputes from the kept carries
    (the loop's forward, then its rerun in the gradient)."""
    kiln.set_context(loop_residual_budget=0)
    args = data(5)
    want = kiln.grad(python_loss, (3, 4))(*args)
    grad = kiln.grad(kiln.jit(fresh(scan_loss), capture_mode="trace"), (3, 4))
    assert_close(grad(*args), want)
    got, runs = body_runs(lambda: grad(*args))
    assert_close(got, want)
    assert runs == 2 * STEPS


@pytest.mark.parametrize("mode", ["ast", "trace"])
def test_a_forward_call_reading_weights_that_need_gradients_stores_nothing(mode):
    """Outside kiln.grad (grad mode on, a captured weight needing a gradient) the compiled forward
    is the plain loop: nothing there would read stored residuals."""
    h0, c0, xs, w, u, b = data(6)
    w = w.detach().requires_grad_()

    def forward(h0, c0, xs, u, b):
        return scan_loss(h0, c0, xs, w, u, b)

    fn = kiln.jit(forward, capture_mode=mode)
    want = python_loss(h0, c0, xs, w, u, b)
    for _ in range(2):
        np.testing.assert_allclose(to_numpy(fn(h0, c0, xs, u, b)), to_numpy(want), rtol=1e-10)
    attrs = while_attrs(fn.graph_str(h0, c0, xs, u, b))
    assert attrs and all(len(a) < 6 or a[5] == 0 for a, _ in attrs), attrs


def while_grad_attrs(graph_text):
    main = graph_text.split("\nsubgraph")[0]
    return [[int(v) for v in m.split(", ")] for m in re.findall(r"= while_grad\(.*\) \{([-0-9, ]*)\}", main)]


def shared_weight_loss(h0, xs, w, v):
    """w read twice per step (x_t @ w and h @ w.T @ w): its gradient is not one product per step,
    so it stays accumulated per step; v's is (x_t @ v), summed over all steps in one matmul."""
    def step(h, x):
        h = (ops.matmul(x, w) + ops.matmul(ops.matmul(h, w.transpose(1, 0)), w) + ops.matmul(x, v)).tanh()
        return h, h.sum()
    h, ys = ops.scan(step, h0, xs, reverse=True)
    return (h * h).sum() + (ys * ys).sum()


def shared_weight_python(h0, xs, w, v):
    h, total = h0, None
    for t in range(xs.shape[0] - 1, -1, -1):
        x = xs[t]
        h = (ops.matmul(x, w) + ops.matmul(ops.matmul(h, w.transpose(1, 0)), w) + ops.matmul(x, v)).tanh()
        total = h.sum() * h.sum() if total is None else total + h.sum() * h.sum()
    return (h * h).sum() + total


@pytest.mark.parametrize("variant", JIT_VARIANTS, ids=JIT_IDS)
def test_weight_gradients_summed_over_all_steps_in_one_matmul(variant):
    """A weight read as x_t @ w has the gradient sum_t x_t^T dy_t: the backward body stores dy_t
    per step and one matmul over every step's rows sums it after the loop (ops.def STACK)."""
    rng = np.random.default_rng(9)
    h0, xs = kiln.tensor(rng.standard_normal((2, 3)) * 0.5), kiln.tensor(rng.standard_normal((5, 2, 3)) * 0.5)
    w, v = kiln.tensor(rng.standard_normal((3, 3)) * 0.4), kiln.tensor(rng.standard_normal((3, 3)) * 0.4)
    want = kiln.grad(shared_weight_python, (0, 1, 2, 3))(h0, xs, w, v)
    grad = kiln.grad(jitted(fresh(shared_weight_loss), variant), (0, 1, 2, 3))
    for _ in range(3):
        assert_close(grad(h0, xs, w, v), want)
    traced = kiln.trace(lambda *a: kiln.grad(shared_weight_loss, (0, 1, 2, 3))(*a))
    assert_close(traced(h0, xs, w, v), want)
    (attrs,) = while_grad_attrs(traced.graph_str())
    assert attrs[8] == 1, attrs  # NSTACK: v's gradient stacked, w's (read twice) accumulated per step
    for g, c in zip(traced(h0, xs, w, v), central_differences(shared_weight_python, [h0, xs, w, v])):
        np.testing.assert_allclose(to_numpy(g), c, rtol=1e-6, atol=1e-8)


def test_the_lstm_weights_are_stacked():
    args = data(7)
    traced = kiln.trace(lambda *a: kiln.grad(scan_loss, (3, 4, 5))(*a))
    assert_close(traced(*args), kiln.grad(python_loss, (3, 4, 5))(*args))
    (attrs,) = while_grad_attrs(traced.graph_str())
    assert attrs[8] == 2, attrs  # w (read by x_t @ w) and u (h @ u); b's is a sum, kept per step


def test_no_stacking_past_the_budget():
    """The stacked cotangents count against loop_residual_budget: with room for the residuals alone
    the weights' gradients are summed per step, and are the same."""
    args = data(8)
    traced = kiln.trace(lambda *a: kiln.grad(scan_loss, (3, 4))(*a))
    traced(*args)
    (attrs,) = while_grad_attrs(traced.graph_str())
    residual_bytes = attrs[6]
    kiln.set_context(loop_residual_budget=(residual_bytes + 8) * STEPS / (1 << 20))  # (a cotangent row: 192 bytes)
    tight = kiln.trace(lambda *a: kiln.grad(scan_loss, (3, 4))(*a))
    assert_close(tight(*args), kiln.grad(python_loss, (3, 4))(*args))
    (attrs,) = while_grad_attrs(tight.graph_str())
    assert attrs[5] > 0 and attrs[7] == 1 and attrs[8] == 0, attrs  # stored, single forward, nothing stacked
