"""The one capture core (kiln.jit.capture_core): every front end records through a Recording and
keeps one Entry type in one EntryCache; a capture that fails leaves no tracer, hook or log behind."""
import sys

import numpy as np
import pytest

import kiln
from kiln import _C
from kiln.jit.capture_core import Entry, EntryCache, PieceInfo, TraceInfo


def T(*shape, seed=0):
    return kiln.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def scaled(x, y):
    return (x * 2.0 + y).sin(), x.shape[0]


def _want(x, y):
    return np.sin(x.asnumpy() * 2.0 + y.asnumpy())


@pytest.mark.parametrize("mode", ["ast", "trace", "bytecode"])
@pytest.mark.parametrize("level,backend", [("O0", "kbk"), ("O1", "kbk"), ("O1", "sink")])
def test_every_jit_mode_keeps_one_entry_type_in_one_cache(mode, level, backend):
    jf = kiln.jit(scaled, capture_mode=mode, jit_level=level, backend=backend)
    x, y = T(3, 4), T(3, 4, seed=1)
    for _ in range(2):
        got, n = jf(x, y)
        np.testing.assert_allclose(got.asnumpy(), _want(x, y), rtol=1e-5, atol=1e-6)
        assert n == 3
    cache = jf._pieces.entries if mode == "bytecode" else jf._entries
    assert isinstance(cache, EntryCache)
    entries = cache.entries()
    assert len(entries) == 1 and all(type(e) is Entry for e in entries)
    assert (type(entries[0].extra) is PieceInfo) == (mode == "bytecode")
    assert "sin" in entries[0].graph_text


@pytest.mark.parametrize("kw", [{}, {"symbolic": True}, {"verify": False}, {"capture_as_const": True}])
def test_kiln_trace_keeps_the_same_entry_type(kw):
    t = kiln.trace(lambda x, y: (x * 2.0 + y).sin(), **kw)
    x, y = T(2, 5), T(2, 5, seed=2)
    for _ in range(2):
        np.testing.assert_allclose(t(x, y).asnumpy(), _want(x, y), rtol=1e-5, atol=1e-6)
    entries = t._entries.entries()
    assert len(entries) == 1 and type(entries[0]) is Entry and type(entries[0].extra) is TraceInfo
    assert "sin" in t.graph_str()


class Boom(Exception):
    pass


def failing(x):
    y = x * 3.0
    if y.shape[0] > 0:
        raise Boom("raised by the user's code during the capture")
    return y


@pytest.mark.parametrize("make", [
    lambda: kiln.jit(failing, capture_mode="ast"),
    lambda: kiln.jit(failing, capture_mode="trace"),
    lambda: kiln.jit(failing, capture_mode="bytecode"),
    lambda: kiln.trace(failing),
    lambda: kiln.trace(failing, symbolic=True),
], ids=["ast", "trace", "bytecode", "kiln.trace", "kiln.trace-symbolic"])
def test_a_failing_capture_leaves_nothing_behind(make):
    hook = sys.gettrace()
    logs = _C.cell_logs()
    x = T(2, 2)
    with pytest.raises(Boom):
        make()(x)
    assert sys.gettrace() is hook
    assert _C.cell_logs() == logs
    assert not _C.is_tracing()
    np.testing.assert_allclose(x.asnumpy(), T(2, 2).asnumpy())  # the argument is untouched
    # value reads work again (kiln.trace(symbolic=True) hides them only while it records)
    assert float((x * 0.0).sum().item()) == 0.0
    f = kiln.jit(lambda a: a + 1.0, capture_mode="trace")
    np.testing.assert_allclose(f(x).asnumpy(), x.asnumpy() + 1.0)


# ---- what kiln.trace's verification pays per call (it records on every call) --------------------

def _record(fn, args, keep_graph, **kw):
    from kiln.jit import tree
    from kiln.jit.capture_core import CallStrategy, Recording

    leaves = []
    spec = tree.flatten((tuple(args), {}), leaves)
    with Recording(_C.CompileOptions(level=0), timed=False, **kw) as rec:
        call_args, call_kwargs = rec.bind(spec, leaves)
        result = rec.run(CallStrategy(fn), call_args, call_kwargs)
        result, _, out_leaves = rec.outputs(result)
        executable = rec.compile(out_leaves, keep_graph=keep_graph)
    return rec, executable


