"""Dynamic shapes under capture_mode="bytecode" (kiln.jit.bytecode_capture with kiln.jit.dynamic):
each piece captured with symbolic sizes serves every binding its guards admit — checked against
eager over several shapes, with compile counts that fail if a shape compiles its own graph: the
seed's simple function (automatic, dynamic=True/1/False, mark_dynamic/static), a branch on a shape
(recompiling only when the branch flips), sizes used as numbers and carried across a graph break
(print, .item()), value_and_grad, a call that breaks a relation, the recompile limit, introspection
of a binding, and test_dynamic_random's random programs (one compile each)."""
import types
import warnings

import numpy as np
import pytest

import kiln
from kiln import models, nn, ops
from test_dynamic_random import SHAPES, program, source

RNG = np.random.default_rng(1616)
ROWS = (3, 4, 6, 9, 13, 4, 3)  # (never 2 or 5: the sizes of the other dimensions, an equal size would share a symbol)


def T(*shape):
    return kiln.Tensor(RNG.standard_normal(shape).astype(np.float32))


def bc(fn, **kw):
    return kiln.jit(fn, capture_mode="bytecode", **kw)


def fresh(fn):
    """fn with a code object of its own: the entries of bytecode capture are kept with the code object
    and shared by the wrappers whose options agree (dynamic=True and 1 do), which would hide compiles."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def close(got, want, tol=1e-5):
    np.testing.assert_allclose(got.asnumpy() if isinstance(got, kiln.Tensor) else got,
                               want.asnumpy() if isinstance(want, kiln.Tensor) else want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dyn,compiles", [(None, 2), (True, 1), (1, 1), (False, len(set(ROWS)))])
def test_simple_function_over_shapes(dyn, compiles):
    def simple(a, b, c):  # (models.simple_function's maths, in a function of this test's own code)
        return a * b + c

    f = bc(fresh(simple), dynamic=dyn)
    for n in ROWS:
        a, b, c = T(n, 5), T(n, 5), T(n, 5)
        close(f(a, b, c), a.asnumpy() * b.asnumpy() + c.asnumpy())
    info = f.cache_info()
    assert info.compiles == compiles and info.eager_calls == 0, info
    if dyn is False:
        assert info.dynamic == [], info
        return
    (d,) = info.dynamic
    assert "a.shape[0] = b.shape[0] = c.shape[0] >= 2" in d["symbols"].values(), d  # (named by the locals)
    assert d["guards"] == [] and d["optimized_once"] is d["planned_once"] is True, d


def test_the_seeds_simple_function_runs_each_binding_from_c():
    f = bc(models.simple_function, dynamic=True)
    for n in (3, 4, 6, 4, 3):
        a, b, c = T(2, n), T(2, n), T(2, n)
        for _ in range(2):
            close(f(a, b, c), a.asnumpy() * b.asnumpy() + c.asnumpy())
    assert f.cache_info().compiles == 1
    assert f._fast_hits >= 5, f._fast_hits  # each binding's second call at least


def test_mark_dynamic_and_mark_static():
    f = bc(lambda a: a * 2, dynamic=False)
    g = bc(lambda a: a * 3, dynamic=True)
    for n in (3, 4, 6):
        a, b = T(n, 5), T(n, 5)
        kiln.mark_dynamic(a, 0)
        kiln.mark_static(b, 0)
        close(f(a), a.asnumpy() * 2)
        close(g(b), b.asnumpy() * 3)
    assert f.cache_info().compiles == 1, f.cache_info()
    assert g.cache_info().compiles == 3, g.cache_info()  # dim 0 exact: a graph per size (dim 1 symbolic)


def test_a_branch_on_a_shape_recompiles_only_when_it_flips():
    def fn(x):
        n = x.shape[0]
        if n > 6:
            return x * 2 + n  # (the size as a number: a graph input given per call, not specialized)
        return x - len(x)

    f = bc(fn, dynamic=True)
    for n in (3, 4, 6, 9, 13, 7, 4, 3):
        x = T(n, 5)
        close(f(x), fn(x))
    info = f.cache_info()
    assert info.compiles == 2 and info.eager_calls == 0, info
    assert sorted(g for d in info.dynamic for g in d["guards"]) == ["not (s0 > 6)", "s0 > 6"], info.dynamic
    assert all("specialized" not in s for d in info.dynamic for s in d["symbols"].values()), info.dynamic
    text = str(f.explain())  # each graph with its symbols and shape guards
    assert text.count("size s0: x.shape[0] >= 2") == 2 and "shapes: not (s0 > 6)" in text, text


def test_a_call_that_breaks_a_relation_recompiles_and_is_right():
    def fn(x):
        if x.shape[0] % 2 == 0:
            return x.sum(axis=0) * 2
        return x.mean(axis=0)

    f = bc(fn, dynamic=True)
    for n in (4, 6, 10):
        x = T(n, 5)
        close(f(x), fn(x))
    assert f.cache_info().compiles == 1, f.cache_info()
    x = T(7, 5)  # odd: the guard s0 % 2 == 0 fails
    close(f(x), fn(x))
    assert f.cache_info().compiles == 2, f.cache_info()
    for n in (8, 9, 11):  # both entries serve their side
        x = T(n, 5)
        close(f(x), fn(x))
    assert f.cache_info().compiles == 2, f.cache_info()


@pytest.mark.parametrize("dyn", [None, True])
def test_graph_breaks_with_dynamic_sizes(dyn):
    def fn(x, w):
        n = x.shape[0]
        y = ops.tanh(x @ w)
        print(end="")  # a graph break: n and y are live across it
        s = y.sum().item()  # another: s becomes a graph input of the last piece
        return y * s + n + len(x)

    f = bc(fresh(fn), dynamic=dyn)
    w = T(5, 2)
    for n in ROWS:
        x = T(n, 5)
        close(f(x, w), fn(x, w), 1e-4)
    info = f.cache_info()
    pieces = info.compiles if dyn else info.compiles // 2  # automatic: each piece once exact, once symbolic
    assert pieces <= 3 and info.compiles <= (3 if dyn else 6), info
    assert len(info.dynamic) == pieces and all(d["instances"] >= 4 for d in info.dynamic), info.dynamic


def test_pieces_after_a_break_follow_marked_sizes():
    def fn(x, w):
        y = (x @ w) * 2
        print(end="")
        return y.sum(axis=1) + x.shape[0]

    f = bc(fn, dynamic=False)
    w = T(5, 2)
    for n in (4, 6, 7, 9):
        x = T(n, 5)
        kiln.mark_dynamic(x, 0)  # only the input is marked: y's rows follow it into the second piece
        close(f(x, w), fn(x, w), 1e-4)
    info = f.cache_info()
    assert info.compiles == 2 and len(info.dynamic) == 2, info


def test_value_and_grad_with_dynamic_shapes():
    w = nn.Parameter(T(5, 2), name="w")

    def loss(x):
        return (ops.tanh(x @ w) ** 2).mean()

    f = bc(loss, dynamic=True)
    step = kiln.value_and_grad(f, None, [w])
    for n in (3, 4, 6, 9, 4):
        x = T(n, 5)
        v, (g,) = step(x)
        ev, (eg,) = kiln.value_and_grad(loss, None, [w])(x)
        close(v, ev)
        close(g, eg)
    # the first call's differentiable piece (exact sizes), then the forward-and-backward graph, once
    # (cache_info counts the forward-and-backward graphs value_and_grad of f compiles)
    variants = [j.cache_info() for j in f._grad_variants.values()]
    assert f.cache_info().compiles == 2, (f.cache_info(), variants)
    assert sum(i.instances for i in variants) == 2 == f.cache_info().instances, variants  # sizes 6 and 9 (4: the capture)


def test_value_and_grad_through_a_graph_break_with_changing_shapes():
    # differentiable pieces keep exact sizes (their forward and backward are split per capture): a
    # graph per shape, still right
    def loss(x, w):
        y = ops.tanh(x @ w)
        print(end="")
        return (y * y).sum()

    w = T(5, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in (3, 4):
            x = T(n, 5)
            got = kiln.value_and_grad(bc(loss, dynamic=True), grad_position=(0, 1))(x, w)
            want = kiln.value_and_grad(loss, grad_position=(0, 1))(x, w)
            close(got[0], want[0], 1e-4)
            for a, b in zip(got[1], want[1]):
                close(a, b, 1e-4)


def test_relations_that_keep_breaking_reach_the_recompile_limit():
    def fn(x):
        if x.shape[0] % 3 == 0:
            return x * 2
        if x.shape[0] % 3 == 1:
            return x * 3
        return x * 4

    f = bc(fn, dynamic=True, recompile_limit=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 6, 4, 7, 5, 8):
            x = T(n, 2)
            close(f(x), fn(x))
    info = f.cache_info()
    assert info.compiles == 2 and info.eager_calls == 2, info  # 5 and 8: a third relation, run eagerly
    assert any("recompile_limit=2" in str(w.message) for w in caught), [str(w.message) for w in caught]


def test_introspection_of_a_binding_made_after_the_compile():
    def fn(a, b):
        return a * b + 1

    f = bc(fn, dynamic=True)
    f(T(3, 5), T(3, 5))
    x, y = T(7, 5), T(7, 5) * 2.0  # (two tensors, as at the compile: one passed twice is keyed apart)
    exe = f.executable(x, y)  # the instance of the binding (7, 5), made here without a compile
    close(exe(x, y)[0], x.asnumpy() * y.asnumpy() + 1)
    assert "outputs 140 bytes" in f.plan_str(x, y) and "mul(" in f.graph_str(x, y), f.plan_str(x, y)  # 7*5*4
    info = f.cache_info()
    assert info.compiles == 1 and info.instances == 1, info


@pytest.mark.parametrize("seed", range(200, 224, 3))
def test_random_programs_compile_once_over_shapes(seed):
    fn = program(seed)  # (test_dynamic_random's straight-line programs reading and using symbolic sizes)
    f = bc(fn, dynamic=True)
    rng = np.random.default_rng(seed)
    for b, s in SHAPES:
        x = kiln.Tensor(rng.standard_normal((b, s, 3)).astype(np.float32))
        y = kiln.Tensor(rng.standard_normal((s, 3)).astype(np.float32))
        for g, w in zip(f(x, y), fn(x, y)):
            np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-4, atol=1e-4, err_msg=source(seed))
    info = f.cache_info()
    assert info.compiles == 1 and info.instances == len(SHAPES) - 1, (info, source(seed))
