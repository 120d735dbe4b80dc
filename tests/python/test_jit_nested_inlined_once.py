"""A jitted function called inside another jitted function is inlined into its caller's graph
when the caller is captured: its Python runs once per call site at that capture, never again on
later calls (JAX traces it once too)."""
import numpy as np
import pytest

import kiln
from kiln.jit import guards

RUNS = [0]


def _tick():  # counted by the test; treated as library code below so that it is no side effect
    RUNS[0] += 1


@pytest.fixture
def counting(monkeypatch):
    original = guards.is_user_code
    monkeypatch.setattr(guards, "is_user_code", lambda code: code is not _tick.__code__ and original(code))
    RUNS[0] = 0


@pytest.mark.parametrize("mode", ["ast", "trace"])
def test_nested_jit_is_traced_once_per_call_site(mode, counting):
    def inner_body(x):
        _tick()
        return x * 2 + 1

    inner = kiln.jit(inner_body, capture_mode=mode)

    def outer_body(x):
        return inner(x) + inner(x * 3)

    outer = kiln.jit(outer_body, capture_mode=mode)
    for i in range(6):
        x = kiln.Tensor(np.full(3, float(i), np.float32))
        np.testing.assert_allclose(outer(x).asnumpy(), (x * 2 + 1 + x * 6 + 1).asnumpy())
    assert RUNS[0] == 2  # the two call sites, at the one capture
    assert outer.stats.compiles == 1 and inner.stats.compiles == 0