@pytest.mark.parametrize("keep_graph", [False, True])
def test_compile_keeps_the_recorded_graph_when_asked(keep_graph):
    x = T(2, 3)
    rec, executable = _record(lambda a: (a * 2.0).sin(), [x], keep_graph)
    (out,) = executable(x)
    np.testing.assert_allclose(out.asnumpy(), np.sin(x.asnumpy() * 2.0), rtol=1e-6)
    if keep_graph:
        assert "= sin(" in str(rec.graph) and "return (" in str(rec.graph)  # (as recorded, its output set)
    else:
        assert rec.graph is None


def test_the_lean_run_collects_grad_writes_and_enters_the_symbols():
    from kiln.jit import dynamic

    x = T(4, 3)
    names, values, exprs, _ = dynamic.choose_symbols([x], None, True, None)
    seen = []

    def fn(a):
        seen.append(a.shape[0])  # a size read while the symbols are entered is a symbolic int
        return a + 1.0

    rec, _ = _record(fn, [x], False, grad_writes=True, symbols=(names, values, exprs))
    assert rec.grad_log is not None and rec.grad_log.writes == []
    assert rec.capture is not None and rec.graph is not None  # (symbolic sizes: the graph is kept)
    assert type(seen[0]) is not int and int(seen[0]) == 4
    rec, _ = _record(lambda a: a + 1.0, [x], False)
    assert rec.grad_log is None and rec.capture is None


def test_choose_symbols_without_labels_makes_the_same_symbols_and_no_origins():
    from kiln.jit import dynamic

    leaves = [T(4, 3), T(4, 1), T(5)]
    with_labels = dynamic.choose_symbols(leaves, ["a", "b", "c"], True, None)
    without = dynamic.choose_symbols(leaves, None, True, None)
    assert with_labels[0] == without[0] == ["s0", "s1", "s2"]
    assert with_labels[1] == without[1] == [4, 3, 5]
    assert [[str(e) for e in row] for row in with_labels[2]] == [[str(e) for e in row] for row in without[2]]
    assert with_labels[3] == {0: ["a.shape[0]", "b.shape[0]"], 1: ["a.shape[1]"], 2: ["c.shape[0]"]}
    assert without[3] is None


def test_a_trace_compiles_its_recordings_with_one_options_object_per_level():
    from kiln.jit import megengine

    o0, o1 = megengine._compile_options(0, None), megengine._compile_options(1, (1, 2, 3, 4 << 20, 1))
    assert megengine._compile_options(0, None) is o0
    assert (o0.level, o0.sublinear) == (0, None)
    assert (o1.level, o1.sublinear) == (1, (1, 2, 3, 4 << 20, 1))


def test_a_verified_trace_compares_each_call_with_its_own_recorded_graph(monkeypatch):
    from kiln.jit import capture_core, megengine

    made = []
    compile_ = capture_core.Recording.compile

    def compile_spy(self, out_leaves, compile_options=None, keep_graph=False):
        made.append(self)
        return compile_(self, out_leaves, compile_options, keep_graph)

    monkeypatch.setattr(capture_core.Recording, "compile", compile_spy)
    t = kiln.trace(lambda a, b: (a * b + 1.0).sin())
    x, y = T(2, 3), T(2, 3, seed=1)
    for _ in range(3):
        np.testing.assert_allclose(t(x, y).asnumpy(), np.sin(x.asnumpy() * y.asnumpy() + 1.0), rtol=1e-6)
    assert len(made) == 3  # the first call's recording, then one per verified call
    assert t._last.graph is made[0].graph and made[0].graph is not None
    # (the comparison still sees a call that records something else)
    flips = kiln.trace(_flipping)
    flips(x)
    flips(x)
    monkeypatch.setitem(globals(), "_FLIP", True)
    with pytest.raises(megengine.TraceMismatchError):
        flips(x)


_FLIP = False


def _flipping(a):
    return a.cos() if _FLIP else a.sin()
