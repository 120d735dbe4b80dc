"""Dynamic shapes (kiln.jit.dynamic): one capture serving many input shapes, checked against eager
and NumPy — which sizes become symbolic (automatic, dynamic=True/1/False, mark_dynamic/static),
broadcasting a symbol against 1, reductions and reshapes over symbolic sizes, a branch on a shape
(ast and trace capture), uses that specialize, a call breaking a relation, value_and_grad, the C
dispatcher serving instances, and cache_info's symbols and guards."""
import math
import numbers

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


def test_comparing_a_size_with_itself_is_no_guard():
    def fn(x, y):
        if x.shape[0] == y.shape[0] and x.shape[0] <= y.shape[0]:  # one symbol: true at every binding
            return x + y
        return x - y

    f = kiln.jit(fn, dynamic=True)
    for n in (3, 5, 8):
        x, y = T(n, 2), T(n, 2)
        close(f(x, y), x.asnumpy() + y.asnumpy())
    info = f.cache_info()
    assert info.compiles == 1, info
    assert [d["guards"] for d in info.dynamic] == [[]], info.dynamic


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
    assert t.instances == 0 and len(t._entries.exact) == 3
    u = kiln.trace(lambda x, y: ops.reshape(x * y, (y.shape[1], -1)).sum(0))
    for n in (3, 4, 6, 4):
        x, y = T(2, n), T(2, n)
        close(u(x, y), (x.asnumpy() * y.asnumpy()).reshape(n, 2).sum(0))
    assert u.instances == 2 and len(u._entries.exact) == 3, u._entries.exact


def test_megengine_trace_symbolic_shape_optimizes_once(tmp_path):
    from kiln.profiler import profile

    kiln.manual_seed(4)
    net = models.BasicBlock(channels=4)
    net.set_train(False)
    for verify in (True, False):  # verify: each call also compared with the recording at its shapes
        t = kiln.trace(net, verify=verify)
        built = kiln._C.plan_counts()[0]
        for k, (n, h) in enumerate(((2, 6), (3, 7), (2, 9), (4, 5), (3, 6))):
            x = T(n, 4, h, h)
            with profile() as p:
                got = t(x)
            close(got, net(x).asnumpy(), 1e-4)
            phases = [e["name"] for e in p.events() if e["kind"] == "phase" and e["name"] != "prepare"]
            if k >= 2 and not verify:  # a new shape: the one plan bound, no pass run and nothing planned again
                assert phases == ["bind"], (h, phases)
        if not verify:  # planned twice in all: the first recording, and the recording made symbolic
            assert kiln._C.plan_counts()[0] - built == 2
        # the channels meet the weights: specialized when the recording was made symbolic
        assert t.optimized_once == 1 and t.instances == 4 and len(t._entries.exact) == 5, (t.optimized_once, t.instances)
    t = kiln.trace(net, capture_as_const=True)  # dump writes the graph of the last call's shapes
    for h in (6, 7, 9):
        x = T(2, 4, h, h)
        t(x)
    t.dump(str(tmp_path / "block.kiln"))
    got = kiln.load(str(tmp_path / "block.kiln"))(x)
    assert t.optimized_once == 1 and tuple(got.shape) == (2, 4, 9, 9)
    close(got, net(x).asnumpy(), 1e-4)


def test_introspection_finds_the_instance_of_a_binding():
    f = kiln.jit(lambda x: ops.exp(x) * 2, dynamic=True)
    small, large = T(2, 3), T(20, 30)
    f(small)
    assert f.executable(large).output_bytes == 20 * 30 * 4
    assert f.executable(small).output_bytes == 2 * 3 * 4
    assert f.cache_info().compiles == 1 and "exp" in f.graph_str(large)


def test_a_backward_pass_inside_the_function_follows_the_sizes():
    w = nn.Parameter(kiln.Tensor(RNG.standard_normal((3,)).astype(np.float32)), name="w")

    def fn(x):  # the gradient is w / (3 n) in every row: the rule counts the 3 n elements with ops
        return kiln.grad(lambda v: (v * w).mean(), grad_position=0)(x).max(0) + x.sum(0)

    f = kiln.jit(fn, dynamic=True)
    for n in (2, 4, 5):
        x = T(n, 3)
        close(f(x), w.asnumpy() / (n * 3) + x.asnumpy().sum(0))
    assert f.cache_info().compiles == 1 and f.cache_info().instances == 2, f.cache_info()


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
    "range": lambda x: sum(x[i] for i in range(x.shape[0])),
    "int()": lambda x: x * int(x.shape[1]),
    "math.sqrt": lambda x: x / math.sqrt(x.shape[1]),
    "a list index": lambda x: x * [1.0, 2.0, 3.0][x.shape[0] % 3],
    "an f-string": lambda x: x * len(f"{x.shape[0]}"),
    "str()": lambda x: x * len(str(x.shape[1])),
    "a bitwise and": lambda x: x * (x.shape[0] & 1),
}


