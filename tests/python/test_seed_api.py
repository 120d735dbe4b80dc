"""The rest of the seeds' API surface: MindSpore's positional dtypes in creation ops, jit's
dynamic and ge_options, set_context / get_context; MegEngine's trace parameters (record_only,
dtr_config, graph_opt_config, opt_level), its config classes and module paths."""
import numpy as np
import pytest

import kiln
from kiln import ops


# ---- creation ops: MindSpore's positional dtype -------------------------------------------


def test_creation_ops_take_a_positional_dtype_after_the_shape():
    z = ops.zeros((2, 4), kiln.float32)
    assert z.shape == (2, 4) and z.dtype == kiln.float32
    np.testing.assert_array_equal(z.asnumpy(), np.zeros((2, 4), np.float32))
    o = ops.ones((2, 4), kiln.int32)
    assert o.dtype == kiln.int32
    np.testing.assert_array_equal(o.asnumpy(), np.ones((2, 4), np.int32))
    f = ops.full((2, 4), 3.0, kiln.float64)
    assert f.dtype == kiln.float64
    np.testing.assert_array_equal(f.asnumpy(), np.full((2, 4), 3.0))
    assert ops.zeros(3, kiln.int64).dtype == kiln.int64 and ops.zeros(3, kiln.int64).shape == (3,)
    assert ops.ones(2, 3, kiln.float64).shape == (2, 3)


def test_creation_ops_keep_their_other_call_forms():
    assert ops.zeros(2, 4, dtype=kiln.int32).dtype == kiln.int32
    assert ops.zeros([2, 4]).shape == (2, 4) and ops.zeros(5).dtype == kiln.float32
    assert ops.ones((3,), dtype=kiln.float64).dtype == kiln.float64
    assert ops.full((2,), 7).dtype == kiln.int64 and ops.full(2, True).dtype == kiln.bool
    with pytest.raises(TypeError, match=r"zeros: dtype given twice, positionally \(float32\)"):
        ops.zeros((2, 4), kiln.float32, dtype=kiln.int32)
    with pytest.raises(TypeError, match="ones: shape entries must be ints"):
        ops.ones(kiln.float32)


# ---- kiln.jit(dynamic=...) and ge_options ---------------------------------------------------


def _x(shape=(2, 3), seed=0):
    return kiln.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def test_jit_dynamic_accepts_mindspore_ints_and_bools():
    for value, stored in ((0, False), (1, True), (False, False), (True, True), (None, None)):
        f = kiln.jit(lambda a: a * 2 + 1, dynamic=value)
        assert f.options.dynamic is stored
        x = _x()
        np.testing.assert_allclose(f(x).asnumpy(), x.asnumpy() * 2 + 1, rtol=1e-6)
    for bad in (2, -1, "1", 1.0):
        with pytest.raises(ValueError, match=f"jit: dynamic must be 0, 1, False, True or None, got {bad!r}"):
            kiln.jit(lambda a: a, dynamic=bad)
    with pytest.raises(TypeError, match="jit: fullgraph must be True or False, got 1"):
        kiln.jit(lambda a: a, fullgraph=1)


def test_ge_options_are_checked_recorded_and_listed_in_one_warning():
    ge = {"global": {"ge.exec.precision_mode": "must_keep_origin_dtype"}, "session": {"ge.exec.atomicCleanPolicy": "1"}}
    with pytest.warns(UserWarning) as record:
        f = kiln.jit(lambda a: ops.exp(a) + a, backend="GE", ge_options=ge)
    assert len(record) == 1
    msg = str(record[0].message)
    assert "global 'ge.exec.precision_mode'" in msg and "session 'ge.exec.atomicCleanPolicy'" in msg
    assert f.options.ge_options == ge and f.options.ge_options is not ge and f.options.backend == "sink"
    x = _x()
    np.testing.assert_allclose(f(x).asnumpy(), np.exp(x.asnumpy()) + x.asnumpy(), rtol=1e-5)
    np.testing.assert_allclose(f(x).asnumpy(), np.exp(x.asnumpy()) + x.asnumpy(), rtol=1e-5)
    # the sink alias, O2's default backend and JitConfig's sink mode take them too; empty groups: no warning
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kiln.jit(lambda a: a, backend="sink", ge_options={"global": {}}).options.ge_options == {"global": {}}
        assert kiln.jit(lambda a: a, jit_level="O2", ge_options={}).options.ge_options == {}
        kiln.JitConfig(exc_mode="sink", ge_options={"session": {}})
    assert kiln.jit(lambda a: a).options.ge_options is None


