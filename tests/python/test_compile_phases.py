"""explain() names every compile phase kiln's profiler records while a jitted function captures and
compiles (capture, record, gradient, split, each pass, plan, prepare, codegen, ...): names only,
never times. Each case is a first call (forward, or forward and backward through value_and_grad)
run inside kiln.profiler.profile, on every capture mode, jit level and backend, with its results
checked against eager kiln and NumPy."""

import numpy as np
import pytest

import kiln
from kiln import nn, ops

VARIANTS = [dict(capture_mode=m, jit_level=lv, backend=b) for m in ("bytecode", "ast", "trace")
            for lv in ("O0", "O1") for b in ("kbk", "sink")]
ids = [f"{v['capture_mode']}-{v['jit_level']}-{v['backend']}" for v in VARIANTS]


def t(*shape, seed=0):
    return kiln.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def simple(a, b, c):
    return a * b + c


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(6, 6)

    def construct(self, x):
        return (ops.tanh(self.dense(x)) + x).sum()


def with_a_break(x):
    y = ops.exp(x * 0.5)
    print("a graph break")
    return (y * y).sum()


def recorded_and_listed(fn, *args):
    """(the call's result, the phase names the profile recorded, explain()'s phase names and text)."""
    with kiln.profiler.profile() as prof:
        result = fn(*args)
    recorded = {e["name"] for e in prof.events() if e["kind"] == "phase"}
    return result, recorded


def explained(jf):
    report = jf.explain()
    return {name for name, _, _ in report.phases}, str(report)


def check_listed(recorded, jf, must=()):
    names, text = explained(jf)
    assert recorded, "the profile recorded no compile phase"
    assert recorded <= names, f"recorded but not listed by explain(): {sorted(recorded - names)}"
    for name in recorded:
        assert f" {name} " in text
    assert set(must) <= recorded


@pytest.mark.parametrize("variant", VARIANTS, ids=ids)
def test_the_forward_capture_phases_are_listed(variant, capsys):
    a, b, c = t(2, 3, seed=1), t(2, 3, seed=2), t(2, 3, seed=3)
    jf = kiln.jit(simple, **variant)
    got, recorded = recorded_and_listed(jf, a, b, c)
    np.testing.assert_allclose(got.asnumpy(), a.asnumpy() * b.asnumpy() + c.asnumpy(), rtol=1e-6)
    check_listed(recorded, jf, ("capture", "record", "plan"))


@pytest.mark.parametrize("variant", VARIANTS, ids=ids)
def test_the_phases_of_forward_and_backward_are_listed(variant, capsys):
    kiln.manual_seed(0)
    net = Block()
    x = t(4, 6, seed=4)
    want = kiln.value_and_grad(net, None, net.trainable_params())(x)
    jf = kiln.jit(net, **variant)
    vg = kiln.value_and_grad(jf, None, net.trainable_params())
    for call in range(2):  # (bytecode: the second call compiles forward and backward as one graph)
        (value, grads), recorded = recorded_and_listed(vg, x)
        np.testing.assert_allclose(value.asnumpy(), want[0].asnumpy(), rtol=1e-5, atol=1e-5)
        for g, w in zip(grads, want[1]):
            np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-4, atol=1e-5)
        if call == 0 or recorded:
            must = ("capture", "gradient", "split") if variant["capture_mode"] == "bytecode" and call == 0 else ()
            check_listed(recorded, jf, must)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v["capture_mode"] == "bytecode"],
                         ids=[i for i in ids if i.startswith("bytecode")])
def test_the_phases_of_each_graph_around_a_break_are_listed(variant, capsys):
    x = t(3, 4, seed=5)
    jf = kiln.jit(with_a_break, **variant)
    got, recorded = recorded_and_listed(jf, x)
    np.testing.assert_allclose(got.asnumpy(), np.exp(x.asnumpy().astype(np.float64)).sum(), rtol=1e-5)
    check_listed(recorded, jf, ("capture", "record"))
    assert explained(jf)[1].count("capture") >= 1 and jf.explain().graph_break_count == 1


def test_a_function_never_called_lists_no_phase(capsys):
    jf = kiln.jit(simple, capture_mode="bytecode")
    assert jf.explain().phases == []
    assert "compile phases" not in str(jf.explain())


def test_phase_only_session_keeps_phases_not_kernels():
    """The session a capture runs under records its compile phases but none of its eager run's
    kernels or allocations; a user's full session open at the same time still gets everything."""
    from kiln import _C

    a = t(64, 64)
    mark = _C.profile_start_phases()
    try:
        start = _C.profile_now()
        (a * a + a).sum()
        _C.profile_phase("probe", start, "a phase")
        events = _C.profile_events(mark)
    finally:
        _C.profile_stop_phases()
    kinds = {e["kind"] for e in events}
    assert kinds == {"phase"} and [e["name"] for e in events] == ["probe"]

    full = _C.profile_start()
    inner = _C.profile_start_phases()
    try:
        (a * a).sum()
        assert {e["kind"] for e in _C.profile_events(full)} >= {"kernel", "alloc"}
        assert [e for e in _C.profile_events(inner, "kernel")]  # one list: both sessions read it
    finally:
        _C.profile_stop_phases()
        _C.profile_stop()


def test_first_call_phases_named_without_kernel_events():
    """explain() still lists the record phase of a trace capture after the switch to phase-only sessions."""
    f = kiln.jit(simple, capture_mode="trace")
    out = f(t(3, 4), t(3, 4, seed=1), t(3, 4, seed=2))
    np.testing.assert_allclose(out.asnumpy(), simple(t(3, 4), t(3, 4, seed=1), t(3, 4, seed=2)).asnumpy())
    assert "record" in str(f.explain())
