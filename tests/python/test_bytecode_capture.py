"""capture_mode="bytecode": the frame hook, the bytecode interpreter against eager (astgen's random
programs, the tutorial's workloads, exec-defined functions and lambdas), graph breaks with their
counts and side-effect order, guards recompiling once with the new value, bad input raising as
eager, fullgraph=True naming the break, and reference counts over many calls."""
import gc
import sys
import warnings

import numpy as np
import pytest

import astgen
import kiln
from kiln import _C, models


def t(*shape, seed=0, scale=1.0):
    return kiln.tensor((np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32))


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=tol, atol=tol)


def bc(fn, **kw):
    return kiln.jit(fn, capture_mode="bytecode", **kw)


def graphs(jf):
    return jf._pieces.count


# ---- the frame hook ------------------------------------------------------------------------------


def test_frame_hook_hands_bound_arguments_and_runs_eager_on_request():
    def f(a, b=2, *rest, k=3, **kw):
        return a + b + k

    seen = []
    _C.eval_frame_mark(f.__code__, lambda fn, args: seen.append((fn, args)) or "hooked")
    try:
        assert f(1) == 6  # not under run_hooked: CPython runs it
        assert _C.run_hooked(f, (1,), {"k": 5, "z": 0}) == "hooked"
        assert seen == [(f, (1, 2, 5, (), {"z": 0}))]
        _C.eval_frame_mark(f.__code__, lambda fn, args: _C.RUN_EAGER)
        assert _C.run_hooked(f, (1,), {}) == 6
    finally:
        _C.eval_frame_mark(f.__code__, None)
    assert _C.eval_frame_marked(f.__code__) is None


def test_frame_hook_leaves_generators_alone():
    def gen(n):
        yield from range(n)

    _C.eval_frame_mark(gen.__code__, lambda fn, args: "hooked")
    try:
        assert _C.run_hooked(lambda: list(gen(3)), (), {}) == [0, 1, 2]
    finally:
        _C.eval_frame_mark(gen.__code__, None)


# ---- whole functions against eager --------------------------------------------------------------


@pytest.mark.parametrize("seed", range(120))
def test_astgen_programs_agree_with_eager(seed):
    fn = astgen.program(seed)
    jf = bc(fn)
    rng = np.random.default_rng(7)
    base = rng.standard_normal((2, 3)).astype(np.float32)
    for s in (0.1, 3.0, 0.1, -2.0):
        x = kiln.tensor(base * s)
        got, want = jf(x), fn(x)
        for a, b in zip(got, want):
            a = np.asarray(a.asnumpy() if isinstance(a, kiln.Tensor) else a, np.float64)
            b = np.asarray(b.asnumpy() if isinstance(b, kiln.Tensor) else b, np.float64)
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=astgen.source(seed))


def test_workloads_are_one_graph_and_agree_with_eager():
    a, b, c = t(2, 3, seed=1), t(2, 3, seed=2), t(2, 3, seed=3)
    f = bc(models.simple_function)
    for _ in range(3):
        close(f(a, b, c), a * b + c)
    info = f.cache_info()  # (compiled here, or by an earlier wrapper of the function: shared entries)
    assert graphs(f) == 1 and info.compiles <= 1 and info.hits == 3 - info.compiles

    block = models.BasicBlock(channels=4)
    block.set_train(False)
    x = t(2, 4, 6, 6, seed=4)
    fb = bc(block, jit_level="O1")
    for _ in range(2):
        close(fb(x), block(x), 1e-4)
    assert graphs(fb) == 1 and fb._pieces.breaks == []

    att = models.LlamaAttention(hidden_size=32, num_heads=4, num_kv_heads=2)
    xa, pos = t(1, 8, 32, seed=5), kiln.tensor(np.arange(8).reshape(1, 8).astype(np.int64))
    fa = bc(att, backend="sink")
    for _ in range(2):
        close(fa(xa, pos), att(xa, pos), 1e-4)
    assert graphs(fa) == 1