def test_ge_options_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="ge_options apply to backend=\"GE\" .*got backend='ms_backend'"):
        kiln.jit(lambda a: a, backend="ms_backend", ge_options={"global": {}})
    with pytest.raises(ValueError, match="got backend='' \\(kernel by kernel at this jit_level\\)"):
        kiln.jit(lambda a: a, ge_options={"global": {}})
    with pytest.raises(ValueError, match="ge_options accepts the keys 'global' and 'session', got 'graph'"):
        kiln.jit(lambda a: a, backend="GE", ge_options={"graph": {}})
    with pytest.raises(TypeError, match="ge_options must be a dict with keys 'global' and 'session', got list"):
        kiln.jit(lambda a: a, backend="GE", ge_options=[("global", {})])
    with pytest.raises(TypeError, match=r"ge_options\['session'\] must map str to str, got 'ge.x': 1"):
        kiln.jit(lambda a: a, backend="GE", ge_options={"session": {"ge.x": 1}})
    with pytest.raises(TypeError, match=r"ge_options\['global'\] must be a dict of str to str, got str"):
        kiln.jit(lambda a: a, backend="GE", ge_options={"global": "ge.x=1"})
    with pytest.raises(ValueError, match="ge_options apply to backend=\"GE\""):
        kiln.JitConfig(exc_mode="no_sink", ge_options={"global": {}})


# ---- set_context / get_context --------------------------------------------------------------


@pytest.fixture
def context():
    """Restores set_context's settings after a test."""
    saved = {name: kiln.get_context(name) for name in ("mode", "jit_syntax_level")}
    yield
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kiln.set_context(**saved)


def test_context_defaults_constants_and_validation(context):
    assert (kiln.GRAPH_MODE, kiln.PYNATIVE_MODE) == (0, 1)
    assert kiln.get_context("mode") == kiln.PYNATIVE_MODE and kiln.get_context("jit_syntax_level") == "LAX"
    kiln.set_context(jit_syntax_level=kiln.STRICT)
    assert kiln.get_context("jit_syntax_level") == "STRICT"
    kiln.set_context(mode=kiln.PYNATIVE_MODE, jit_syntax_level="LAX")
    assert kiln.get_context("jit_syntax_level") == "LAX"
    with pytest.raises(ValueError, match="set_context: mode must be kiln.GRAPH_MODE \\(0\\) or kiln.PYNATIVE_MODE "
                                         "\\(1\\), got 2"):
        kiln.set_context(mode=2)
    with pytest.raises(ValueError, match="set_context: jit_syntax_level must be 'STRICT' or 'LAX', got 'COMPATIBLE'"):
        kiln.set_context(jit_syntax_level="COMPATIBLE")
    with pytest.raises(ValueError, match="set_context: unknown setting 'enable_graph_kernel'; accepted: mode, "
                                         "jit_syntax_level, device_target, device_id"):
        kiln.set_context(enable_graph_kernel=True)
    with pytest.raises(ValueError, match="get_context: unknown setting 'speed'"):
        kiln.get_context("speed")
    # a rejected call changes nothing
    with pytest.raises(ValueError):
        kiln.set_context(jit_syntax_level="STRICT", mode=7)
    assert kiln.get_context("jit_syntax_level") == "LAX"


def test_graph_mode_runs_cells_compiled(context):
    import numpy as np

    kiln.manual_seed(0)
    net = kiln.nn.SequentialCell(kiln.nn.Dense(3, 4), kiln.nn.ReLU(), kiln.nn.Dense(4, 2))
    x = kiln.Tensor(np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32))
    want = net(x).asnumpy()  # PYNATIVE_MODE: eager
    assert "_graph_jitted" not in net.__dict__
    kiln.set_context(mode=kiln.GRAPH_MODE)
    assert kiln.get_context("mode") == kiln.GRAPH_MODE
    for _ in range(3):
        np.testing.assert_array_equal(net(x).asnumpy(), want)
    info = net.__dict__["_graph_jitted"].cache_info()
    assert info.compiles == 1 and info.hits == 2, info
    inner = net.__dict__["_cells"]
    assert all("_graph_jitted" not in c.__dict__ for c in inner.values())  # part of the outer graph
    kiln.set_context(mode=kiln.PYNATIVE_MODE)
    np.testing.assert_array_equal(net(x).asnumpy(), want)
    assert net.__dict__["_graph_jitted"].cache_info().hits == 2  # eager again


