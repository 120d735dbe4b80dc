"""The call that captures a differentiable piece (capture_mode="bytecode" under value_and_grad /
grad, kiln.jit.piece_grad) goes on with the values its capture computed: the forward does not run
a second time, and the backward gives the gradients the capture recorded when the output
gradients are ones, else runs the capture's backward again with the gradients given. Each test is
the user code of one way this could go wrong, compared against eager kiln, NumPy and finite
differences, on every compiled variant that applies."""

import contextlib
import types

import numpy as np
import pytest

import kiln
from kiln import nn, ops

VARIANTS = [dict(capture_mode=m, jit_level=lv, backend=b) for m in ("bytecode", "ast", "trace")
            for lv in ("O0", "O1") for b in ("kbk", "sink")]
BYTECODE = [v for v in VARIANTS if v["capture_mode"] == "bytecode"]
ids = [f"{v['capture_mode']}-{v['jit_level']}-{v['backend']}" for v in VARIANTS]
bc_ids = [i for i in ids if i.startswith("bytecode")]


def t(*shape, seed=0):
    return kiln.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def close(got, want, tol=1e-5):
    np.testing.assert_allclose(np.asarray(got.asnumpy() if hasattr(got, "asnumpy") else got),
                               np.asarray(want.asnumpy() if hasattr(want, "asnumpy") else want), rtol=tol, atol=tol)


def tanh_loss(x, w):
    return (ops.tanh(ops.matmul(x, w)) * 0.5).sum()


def numpy_tanh_loss_grad(x, w):
    y = np.tanh(x @ w)
    return (0.5 * y).sum(), x.T @ (0.5 * (1 - y * y))


def finite_difference(f, x, w, eps=1e-3):
    base = w.astype(np.float64)
    out = np.zeros_like(base)
    for i in np.ndindex(base.shape):
        vals = []
        for sign in (1, -1):
            p = base.copy()
            p[i] += sign * eps
            vals.append(float(f(kiln.Tensor(x), kiln.Tensor(p.astype(np.float32))).asnumpy()))
        out[i] = (vals[0] - vals[1]) / (2 * eps)
    return out


@pytest.mark.parametrize("variant", VARIANTS, ids=ids)
def test_first_and_later_calls_give_the_gradients_of_eager_numpy_and_finite_differences(variant):
    x, w = t(4, 3, seed=1), t(3, 5, seed=2)
    want_v, want_g = numpy_tanh_loss_grad(x.asnumpy().astype(np.float64), w.asnumpy().astype(np.float64))
    eager = kiln.value_and_grad(tanh_loss, grad_position=1)(x, w)
    fd = finite_difference(tanh_loss, x.asnumpy(), w.asnumpy())
    vg = kiln.value_and_grad(kiln.jit(tanh_loss, **variant), grad_position=1)
    for _ in range(3):  # the capture call, then calls of what it compiled
        value, grad = vg(x, w)
        close(value, want_v, 1e-5)
        close(value, eager[0])
        close(grad, want_g, 1e-5)
        close(grad, eager[1])
        np.testing.assert_allclose(grad.asnumpy(), fd, rtol=1e-2, atol=1e-3)


def scaled_output(x, w):
    return ops.tanh(ops.matmul(x, w))


@pytest.mark.parametrize("variant", VARIANTS, ids=ids)
def test_output_gradients_other_than_ones_reach_the_first_call(variant):
    # sens_param: the output's gradient is the caller's, not ones; the first call's node has only
    # its capture's tape to differentiate with
    x, w = t(4, 3, seed=3), t(3, 5, seed=4)
    sens = t(4, 5, seed=5)
    grad_all = kiln.GradOperation(get_all=True, sens_param=True)
    g = grad_all(kiln.jit(scaled_output, **variant))
    y = np.tanh(x.asnumpy().astype(np.float64) @ w.asnumpy().astype(np.float64))
    gy = sens.asnumpy().astype(np.float64) * (1 - y * y)
    for s in (sens, ops.ones((4, 5)), sens * 2.0):
        got = g(x, w, s)
        want = grad_all(scaled_output)(x, w, s)
        close(got[0], want[0])
        close(got[1], want[1])
    close(g(x, w, sens)[1], x.asnumpy().astype(np.float64).T @ gy)


