"""capture_mode="bytecode" under value_and_grad / grad: each compiled piece records one node on
the eager tape whose backward is the piece's compiled backward graph (kiln.jit.piece_grad), so
gradients flow across graph breaks. Checked against eager gradients and finite differences, with
breaks inside a Cell, a Python value from a break feeding later tensor maths, and Parameters used
on both sides of a break; plus the graph split itself (kiln._C.Graph.split) and record_grad."""

import numpy as np
import pytest

import kiln
from test_bytecode_capture import bc, close, t  # the helpers of the bytecode tests
from kiln import _C, ops




def compiled_nodes(jf):
    """Pieces compiled with their backward."""
    return sum(p.extra.grad is not None for entries in jf._pieces.cache.values() for p in entries)


def finite_difference(f, args, position, eps=1e-3):
    """d f(*args) / d args[position] by central differences, in float64 from float32 evaluations."""
    base = args[position].asnumpy().astype(np.float64)
    out = np.zeros_like(base)
    for i in np.ndindex(base.shape):
        vals = []
        for sign in (1, -1):
            x = base.copy()
            x[i] += sign * eps
            a = list(args)
            a[position] = kiln.tensor(x.astype(np.float32))
            vals.append(float(f(*a).asnumpy()))
        out[i] = (vals[0] - vals[1]) / (2 * eps)
    return out


# ---- gradients across graph breaks -------------------------------------------------------------


def item_feeds_maths(x, w):
    y = ops.tanh(x * w)
    s = y.sum().item()  # a graph break whose Python value feeds the tensor maths after it
    if s > 0:
        y = y * 2.0
    return (y * s + x).sum()


def test_a_python_value_from_a_break_feeds_later_maths():
    x, w = t(2, 3, seed=1), t(2, 3, seed=2)
    want = kiln.value_and_grad(item_feeds_maths, grad_position=(0, 1))(x, w)
    jf = bc(item_feeds_maths)
    for _ in range(2):  # the capture call, then a call of the compiled pieces
        got = kiln.value_and_grad(jf, grad_position=(0, 1))(x, w)
        close(got[0], want[0])
        for a, b in zip(got[1], want[1]):
            close(a, b)
    assert jf.cache_info().eager_calls == 0 and compiled_nodes(jf) == 2
    # .item() is a constant for the gradient, in eager as here: finite differences hold it fixed
    s = ops.tanh(x * w).sum().item()
    fd = finite_difference(lambda a, b: ((ops.tanh(a * b) * (2.0 if s > 0 else 1.0)) * s + a).sum(), [x, w], 1)
    np.testing.assert_allclose(got[1][1].asnumpy(), fd, rtol=2e-2, atol=2e-2)


class Net(kiln.nn.Cell):
    """Its Parameters are read before and after a break (a print, then a branch on .item())."""

    def __init__(self):
        super().__init__()
        self.a = kiln.nn.Dense(3, 4)
        self.b = kiln.nn.Dense(4, 3)
        self.log = []

    def construct(self, x):
        h = ops.tanh(self.a(x))
        print(end="")  # a graph break in the middle of the Cell
        self.log.append(1)
        if h.mean().item() > 10.0:  # another, a branch on a tensor's value
            h = h * 0.0
        return (self.b(h) * self.a.weight.sum() + x).sum()


def test_parameters_used_in_both_pieces_of_a_cell():
    net = Net()
    x = t(2, 3, seed=3)
    params = net.trainable_params()
    want_v, want_g = kiln.value_and_grad(net, grad_position=0, weights=params)(x)
    net.log.clear()
    jf = bc(net)
    for call in range(2):
        v, (gx, gw) = kiln.value_and_grad(jf, grad_position=0, weights=params)(x)
        close(v, want_v)
        close(gx, want_g[0])
        for a, b in zip(gw, want_g[1]):
            close(a, b)
        assert net.log == [1] * (call + 1)  # the side effect ran once per call, in Python
    assert jf.cache_info().eager_calls == 0 and compiled_nodes(jf) >= 2

    def loss_of_bias(bias):
        old = net.b.bias.asnumpy().copy()
        net.b.bias.set_data(bias)
        try:
            return net.construct(x)
        finally:
            net.b.bias.set_data(kiln.tensor(old))

    k = [p.name for p in params].index(net.b.bias.name)
    np.testing.assert_allclose(gw[k].asnumpy(), finite_difference(loss_of_bias, [net.b.bias.detach()], 0),
                               rtol=2e-2, atol=2e-2)


