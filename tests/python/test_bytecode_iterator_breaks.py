"""Bytecode capture and iterators the code made, live at a graph break: the name holding one and a
loop over it are one iterator, so the state a break freezes must thaw them as one object, and never
keep the first call's exhausted iterator for later calls. Each call must equal eager."""
import warnings

import numpy as np
import pytest

import kiln

VARIANTS = [(lv, b) for lv in ("O0", "O1") for b in ("kbk", "sink")]


def loop_and_next(x):
    out, skipped = [], []
    it = iter([1, 2, 3, 4, 5])
    for i in it:
        out.append(x * i)
        if i == 2:
            print("a graph break")
            skipped.append(next(it))
    return out, skipped, sum(out)


def next_across_break(x):
    it = iter([x, x * 2, x * 3])
    a = next(it)
    print("a graph break")
    b = next(it)
    return a + b, list(it)


def enumerate_across_break(x):
    pairs = enumerate([x, x + 1, x + 2])
    first = next(pairs)
    print("a graph break")
    return [i * v for i, v in pairs], first[1]


def zip_in_loop_with_break(x):
    z = zip(range(4), [x, x * 2, x * 3, x * 4])
    total = x * 0
    for i, v in z:
        if i == 1:
            print("a graph break")
            total = total - next(z)[1]
        total = total + v
    return total


def reversed_loop_with_break(x):
    r = reversed(range(5))
    s = x * 0
    for i in r:
        s = s + x * i
        if i == 3:
            print("a graph break")
            s = s - next(r)
    return s


FUNCTIONS = [loop_and_next, next_across_break, enumerate_across_break, zip_in_loop_with_break,
             reversed_loop_with_break]


def plain(v):
    if isinstance(v, kiln.Tensor):
        return v.numpy().tolist()
    if isinstance(v, (list, tuple)):
        return [plain(i) for i in v]
    return v


@pytest.mark.parametrize("fn", FUNCTIONS, ids=[f.__name__ for f in FUNCTIONS])
@pytest.mark.parametrize("level,backend", VARIANTS)
def test_iterators_live_at_a_break_equal_eager(fn, level, backend, capsys):
    jf = kiln.jit(fn, capture_mode="bytecode", jit_level=level, backend=backend)
    for c in range(4):
        x = kiln.tensor(np.array([1.0, 2.0 + c], np.float32))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = plain(jf(x))
        assert got == plain(fn(x)), f"call {c}"