def _lax_run(call):
    """call() under LAX: the ast mode can't compile the read, falls back to trace, then runs eagerly."""
    import warnings
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out = call()
    messages = " | ".join(str(w.message) for w in record)
    assert "falls back to trace capture" in messages and "runs eagerly" in messages, messages
    return out


def _reads_a_value(a):
    if float(a.sum()) > 0:  # a tensor read as a Python number: STRICT refuses it
        return a + 1
    return a - 1


def test_an_empty_syntax_level_defers_to_set_context(context):
    x = _x((3,), seed=1)
    kiln.set_context(jit_syntax_level="STRICT")
    with pytest.raises(kiln.JitSyntaxError, match=r"float\(\) of a tensor value"):
        kiln.jit(_reads_a_value)(x)
    with pytest.raises(kiln.JitSyntaxError, match=r"float\(\) of a tensor value"):
        kiln.jit(_reads_a_value, jit_syntax_level="")(x)
    # read when the function is captured, not when it is wrapped
    f = kiln.jit(_reads_a_value)
    kiln.set_context(jit_syntax_level="LAX")
    out = _lax_run(lambda: f(x))
    np.testing.assert_allclose(out.asnumpy(), _reads_a_value(x).asnumpy())
    # the function's own level, or fullgraph, wins over the context
    kiln.set_context(jit_syntax_level="STRICT")
    _lax_run(lambda: kiln.jit(_reads_a_value, jit_syntax_level="LAX")(x))
    kiln.set_context(jit_syntax_level="LAX")
    with pytest.raises(kiln.JitSyntaxError):
        kiln.jit(_reads_a_value, fullgraph=True)(x)
    assert kiln.jit(_reads_a_value).options.jit_syntax_level == "LAX"


def test_jit_config_with_an_empty_syntax_level_defers_to_set_context(context):
    from kiln import nn

    class Net(nn.Cell):
        def construct(self, a):
            return _reads_a_value(a)

    x = _x((3,), seed=2)
    kiln.set_context(jit_syntax_level="STRICT")
    net = Net()
    net.set_jit_config(kiln.JitConfig(jit_level="O0"))
    assert kiln.JitConfig().jit_syntax_level == ""
    with pytest.raises(kiln.JitSyntaxError):
        net(x)
    lax = Net()
    lax.set_jit_config(kiln.JitConfig(jit_level="O0", jit_syntax_level="LAX"))
    np.testing.assert_allclose(_lax_run(lambda: lax(x)).asnumpy(), _reads_a_value(x).asnumpy())


# ---- MegEngine's module paths ---------------------------------------------------------------


def test_megengine_module_paths_and_the_callable_jit_package():
    import importlib
    import inspect

    import kiln.jit.tracing
    from kiln.jit.dtr_config import DTRConfig
    from kiln.jit.graph_opt_config import GraphOptimizationConfig
    from kiln.jit.sublinear_memory_config import SublinearMemoryConfig
    from kiln.jit.tracing import TraceMismatchError, trace

    assert trace is kiln.trace is kiln.jit.trace is kiln.jit.tracing.trace
    assert TraceMismatchError is kiln.TraceMismatchError is kiln.jit.TraceMismatchError
    assert issubclass(TraceMismatchError, RuntimeError)
    assert SublinearMemoryConfig is kiln.SublinearMemoryConfig is kiln.jit.SublinearMemoryConfig
    assert DTRConfig is kiln.jit.DTRConfig and GraphOptimizationConfig is kiln.jit.GraphOptimizationConfig
    assert importlib.import_module("kiln.jit") is kiln.jit
    assert "capture_mode" in inspect.signature(kiln.jit).parameters
    # the package still works as MindSpore's jit, in every form
    x = _x()

    @kiln.jit
    def double(a):
        return a * 2

    @kiln.jit(capture_mode="trace", jit_level="O1")
    def triple(a):
        return a * 3

    np.testing.assert_allclose(double(x).asnumpy(), x.asnumpy() * 2)
    np.testing.assert_allclose(triple(x).asnumpy(), x.asnumpy() * 3)
    np.testing.assert_allclose(kiln.jit(function=lambda a: a + 1)(x).asnumpy(), x.asnumpy() + 1)
    assert isinstance(double, kiln.jit.JitFunction) and kiln.jit.jit(double).fn is double.fn
    from kiln import jit
    assert jit is kiln.jit


