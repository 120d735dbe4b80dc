"""Dynamic shapes (kiln.jit.dynamic): one capture serving many input shapes, checked against eager
and NumPy — which sizes become symbolic (automatic, dynamic=True/1/False, mark_dynamic/static),
broadcasting a symbol against 1, reductions and reshapes over symbolic sizes, a branch on a shape
(ast and trace capture), uses that specialize, a call breaking a relation, value_and_grad, the C
dispatcher serving instances, and cache_info's symbols and guards."""
import numpy as np
import pytest

import kiln
from kiln import models, nn, ops

RNG = np.random.default_rng(16)


def T(*shape):
    return kiln.Tensor(RNG.standard_normal(shape).astype(np.float32))


def close(got, want, tol=1e-5):
    np.testing.assert_allclose(np.asarray(got.asnumpy() if isinstance(got, kiln.Tensor) else got), want,
                               rtol=tol, atol=tol)


def test_automatic_mode_compiles_twice_then_serves_new_sizes():
    f = kiln.jit(models.simple_function)
    for n in (3, 4, 5, 9, 4, 3):
        a, b, c = T(2, n), T(2, n), T(2, n)
        close(f(a, b, c), a.asnumpy() * b.asnumpy() + c.asnumpy())
    info = f.cache_info()
    assert info.compiles == 2 and info.instances == 2, info
    (d,) = info.dynamic
    assert d["symbols"] == {"s0": "input0.shape[1] = input1.shape[1] = input2.shape[1] >= 2"}, d
    assert d["guards"] == [] and d["instances"] == 3, d  # sizes 4 (the capture), 5 and 9


def test_dynamic_true_and_one_compile_once():
    for dyn in (True, 1):
        f = kiln.jit(lambda x, y: ops.relu(x @ y) * 2, dynamic=dyn)
        for m, k, n in ((2, 3, 4), (5, 3, 6), (7, 4, 2), (3, 9, 5)):
            x, y = T(m, k), T(k, n)
            close(f(x, y), np.maximum(x.asnumpy() @ y.asnumpy(), 0) * 2, 1e-4)
        assert f.cache_info().compiles == 1, f.cache_info()


def test_dynamic_false_compiles_every_shape_and_marks_override():
    f = kiln.jit(lambda x: x * 3 - 1, dynamic=False)
    for n in (2, 3, 4):
        x = T(n, 2)
        close(f(x), x.asnumpy() * 3 - 1)
    assert f.cache_info().compiles == 3
    g = kiln.jit(lambda x: x * 3 - 1, dynamic=False)
    for n in (2, 3, 4, 5):
        x = T(n, 2)
        kiln.mark_dynamic(x, 0)
        close(g(x), x.asnumpy() * 3 - 1)
    assert g.cache_info().compiles == 1, g.cache_info()
    h = kiln.jit(lambda x: x.sum(-1), dynamic=True)
    for n in (2, 3, 4):
        x = T(3, n)
        kiln.mark_static(x, -1)
        close(h(x), x.asnumpy().sum(-1))
    assert h.cache_info().compiles == 3, h.cache_info()
    with pytest.raises(IndexError, match="mark_dynamic: dimension 2 is out of range"):
        kiln.mark_dynamic(T(2, 2), 2)


def test_broadcasting_a_symbol_against_one():
    f = kiln.jit(lambda x, row, col: x * row + col, dynamic=True)
    for s in (3, 5, 8):
        x, row, col = T(s, 4), T(1, 4), T(s, 1)
        close(f(x, row, col), x.asnumpy() * row.asnumpy() + col.asnumpy())
    assert f.cache_info().compiles == 1
    x, row, col = T(1, 4), T(1, 4), T(1, 1)  # size 1 is specialized: a new entry, broadcasting right
    close(f(x, row, col), x.asnumpy() * row.asnumpy() + col.asnumpy())
    assert f.cache_info().compiles == 2