@pytest.mark.parametrize("name", sorted(USES))
def test_every_use_of_a_size_stays_right_at_other_shapes(name):
    fn = USES[name]
    f = kiln.jit(fn, dynamic=True, capture_mode="trace")
    for shape in ((2, 4), (3, 6), (5, 8), (3, 4), (12, 10)):
        x = T(*shape)
        close(f(x), fn(x).asnumpy())


SYMBOLIC_USES = {  # int-like uses that keep the size symbolic (a guard where the result depends on it)
    "isinstance int": lambda x: x * 2 if isinstance(x.shape[0], int) else x,
    "numbers.Integral": lambda x: x * 2 if isinstance(x.shape[0], numbers.Integral) else x,
    "divmod": lambda x: ops.reshape(x, (divmod(x.shape[0] * x.shape[1], 2)[0], -1)) * 2,
    "abs, floor, ceil, round": lambda x: ops.reshape(x, (abs(x.shape[0]), math.floor(x.shape[1]),
                                                         math.ceil(round(x.shape[2])))) * 2,
    "math.prod": lambda x: ops.reshape(x, (math.prod(x.shape),)) * 2,
}


@pytest.mark.parametrize("name", sorted(SYMBOLIC_USES))
def test_int_like_uses_of_a_size_stay_symbolic(name):
    fn = SYMBOLIC_USES[name]
    f = kiln.jit(fn, dynamic=True)
    for shape in ((2, 4, 6), (3, 6, 2), (5, 8, 4), (12, 10, 2)):
        x = T(*shape)
        close(f(x), fn(x).asnumpy())
    assert f.cache_info().compiles == 1, f.cache_info()


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


def test_ast_tensor_control_flow_rebinds_its_bodies():
    def fn(x, w):
        h = ops.reshape(x, (x.shape[0] * x.shape[1], -1))
        if h.sum() > 0:
            y = ops.softmax(h @ w, -1) * 2
        else:
            y = (h @ w).mean(0, keepdims=True) - h.sum(-1, keepdims=True)
        n = x.sum() * 0
        while n < 3:
            y = y * 0.5 + 1
            n = n + 1
        return y.sum(0), y

    f = kiln.jit(fn, dynamic=True)  # capture_mode="ast": the if and the while are graph nodes
    for b, s in ((2, 3), (3, 5), (5, 2), (2, 7), (7, 5)):
        x, w = T(b, s, 10), T(10, 11)
        for g, e in zip(f(x, w), fn(x, w)):
            close(g, e.asnumpy(), 1e-5)
    info = f.cache_info()
    assert info.compiles == 1 and info.instances == 4, info
    assert "if" in f.graph_str(x, w) and "while" in f.graph_str(x, w)


def test_a_size_used_inside_an_ast_branch_specializes():
    def fn(x):
        if x.sum() > 0:
            y = ops.reshape(x, (x.shape[0], -1)) * 2
        else:
            y = ops.reshape(x, (x.shape[0], -1)) - 1
        return y

    f = kiln.jit(fn, dynamic=True)
    for n in (3, 4, 3, 5):
        x = T(n, 2, 2)
        close(f(x), fn(x).asnumpy())
    info = f.cache_info()
    assert info.compiles == 3 and info.instances == 0, info
    # the body's reshape records no size expression: its size is fixed, with the other size symbolic
    assert info.dynamic[0]["symbols"]["s0"] == "input0.shape[0] == 3 (specialized: reshape)", info.dynamic


def test_two_threads_capture_dynamically_at_once():
    import threading
    import time

    def body(x):
        b, s = x.shape
        return ops.softmax(ops.reshape(x, (s, b)) * 2, -1).sum(0)

    def fn(x):
        # runs only while capturing: the captures overlap, and the one that started first ends first
        time.sleep(0.1 if x.shape[1] < 8 else 0.3)  # (a guard: s1 < 8 or not)
        return body(x)

    f = kiln.jit(fn, dynamic=True, capture_mode="trace")
    errors = []

    def work(sizes):
        try:
            for n in sizes:
                x = T(3, n)
                close(f(x), body(x).asnumpy(), 1e-5)
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(sizes,)) for sizes in ((4, 5, 6, 7), (8, 9, 10, 11))]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join()
    assert not errors, errors
    assert kiln._C.cell_logs() == (None, None)  # each capture restored its own thread's logs
    info = f.cache_info()  # each capture kept its own symbols: the later sizes are instances
    assert info.compiles == 2 and info.instances == 6, info


