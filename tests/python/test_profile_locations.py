"""Source lines in profiles (issue 27): eager kernels carry the user's file:line (the innermost
frame outside the kiln package: the line calling kiln.ops, a Cell, a loss), not an empty
location."""
import inspect

import numpy as np

import kiln
from kiln import nn, ops


def here():
    """file:line of the caller's line."""
    f = inspect.currentframe().f_back
    return f"{f.f_code.co_filename}:{f.f_lineno}"


def test_eager_kernels_name_the_calling_line():
    x = kiln.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    kiln.manual_seed(0)
    dense = nn.Dense(4, 2)
    loss_fn = nn.MSELoss()
    t = kiln.tensor(np.zeros((3, 2), np.float32))
    with kiln.profiler.profile() as p:
        y = ops.tanh(x); line_tanh = here()  # noqa: E702  (one line: the call and its location)
        z = dense(y); line_dense = here()  # noqa: E702
        loss = loss_fn(z, t); line_loss = here()  # noqa: E702
    kernels = [e for e in p.events() if e["kind"] == "kernel" and e["source"] == "eager"]
    assert kernels and all(e["loc"] for e in kernels), [e for e in kernels if not e["loc"]]
    by_line = {}
    for e in kernels:
        by_line.setdefault(e["loc"], []).append(e["name"])
    assert by_line[line_tanh] == ["tanh"]
    assert "matmul" in by_line[line_dense] or "linear" in " ".join(by_line[line_dense])
    assert set(by_line) == {line_tanh, line_dense, line_loss}, by_line
    del loss


def test_eager_backward_kernels_name_the_line_that_ran_it():
    x = kiln.tensor(np.linspace(-1, 1, 6, dtype=np.float32))
    with kiln.profiler.profile() as p:
        g = kiln.grad(lambda v: (v.sin() * v).sum())(x); line = here()  # noqa: E702
    kernels = [e for e in p.events() if e["kind"] == "kernel" and e["source"] == "eager"]
    assert {"sin", "cos"} <= {e["name"] for e in kernels}  # forward and backward ran eagerly
    assert {e["loc"] for e in kernels} == {line}
    np.testing.assert_allclose(g.asnumpy(), np.cos(x.asnumpy()) * x.asnumpy() + np.sin(x.asnumpy()), rtol=1e-5)