def test_exec_defined_function_and_lambda():
    ns = {}
    exec("def e(a, k=2.0):\n    y = a * k\n    return y + 1\n", {}, ns)
    x = t(2, 3)
    je = bc(ns["e"])
    close(je(x), x * 2.0 + 1)
    close(je(x, k=3.0), x * 3.0 + 1)
    lam = bc(lambda p, q: p * q - 1)
    close(lam(x, x), x * x - 1)
    assert graphs(je) == 2 and graphs(lam) == 1


# ---- graph breaks ----------------------------------------------------------------------------------


def test_print_break_splits_in_two_graphs_in_order(capsys):
    log = []

    def f(x):
        y = kiln.ops.tanh(x) * 2
        log.append("first")
        print("between", 7)
        z = y + x
        log.append("second")
        return z * 3

    jf = bc(f)
    x = t(2, 3)
    for _ in range(3):
        close(jf(x), (kiln.ops.tanh(x) * 2 + x) * 3)
    assert log == ["first", "second"] * 3
    assert capsys.readouterr().out == "between 7\n" * 3
    assert [r for r, _ in jf._pieces.breaks] == ["list.append() on an object the function did not create "
                                                "(a Python side effect)", "print() (a Python side effect)",
                                                "list.append() on an object the function did not create "
                                                "(a Python side effect)"]
    assert graphs(jf) == 4


def test_branch_on_tensor_value_compiles_each_side():
    def f(x):
        y = x * 2
        if y.sum() > 0:
            y = y + 1
        else:
            y = y - 1
        return y * 3

    jf = bc(f)
    for s in (1.0, -1.0, 1.0, -1.0):
        x = t(2, 3, scale=s) * 0 + s
        close(jf(x), f(x))
    assert graphs(jf) == 3  # before the branch, each side to the return


def test_item_breaks_and_inlined_helper_breaks():
    def helper(v):
        s = v.sum().item()
        return v * s

    def f(x):
        return helper(x + 1) - 1

    jf = bc(f)
    x = t(2, 3)
    for _ in range(2):
        close(jf(x), f(x))
    assert jf._pieces.breaks[0][0] == "Tensor.item() (its value is read into Python)"


def test_global_write_is_a_break_and_happens_each_call():
    global COUNTER
    COUNTER = 0

    def f(x):
        global COUNTER
        COUNTER = COUNTER + 1
        return x * COUNTER

    jf = bc(f)
    x = t(2, 3)
    for k in (1, 2, 3):
        close(jf(x), x * k)
    assert COUNTER == 3


def test_fullgraph_names_file_line_instruction_and_reason():
    def f(x):
        print("no")
        return x

    with pytest.raises(kiln.JitSyntaxError) as e:
        bc(f, fullgraph=True)(t(2, 3))
    msg = str(e.value)
    assert __file__ in msg and f":{f.__code__.co_firstlineno + 1}" in msg and "CALL" in msg and "print()" in msg


def test_try_and_with_run_in_python_between_graphs():
    class Scale:
        def __init__(self):
            self.log = []

        def __enter__(self):
            self.log.append("enter")
            return 3.0

        def __exit__(self, *exc):
            self.log.append("exit" if exc[0] is None else f"exit {exc[0].__name__}")
            return exc[0] is KeyError  # swallows KeyError

    cm = Scale()

    def f(x, k, key):
        y = x * 2
        try:
            z = y * (1.0 / k)
        except ZeroDivisionError:
            z = y - 1
        with cm as s:
            z = z * s
            if key:
                raise KeyError(key)
        return z + 1

    jf = bc(f)
    x = t(2, 3)
    for k, key in ((2.0, None), (0.0, None), (2.0, "a"), (0.0, None), (2.0, "b")):
        cm.log.clear()
        got = jf(x, k, key)
        jitted_log = list(cm.log)
        cm.log.clear()
        close(got, f(x, k, key))
        assert jitted_log == cm.log == ["enter", "exit KeyError" if key else "exit"]
    assert jf._eager_reason is None
    assert "try/with (run in Python)" in [r for r, _ in jf._pieces.breaks]


# ---- guards ------------------------------------------------------------------------------------------

SCALE = 2.0


