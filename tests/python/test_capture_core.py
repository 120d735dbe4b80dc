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
