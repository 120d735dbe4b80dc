"""A scanned step reading a view its closure (or a global) makes at each read (`w.T`): the guard on
that view compares what it views (storage, layout, dtype, requires_grad), not its identity, which
never holds again (every later call recompiled, then ran eagerly). Values against NumPy, eagerly
and under every kiln.jit variant; no recompilation while the view reads the same memory (also
after w is written in place); a recompilation when w is rebound or its requires_grad changes."""
import numpy as np
import pytest

import kiln
from kiln import ops

from loop_variants import JIT_IDS, JIT_VARIANTS, jitted

STEPS, BATCH, WIDTH = 4, 2, 3


def make(w):
    def f(h0, xs):
        def step(h, x):
            h = (ops.matmul(h, w.T) + x).tanh()
            return h, h.sum()
        return ops.scan(step, h0, xs)
    return f


W_GLOBAL = None


def with_global(h0, xs):
    def step(h, x):
        h = (ops.matmul(h, W_GLOBAL.T) + x).tanh()
        return h, h.sum()
    return ops.scan(step, h0, xs)


def reference(h0, xs, w):
    h, ys = h0, []
    for x in xs:
        h = np.tanh(h @ w.T + x)
        ys.append(h.sum())
    return h, np.array(ys)


def data(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((BATCH, WIDTH)), rng.standard_normal((STEPS, BATCH, WIDTH)),
            rng.standard_normal((WIDTH, WIDTH)))


def check(got, h0, xs, w):
    h, ys = reference(h0, xs, w)
    np.testing.assert_allclose(got[0].numpy(), h, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got[1].numpy(), ys, rtol=1e-10, atol=1e-12)


def test_eager_matches_numpy():
    h0, xs, w = data()
    check(make(kiln.tensor(w))(kiln.tensor(h0), kiln.tensor(xs)), h0, xs, w)


@pytest.mark.parametrize("variant", JIT_VARIANTS, ids=JIT_IDS)
def test_closure_view_compiles_once(variant):
    h0, xs, w = data()
    wt = kiln.tensor(w.copy())
    fn = jitted(make(wt), variant)
    args = kiln.tensor(h0), kiln.tensor(xs)
    for k in range(3):
        check(fn(*args), h0, xs, wt.numpy())
    w2 = np.random.default_rng(1).standard_normal((WIDTH, WIDTH))
    wt.copy_(kiln.tensor(w2))  # written in place: the same memory, new values
    check(fn(*args), h0, xs, w2)
    info = fn.cache_info()
    assert info.compiles == 1 and info.eager_calls == 0, info


@pytest.mark.parametrize("variant", JIT_VARIANTS, ids=JIT_IDS)
def test_global_view_compiles_once_and_follows_rebinding(variant):
    global W_GLOBAL
    h0, xs, w = data(2)
    W_GLOBAL = kiln.tensor(w)
    fn = jitted(with_global, variant)
    args = kiln.tensor(h0), kiln.tensor(xs)
    for _ in range(3):
        check(fn(*args), h0, xs, w)
    assert fn.cache_info().compiles == 1 and fn.cache_info().eager_calls == 0, fn.cache_info()
    w2 = np.random.default_rng(3).standard_normal((WIDTH, WIDTH))
    W_GLOBAL = kiln.tensor(w2)  # rebound: another tensor, the view reads other memory
    check(fn(*args), h0, xs, w2)
    check(fn(*args), h0, xs, w2)


def test_view_guard_fails_on_other_memory_or_requires_grad():
    h0, xs, w = data(4)
    wt = kiln.tensor(w)
    fn = kiln.jit(make(wt), capture_mode="bytecode")
    args = kiln.tensor(h0), kiln.tensor(xs)
    check(fn(*args), h0, xs, w)
    check(fn(*args), h0, xs, w)
    assert fn.cache_info().compiles == 1
    wt.requires_grad_(True)  # w.T now carries gradients: the graph read it as a constant
    check(fn(*args), h0, xs, w)
    assert fn.cache_info().compiles == 2, fn.cache_info()
    assert "w.T" in str(fn.explain())
