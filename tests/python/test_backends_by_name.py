"""Backends by name: kiln.jit's backend= takes any backend registered in C (kiln._C.backend_names():
kbk, sink and the reference, which runs each node's op-table kernel and fused groups node by node)
besides MindSpore's aliases; an unknown name is refused naming the registered ones. The reference
gives what eager execution, kbk and the sink give, on graphs with a fused group, an if and a while, in every
capture mode and at O0/O1. kiln._C.CompileOptions is the one definition of a compile's options."""
import numpy as np
import pytest

import kiln
from kiln import _C
from kiln.jit.options import BACKENDS

MODES = ("ast", "bytecode", "trace")
LEVELS = ("O0", "O1")


def T(a):
    return kiln.tensor(np.asarray(a, dtype=np.float32))


def fused_chain(x, y):
    z = (x * y + 1.0).tanh() * x - y.exp()  # one fused group at O1
    return z.sum(axis=1), z


def branchy(x):
    if x.sum() > 10:  # a tensor condition: an if node in ast mode
        y = x * 2 + 1
    else:
        y = (x - 3).abs()
    return y


def grow_until(x):
    while x.sum() < 100:  # a while node in ast mode
        x = x * 1.5 + 0.1
    return x


CASES = [
    (fused_chain, lambda rng: (rng.standard_normal((4, 5)), rng.standard_normal((4, 5)))),
    (branchy, lambda rng: (rng.uniform(0, 1, (2, 3)),)),
    (branchy, lambda rng: (rng.uniform(5, 6, (2, 3)),)),
    (grow_until, lambda rng: (rng.uniform(0.5, 1.5, (2, 3)),)),
]


def leaves(out):
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def test_registered_names_and_aliases():
    names = _C.backend_names()
    assert names[:3] == ("kbk", "sink", "reference")
    assert {name: BACKENDS[name] for name in names} == {name: name for name in names}
    assert BACKENDS["ms_backend"] == "kbk" and BACKENDS["GE"] == "sink" and BACKENDS[""] == ""


def test_an_unknown_backend_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"backend must be one of .*'reference'.*got 'tpu'"):
        kiln.jit(fused_chain, backend="tpu")
    with pytest.raises(ValueError, match=r"unknown backend 'tpu'; registered backends: kbk, sink, reference"):
        _C.CompileOptions(backend="tpu")


@pytest.mark.filterwarnings("ignore:kiln.jit")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_reference_equals_eager_kbk_and_sink(mode, level, case):
    fn, make = CASES[case]
    rng = np.random.default_rng(case)
    calls = [tuple(T(a) for a in make(rng)) for _ in range(2)]
    results = {}
    for backend in ("kbk", "sink", "reference"):
        jf = kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)
        results[backend] = [leaves(jf(*args)) for args in calls + calls]  # capture, then replays
        if mode == "ast" or fn is fused_chain:  # (trace and bytecode run an if on a tensor eagerly / in pieces)
            assert jf._last.executable.backend == backend
    for k, args in enumerate(calls + calls):
        eager = leaves(fn(*args))
        for backend, got in results.items():
            for g, e in zip(got[k], eager):
                np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6, err_msg=f"{backend}, call {k}")


def test_the_graph_holds_the_fused_group_and_control_flow():
    x, y = T(np.ones((4, 5))), T(np.ones((4, 5)))
    jf = kiln.jit(fused_chain, capture_mode="ast", jit_level="O1", backend="reference")
    jf(x, y)
    assert "fused(" in jf._last.executable.graph_str()
    for fn, op in ((branchy, "if("), (grow_until, "while(")):
        jf = kiln.jit(fn, capture_mode="ast", backend="reference")
        jf(x)
        assert op in jf._last.executable.graph_str(), fn.__name__


def test_the_reference_runs_a_loaded_model(tmp_path):
    def mlp(x, w):
        return (x @ w + 1.0).relu().sum(axis=1)

    rng = np.random.default_rng(3)
    x, w = T(rng.standard_normal((3, 4))), T(rng.standard_normal((4, 2)))
    t = kiln.trace(mlp, capture_as_const=True)
    t(x, w)
    path = str(tmp_path / "mlp.kiln")
    t.dump(path)
    for backend in ("kbk", "sink", "reference"):
        loaded = kiln.load(path, backend=backend)
        np.testing.assert_allclose(loaded(x, w).numpy(), mlp(x, w).numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="registered backends: kbk, sink, reference"):
        kiln.load(path, backend="tpu")


def test_compile_options_validate_and_replace():
    o = _C.CompileOptions()
    assert (o.order, o.poison, o.level, o.inference, o.disable_format_transform, o.backend, o.sublinear) == (
        "bfs", False, 0, False, False, "kbk", None)
    r = o.replace(level=2, backend="reference")
    assert (r.level, r.backend, o.level, o.backend) == (2, "reference", 0, "kbk")
    assert r == _C.CompileOptions(level=2, backend="reference") and r != o
    with pytest.raises(ValueError, match="order must be 'bfs' or 'dfs'"):
        _C.CompileOptions(order="random")
    with pytest.raises(ValueError, match="level must be 0, 1 or 2"):
        o.replace(level=3)
    with pytest.raises(TypeError, match="sublinear must be None or a tuple"):
        _C.CompileOptions(sublinear=[1, 2])
    with pytest.raises(TypeError):
        _C.CompileOptions("bfs")  # keywords only


def test_jit_options_hold_one_compile_options():
    from kiln.jit.options import JitOptions

    o = JitOptions.make(jit_level="O1", backend="reference", exec_order="dfs", debug_poison=True, infer_boost="on")
    assert o.compile_options == _C.CompileOptions(order="dfs", poison=True, level=1, inference=True,
                                                  backend="reference")
    assert JitOptions.make(jit_level="O2").compile_options.backend == "sink"
