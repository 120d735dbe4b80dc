"""capture_mode="bytecode": compiled entries kept with the function (kiln.jit.bytecode_capture.
entries_of), shared by its wrappers whose options agree, and gone with the function and its code
object (no leak over many calls and many functions)."""
import gc
import sys
import weakref

import numpy as np

import kiln
from test_bytecode_capture import bc, close, t  # the helpers of the bytecode tests




def make(scale):
    def f(x, y):
        z = x * y * scale
        print(end="")  # a graph break: two pieces
        return z + 1.0

    return f


def test_wrappers_of_one_function_share_entries_where_options_agree():
    f = make(2.0)
    x = t(2, 3)
    first = bc(f)
    close(first(x, x), x * x * 2.0 + 1.0)
    assert first.cache_info().compiles == 2
    second = bc(f)  # another wrapper, the same options: nothing to compile
    close(second(x, x), x * x * 2.0 + 1.0)
    assert second.cache_info().compiles == 0 and second.cache_info().hits == 2
    other = bc(f, jit_level="O1")  # other options: its own entries
    close(other(x, x), x * x * 2.0 + 1.0)
    assert other.cache_info().compiles == 2
    del first, second
    gc.collect()
    again = bc(f)  # wrapped again after the others are gone
    close(again(x, x), x * x * 2.0 + 1.0)
    assert again.cache_info().compiles == 0
    assert "graph breaks: 1" in str(again.explain())  # what the captures found is shared too


def test_another_function_of_the_same_code_keeps_its_own_guards():
    f, g = make(2.0), make(3.0)  # one code object, other closure cells
    assert f.__code__ is g.__code__
    x = t(2, 3)
    close(bc(f)(x, x), x * x * 2.0 + 1.0)
    close(bc(g)(x, x), x * x * 3.0 + 1.0)


def test_entries_go_with_the_function_and_its_code():
    x = t(2, 3)
    namespace = {}
    exec("def h(x):\n    y = x * 2.0\n    print(end='')\n    return y + 1.0\n", namespace)
    h = namespace.pop("h")
    jf = bc(h)
    for _ in range(3):
        close(jf(x), x * 2.0 + 1.0)
        kiln.grad(lambda a: jf(a).sum())(x)
    entries = weakref.ref(jf._pieces.entries)
    code = weakref.ref(h.__code__)
    assert entries().count >= 2
    del h, jf, namespace
    gc.collect()
    assert entries() is None and code() is None


def test_no_leak_over_many_calls_and_many_functions():
    x = t(2, 3)
    f = make(2.0)
    counts = []
    for n in (100, 10000):
        jf = bc(f)
        for k in range(n):
            jf(x, x)
            if k % 1000 == 0:
                bc(make(float(k)))(x, x)  # functions made, compiled and dropped
        del jf
        gc.collect()
        counts.append((sys.getrefcount(x), sys.getrefcount(f), sys.getrefcount(f.__code__), len(gc.get_objects())))
    before, after = counts
    assert after[:3] == before[:3]
    assert after[3] - before[3] < 100