def test_global_closure_attribute_and_train_each_recompile_once():
    global SCALE
    SCALE = 2.0
    k = [3.0]
    offset = 1.0

    def f(x):
        return x * SCALE + offset

    jf = bc(f)
    x = t(2, 3)
    close(jf(x), x * 2.0 + 1.0)
    close(jf(x), x * 2.0 + 1.0)
    SCALE = 5.0
    close(jf(x), x * 5.0 + 1.0)
    close(jf(x), x * 5.0 + 1.0)
    assert jf.cache_info().compiles == 2
    offset = 4.0
    close(jf(x), x * 5.0 + 4.0)
    assert jf.cache_info().compiles == 3
    del k

    class M(kiln.nn.Cell):
        def __init__(self):
            super().__init__()
            self.alpha = 2.0
            self.drop = kiln.nn.Dropout(p=0.5)

        def construct(self, x):
            return self.drop(x * self.alpha)

    m = M()
    m.set_train(False)
    jm = bc(m)
    close(jm(x), x * 2.0)
    close(jm(x), x * 2.0)
    m.alpha = 3.0
    close(jm(x), x * 3.0)
    assert jm.cache_info().compiles == 2
    m.set_train(True)
    y = jm(x).asnumpy()
    assert jm.cache_info().compiles == 3
    assert ((y == 0) | np.isclose(y, x.asnumpy() * 6.0, atol=1e-5)).all()


def test_shape_and_dtype_changes_recompile_once():
    jf = bc(lambda a: a * 2)
    jf(t(2, 3))
    jf(t(4, 3))
    jf(t(4, 3))
    jf(kiln.tensor(np.ones((4, 3), np.float64)))
    assert jf.cache_info().compiles == 3


# ---- errors and references ----------------------------------------------------------------------------


def test_bad_input_after_compile_raises_as_eager():
    jf = bc(models.simple_function)
    a = t(2, 3)
    jf(a, a, a)
    for bad in (None, t(5, 7), "text"):
        with pytest.raises(Exception) as eager:
            models.simple_function(a, bad, a)
        with pytest.raises(type(eager.value)) as got:
            jf(a, bad, a)
        assert str(got.value) == str(eager.value)


def test_reference_counts_unchanged_after_many_calls():
    def f(x, y):
        z = x * y
        print(end="")
        return z + 1

    def h(x, k=1.0, **named):
        return x * k + named["b"]

    jf, jg, jh = bc(f), bc(models.simple_function), bc(h)
    x = t(2, 3)
    counts = []
    for n in (100, 10000):
        for _ in range(n):
            jf(x, x)
            jg(x, x, x)
            jh(x, k=2.0, b=x)  # keywords: through the frame hook at each call
        gc.collect()
        counts.append((sys.getrefcount(x), sys.getrefcount(f), sys.getrefcount(f.__code__), len(gc.get_objects())))
    before, after = counts
    assert after[:3] == before[:3]
    assert after[3] - before[3] < 100  # no object kept per call


# ---- more of the language, explain, limits, gradients -------------------------------------------------


def test_calls_loops_and_nested_functions_in_one_graph():
    class Stack(kiln.nn.Cell):
        def __init__(self):
            super().__init__()
            self.layers = kiln.nn.CellList([kiln.nn.Dense(3, 3) for _ in range(2)])

        def construct(self, x, *extra, scale=1.0, **named):
            def act(v, k=0.5):
                return kiln.ops.tanh(v) * k

            outs = []
            for i, layer in enumerate(self.layers):
                x = act(layer(x), k=scale + i)
                outs.append(x)
            pairs = {"a": outs[0], "b": outs[1]}
            total = sum(extra, x) if extra else x
            for name, v in pairs.items():
                total = total + v * named.get(name, 1.0)
            first, *rest = outs
            return total, (first, rest[-1])

    m = Stack()
    jm = bc(m)
    x = t(2, 3)
    want = m(x, x, scale=2.0, b=3.0)
    for _ in range(2):
        got = jm(x, x, scale=2.0, b=3.0)
        close(got[0], want[0])
        close(got[1][1], want[1][1])
    assert graphs(jm) == 1 and jm._pieces.breaks == []


