"""capture_mode="bytecode": compiled entries kept with the code object (its co_extra: kiln.jit.
code_cache), shared by every wrapper of that code whose options agree (closures made again
included, their cells guarded), and gone with the code object, the function and its globals (no
leak over many calls and many functions)."""
import gc
import sys
import weakref


import kiln
from kiln.jit import bytecode_capture
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


def test_closures_of_one_code_share_entries_and_guard_their_cells():
    def make_here(scale):  # (a code object of this test's own: no entries from other tests)
        def f(x, y):
            z = x * y * scale
            print(end="")
            return z + 1.0

        return f

    f, g, h = make_here(2.0), make_here(3.0), make_here(2.0)  # one code object, other closure cells
    assert f.__code__ is g.__code__
    x = t(2, 3)
    jf, jg, jh = bc(f), bc(g), bc(h)
    close(jf(x, x), x * x * 2.0 + 1.0)
    assert jf.cache_info().compiles == 2
    close(jg(x, x), x * x * 3.0 + 1.0)  # the first piece reads scale: captured again for 3.0
    assert jg._pieces.entries is jf._pieces.entries and jg.cache_info().compiles == 1
    close(jh(x, x), x * x * 2.0 + 1.0)  # the same value in another cell: nothing to compile
    assert jh.cache_info().compiles == 0
    for _ in range(3):  # each call reads its own function's cell
        close(jf(x, x), x * x * 2.0 + 1.0)
        close(jg(x, x), x * x * 3.0 + 1.0)
    g.__closure__[0].cell_contents = 5.0
    close(jg(x, x), x * x * 5.0 + 1.0)
    close(jf(x, x), x * x * 2.0 + 1.0)


_SOURCE = """
import math
OFFSET = 1.0
def helper(v):
    return v * SCALE
TABLE = {"two": 2.0, "helper": helper}  # a dict (no weakref) that leads back to the code
def h(x):
    y = TABLE["helper"](x) + math.sqrt(TABLE["two"] * 2.0)
    print(end='')
    return y + OFFSET
"""


class _Sentinel:
    pass


def _exec_function(scale=2.0):
    namespace = {"SCALE": scale, "sentinel": _Sentinel()}
    exec(_SOURCE, namespace)
    return namespace["h"], weakref.ref(namespace["sentinel"])


def test_entries_go_with_the_function_its_globals_and_its_code():
    x = t(2, 3)
    h, globals_alive = _exec_function()
    jf = bc(h)
    for _ in range(3):
        close(jf(x), x * 2.0 + 2.0 + 1.0)
        kiln.grad(lambda a: jf(a).sum())(x)
    h.__globals__["SCALE"] = 3.0  # a global read by an inlined function, guarded through the frame's globals
    close(jf(x), x * 3.0 + 2.0 + 1.0)
    h.__globals__["TABLE"]["two"] = 4.5  # an item of a global dict: guarded from the globals down
    close(jf(x), x * 3.0 + 3.0 + 1.0)
    entries = weakref.ref(jf._pieces.entries)
    code, func = weakref.ref(h.__code__), weakref.ref(h)
    assert entries().count >= 2
    del h, jf
    gc.collect()
    assert entries() is None and code() is None and func() is None and globals_alive() is None


def test_no_leak_over_many_calls_and_many_functions():
    x = t(2, 3)
    f = make(2.0)
    counts = []
    for n in (100, 10000):
        jf = bc(f)
        for k in range(n):
            jf(x, x)
            if k % 1000 == 0:
                g, _ = _exec_function(float(k))
                bc(g)(x)  # functions of new code objects made, compiled and dropped
        del jf
        gc.collect()
        counts.append((sys.getrefcount(x), sys.getrefcount(f), sys.getrefcount(f.__code__), len(gc.get_objects())))
    before, after = counts
    assert after[:3] == before[:3]
    assert after[3] - before[3] < 100


def test_closures_made_again_many_times_each_compile():
    """A closure of one code made again with a new cell value many times (a step function built per
    model or per epoch): each new wrapper compiles, however many came before; the shared entries stay
    bounded; no wrapper gives up and runs eagerly."""
    def make_here(scale):
        def f(x):
            return x * scale + 1.0

        return f

    x = t(2, 3)
    n = bytecode_capture.MAX_PIECES + bytecode_capture.SHARED_PER_KEY + 5
    for k in range(n):
        jf = bc(make_here(float(k)))
        close(jf(x), x * float(k) + 1.0)
        info = jf.cache_info()
        assert (info.compiles, info.eager_calls) == (1, 0), (k, info)
    shared = jf._pieces.entries
    assert max(len(v) for v in shared.exact.values()) <= bytecode_capture.SHARED_PER_KEY