# ---- DTRConfig, GraphOptimizationConfig ------------------------------------------------------


def test_dtr_config_fields_and_validation():
    c = kiln.jit.DTRConfig(eviction_threshold=1 << 30)
    assert (c.eviction_threshold, c.evictee_minimum_size, c.recomp_memory_factor, c.recomp_time_factor) == \
        (1 << 30, 1 << 20, 1, 1)
    c = kiln.jit.DTRConfig(4096, 0, 0.5, 2)
    assert (c.evictee_minimum_size, c.recomp_memory_factor, c.recomp_time_factor) == (0, 0.5, 2)
    assert "eviction_threshold=4096" in repr(c)
    with pytest.raises(ValueError, match="DTRConfig: eviction_threshold must be > 0 .*got 0"):
        kiln.jit.DTRConfig()
    with pytest.raises(TypeError, match="DTRConfig: eviction_threshold must be an int \\(bytes\\), got 1.5"):
        kiln.jit.DTRConfig(1.5)
    with pytest.raises(ValueError, match="DTRConfig: evictee_minimum_size must be >= 0, got -1"):
        kiln.jit.DTRConfig(1, -1)
    with pytest.raises(ValueError, match="DTRConfig: recomp_time_factor must be >= 0, got -0.5"):
        kiln.jit.DTRConfig(1, recomp_time_factor=-0.5)
    with pytest.raises(TypeError, match="DTRConfig: recomp_memory_factor must be a number, got '1'"):
        kiln.jit.DTRConfig(1, recomp_memory_factor="1")


def test_graph_opt_config_fields_and_validation():
    c = kiln.jit.GraphOptimizationConfig()
    assert c.jit_fuse_dimshuffle is None and c.jit_fuse_reduce is None
    assert repr(c) == "GraphOptimizationConfig { jit_fuse_dimshuffle = UNSET, jit_fuse_reduce = UNSET }"
    c.jit_fuse_reduce = True  # MegEngine's way: set after construction
    c.jit_fuse_dimshuffle = False
    assert repr(c) == "GraphOptimizationConfig { jit_fuse_dimshuffle = OFF, jit_fuse_reduce = ON }"
    assert kiln.jit.GraphOptimizationConfig(jit_fuse_reduce=False).jit_fuse_reduce is False
    with pytest.raises(TypeError, match="GraphOptimizationConfig: jit_fuse_reduce must be True, False or None, got 1"):
        c.jit_fuse_reduce = 1
    with pytest.raises(TypeError, match="jit_fuse_dimshuffle must be True, False or None, got 'on'"):
        kiln.jit.GraphOptimizationConfig(jit_fuse_dimshuffle="on")
    with pytest.raises(AttributeError):
        c.jit_fuse_elemwise = True  # no such switch
    assert c.jit_fuse_reduce is True


# ---- kiln.trace: MegEngine's parameters ----------------------------------------------------


def _softmax_like(a):
    e = ops.exp(a * 2.0 + 1.0)
    return e / e.sum(axis=-1, keepdims=True)


def _np_softmax_like(a):
    e = np.exp(a * 2.0 + 1.0)
    return e / e.sum(axis=-1, keepdims=True)