def test_reductions_and_reshapes_over_symbolic_sizes():
    def fn(x):
        b, s, d = x.shape
        flat = ops.reshape(x, (b * s, d))
        y = ops.softmax(flat, -1).sum(0) + x.mean((0, 1))
        z = ops.reshape(x, (b, -1)).max(-1)
        half = ops.narrow(x, 1, 0, s // 2).sum(1)
        w = ops.squeeze(ops.unsqueeze(ops.flatten(x, 0, 1), 0), 0).sum(-1)
        return y, z, half, w

    f = kiln.jit(fn, dynamic=True)
    for b, s in ((2, 6), (3, 4), (5, 9), (2, 2)):
        x = T(b, s, 3)
        xn = x.asnumpy()
        flat = xn.reshape(b * s, 3)
        e = np.exp(flat - flat.max(-1, keepdims=True))
        want = ((e / e.sum(-1, keepdims=True)).sum(0) + xn.mean((0, 1)), xn.reshape(b, -1).max(-1),
                xn[:, : s // 2].sum(1), xn.reshape(b * s, 3).sum(-1))
        for g, w in zip(f(x), want):
            close(g, w, 1e-5)
    info = f.cache_info()
    assert info.compiles == 1 and info.instances == 3, info


def test_intermediate_shape_reads_follow_the_symbols():
    kiln.manual_seed(0)
    att = models.LlamaAttention(32, 4, 2)  # rotate_half and the head grouping read intermediate shapes
    f = kiln.jit(att, jit_level="O1")
    for s in (5, 8, 12, 7):
        x = T(1, s, 32)
        pos = kiln.Tensor(np.arange(s, dtype=np.int64).reshape(1, s))
        close(f(x, pos), att(x, pos).asnumpy(), 1e-4)
    info = f.cache_info()
    assert info.compiles == 2 and info.instances == 2, info


@pytest.mark.parametrize("mode", ["ast", "trace"])
def test_branch_on_a_shape_is_a_guard(mode):
    def fn(x):
        if x.shape[0] > 4:
            return x * 2
        return x - 1

    f = kiln.jit(fn, capture_mode=mode, dynamic=True)
    for n in (6, 7, 9, 2, 3, 8):
        x = T(n, 3)
        close(f(x), x.asnumpy() * 2 if n > 4 else x.asnumpy() - 1)
    info = f.cache_info()
    assert info.compiles == 2, info
    assert sorted(g for d in info.dynamic for g in d["guards"]) == ["not (s0 > 4)", "s0 > 4"], info.dynamic


def test_using_a_size_as_a_number_specializes_it():
    f = kiln.jit(lambda x: x.sum(0) / x.shape[0], dynamic=True)
    for n in (4, 5, 6):
        x = T(n, 3)
        close(f(x), x.asnumpy().sum(0) / n)
    info = f.cache_info()
    assert info.compiles == 3, info  # the divisor is a constant of the graph: each size its own entry
    assert info.dynamic[0]["symbols"] == {"s0": "input0.shape[0] == 4 (specialized: true division)",
                                          "s1": "input0.shape[1] >= 2"}, info.dynamic


def test_a_call_breaking_a_relation_compiles_a_new_entry():
    f = kiln.jit(lambda a, b: a.sum(0) + b.sum(0), dynamic=True)
    for n in (4, 6):  # equal sizes share a symbol: the entry assumes they stay equal
        a, b = T(n, 3), T(n, 3)
        close(f(a, b), a.asnumpy().sum(0) + b.asnumpy().sum(0))
    assert f.cache_info().compiles == 1
    a, b = T(5, 3), T(7, 3)
    close(f(a, b), a.asnumpy().sum(0) + b.asnumpy().sum(0))
    info = f.cache_info()
    assert info.compiles == 2, info
    assert info.dynamic[1]["symbols"] == {"s0": "input0.shape[0] >= 2", "s1": "input0.shape[1] = input1.shape[1] >= 2",
                                          "s2": "input1.shape[0] >= 2"}, info.dynamic


def test_value_and_grad_with_dynamic_shapes():
    w = nn.Parameter(kiln.Tensor(RNG.standard_normal((3, 2)).astype(np.float32)), name="w")

    def loss(x):
        return (ops.tanh(x @ w) ** 2).mean()

    step = kiln.value_and_grad(kiln.jit(loss, dynamic=True), None, [w])
    for n in (2, 5, 3):
        x = T(n, 3)
        v, (g,) = step(x)
        ev, (eg,) = kiln.value_and_grad(loss, None, [w])(x)
        close(v, ev.asnumpy(), 1e-5)
        close(g, eg.asnumpy(), 1e-5)


def test_the_c_dispatcher_serves_each_binding_and_sink_runs_it():
    for backend in ("kbk", "sink"):
        f = kiln.jit(lambda a, b: a * b + 1, dynamic=True, backend=backend)
        for n in (2, 3, 4, 3, 2):
            a, b = T(n, n + 1), T(n, n + 1)
            for _ in range(2):
                close(f(a, b), a.asnumpy() * b.asnumpy() + 1)
        assert f.cache_info().compiles == 1
        assert f._fast_hits >= 6, (backend, f._fast_hits)


def test_megengine_trace_symbolic_shape_records_one_graph():
    def fn(x, y):
        b, s = x.shape
        return ops.reshape(x * y, (s, b)).sum(0) + s

    t = kiln.trace(fn)  # symbolic_shape=True, verify=True: each call is also compared with the graph it runs
    for n in (3, 4, 6, 4):
        x, y = T(2, n), T(2, n)
        close(t(x, y), (x.asnumpy() * y.asnumpy()).reshape(n, 2).sum(0) + n)
    # `+ s` uses a size as a number: s is specialized, so each new s is recorded again
    assert t.instances == 0 and len(t._records) == 3
    u = kiln.trace(lambda x, y: ops.reshape(x * y, (y.shape[1], -1)).sum(0))
    for n in (3, 4, 6, 4):
        x, y = T(2, n), T(2, n)
        close(u(x, y), (x.asnumpy() * y.asnumpy()).reshape(n, 2).sum(0))
    assert u.instances == 2 and len(u._records) == 3, u._records


def test_introspection_finds_the_instance_of_a_binding():
    f = kiln.jit(lambda x: ops.exp(x) * 2, dynamic=True)
    small, large = T(2, 3), T(20, 30)
    f(small)
    assert f.executable(large).output_bytes == 20 * 30 * 4
    assert f.executable(small).output_bytes == 2 * 3 * 4
    assert f.cache_info().compiles == 1 and "exp" in f.graph_str(large)


def test_a_backward_pass_inside_the_function_specializes_every_size():
    w = nn.Parameter(kiln.Tensor(RNG.standard_normal((3,)).astype(np.float32)), name="w")

    def fn(x):  # the gradient is w / (3 n) in every row: the rule's 1/(3 n) is a constant
        return kiln.grad(lambda v: (v * w).mean(), grad_position=0)(x).max(0) + x.sum(0)

    f = kiln.jit(fn, dynamic=True)
    for n in (2, 4, 5):
        x = T(n, 3)
        close(f(x), w.asnumpy() / (n * 3) + x.asnumpy().sum(0))
    assert f.cache_info().instances == 0


USES = {
    "zeros of the shape": lambda x: x + ops.zeros(x.shape),
    "ones_like": lambda x: x + ops.ones_like(x),
    "arange of a size": lambda x: x + ops.arange(x.shape[1]),
    "split by a size": lambda x: ops.split(x, x.shape[1] // 2, 1)[0] * 2,
    "iteration": lambda x: sum(r.sum() for r in x),
    "negative index": lambda x: x[-1] * 2,
    "slice to the end": lambda x: x[:, 1:] * 2,
    "len": lambda x: x * len(x),
    "an int method": lambda x: x * x.shape[0].bit_length(),
    "a NumPy array of the shape": lambda x: x + kiln.Tensor(np.zeros(x.shape, np.float32)),
    "max of a size": lambda x: x * max(x.shape[0], 3),
    "reshape method": lambda x: x.reshape(x.shape[0], -1) * 2,
}


@pytest.mark.parametrize("name", sorted(USES))
def test_every_use_of_a_size_stays_right_at_other_shapes(name):
    fn = USES[name]
    f = kiln.jit(fn, dynamic=True, capture_mode="trace")
    for shape in ((2, 4), (3, 6), (5, 8), (3, 4)):
        x = T(*shape)
        close(f(x), fn(x).asnumpy())


def test_entries_split_by_a_guard_are_both_served_in_c():
    f = kiln.jit(lambda x: x * 2 if x.shape[0] > 4 else x - 1, dynamic=True, capture_mode="trace")
    for n in (6, 2, 7, 3):  # two entries: s0 > 4 and not; each then makes an instance
        x = T(n, 3)
        close(f(x), x.asnumpy() * 2 if n > 4 else x.asnumpy() - 1)
    hits = f._fast_hits
    for n in (6, 2, 7, 3):
        f(T(n, 3))
    assert f._fast_hits == hits + 4


def test_instances_are_bounded_and_made_again_when_dropped():
    from kiln.jit import dynamic

    f = kiln.jit(lambda x: x * 3 + 1, dynamic=True)
    sizes = range(2, dynamic.MAX_INSTANCES + 6)
    for _ in range(2):
        for n in sizes:
            x = T(n, 7)
            close(f(x), x.asnumpy() * 3 + 1)
    info = f.cache_info()
    assert info.compiles == 1 and info.dynamic[0]["instances"] == dynamic.MAX_INSTANCES, info
    assert info.instances == 2 * len(sizes) - 1  # the second pass made each one again


def test_explain_shows_the_symbols_and_shape_guards_of_a_dynamic_entry():
    def f(a, b):
        if a.shape[0] > 3:
            return (a * b).sum(0)
        return a + b

    jf = kiln.jit(f, dynamic=True)
    for n in (5, 6, 7):
        a, b = T(n, 4), T(n, 4)
        close(jf(a, b), (a.asnumpy() * b.asnumpy()).sum(0), 1e-6)
    report = kiln.jit.explain(jf, T(8, 4), T(8, 4))
    assert report.graph_count == 1 and report.op_count == 2 and not report.recompiles
    guards = report.graphs[0][1]
    assert "size s0: input0.shape[0] = input1.shape[0] >= 2" in guards
    assert "shapes: s0 > 3" in guards
