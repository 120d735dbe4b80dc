"""Source lines of captured ops never point into Python's standard library: an op recorded while
stdlib code runs (copy.deepcopy calling Tensor.__deepcopy__, inspect and tokenize reading a Cell's
source for ast capture, a namedtuple's eval-made __new__ called from there) carries the user's line,
in every capture mode that tracks lines (ast, trace; bytecode names its own instruction's line)."""
import copy
import inspect
import re

import numpy as np
import pytest

import kiln
from kiln import nn, ops

X = kiln.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))


def deep_copying(x):
    y = x * 2
    z = copy.deepcopy(x)
    return ops.tanh(z) + y


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 2)

    def construct(self, x):
        h = self.dense(x)
        return ops.tanh(h)


def line_of(fn, text):
    lines, first = inspect.getsourcelines(fn)
    return first + next(k for k, line in enumerate(lines) if text in line)


def node_locations(jf, *args):
    """[(op, file, line)] of the nodes drawn with a location."""
    dot = jf.graph_dot(*args)
    return [(m.group(1), m.group(2), int(m.group(3)))
            for m in re.finditer(r'label="([a-z_0-9]+)\\n[^"]*?(/[^"\\ ]+\.py):(\d+)"', dot)]


@pytest.mark.parametrize("mode", ["ast", "trace"])
def test_op_recorded_inside_stdlib_carries_the_users_line(mode):
    jf = kiln.jit(deep_copying, capture_mode=mode, jit_level="O0")
    np.testing.assert_allclose(jf(X).numpy(), deep_copying(X).numpy(), rtol=1e-6)
    locs = node_locations(jf, X)
    assert locs, "no node carries a location"
    assert all(f.endswith("test_stdlib_frame_locations.py") for _, f, _ in locs), locs
    assert ("contiguous", line_of(deep_copying, "copy.deepcopy")) in {(op, n) for op, _, n in locs}, locs


@pytest.mark.parametrize("mode", ["ast", "trace"])
@pytest.mark.parametrize("kilns_own", [False, True])
def test_cell_ops_after_source_conversion_are_not_placed_in_tokenize(mode, kilns_own):
    # kiln's own cells have no line of the user's inside: their ops take the calling line (the lambda's)
    net = nn.SequentialCell([nn.Dense(4, 2), nn.Tanh()]) if kilns_own else Block()
    jf = kiln.jit(lambda x: net(x), capture_mode=mode, jit_level="O0")
    np.testing.assert_allclose(jf(X).numpy(), net(X).numpy(), rtol=1e-6)
    files = {f for _, f, _ in node_locations(jf, X)}
    assert files, "no node carries a location"
    assert all(f.endswith("test_stdlib_frame_locations.py") for f in files), files


def test_frame_hook_checks_its_arguments():
    tracer_owner = kiln._C.Tracer() if hasattr(kiln._C, "Tracer") else None
    if tracer_owner is None:
        pytest.skip("kiln._C.Tracer is not constructible from Python")
    with pytest.raises(TypeError, match="stdlib_dir"):
        kiln._C.FrameHook(tracer_owner, "/x", None, 3)
    with pytest.raises(TypeError, match="site_dirs"):
        kiln._C.FrameHook(tracer_owner, "/x", None, "/lib/", ("/a/", 4))
