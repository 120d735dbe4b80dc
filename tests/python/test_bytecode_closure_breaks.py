"""Bytecode capture and graph breaks inside functions the captured code defines: a def or lambda of
the call closes over this call's variables, and a frozen break state names frame functions by
identity, so replaying it would run the first call's function with the first call's values. Such
calls must give eager's results at every call (they run as they are)."""
import warnings

import numpy as np
import pytest

import kiln

VARIANTS = [(lv, b) for lv in ("O0", "O1") for b in ("kbk", "sink")]


def reads_enclosing_tensor(x):
    base = x * 2

    def add(v):
        print("a graph break inside the closure")
        return v + base
    return add(x)


def writes_nonlocal(x):
    total = 0

    def add(v):
        nonlocal total
        total = total + v
    for i in range(3):
        add(x * i)
    return total


def lambda_over_size(x):
    k = x.shape[0] + float(x.sum().item() > 0)
    scale = lambda v: (print("break"), v * k)[1]  # noqa: E731
    return scale(x)


def closure_then_more_work(x):
    acc = [x]

    def push(v):
        print("break")
        acc.append(v * len(acc))
    push(x + 1)
    push(x - 1)
    return sum(acc) * 2


FUNCTIONS = [reads_enclosing_tensor, writes_nonlocal, lambda_over_size, closure_then_more_work]


@pytest.mark.parametrize("fn", FUNCTIONS, ids=[f.__name__ for f in FUNCTIONS])
@pytest.mark.parametrize("level,backend", VARIANTS)
def test_breaks_inside_closures_of_the_call_equal_eager(fn, level, backend, capsys):
    jf = kiln.jit(fn, capture_mode="bytecode", jit_level=level, backend=backend)
    for c in range(4):
        x = kiln.tensor(np.array([1.0, 2.0 + c, -3.0 * c], np.float32))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = jf(x).numpy()
        np.testing.assert_array_equal(got, fn(x).numpy(), err_msg=f"call {c}")


def test_closure_over_an_outer_function_still_compiles():
    """A frame function whose closure holds cells of code outside the capture (not this call's)
    keeps compiling across the break."""
    def make(scale):
        def inner(v):
            print("break")
            return v * scale
        return inner
    inner = make(3.0)

    def outer(x):
        return inner(x + 1) - 1

    jf = kiln.jit(outer, capture_mode="bytecode")
    for c in range(3):
        x = kiln.tensor(np.array([1.0, float(c)], np.float32))
        np.testing.assert_array_equal(jf(x).numpy(), outer(x).numpy())
    assert "runs in Python" not in str(jf.explain())
