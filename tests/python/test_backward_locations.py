"""Source lines of backward ops (issue 27): a gradient's ops carry their forward op's line, not the
line the capture had reached when the backward ran (the last forward statement), in graph pictures
and profiles, for every capture mode and level."""
import inspect
import re

import numpy as np
import pytest

import kiln
from kiln import nn, ops

kiln.manual_seed(0)
NET = nn.Dense(4, 3)
LOSS = nn.CrossEntropyLoss()


def forward(x, t):
    h = NET(x)
    h = ops.tanh(h)
    loss = LOSS(h, t)
    return loss


STEP = kiln.value_and_grad(forward, None, NET.trainable_params())


def train(x, t):
    loss, grads = STEP(x, t)
    return loss, grads


def line_of(text):
    lines, first = inspect.getsourcelines(forward)
    return first + next(k for k, line in enumerate(lines) if text in line)


X = kiln.tensor(np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32))
T = kiln.tensor(np.array([0, 1, 2, 0, 1]), kiln.int64)


def node_lines(dot):
    """{op name: {line, ...}} of the nodes drawn with a location in this file."""
    out = {}
    for m in re.finditer(r'label="([a-z_0-9]+)\\n[^"]*?test_backward_locations\.py:(\d+)"', dot):
        out.setdefault(m.group(1), set()).add(int(m.group(2)))
    return out


@pytest.mark.parametrize("mode", ["ast", "trace"])
def test_backward_nodes_carry_their_forward_line(mode):
    jf = kiln.jit(train, capture_mode=mode, jit_level="O0")
    loss, grads = jf(X, T)
    want_loss, want_grads = train(X, T)
    np.testing.assert_allclose(loss.asnumpy(), want_loss.asnumpy(), rtol=1e-5)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-5, atol=1e-6)
    lines = node_lines(jf.graph_dot())
    assert lines["tanh"] == lines["tanh_backward"] == {line_of("ops.tanh")}
    assert lines["log_softmax"] == lines["log_softmax_backward"] == {line_of("LOSS(h, t)")}
    # only the seed of the backward (ones like the loss, made when it starts) is at the last line
    seeds = {op for op, at in lines.items() if line_of("return loss") in at}
    assert seeds <= {"full"}, lines


@pytest.mark.parametrize("level", ["O0", "O1"])
@pytest.mark.parametrize("mode", ["ast", "trace"])
def test_profiled_backward_kernels_carry_their_forward_line(mode, level):
    jf = kiln.jit(train, capture_mode=mode, jit_level=level, profiling=True)
    jf(X, T)
    jf(X, T)
    ops_ = jf.get_profile()["graph_exec"]["operator"].values()
    locs = {}
    for o in ops_:
        m = re.search(r"test_backward_locations\.py:(\d+)", o["loc"] or "")
        if m:
            locs.setdefault(o["type"], set()).add(int(m.group(1)))
    assert locs, "no kernel names this file"
    assert {op for op, at in locs.items() if line_of("return loss") in at} <= {"full"}, locs
    if "tanh_backward" in locs:
        assert locs["tanh_backward"] == {line_of("ops.tanh")}
