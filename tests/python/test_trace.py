"""kiln.trace (MegEngine's megengine.jit.trace): replay, symbolic tracing, constants, every
TraceMismatchError kind, SublinearMemoryConfig, Cells, nested containers, side effects."""
import os
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn, trace, TraceMismatchError, SublinearMemoryConfig


def T(a, dtype=None):
    return kiln.Tensor(np.asarray(a), dtype)


def rand(*shape, seed=0):
    return T(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def close(a, b):
    np.testing.assert_allclose(np.asarray(a.asnumpy()), np.asarray(b.asnumpy()), rtol=1e-6, atol=1e-6)


# ---- forms and replay ---------------------------------------------------------------------


def _f(a, b, c):
    return a * b + c


def test_decorator_forms():
    x, y, z = rand(2, 3, seed=1), rand(2, 3, seed=2), rand(2, 3, seed=3)
    expected = _f(x, y, z)

    @trace
    def bare(a, b, c):
        return a * b + c

    @trace()
    def empty(a, b, c):
        return a * b + c

    @trace(symbolic=True)
    def symbolic(a, b, c):
        return a * b + c

    for t in (trace(_f), trace(function=_f), trace(_f, symbolic=True), bare, empty, symbolic):
        assert isinstance(t, trace)
        close(t(x, y, z), expected)
        close(t(x, y, z), expected)
    assert bare.__name__ == "bare" and trace(_f).__wrapped__ is _f


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize("symbolic", [False, True])
def test_replay_equals_eager(verify, symbolic):
    calls = []

    def f(a, b, c):
        calls.append(1)
        return (a * b + c).exp() - a.sum(axis=0)

    tf = trace(f, symbolic=symbolic, verify=verify)
    for i in range(5):
        x, y, z = rand(3, 4, seed=i), rand(3, 4, seed=10 + i), rand(3, 4, seed=20 + i)
        close(tf(x, y, z), f(x, y, z))
    # 5 eager reference calls, 1 recording, and a re-run per later call only when verifying
    assert len(calls) == 5 + 1 + (4 if verify else 0)
    assert "exp(" in tf.graph_str() and "return (" in tf.graph_str()


def test_verify_attribute_turns_checking_off():
    calls = []

    @trace
    def f(a):
        calls.append(1)
        return a * 3

    x = rand(4)
    f(x)
    f(x)
    assert len(calls) == 2 and f.verify is True
    f.verify = False
    for _ in range(3):
        close(f(x), x * 3)
    assert len(calls) == 2 and f._fast_hits >= 2  # replayed by the C fast path
    f.verify = True
    close(f(x), x * 3)
    assert len(calls) == 3


def test_nested_containers_in_and_out():
    @trace
    def f(pair, d, scale=2.0):
        a, (b,) = pair
        return {"sum": a + b * scale, "parts": [a * d["k"], (b - d["k"],)]}, 7

    for i in range(3):
        a, b, k = rand(2, 2, seed=i), rand(2, 2, seed=5 + i), rand(2, 2, seed=9 + i)
        out, seven = f((a, [b]), {"k": k}, scale=2.0)
        assert seven == 7 and set(out) == {"sum", "parts"}
        assert isinstance(out["parts"], list) and isinstance(out["parts"][1], tuple)
        close(out["sum"], a + b * 2.0)
        close(out["parts"][0], a * k)
        close(out["parts"][1][0], b - k)


def test_keyword_order_does_not_matter():
    @trace
    def f(*, a, b):
        return a - b

    x, y = rand(3, seed=1), rand(3, seed=2)
    close(f(a=x, b=y), x - y)
    close(f(b=y, a=x), x - y)


def test_method_and_cell():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(4, 8, activation="relu")
            self.fc2 = nn.Dense(8, 2)

        def construct(self, x):
            return self.fc2(self.fc1(x))

    kiln.manual_seed(0)
    net = Net()
    traced = trace(net)
    for i in range(3):
        x = rand(5, 4, seed=i)
        close(traced(x), net(x))
    # parameters stay live: an in-place update is seen by the next replay
    with kiln.no_grad():
        net.fc2.bias.assign_value(net.fc2.bias + 1.0)
    x = rand(5, 4, seed=7)
    close(traced(x), net(x))

    class Scaler:
        def __init__(self, s):
            self.s = s

        @trace
        def apply(self, x):
            return x * self.s

    a, b = Scaler(2.0), Scaler(3.0)
    x = rand(3)
    close(a.apply(x), x * 2.0)
    close(b.apply(x), x * 3.0)
    close(a.apply(x), x * 2.0)


def test_cell_training_mode_records_a_new_graph():
    kiln.manual_seed(1)
    net = nn.SequentialCell(nn.Dense(3, 4), nn.BatchNorm1d(4))
    traced = trace(net)
    x = rand(6, 3)
    net.set_train(False)
    close(traced(x), net(x))
    assert "batch_norm(" in traced.graph_str()
    net.set_train(True)
    traced(x)
    assert traced.graph_str().count("batch_norm(") == 1
    net.set_train(False)
    close(traced(x), net(x))


def test_symbolic_shape_allows_new_shapes_and_false_rejects_them():
    f = trace(lambda a: a.sum(axis=0))
    close(f(rand(2, 3)), rand(2, 3).sum(axis=0))
    close(f(rand(5, 3)), rand(5, 3).sum(axis=0))
    g = trace(lambda a: a.sum(axis=0), symbolic_shape=False)
    g(rand(2, 3))
    with pytest.raises(TraceMismatchError, match=r"argument args\[0\] changed shape: \(2, 3\) when traced, "
                                                 r"\(5, 3\) now \(symbolic_shape=False\)"):
        g(rand(5, 3))


def test_training_step_with_side_effects_runs_once_per_call():
    """A traced step with backward and an optimizer update (in-place) gives the eager losses,
    with and without verification (the update is applied once per call)."""
    def make():
        kiln.manual_seed(5)
        net = nn.SequentialCell(nn.Dense(2, 8, activation="tanh"), nn.Dense(8, 1))
        opt = nn.SGD(net.trainable_params(), 0.05, momentum=0.9)
        loss_fn = nn.MSELoss()
        grad_fn = kiln.value_and_grad(lambda a, b: loss_fn(net(a), b), None, opt.parameters)

        def step(a, b):
            loss, grads = grad_fn(a, b)
            opt(grads)
            return loss

        return step

    r = np.random.default_rng(3)
    data = [(T(r.uniform(-1, 1, (16, 2)).astype(np.float32)), T(r.uniform(-1, 1, (16, 1)).astype(np.float32)))
            for _ in range(6)]
    eager_step = make()
    eager = [eager_step(a, b).item() for a, b in data]
    for verify in (True, False):
        step = trace(make(), verify=verify)
        traced = [step(a, b).item() for a, b in data]
        np.testing.assert_allclose(traced, eager, rtol=1e-5)
        assert "sgd_update(" in step.graph_str()


# ---- symbolic tracing ----------------------------------------------------------------------


@pytest.mark.parametrize("read", [
    lambda t: t.asnumpy(), lambda t: t.numpy(), lambda t: t.tolist(), lambda t: t.sum().item(),
    lambda t: bool(t.sum() > 0), lambda t: float(t.sum()), lambda t: int(t.sum()), lambda t: print(t),
    lambda t: repr(t), lambda t: str(t), lambda t: f"{t.sum():.3f}", lambda t: np.array(t.__array__()),
])
def test_symbolic_value_read_raises(read):
    @trace(symbolic=True)
    def f(a):
        y = a * 2
        read(y)
        return y

    with pytest.raises(RuntimeError, match="can't read the value of a traced tensor .* tracing symbolically"):
        f(rand(3))
    # the guard is gone afterwards, and a non-symbolic trace may read values
    assert "__bool__" not in kiln.Tensor.__dict__ and "item" not in kiln.Tensor.__dict__
    assert kiln.Tensor.__dict__["asnumpy"].__qualname__ == "Tensor.asnumpy"
    y = rand(3) * 2
    read(y)
    close(trace(lambda a: (read(a * 2), a * 2)[1])(rand(3)), rand(3) * 2)


def test_symbolic_may_read_captured_values():
    w = T(np.float32(3.0))

    @trace(symbolic=True)
    def f(a):
        return a * w if float(w) > 0 else a  # w is not traced: its value is known

    close(f(rand(4)), rand(4) * 3.0)


# ---- captured tensors -----------------------------------------------------------------------


def test_closure_tensor_is_live_by_default_and_baked_with_capture_as_const():
    w = T(np.ones(3, np.float32))

    def f(a):
        return a + w

    live = trace(f)
    baked = trace(f, capture_as_const=True, verify=False)
    checked = trace(f, capture_as_const=True)
    x = rand(3)
    for t in (live, baked, checked):
        close(t(x), x + 1.0)
    assert "= constant" in baked.graph_str() and "= captured" in live.graph_str()
    w.assign_value(T(np.full(3, 5.0, np.float32)))
    close(live(x), x + 5.0)   # captured by reference
    with pytest.raises(TraceMismatchError, match=r"captured constant %\d+ \(float32\[3\], read by add at "
                                                 r"test_trace.py:\d+\) was changed in place"):
        baked(x)  # baked in when traced: never silently the old value
    with pytest.raises(TraceMismatchError, match="a captured constant changed: closure variable 'w' has a "
                                                 "different value than when it was traced"):
        checked(x)


_G = T(np.ones(2, np.float32))


def _uses_global(a):
    return a * _G


def test_rebound_global_is_a_mismatch():
    global _G
    t = trace(_uses_global)
    x = rand(2)
    t(x)
    t(x)
    old = _G
    try:
        _G = T(np.full(2, 4.0, np.float32))
        with pytest.raises(TraceMismatchError, match="global '_G' refers to a different tensor"):
            t(x)
    finally:
        _G = old


def test_function_storing_a_global_is_not_a_mismatch():
    @trace
    def f(a):
        global _LAST
        _LAST = a * 2
        return _LAST + 1

    for i in range(3):
        x = rand(2, seed=i)
        close(f(x), x * 2 + 1)


# ---- every TraceMismatchError kind ----------------------------------------------------------


def _switchable(body):
    """A traced function whose behavior is body(flag, a) with flag set from outside."""
    state = {"flag": False}
    t = trace(lambda a: body(state["flag"], a))
    x = rand(2, 3)
    t(x)
    t(x)  # the recorded behavior matches
    state["flag"] = True
    return t, x


def test_mismatch_more_ops():
    t, x = _switchable(lambda flag, a: (a * 2 + 1) if flag else a * 2)
    with pytest.raises(TraceMismatchError, match=r"more ops than recorded: the trace recorded 1 ops, this call ran 2; "
                                                 r"the first one not recorded is op #1 \(add at test_trace.py:\d+\)"):
        t(x)


def test_mismatch_fewer_ops():
    t, x = _switchable(lambda flag, a: a.exp() if flag else a.exp().sin())
    with pytest.raises(TraceMismatchError, match=r"fewer ops than recorded: the trace recorded 2 ops, this call "
                                                 r"ran only 1; the first one missing is op #1 \(sin at "
                                                 r"test_trace.py:\d+\)"):
        t(x)


def test_mismatch_different_op():
    t, x = _switchable(lambda flag, a: a.sin() if flag else a.exp())
    with pytest.raises(TraceMismatchError, match=r"op #0: the trace recorded exp at test_trace.py:\d+, this call ran "
                                                 r"sin at test_trace.py:\d+"):
        t(x)


def test_mismatch_input_count():
    t, x = _switchable(lambda flag, a: kiln.ops.concat([a, a, a] if flag else [a, a], 0))
    with pytest.raises(TraceMismatchError, match=r"op #0 \(concat at .*\): the trace recorded it with 2 inputs, "
                                                 r"this call gave it 3"):
        t(x)


def test_mismatch_attributes():
    t, x = _switchable(lambda flag, a: a.sum(axis=1 if flag else 0))
    with pytest.raises(TraceMismatchError, match=r"op #0 \(sum at .*\): the trace recorded attributes \{1, 0\}, "
                                                 r"this call used \{2, 0\}"):
        t(x)


def test_mismatch_external_internal():
    w = rand(2, 3, seed=4)

    def body(flag, a):
        e = a.exp()
        return e * (w if flag else e)

    t, x = _switchable(body)
    with pytest.raises(TraceMismatchError, match=r"input 1 of op #1 \(mul at .*\) switched between external and "
                                                 r"internal: the trace recorded internal \(output 0 of op #0 \(exp at "
                                                 r".*\)\), this call gave external \(captured tensor #0 "
                                                 r"\(float32\[2, 3\]\)\)"):
        t(x)


def test_mismatch_wiring():
    def body(flag, a):
        e, s = a.exp(), a.sin()
        return e * (e if flag else s)

    t, x = _switchable(body)
    with pytest.raises(TraceMismatchError, match=r"input 1 of op #2 \(mul at .*\): different wiring: the trace "
                                                 r"recorded output 0 of op #1 \(sin at .*\), this call used output 0 "
                                                 r"of op #0 \(exp at .*\)"):
        t(x)


def test_mismatch_wiring_of_arguments():
    @trace
    def f(a, b, swap=False):
        return (b - a) if swap else (a - b)

    x, y = rand(3, seed=1), rand(3, seed=2)
    f(x, y, swap=False)
    with pytest.raises(TraceMismatchError, match=r"input 0 of op #0 \(sub at .*\): different wiring: the trace "
                                                 r"recorded argument args\[0\], this call used argument args\[1\]"):
        f(x, y, swap=True)


def test_mismatch_captured_constant():
    state = {"c": 2.0}
    t = trace(lambda a: a * state["c"])
    x = rand(3)
    close(t(x), x * 2.0)
    state["c"] = 3.0
    with pytest.raises(TraceMismatchError, match=r"input 1 of op #0 \(mul at .*\): a captured constant changed: the "
                                                 r"trace recorded the constant 2, this call used the constant 3"):
        t(x)


def test_mismatch_changed_dtype_of_argument_and_inside():
    t = trace(lambda a: a * 2)
    t(rand(3))
    with pytest.raises(TraceMismatchError, match=r"argument args\[0\] changed dtype: float32 when traced, float64 "
                                                 r"now"):
        t(rand(3).double())
    dt = {"d": kiln.float64}
    c = trace(lambda a: a.astype(dt["d"]) + 1)
    c(rand(3))
    dt["d"] = kiln.float16
    with pytest.raises(TraceMismatchError, match=r"op #0 \(cast at .*\): the trace recorded attributes"):
        c(rand(3))
    held = {"w": rand(3)}
    m = trace(lambda a: a * held["w"])
    m(rand(3))
    held["w"] = rand(3).double()
    with pytest.raises(TraceMismatchError, match=r"input 1 of op #0 \(mul at .*\): a captured tensor changed dtype: "
                                                 r"the trace recorded float32\[3\], this call used float64\[3\]"):
        m(rand(3))


def test_mismatch_changed_device():
    class Elsewhere(kiln.Tensor):
        __slots__ = ()
        device = property(lambda self: "xpu:0")

    t = trace(lambda a: a + 1)
    t(rand(3))
    with pytest.raises(TraceMismatchError, match=r"argument args\[0\] changed device: cpu when traced, xpu:0 now"):
        t(Elsewhere(np.zeros(3, np.float32)))


def test_mismatch_argument_count():
    t = trace(lambda a, b=None: a if b is None else a + b)
    t(rand(3))
    with pytest.raises(TraceMismatchError, match="different argument count: the function was traced with 1 "
                                                 "positional arguments, this call passes 2"):
        t(rand(3), rand(3))


def test_mismatch_keyword_arguments():
    t = trace(lambda a, scale=1.0, shift=None: a * scale if shift is None else a * scale + shift)
    x = rand(3)
    t(x, scale=2.0)
    with pytest.raises(TraceMismatchError, match=r"keyword arguments found to be tensor this time but were "
                                                 r"non-tensor when traced: scale \(was 2.0\)"):
        t(x, scale=T(np.float32(2.0)))
    with pytest.raises(TraceMismatchError, match=r"different keyword arguments: the function was traced with "
                                                 r"\['scale'\], this call passes \['scale', 'shift'\]"):
        t(x, scale=2.0, shift=x)
    u = trace(lambda a, scale: a * scale)
    u(x, scale=T(np.float32(2.0)))
    with pytest.raises(TraceMismatchError, match=r"keyword arguments found to be non-tensor this time but were "
                                                 r"tensor when traced: scale \(now 2.0\)"):
        u(x, scale=2.0)


def test_mismatch_positional_tensor_and_structure():
    t = trace(lambda a, b: a * b)
    t(rand(3), rand(3))
    with pytest.raises(TraceMismatchError, match=r"args\[1\] is a non-tensor \(2.0\) this time but was a tensor"):
        t(rand(3), 2.0)
    s = trace(lambda pair: pair[0] + pair[-1])
    s((rand(3), rand(3)))
    with pytest.raises(TraceMismatchError, match=r"args\[0\] is \(Tensor, Tensor, Tensor\) this time but was "
                                                 r"\(Tensor, Tensor\) when traced"):
        s((rand(3), rand(3), rand(3)))


def test_non_tensor_values_are_checked_by_the_rerun():
    t = trace(lambda a, n: a * n)
    x = rand(3)
    t(x, 2)
    with pytest.raises(TraceMismatchError, match="a captured constant changed"):
        t(x, 3)
    u = trace(lambda a, tag: a * 2)  # tag does not reach the graph: a new value is fine
    u(x, "first")
    close(u(x, "second"), x * 2)
    v = trace(lambda a, n: a * n, verify=False)
    v(x, 2)
    with pytest.raises(TraceMismatchError, match=r"args\[1\] is 3 this time but was 2 when traced; with verify=False"):
        v(x, 3)


def test_mismatch_outputs():
    t, x = _switchable(lambda flag, a: (a.exp(), a.sin()) if flag else (a.exp(), a.sin(), a))
    with pytest.raises(TraceMismatchError, match=r"different outputs: the traced function returned \(Tensor, Tensor, "
                                                 r"Tensor\), this call returned \(Tensor, Tensor\)"):
        t(x)

    def body(flag, a):
        e, s = a.exp(), a.sin()
        return s if flag else e

    t, x = _switchable(body)
    with pytest.raises(TraceMismatchError, match=r"different outputs: output tensor 0 was output 0 of op #0 \(exp at "
                                                 r".*\) in the trace, this call returned output 0 of op #1 \(sin"):
        t(x)


def test_mismatch_leaves_the_trace_usable():
    state = {"flag": False}
    t = trace(lambda a: a * 2 + 1 if state["flag"] else a * 2)
    x = rand(3)
    t(x)
    state["flag"] = True
    with pytest.raises(TraceMismatchError):
        t(x)
    state["flag"] = False
    close(t(x), x * 2)


# ---- settings -------------------------------------------------------------------------------


def test_profiling_warns_once_and_sublinear_memory_is_honoured_without_a_warning():
    x = rand(3)
    t = trace(lambda a: a + 1, sublinear_memory_config=SublinearMemoryConfig())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # recomputation runs (tests/python/test_sublinear.py): nothing to warn
        t(x)
        t(x)
        t(rand(5))
    assert t.memory_report()["recompute"] == "search"
    p = trace(lambda a: a + 1, profiling=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # profiling works: nothing to warn about
        p(x)
    assert p.profiling is True and t.sublinear_memory_config.thresh_nr_try == 10
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trace(lambda a: a + 1, opt_level=2, symbolic_shape=False)(x)


def test_sublinear_memory_config_fields_and_validation():
    c = SublinearMemoryConfig()
    assert (c.thresh_nr_try, c.genetic_nr_iter, c.genetic_pool_size, c.lb_memory_mb) == (10, 0, 20, 0)
    assert c.num_worker == max(1, (os.cpu_count() or 1) // 2) and c.num_worker >= 1
    c = SublinearMemoryConfig(5, 2, 8, 128, 3)
    assert (c.thresh_nr_try, c.genetic_nr_iter, c.genetic_pool_size, c.lb_memory_mb, c.num_worker) == (5, 2, 8, 128, 3)
    alias = SublinearMemoryConfig(lb_memory=64)
    assert alias.lb_memory_mb == 64 and alias.lb_memory == 64
    assert "lb_memory_mb=0" in repr(SublinearMemoryConfig())
    with pytest.raises(ValueError, match="num_worker must be >= 1"):
        SublinearMemoryConfig(num_worker=0)
    with pytest.raises(ValueError, match="thresh_nr_try must be >= 0"):
        SublinearMemoryConfig(thresh_nr_try=-1)
    with pytest.raises(TypeError, match="genetic_pool_size must be an int"):
        SublinearMemoryConfig(genetic_pool_size=2.5)
    with pytest.raises(ValueError, match="name the same setting"):
        SublinearMemoryConfig(lb_memory_mb=1, lb_memory=2)


def test_argument_validation():
    with pytest.raises(ValueError, match="opt_level must be 0, 1, 2, 3 or None"):
        trace(_f, opt_level=4)
    with pytest.raises(TypeError, match="symbolic must be True or False"):
        trace(_f, symbolic=1)
    with pytest.raises(TypeError, match="sublinear_memory_config must be a SublinearMemoryConfig"):
        trace(_f, sublinear_memory_config={"num_worker": 2})
    with pytest.raises(TypeError, match="expected a function or a Cell"):
        trace(3)
    for level in (None, 0, 1, 2, 3):
        assert trace(_f, opt_level=level).opt_level == level


def test_profile_needs_profiling():
    t = trace(_f, capture_as_const=True)
    x = rand(2)
    t(x, x, x)
    with pytest.raises(RuntimeError, match="made with profiling=False"):
        t.get_profile()
    with pytest.raises(RuntimeError, match="nothing traced yet"):
        trace(_f).graph_str()


def test_grad_of_a_trace_runs_eagerly():
    f = lambda a: (a * a).sum()  # noqa: E731
    t = trace(f)
    x = rand(4)
    t(x)
    calls = t._fast_hits
    np.testing.assert_allclose(kiln.grad(t)(x).asnumpy(), kiln.grad(f)(x).asnumpy())
    assert t._fast_hits == calls


def test_trace_inside_jit_contributes_ops():
    inner = trace(lambda a: a * 2)
    outer = kiln.jit(lambda a: inner(a) + 1)
    x = rand(3)
    close(outer(x), x * 2 + 1)
    close(outer(x), x * 2 + 1)


def test_side_effect_ops_come_from_the_op_table():
    """The ops a trace treats as side effects are those whose op-table flags say so (in-place
    writes, random draws, print, check; batch_norm in training), no list of names."""
    from kiln._optable import INFO

    flagged = {name for name, info in INFO.items() if info.side_effects}
    assert {"print", "check", "sgd_update", "adam_update", "slice_assign", "index_put", "rand", "randn", "dropout",
            "batch_norm"} <= flagged
    assert not {"add", "matmul", "reshape", "softmax"} & flagged

    def recorded(fn):
        t = trace(fn, verify=True)
        x = rand(3)
        t(x)
        return t._last.graph.has_effects

    def writes_in_place(x):
        y = x * 1
        y[0] = 1.0
        return y

    assert not recorded(lambda x: (x * 2).exp())
    assert recorded(writes_in_place)