def broken_in_the_middle(x, w):
    h = ops.tanh(ops.matmul(x, w))
    print("between the graphs")  # a graph break: the first piece's outputs get the second's gradients
    return (h * h * 3.0 + h).sum()


@pytest.mark.parametrize("variant", BYTECODE, ids=bc_ids)
def test_a_graph_break_gives_the_first_piece_gradients_other_than_ones(variant, capsys):
    x, w = t(4, 3, seed=6), t(3, 5, seed=7)
    want = kiln.value_and_grad(broken_in_the_middle, grad_position=(0, 1))(x, w)
    jf = kiln.jit(broken_in_the_middle, **variant)
    for _ in range(2):
        got = kiln.value_and_grad(jf, grad_position=(0, 1))(x, w)
        close(got[0], want[0])
        close(got[1][0], want[1][0])
        close(got[1][1], want[1][1])
    h = np.tanh(x.asnumpy().astype(np.float64) @ w.asnumpy().astype(np.float64))
    close(got[1][1], x.asnumpy().astype(np.float64).T @ ((6 * h + 1) * (1 - h * h)), 1e-4)
    assert capsys.readouterr().out.count("between the graphs") == 3  # eager once, then once per call
    assert jf.cache_info().eager_calls == 0


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(3, 4)
        self.bn = nn.BatchNorm1d(4)

    def construct(self, x):
        return ops.tanh(self.bn(self.dense(x))).sum()


def fresh_net(training):
    kiln.manual_seed(11)
    net = Net()
    net.set_train(training)
    return net


@pytest.mark.parametrize("variant", VARIANTS, ids=ids)
def test_running_statistics_move_once_per_call(variant):
    # BatchNorm in training writes its running statistics in place: the capture's writes stand for
    # the first call (no second forward writes them again)
    x = t(6, 3, seed=8)
    eager_net, net = fresh_net(True), fresh_net(True)
    eager = kiln.value_and_grad(eager_net, None, eager_net.trainable_params())
    vg = kiln.value_and_grad(kiln.jit(net, **variant), None, net.trainable_params())
    for call in range(3):
        want, got = eager(x * (call + 1.0)), vg(x * (call + 1.0))
        close(got[0], want[0])
        for a, b in zip(got[1], want[1]):
            close(a, b, 1e-4)
        close(net.bn.moving_mean, eager_net.bn.moving_mean)
        close(net.bn.moving_variance, eager_net.bn.moving_variance)


def dropped(x, w):
    return ops.dropout(ops.tanh(ops.matmul(x, w)), p=0.5).sum()


@pytest.mark.parametrize("variant", BYTECODE, ids=bc_ids)
def test_random_draws_of_the_first_call_are_eager_draws(variant):
    x, w = t(8, 3, seed=9), t(3, 16, seed=10)
    kiln.manual_seed(3)
    want = [kiln.value_and_grad(dropped, grad_position=1)(x, w) for _ in range(2)]
    kiln.manual_seed(3)
    vg = kiln.value_and_grad(kiln.jit(dropped, **variant), grad_position=1)
    got = [vg(x, w) for _ in range(2)]
    for (gv, gg), (wv, wg) in zip(got, want):
        close(gv, wv)
        close(gg, wg)


