"""kiln.trace(verify=False)'s C fast path (kiln._C.JitDispatcher) serves Cells and functions whose
results read parameters, as the Python path would: a Cell's record is the one of its current mode,
a result in grad mode gets the node that refuses backward (kiln.jit.capture_core.refuse_backward),
inside GradManager / kiln.grad the call runs eagerly, and dump / graph_str show the graph the latest
call ran. Each test counts the calls the fast path served, so it fails if they went to Python."""
import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.autodiff import GradManager

LEVELS = (0, 2)


class Scaled(nn.Cell):
    """A Dense layer whose output is scaled by 2 in training mode and by 3 in inference mode."""

    def __init__(self):
        super().__init__()
        kiln.manual_seed(0)
        self.fc = nn.Dense(4, 3)

    def construct(self, x):
        return self.fc(x) * (2.0 if self.training else 3.0)


def _x(seed=1):
    return kiln.Tensor(np.random.default_rng(seed).standard_normal((2, 4)).astype(np.float32))


def _eager(cell, x):
    w, b = cell.fc.weight.asnumpy(), cell.fc.bias.asnumpy()
    return (x.asnumpy() @ w.T + b) * (2.0 if cell.training else 3.0)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("grad_mode", (True, False))
def test_a_cell_is_served_in_the_mode_it_is_in(level, grad_mode):
    cell = Scaled()
    t = kiln.trace(cell, verify=False, opt_level=level)
    x = _x()
    with (kiln.enable_grad() if grad_mode else kiln.no_grad()):
        for mode in (False, True, False, True, True, False):
            cell.set_train(mode)
            hits = t._fast_hits
            for _ in range(3):  # (the first call of a record registers it: the next is served)
                y = t(x)
                np.testing.assert_allclose(y.asnumpy(), _eager(cell, x), rtol=1e-5, atol=1e-6)
                assert y.requires_grad == grad_mode  # (eagerly the result reads the parameters)
            assert t._fast_hits > hits  # (both modes were recorded on the first two mode changes)


@pytest.mark.parametrize("level", LEVELS)
def test_dump_shows_the_latest_calls_mode(level, tmp_path):
    cell = Scaled()
    t = kiln.trace(cell, verify=False, opt_level=level, capture_as_const=True)
    x = _x()
    graphs = {}
    for mode in (True, False):
        cell.set_train(mode)
        t(x)
        t(x)
        t(x)  # (this one from the fast path)
        graphs[mode] = t.graph_str()
    assert graphs[True] != graphs[False]
    cell.set_train(True)
    hits = t._fast_hits
    t(x)
    assert t._fast_hits == hits + 1
    assert t.graph_str() == graphs[True]  # (not the inference graph the Python path ran last)
    t.dump(str(tmp_path / "m.kiln"))  # (reads the same record)
    assert (tmp_path / "m.kiln").stat().st_size > 0


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("what", ("cell", "function"))
def test_backward_through_a_fast_result_raises_naming_it(level, what):
    cell = Scaled()
    cell.set_train(False)
    fn = cell if what == "cell" else (lambda x: cell(x) + 1.0)
    t = kiln.trace(fn, verify=False, opt_level=level)
    x = _x()
    t(x)
    t(x)
    hits = t._fast_hits
    y = t(x)
    assert t._fast_hits == hits + 1
    assert y.requires_grad
    loss = (y * y).sum() + (cell.fc.weight * cell.fc.weight).sum()
    with pytest.raises(Exception, match="kiln.trace: a result of .* reached backward"):
        loss.backward()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("how", ("GradManager", "kiln.grad"))
def test_inside_a_gradient_computation_the_call_runs_eagerly(level, how):
    cell = Scaled()
    cell.set_train(False)
    x = _x()
    params = cell.trainable_params()

    def loss_of(f, x):
        y = f(x)
        return (y * y).sum()

    def grads(f):
        for p in params:
            p.grad = None
        if how == "GradManager":
            gm = GradManager().attach(params)
            with gm:
                gm.backward(loss_of(f, x))
            return [p.grad.asnumpy().copy() for p in params]
        g = kiln.grad(lambda x: loss_of(f, x), grad_position=None, weights=params)(x)
        return [v.asnumpy() for v in g]

    want = grads(cell)
    t = kiln.trace(cell, verify=False, opt_level=level)
    t(x)
    t(x)
    t(x)
    assert t._fast_hits == 1  # (the fast entry is there, for calls outside a gradient computation)
    for _ in range(2):
        got = grads(t)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert t._fast_hits == 1
    t(x)  # (and it serves again after)
    assert t._fast_hits == 2
