"""capture_mode="bytecode": a Python scalar made at a graph break (`s = t.item()`) that only feeds
tensor maths is an input of the next graph (kiln.jit.sym_scalar), guarded by its type: new values
compile nothing; a branch on it or its use as a size specializes (a graph per value, as eager)."""
import contextlib
import io

import numpy as np

import kiln
from test_bytecode_capture import bc, close, t


def scaled(x, y):
    s = y.sum().item()  # a graph break: s is a Python float
    return x * s - s / (x * x + 1.0) + (x > s) * 0.5


def test_a_scalar_from_a_break_is_a_graph_input():
    jf = bc(scaled)
    x = t(2, 3)
    for k in range(20):
        y = kiln.tensor(np.full((2,), 0.3 * k - 2.0, np.float32))
        close(jf(x, y), scaled(x, y))
    assert jf.cache_info().compiles <= 2


def test_the_scalar_is_weak_as_in_eager():
    def f(x, y):
        s = y.sum().item()
        n = int(y.shape[0])  # a constant int beside it
        return x * s + n, s - x

    for dtype in (np.float16, np.int32):
        jf = bc(f)
        x = kiln.tensor((np.arange(6).reshape(2, 3) + 1).astype(dtype))
        for k in range(4):
            y = kiln.tensor(np.full((2,), 0.5 * k + 0.25, np.float32))
            got, want = jf(x, y), f(x, y)
            for a, b in zip(got, want):
                assert a.dtype == b.dtype
                close(a, b, tol=1e-3)
        assert jf.cache_info().compiles <= 2


def test_an_int_scalar_and_a_printed_one():
    def f(x, y):
        n = int(y.sum().item())  # int() of the float: its value is needed (specialized)
        s = y.max().item()
        print("max", s)  # a break of its own: s goes to Python as a number
        return x * s + n

    jf = bc(f)
    x = t(2, 3)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for k in range(6):
            y = kiln.tensor(np.array([1.0 + 0.25 * k, -0.25 * k], np.float32))  # n is 1, s takes 6 values
            close(jf(x, y), f(x, y))
    assert out.getvalue().count("max") == 12
    assert "max 2.25" in out.getvalue()
    # entry, after n (one value), up to the print, after it: no graph per value of s (that would be 9+)
    assert jf.cache_info().compiles <= 4


def test_a_branch_on_the_scalar_specializes():
    def f(x):
        s = x.sum().item()
        if s > 0:
            return x * s
        return x - s

    jf = bc(f)
    for k in (-2.0, 1.0, 3.0, -1.0, 1.0):
        x = kiln.tensor(np.full((2, 2), k, np.float32))
        close(jf(x), f(x))
    # the entry graph, then one graph per value of s (4 values): its value is guarded, never stale
    assert jf.cache_info().compiles == 5


def test_a_scalar_as_a_size_specializes():
    def f(x):
        n = x.sum().item()
        return x[:int(n)] * 2.0

    jf = bc(f)
    for k in (1, 3, 2, 3):
        x = kiln.tensor(np.full((4,), k / 4, np.float32))
        got, want = jf(x), f(x)
        assert got.shape == want.shape
        close(got, want)