def test_opt_level_maps_onto_kiln_levels_and_results_match():
    x = _x((4, 8), seed=3)
    expected = _np_softmax_like(x.asnumpy())
    for opt_level, level in ((0, "O0"), (1, "O0"), (2, "O1"), (3, "O2"), (None, "O1")):
        t = kiln.trace(_softmax_like, opt_level=opt_level)
        assert t.opt_level == opt_level and t.jit_level == level
        for _ in range(3):  # the recording call, then compiled calls (verified)
            np.testing.assert_allclose(t(x).asnumpy(), expected, rtol=1e-5, atol=1e-6)
        fused = "fused(" in t.graph_str()
        assert fused == (level != "O0"), (opt_level, t.graph_str())
    assert kiln.trace(_softmax_like).opt_level == 2  # MegEngine's default
    for bad in (4, -1, 2.0, True, "2"):
        with pytest.raises(ValueError, match=f"trace: opt_level must be 0, 1, 2, 3 or None, got {bad!r}"):
            kiln.trace(_softmax_like, opt_level=bad)


def test_an_optimized_trace_still_checks_each_call_against_the_recording():
    state = {"op": "mul"}

    def f(a):
        b = ops.exp(a)
        return b * 2.0 if state["op"] == "mul" else b + 2.0

    t = kiln.trace(f, opt_level=3)
    x = _x((3, 4), seed=4)
    t(x)
    np.testing.assert_allclose(t(x).asnumpy(), np.exp(x.asnumpy()) * 2, rtol=1e-5)
    state["op"] = "add"
    with pytest.raises(kiln.TraceMismatchError, match="op #1: the trace recorded mul.*this call ran add"):
        t(x)


def test_record_only_records_every_call_and_never_runs_the_compiled_graph():
    calls = []

    def f(a, b):
        calls.append(1)
        return ops.exp(a) * b if len(calls) < 3 else a - b  # a different graph from the third call

    t = kiln.trace(f, record_only=True)
    x, y = _x((2, 3), seed=5), _x((2, 3), seed=6)
    np.testing.assert_allclose(t(x, y).asnumpy(), np.exp(x.asnumpy()) * y.asnumpy(), rtol=1e-6)
    assert "exp(" in t.graph_str()
    np.testing.assert_allclose(t(x, y).asnumpy(), np.exp(x.asnumpy()) * y.asnumpy(), rtol=1e-6)
    # no mismatch: each call is a new recording, run eagerly
    np.testing.assert_allclose(t(x, y).asnumpy(), x.asnumpy() - y.asnumpy())
    assert "sub(" in t.graph_str() and "exp(" not in t.graph_str()
    assert len(calls) == 3 and t._fast_hits == 0
    # new shapes and argument kinds are recorded too, with no mismatch
    np.testing.assert_allclose(t(_x((5,)), 2.0).asnumpy(), _x((5,)).asnumpy() - 2.0)
    assert t.record_only is True and kiln.trace(f).record_only is False
    with pytest.raises(TypeError, match="trace: record_only must be True or False, got 1"):
        kiln.trace(f, record_only=1)


def test_record_only_runs_side_effects_once_per_call():
    w = kiln.Tensor(np.zeros(3, np.float32))

    def step(a):
        w[:] = w + a  # in place, once per call
        return w * 1.0

    t = kiln.trace(step, record_only=True, opt_level=3)
    one = kiln.Tensor(np.ones(3, np.float32))
    for k in range(1, 4):
        np.testing.assert_array_equal(t(one).asnumpy(), np.full(3, k, np.float32))
    np.testing.assert_array_equal(w.asnumpy(), np.full(3, 3, np.float32))