@pytest.mark.parametrize("variant", BYTECODE, ids=bc_ids)
def test_backward_twice_through_the_first_call(variant):
    # the first call's node is differentiated twice (two losses over one output); the gradients
    # the capture computed are given out once, the second backward runs the capture's tape
    w = kiln.Parameter(t(3, 5, seed=12), name="w")
    x = t(4, 3, seed=13)

    f = kiln.jit(scaled_output, **variant)
    for fn in (scaled_output, f):
        w.grad = None
        y = fn(x, w)
        y.sum().backward()
        first = w.grad.asnumpy().copy()
        (y * 2.0).sum().backward()
        if fn is scaled_output:
            want = (first, w.grad.asnumpy().copy())
        else:
            np.testing.assert_allclose(first, want[0], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(w.grad.asnumpy(), want[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", BYTECODE, ids=bc_ids)
def test_gradients_of_gradients_through_the_first_call_equal_eager(variant):
    # (grad inside grad runs the call on the eager tape: a compiled piece's backward is not differentiable)
    x, w = t(4, 3, seed=14), t(3, 5, seed=15)
    f = kiln.jit(tanh_loss, **variant)
    inner = kiln.grad(f, grad_position=1)
    eager_inner = kiln.grad(tanh_loss, grad_position=1)
    want = kiln.grad(lambda x, w: eager_inner(x, w).sum(), grad_position=1)(x, w)
    got = kiln.grad(lambda x, w: inner(x, w).sum(), grad_position=1)(x, w)
    np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-6, atol=1e-6)


def matmul_kernels(fn, *args):
    with kiln.profiler.profile() as prof:
        fn(*args)
    return sum(1 for e in prof.events() if e["kind"] == "kernel" and e["name"] == "matmul")


@pytest.mark.parametrize("variant", BYTECODE, ids=bc_ids)
def test_the_first_call_runs_the_matmuls_of_an_eager_call(variant):
    # the capture computed forward and backward on the call's values: nothing runs a second time
    x, w = t(4, 3, seed=16), t(3, 5, seed=17)
    # (a code object of its own: none of the pieces other tests compiled, kept with the code, serve it)
    fresh = types.FunctionType(tanh_loss.__code__.replace(), tanh_loss.__globals__, "fresh_tanh_loss")
    eager = matmul_kernels(kiln.value_and_grad(tanh_loss, grad_position=1), x, w)
    first = matmul_kernels(kiln.value_and_grad(kiln.jit(fresh, **variant), grad_position=1), x, w)
    assert eager >= 2 and first == eager


def two_graphs(x, w):
    h = ops.tanh(ops.matmul(x, w))
    print("between the graphs")
    return (ops.exp(h * 0.5) * h).sum()


@pytest.mark.parametrize("failing", [1, 2], ids=["first-piece", "second-piece"])
def test_a_backward_kiln_cannot_compile_at_the_second_call_runs_in_python(failing, monkeypatch, capsys):
    # a piece's backward is compiled when a call after the capturing one runs it: one that fails
    # there leaves that call (and the later ones) to Python, as a capture that fails does
    x, w = t(4, 3, seed=18), t(3, 5, seed=19)
    want = kiln.value_and_grad(two_graphs, grad_position=(0, 1))(x, w)
    jf = kiln.jit(types.FunctionType(two_graphs.__code__.replace(), two_graphs.__globals__, "two"),
                  capture_mode="bytecode")
    vg = kiln.value_and_grad(jf, grad_position=(0, 1))
    first = vg(x, w)
    compile_graph, seen = kiln._C.compile_graph, []

    def failing_compile(graph, options):
        seen.append(graph)
        if len(seen) == failing:
            raise RuntimeError("no kernel for this op (made up by the test)")
        return compile_graph(graph, options)

    monkeypatch.setattr(kiln._C, "compile_graph", failing_compile)
    with pytest.warns(RuntimeWarning) if failing == 1 else contextlib.nullcontext():
        later = [vg(x, w) for _ in range(2)]
    for got in [first] + later:
        close(got[0], want[0])
        close(got[1][0], want[1][0])
        close(got[1][1], want[1][1])
    assert seen and capsys.readouterr().out.count("between the graphs") == 4
    given_up = jf._eager_reason if failing == 1 else jf._pieces.given_up  # (the whole call, or the rest of it)
    assert "could not be compiled" in given_up