INDEXING = {
    "x[:, :n - 1]": (lambda x: x[:, : x.shape[1] - 1] * 2, 1),
    "x[..., -1]": (lambda x: x[..., -1] * 2, 1),
    "x[None, 1:]": (lambda x: x[None, 1:] + 1, 1),
    "x[1:-1, ::2]": (lambda x: x[1:-1, ::2] - 1, 1),
    "x[-2]": (lambda x: x[-2] * 3, 1),
    "x[:, n // 2:, None]": (lambda x: x[:, x.shape[1] // 2 :, None] * 2, 1),
    "x[:, :3] (clamped at 2)": (lambda x: x[:, :3] * 2, 2),  # 3 <= s1 is a guard: size 2 breaks it
    "x[ints tensor]": (lambda x: x[kiln.Tensor(np.array([0, 1]))] * 2, 4),  # index tensors specialize
}


@pytest.mark.parametrize("name", sorted(INDEXING))
def test_indexing_rebinds_from_symbolic_bounds(name):
    fn, compiles = INDEXING[name]
    f = kiln.jit(fn, dynamic=True)
    for shape in ((4, 5), (6, 7), (3, 2), (5, 9)):
        x = T(*shape)
        close(f(x), fn(x).asnumpy())
    assert f.cache_info().compiles == compiles, f.cache_info()


@pytest.mark.parametrize("mode", ["ast", "trace"])
def test_index_assignment_rebinds_from_symbolic_bounds(mode):
    def fn(x, v):
        y = x * 1
        y[:, 1:] = v[:, : v.shape[1] - 1]  # a tensor of the slice's shape
        y[0] = 5.0  # a number: expanded and reshaped to the slice
        y[..., -1] = v[:, 0]  # reshaped to the slice
        y[1:, None, :2] = y[:1, None, -2:] * 2
        return y

    f = kiln.jit(fn, dynamic=True, capture_mode=mode)
    for shape in ((3, 4), (5, 6), (4, 7), (2, 3)):
        x, v = T(*shape), T(*shape)
        close(f(x, v), fn(x, v).asnumpy())
    info = f.cache_info()
    assert info.compiles == 1 and info.instances == 3, info


def test_value_and_grad_compiles_once_over_shapes():
    w = nn.Parameter(kiln.Tensor(RNG.standard_normal((6, 4)).astype(np.float32)), name="w")
    b = nn.Parameter(kiln.Tensor(RNG.standard_normal((4,)).astype(np.float32)), name="b")

    def loss(x):  # broadcasting, reductions over symbolic axes (their counts), reshape, slices, var/std
        h = ops.tanh(x @ w + b)
        s = x.shape[0]
        flat = ops.reshape(h, (s * 4,))
        return ((h ** 2).mean() + h.mean(0).sum() + h.sum(1).max() + flat[1:].var() * 0.5
                + h.std((0,), ddof=1).sum() + ops.softmax(h[:, :3], -1)[:, 0].mean())

    jf = kiln.jit(loss, dynamic=True)
    step = kiln.value_and_grad(jf, 0, [w, b])
    for n in (3, 5, 8, 4):
        x = T(n, 6)
        v, (gx, (gw, gb)) = step(x)
        ev, (egx, (egw, egb)) = kiln.value_and_grad(loss, 0, [w, b])(x)
        close(v, ev.asnumpy(), 1e-5)
        for got, want in ((gx, egx), (gw, egw), (gb, egb)):
            close(got, want.asnumpy(), 1e-4)
    (variant,) = jf._grad_variants.values()  # forward and backward: one graph, rebound per size
    info = variant.cache_info()
    assert info.compiles == 1 and info.instances == 3, info
    x = T(7, 6)  # central differences of the compiled gradient at a size no capture saw
    gx = step(x)[1][0].asnumpy()
    xn, eps = x.asnumpy().astype(np.float64), 1e-2
    for i, j in ((0, 0), (6, 5), (3, 2)):
        hi, lo = xn.copy(), xn.copy()
        hi[i, j] += eps
        lo[i, j] -= eps
        fd = (loss(kiln.Tensor(hi.astype(np.float32))).item() - loss(kiln.Tensor(lo.astype(np.float32))).item()) / (2 * eps)
        assert abs(fd - gx[i, j]) < 2e-2 * max(1.0, abs(fd)), (i, j, fd, gx[i, j])


def test_value_and_grad_of_a_dense_layer_over_sequence_lengths():
    kiln.manual_seed(3)
    net = nn.Dense(6, 5, activation="tanh")
    params = net.trainable_params()
    jf = kiln.jit(lambda x: (net(x) ** 2).mean(), dynamic=True)
    step = kiln.value_and_grad(jf, None, params)  # linear's gradient flattens the leading sizes
    for b, s in ((2, 3), (3, 7), (2, 9), (4, 4)):
        x = T(b, s, 6)
        v, grads = step(x)
        ev, egrads = kiln.value_and_grad(lambda x: (net(x) ** 2).mean(), None, params)(x)
        close(v, ev.asnumpy(), 1e-5)
        for got, want in zip(grads, egrads):
            close(got, want.asnumpy(), 1e-4)
    (variant,) = jf._grad_variants.values()
    assert variant.cache_info().compiles == 1, variant.cache_info()