def test_gradient_of_a_piece_agrees_with_finite_differences():
    def f(x, w):
        y = ops.sigmoid(x @ w)
        print(end="")
        return (y * y).mean()

    x, w = t(2, 3, seed=4), t(3, 2, seed=5)
    jf = bc(f)
    g = kiln.grad(jf, grad_position=1)(x, w)
    g = kiln.grad(jf, grad_position=1)(x, w)
    np.testing.assert_allclose(g.asnumpy(), finite_difference(f, [x, w], 1), rtol=2e-2, atol=1e-3)
    assert compiled_nodes(jf) == 2 and jf.cache_info().eager_calls == 0


def test_backward_through_pieces_with_requires_grad_inputs_and_an_unused_output():
    def f(x):
        y = x * 3.0
        z = x + 1.0  # an output of the first piece that the loss never reads
        print(end="")
        return (y * y).sum(), z

    x = t(2, 2, seed=6)
    x.requires_grad = True
    jf = bc(f)
    for _ in range(2):
        x.grad = None
        loss, z = jf(x)
        loss.backward()
        close(x.grad, x.detach() * 18.0)
        assert z.requires_grad
    assert jf.cache_info().eager_calls == 0


def test_no_grad_calls_keep_their_own_pieces():
    def f(x):
        y = x * 2.0
        print(end="")
        return y.sum()

    jf = bc(f)
    x = t(3, seed=7)
    jf(x)
    kiln.grad(jf)(x)
    jf(x)
    assert compiled_nodes(jf) == 2  # the differentiable pieces beside the plain ones
    assert not jf(x).requires_grad


def test_gradients_of_gradients_through_a_piece_equal_eager():
    def f(x):
        y = (x * x * x).sum()
        print(end="")
        return y

    jf = bc(f)
    x = t(3, seed=8)
    got = kiln.grad(lambda a: kiln.grad(jf)(a).sum())(x)
    np.testing.assert_allclose(got.asnumpy(), 6 * x.asnumpy(), rtol=1e-6)


# ---- the pieces' parts -------------------------------------------------------------------------


def test_graph_split_keeps_the_values_the_backward_reads():
    x = t(2, 3, seed=9)
    tr = _C.Tracer()
    a = x.detach()
    tr.add_input(a)
    y = ops.exp(a)
    out = y.sum()
    c = out.detach()
    tr.add_input(c)
    g = y * c  # the backward reads exp's result
    fwd, bwd, nres = tr.finish_graph([out, g]).split(1, 1)
    assert nres == 1 and "exp" in str(fwd) and "exp" not in str(bwd)
    outs = _C.compile_graph(fwd)(x)
    close(outs[0], ops.exp(x).sum())
    (back,) = _C.compile_graph(bwd)(outs[1], kiln.tensor(np.float32(2.0)))
    close(back, ops.exp(x) * 2.0)
    with pytest.raises(ValueError, match="split"):
        tr.recorded().split(1, 5)


def test_record_grad_rejects_bad_gradients_with_a_clear_error():
    x = t(2, seed=10)
    x.requires_grad = True
    y = kiln.tensor(np.ones(2, np.float32))
    _C.record_grad((x,), (y,), lambda grads, needs, create: [kiln.tensor(np.ones(3, np.float32))], "node")
    assert y._grad_fn_name() == "node"
    with pytest.raises(RuntimeError, match="node: the gradient of input 0 has the wrong shape"):
        kiln.ops.sum(y).backward()
    z = kiln.tensor(np.ones(2, np.float32))
    _C.record_grad((x,), (z,), lambda grads, needs, create: 1 / 0, "node2")
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        kiln.ops.sum(z).backward()


class Small(kiln.nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = kiln.nn.Dense(3, 4)
        self.b = kiln.nn.Dense(4, 1)

    def construct(self, x):
        h = ops.tanh(self.a(x))
        if h.mean().item() > 5.0:  # a graph break
            h = h * 0.0
        return (self.b(h) ** 2).mean()


def test_a_training_step_jitted_around_value_and_grad():
    x = t(4, 3, seed=11)
    init = [p.asnumpy().copy() for p in Small().trainable_params()]

    def losses(jit):
        net = Small()
        for p, v in zip(net.trainable_params(), init):
            p.set_data(kiln.tensor(v))
        opt = kiln.nn.SGD(net.trainable_params(), learning_rate=0.1)
        vg = kiln.value_and_grad(bc(net) if jit else net, None, opt.parameters)

        def step(x):
            loss, grads = vg(x)
            opt(grads)
            return loss

        step = bc(step) if jit else step
        out = [float(step(x).asnumpy()) for _ in range(3)]
        return out, step

    want, _ = losses(False)
    got, step = losses(True)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert want[2] < want[0]  # it trains
    assert step.cache_info().eager_calls == 0 and step._pieces.breaks  # the update is a compiled graph