def test_explain_reports_graphs_breaks_guards_and_recompiles(capsys):
    global SCALE
    SCALE = 2.0

    def f(x):
        y = x * SCALE
        print("between")
        return y + 1

    x = t(2, 3)
    out = kiln.jit.explain(f, x)
    assert out.graph_count == 2 and out.graph_break_count == 1 and out.op_count == 2
    assert out.breaks[0] == ("print() (a Python side effect)", f"{__file__}:{f.__code__.co_firstlineno + 2}")
    assert any("global 'SCALE'" in g for _, names in out.graphs for g in names)
    text = capsys.readouterr().out
    assert "graph breaks: 1" in text and "print()" in text

    jt = kiln.jit(lambda a: a * SCALE, capture_mode="trace")
    jt(x)
    SCALE = 3.0
    jt(x)
    jt(t(4, 3))
    rep = jt.explain()
    assert rep.recompiles == ["the value of global 'SCALE' changed",
                              "the shape of tensor argument 0 ((2, 3) -> (4, 3))"]


def test_recompile_limit_then_eager_with_one_warning():
    jf = bc(lambda a: a + 1, recompile_limit=2, dynamic=False)  # (exact shapes: automatic mode would bind t(3, 3))
    jf(t(1, 3))
    jf(t(2, 3))
    with pytest.warns(RuntimeWarning, match="recompile_limit=2"):
        close(jf(t(3, 3)), t(3, 3) + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        close(jf(t(4, 3)), t(4, 3) + 1)
    assert jf.cache_info().compiles == 2 and jf.cache_info().eager_calls == 2


@pytest.mark.parametrize("with_break", [False, True])
def test_value_and_grad_agrees_with_eager(with_break):
    def f(x, w):
        y = kiln.ops.tanh(x * w)
        if with_break:
            print(end="")
        return (y * y).sum()

    x, w = t(2, 3, seed=1), t(2, 3, seed=2)
    want = kiln.value_and_grad(f, grad_position=(0, 1))(x, w)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = kiln.value_and_grad(bc(f), grad_position=(0, 1))(x, w)
    close(got[0], want[0])
    for a, b in zip(got[1], want[1]):
        close(a, b)


def test_a_global_read_before_a_break_recompiles_only_that_graph():
    global SCALE
    SCALE = 2.0

    def f(x):
        y = x * SCALE
        print(end="")
        return y + 1

    jf = bc(f)
    x = t(2, 3)
    close(jf(x), x * 2.0 + 1)
    close(jf(x), x * 2.0 + 1)
    SCALE = 4.0
    close(jf(x), x * 4.0 + 1)
    close(jf(x), x * 4.0 + 1)
    assert jf.cache_info().compiles == 3  # two pieces, then the first again


def test_an_attribute_read_after_a_break_is_guarded():
    class M(kiln.nn.Cell):
        def __init__(self):
            super().__init__()
            self.alpha = 2.0

        def construct(self, x):
            y = x + 1
            print(end="")
            return y * self.alpha

    m = M()
    jm = bc(m)
    x = t(2, 3)
    close(jm(x), (x + 1) * 2.0)
    m.alpha = 5.0
    close(jm(x), (x + 1) * 5.0)


def test_set_jit_config_and_each_level_and_backend():
    block = models.BasicBlock(channels=3)
    block.set_train(False)
    x = t(1, 3, 5, 5, seed=9)
    want = block(x)
    block.set_jit_config(kiln.JitConfig(jit_level="O1", capture_mode="bytecode"))
    close(block(x), want, 1e-4)
    close(block(x), want, 1e-4)
    assert block._jitted.options.capture_mode == "bytecode" and block._jitted._pieces.count == 1
    for level, backend in (("O0", "kbk"), ("O1", "kbk"), ("O2", ""), ("O0", "GE")):
        m = models.BasicBlock(channels=3)
        m.set_train(False)
        jm = bc(m, jit_level=level, backend=backend)
        close(jm(x), m(x), 1e-4)
        close(jm(x), m(x), 1e-4)
        assert jm._last.executable.backend == ("sink" if level == "O2" or backend == "GE" else "kbk")


def test_more_break_kinds():
    import math

    def unknown_call(x):
        y = x * 2
        n = int(np.prod(y.shape))  # NumPy: an unknown function
        return y + math.sqrt(n)

    def to_numpy(x):
        y = x * 2
        host = y.asnumpy()
        return y + float(host.sum())

    def gen(x):
        def g(v):
            yield v * 2
            yield v * 3
        out = x
        for v in g(x):
            out = out + v
        return out

    x = t(2, 3)
    for fn, reason in ((unknown_call, "a call of prod"), (to_numpy, "Tensor.asnumpy()"),
                       (gen, "a generator")):
        jf = bc(fn)
        close(jf(x), fn(x))
        close(jf(x), fn(x))
        assert jf._pieces.breaks and jf._pieces.breaks[0][0].startswith(reason), jf._pieces.breaks


def test_a_callee_with_try_runs_in_python_between_graphs():
    def safe_scale(v, k):
        try:
            return v * (1.0 / k)
        except ZeroDivisionError:
            return v

    def f(x, k):
        y = x + 1
        z = safe_scale(y, k)
        return z - 1

    jf = bc(f)
    x = t(2, 3)
    for k in (2.0, 0.0, 2.0, 0.0):
        close(jf(x, k), f(x, k))
    assert jf._pieces.breaks[0][0] == "try/with (run in Python)"


def test_raise_assert_and_import_inside_the_function():
    def f(x, n):
        import math as m
        from math import sqrt
        assert n != 3, "three is not allowed"
        if n < 0:
            raise ValueError(f"negative n: {n}")
        return x * m.sqrt(n) + sqrt(4.0)

    jf = bc(f)
    x = t(2, 3)
    close(jf(x, 4), f(x, 4))
    close(jf(x, 4), f(x, 4))
    with pytest.raises(ValueError, match="negative n: -1"):
        jf(x, -1)
    with pytest.raises(AssertionError, match="three is not allowed"):
        jf(x, 3)
    close(jf(x, 9), f(x, 9))


def test_graph_str_and_plan_str_of_a_bytecode_function():
    x = t(2, 3)
    jf = bc(models.simple_function)
    text = jf.graph_str(x, x, x)
    assert "mul(" in text and "add(" in text and jf.graph_str() == text
    assert jf.plan_str(x, x, x).startswith("plan:")


def test_a_callable_without_bytecode_runs_eagerly_or_raises_in_strict():
    import functools

    x = t(2, 3)
    part = functools.partial(lambda a, b: a * b, x)
    with pytest.warns(RuntimeWarning, match="has no Python bytecode"):
        close(bc(part)(x), x * x)
    with pytest.raises(TypeError, match="partial has no Python bytecode"):
        bc(part, fullgraph=True)(x)


def test_a_guard_that_keeps_failing_ends_in_eager_with_one_warning_naming_it():
    global SCALE

    def f(x):
        return x * SCALE

    jf = bc(f, recompile_limit=3)
    x = t(2, 3)
    for k in range(3):
        SCALE = float(k)
        close(jf(x), x * float(k))
    SCALE = 7.0
    with pytest.warns(RuntimeWarning, match="the value of global 'SCALE' keeps changing"):
        close(jf(x), x * 7.0)
    SCALE = 8.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        close(jf(x), x * 8.0)
    assert jf.cache_info().compiles == 3


def test_a_python_value_from_a_break_does_not_recompile_at_each_value():
    history = []

    def step(x, w):
        y = kiln.ops.tanh(kiln.ops.matmul(x, w))
        loss = (y * y).mean()
        history.append(loss.item())
        return y * 2, loss

    jf = bc(step)
    for seed in range(6):
        x, w = t(4, 4, seed=seed), t(4, 4, seed=seed + 10)
        got, want = jf(x, w), step(x, w)
        close(got[0], want[0])
        close(got[1], want[1])
    assert history[::2] == history[1::2] and len(set(history)) == 6
    assert graphs(jf) == 2 and jf.cache_info().compiles == 2