def test_dtr_config_is_accepted_and_one_warning_names_it():
    import warnings

    cfg = kiln.jit.DTRConfig(eviction_threshold=1 << 20)
    t = kiln.trace(lambda a: a * 3, dtr_config=cfg)
    assert t.dtr_config is cfg
    x = _x()
    with pytest.warns(UserWarning, match="dtr_config \\(kiln has no dynamic tensor rematerialization\\) has no effect"):
        np.testing.assert_allclose(t(x).asnumpy(), x.asnumpy() * 3, rtol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t(x)
        t(_x((4,)))
    with pytest.raises(TypeError, match="trace: dtr_config must be a DTRConfig or None, got dict"):
        kiln.trace(lambda a: a, dtr_config={"eviction_threshold": 1})


def test_everything_ignored_is_listed_in_one_warning():
    goc = kiln.jit.GraphOptimizationConfig(jit_fuse_dimshuffle=True, jit_fuse_reduce=False)
    t = kiln.trace(lambda a: a + 1, sublinear_memory_config=kiln.SublinearMemoryConfig(),
                   dtr_config=kiln.jit.DTRConfig(1), profiling=True, graph_opt_config=goc)
    with pytest.warns(UserWarning) as record:
        t(_x())
    assert len(record) == 1
    msg = str(record[0].message)
    for what in ("dtr_config", "jit_fuse_dimshuffle=True",
                 "jit_fuse_reduce=False (kiln's O1, which opt_level=2 runs"):
        assert what in msg, msg
    assert "profiling" not in msg  # profiling=True works (issue 14)
    assert "sublinear_memory_config" not in msg, msg  # honoured since issue 15
    assert msg.endswith("have no effect yet")


def test_graph_opt_config_fusion_switches_map_onto_kiln_fusion():
    import warnings

    x = _x((4, 8), seed=7)
    expected = _np_softmax_like(x.asnumpy())
    on = kiln.trace(_softmax_like, opt_level=0, graph_opt_config=kiln.jit.GraphOptimizationConfig(jit_fuse_reduce=True))
    assert on.jit_level == "O1"  # reduce fusion needs kiln's fusion: O1 at least
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            np.testing.assert_allclose(on(x).asnumpy(), expected, rtol=1e-5, atol=1e-6)
    assert "fused(" in on.graph_str()
    # False holds at O0 (nothing is fused) and None leaves it to opt_level: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        off = kiln.trace(_softmax_like, opt_level=1,
                         graph_opt_config=kiln.jit.GraphOptimizationConfig(jit_fuse_reduce=False,
                                                                          jit_fuse_dimshuffle=False))
        off(x)
        assert off.jit_level == "O0" and "fused(" not in off.graph_str()
        unset = kiln.trace(_softmax_like, opt_level=3, graph_opt_config=kiln.jit.GraphOptimizationConfig())
        unset(x)
        assert unset.jit_level == "O2"
    with pytest.raises(TypeError, match="trace: graph_opt_config must be a GraphOptimizationConfig or None, got dict"):
        kiln.trace(_softmax_like, graph_opt_config={"jit_fuse_reduce": True})


def test_trace_method_runs_the_function_like_a_call():
    t = kiln.trace(lambda a, b: a * b + 1)
    x, y = _x(seed=8), _x(seed=9)
    np.testing.assert_allclose(t.trace(x, y).asnumpy(), x.asnumpy() * y.asnumpy() + 1, rtol=1e-6)  # records
    assert "mul(" in t.graph_str()
    np.testing.assert_allclose(t(x, y).asnumpy(), x.asnumpy() * y.asnumpy() + 1, rtol=1e-6)
    np.testing.assert_allclose(t.trace(y, x).asnumpy(), y.asnumpy() * x.asnumpy() + 1, rtol=1e-6)  # compiled
    with pytest.raises(kiln.TraceMismatchError, match="different argument count"):
        t.trace(x)


def test_new_parameters_follow_a_traced_method_to_its_instances():
    class Model:
        def __init__(self, k):
            self.k = k

        @kiln.trace(opt_level=3, record_only=True, dtr_config=kiln.jit.DTRConfig(8))
        def forward(self, a):
            return a * self.k

    m = Model(5.0)
    x = _x()
    with pytest.warns(UserWarning, match="dtr_config"):
        np.testing.assert_allclose(m.forward(x).asnumpy(), x.asnumpy() * 5, rtol=1e-6)
    bound = m.forward
    assert bound.record_only and bound.jit_level == "O2" and bound.dtr_config.eviction_threshold == 8


def test_a_jit_config_with_ge_options_warns_once_and_its_cell_runs_sunk():
    import warnings

    from kiln import nn

    with pytest.warns(UserWarning, match="no use for session 'ge.exec.x'") as record:
        cfg = kiln.JitConfig(jit_level="O2", ge_options={"session": {"ge.exec.x": "1"}})
    assert len(record) == 1
    kiln.manual_seed(0)
    net = nn.Dense(3, 2)
    x = _x((4, 3), seed=10)
    eager = net(x).asnumpy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        net.set_jit_config(cfg)
        for _ in range(2):
            np.testing.assert_allclose(net(x).asnumpy(), eager, rtol=1e-5, atol=1e-6)
    assert net._jitted.options.backend == "sink"
    assert net._jitted.options.ge_options == {"session": {"ge.exec.x": "1"}}
