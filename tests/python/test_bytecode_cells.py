"""Closure cells live at a bytecode graph break: a cell holding a tensor, one holding an empty
tuple and one not yet filled are rebuilt as they were (a tensor payload once crashed the rebuild,
comparing it with the empty tuple that marked an empty cell)."""
import contextlib
import io

import numpy as np
import pytest

import kiln

VARIANTS = [(lvl, be) for lvl in ("O0", "O1") for be in ("kbk", "sink")]


def tensor_cell(x):
    g = lambda: x * 2  # noqa: E731 (a cell holding a tensor argument)
    print("break")
    return g() + 1


def empty_tuple_cell(x):
    t = ()
    g = lambda: len(t)  # noqa: E731
    print("break")
    return x + g()


def later_filled_cell(x):
    def g():
        return y * x
    print("break")
    y = 3.0
    return g() - 1


@pytest.mark.parametrize("fn", [tensor_cell, empty_tuple_cell, later_filled_cell])
@pytest.mark.parametrize("level,backend", VARIANTS)
def test_cells_at_a_graph_break_equal_eager(fn, level, backend):
    x = kiln.Tensor(np.linspace(-1, 1, 6, dtype=np.float32))
    with contextlib.redirect_stdout(io.StringIO()):
        want = fn(x).asnumpy()
        f = kiln.jit(fn, capture_mode="bytecode", jit_level=level, backend=backend)
        for _ in range(3):
            np.testing.assert_array_equal(f(x).asnumpy(), want)
