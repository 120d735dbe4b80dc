"""capture_mode="bytecode": the instructions that only move values, compute with operators or jump
run in C (kiln._C.bytecode_steps, src/python/bytecode_steps.c), the others in Python's handlers.
Captures and Python runs give eager's results with C steps and without them."""
import contextlib

import pytest

from kiln.jit import bytecode
from test_bytecode_capture import bc, close, t


@contextlib.contextmanager
def python_handlers_only():
    saved = bytecode.STEPS_IN_C
    bytecode.STEPS_IN_C = False
    try:
        yield
    finally:
        bytecode.STEPS_IN_C = saved


def shuffles(x, y, n):
    a, b = y, x  # tuple build and unpack, swaps
    parts = [a * 0.5, b - 1.0]
    acc = parts[0]
    for k in range(n):
        if k % 2 == 0 and k is not None:
            acc = acc + parts[1] * (k + 1)
        elif k > 2:
            acc = acc - b
        else:
            acc = acc * 1.5
    pair = (acc, a @ b.T if n > 1 else a)
    return pair[0] / 3.0 + (pair[1] if n <= 1 else pair[1].sum()), -acc


def test_c_steps_match_eager_and_python_handlers():
    x, y = t(2, 3), t(2, 3, seed=1)
    for n in (1, 4):
        want = shuffles(x, y, n)
        got = bc(shuffles)(x, y, n)
        with python_handlers_only():
            slow = bc(shuffles, jit_level="O1")(x, y, n)
        for a, b, c in zip(got, want, slow):
            close(a, b)
            close(c, b)


def helper(a):
    return 1 / a  # BINARY_OP run in C raises in the Python run


def guarded(x, n):
    y = x * 2.0
    print(end="")  # a graph break: the rest runs from a resume point
    try:
        r = helper(n)
    except ZeroDivisionError:
        r = -1.0
    return y * r


def tryer(n):
    try:
        r = helper(n)
    except ZeroDivisionError:
        r = -1.0
    return r


def test_an_exception_raised_in_a_c_step_reaches_the_handler():
    jf = bc(guarded)
    x = t(2, 3)
    for n in (0, 2, 0):
        close(jf(x, n), guarded(x, n))
    for n, want in ((0, -1.0), (2, 0.5)):  # the interpreter running Python (the rest of a call given up)
        interp = bytecode.Interpreter([], capture=False)
        interp.frames = [bytecode.Frame.start(tryer, (n,))]
        assert interp.run() == ("return", want)


def unbound(x, flag):
    if flag:
        z = x + 1.0
    return z * 2.0


def test_an_unbound_local_raises_as_in_eager():
    jf = bc(unbound)
    x = t(2, 3)
    close(jf(x, True), unbound(x, True))
    with pytest.raises(UnboundLocalError):
        jf(x, False)


def test_the_table_says_which_instructions_c_runs():
    code = bytecode.Code.of(shuffles.__code__)
    runs = {ins[0]: bool(code.fast[k]) for k, ins in enumerate(code.ins)}
    assert runs["LOAD_FAST"] and runs["STORE_FAST"] and runs["BINARY_OP"] and runs["BUILD_LIST"]
    assert not runs["LOAD_ATTR"] and not runs["CALL"] and not runs["LOAD_GLOBAL"]
    in_try = bytecode.Code.of(tryer.__code__)  # inside a try: Python's (a capture breaks there)
    assert not any(in_try.fast[k] for k, ins in enumerate(in_try.ins) if ins[2] in in_try.covered)
