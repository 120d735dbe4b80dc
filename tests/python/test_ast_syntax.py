"""capture_mode="ast" syntax levels: STRICT (fullgraph=True, jit_syntax_level="STRICT" as an
option, through JitConfig or Cell.set_jit_config) raises kiln.JitSyntaxError naming the file,
line, column, construct and a hint; LAX (the default) falls back to trace capture (or eager
execution) with one warning and eager's results; functions without source."""
import inspect
import re
import math
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.jit.replay import mark_not_replayable


def T(a):
    return kiln.tensor(np.asarray(a, np.float32))


X = T(np.arange(6).reshape(2, 3) + 1)
COUNTER = [0]


def position(fn, text):
    """(line, 1-based column) of the first occurrence of text in fn's source."""
    lines, first = inspect.getsourcelines(fn)
    start = next(k for k, line in enumerate(lines) if line.lstrip().startswith("def "))
    for k, line in enumerate(lines[start + 1:], start + 1):
        col = line.find(text)
        if col >= 0:
            return first + k, col + 1
    raise AssertionError(f"{text!r} not in the source of {fn.__name__}")


# ---- functions the converter rejects (construct, the text it starts at) ------------------


def uses_try(x):
    y = x * 2
    try:
        y = y + 1
    except ValueError:
        y = y - 1
    return y


def uses_with(x):
    with kiln.no_grad():
        y = x * 2
    return y


def uses_global(x):
    global COUNTER
    return x * 2


def uses_del(x):
    y = x * 2
    z = y + 1
    del y
    return z


def uses_class(x):
    class Local:
        pass
    return x * 2


def uses_walrus(x):
    return x * (n := 2) + n


def uses_import(x):
    import math as m
    return x * m.pi


def uses_decorated_def(x):
    @staticmethod
    def inner(v):
        return v * 2
    return x + 1


def uses_yield(x):
    yield x * 2


REJECTED = [
    (uses_try, "try", "a try statement"),
    (uses_with, "with", "a with statement"),
    (uses_global, "global", "a global declaration"),
    (uses_del, "del", "a del statement"),
    (uses_class, "class", "a class definition"),
    (uses_walrus, "n := 2", "an assignment expression"),
    (uses_import, "import", "an import statement"),
    (uses_decorated_def, "def inner", "a decorated function definition"),
    (uses_yield, "yield", "yield"),
]


def _assert_names(err, fn, text, construct):
    line, col = position(fn, text)
    msg = str(err)
    assert construct in msg, msg
    assert f"{__file__}:{line}:{col}" in msg, (msg, line, col)
    assert err.filename == __file__ and err.lineno == line and err.offset == col
    assert err.hint and err.hint in msg
    assert isinstance(err, SyntaxError)


@pytest.mark.parametrize("fn, text, construct", REJECTED, ids=[r[0].__name__ for r in REJECTED])
def test_strict_rejects_with_file_line_column_construct_and_hint(fn, text, construct):
    with pytest.raises(kiln.JitSyntaxError) as e:
        kiln.jit(fn, fullgraph=True)(X)
    _assert_names(e.value, fn, text, construct)


@pytest.mark.parametrize("make", [
    lambda f: kiln.jit(f, jit_syntax_level="STRICT"),
    lambda f: kiln.jit(f, fullgraph=False, jit_syntax_level="STRICT"),
], ids=["option", "option-over-fullgraph"])
def test_strict_through_the_option(make):
    with pytest.raises(kiln.JitSyntaxError, match="a try statement"):
        make(uses_try)(X)


def test_lax_option_overrides_fullgraph():
    with pytest.warns(RuntimeWarning, match="a try statement"):
        out = kiln.jit(uses_try, fullgraph=True, jit_syntax_level="LAX")(X)
    np.testing.assert_allclose(out.asnumpy(), uses_try(X).asnumpy())


LAX_CASES = [r for r in REJECTED if r[0] is not uses_yield]


@pytest.mark.parametrize("fn, text, construct", LAX_CASES, ids=[r[0].__name__ for r in LAX_CASES])
def test_lax_falls_back_with_one_warning_and_eager_results(fn, text, construct):
    jf = kiln.jit(fn)
    with pytest.warns(RuntimeWarning) as record:
        out = jf(X)
    msgs = [str(w.message) for w in record if "kiln.jit" in str(w.message)]
    assert len(msgs) == 1, msgs
    line, col = position(fn, text)
    assert construct in msgs[0] and f":{line}:{col}" in msgs[0], msgs[0]
    np.testing.assert_allclose(out.asnumpy(), fn(X).asnumpy())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            np.testing.assert_allclose(jf(X).asnumpy(), fn(X).asnumpy())
    assert jf.cache_info().compiles == 1  # traced, then served compiled


# ---- problems found while capturing ---------------------------------------------------------


def int_of_tensor(x):
    n = int(x.sum())
    return x * n


def string_chosen_by_tensor(x):
    mode = "a"
    if x.sum() > 0:
        mode = "b"
    return x * 2, mode


def callee_with_try(x):
    try:
        return x * 2
    except ValueError:
        return x


def calls_bad_callee(x):
    return callee_with_try(x) + 1


def write_under_tensor_if(x):
    y = x * 1
    if x.sum() > 0:
        y[0] = 0.0
    return y


def write_in_tensor_loop(x):
    y = x * 1
    while y.sum() < 100:
        y[0] += 1.0
        y = y * 2
    return y


RUNTIME = [
    (int_of_tensor, "int(x.sum())", "int() of a tensor value"),
    (write_under_tensor_if, "if x.sum()", "a subscript assignment (an in-place write) inside an if on a tensor"),
    (write_in_tensor_loop, "while", "a subscript assignment (an in-place write) inside a loop on a tensor"),
    (string_chosen_by_tensor, "if x.sum() > 0", "variable 'mode' (str) changed by an if on a tensor"),
]


@pytest.mark.parametrize("fn, text, construct", RUNTIME, ids=[r[0].__name__ for r in RUNTIME])
def test_strict_rejects_what_only_capture_reveals(fn, text, construct):
    with pytest.raises(kiln.JitSyntaxError) as e:
        kiln.jit(fn, fullgraph=True)(X)
    _assert_names(e.value, fn, text, construct)


@pytest.mark.parametrize("fn, text, construct", RUNTIME, ids=[r[0].__name__ for r in RUNTIME])
def test_lax_traces_what_only_capture_reveals(fn, text, construct):
    jf = kiln.jit(fn)
    with pytest.warns(RuntimeWarning, match=re.escape(construct)):
        out = jf(X)
    want = fn(X)
    for a, b in zip(out if isinstance(out, tuple) else (out,), want if isinstance(want, tuple) else (want,)):
        if isinstance(b, kiln.Tensor):
            np.testing.assert_allclose(a.asnumpy(), b.asnumpy())
        else:
            assert a == b


def test_strict_reports_the_position_inside_a_called_function():
    with pytest.raises(kiln.JitSyntaxError) as e:
        kiln.jit(calls_bad_callee, fullgraph=True)(X)
    _assert_names(e.value, callee_with_try, "try", "a try statement")


def test_lax_traces_a_called_function_it_cannot_convert_and_warns_once():
    jf = kiln.jit(calls_bad_callee)
    with pytest.warns(RuntimeWarning, match="callee_with_try") as record:
        out = jf(X)
        jf(X * 2)
    assert sum("callee_with_try" in str(w.message) for w in record) == 1
    np.testing.assert_allclose(out.asnumpy(), calls_bad_callee(X).asnumpy())


def traced_but_not_replayable(x):
    with kiln.no_grad():
        mark_not_replayable("reads Python state at every call")
        COUNTER[0] += 1
    return x * COUNTER[0]


def test_lax_runs_eagerly_what_trace_cannot_replay():
    jf = kiln.jit(traced_but_not_replayable)
    with pytest.warns(RuntimeWarning) as record:
        first = jf(X)
        second = jf(X)
    text = " ".join(str(w.message) for w in record)
    assert "a with statement" in text and "runs eagerly" in text, text
    assert not np.allclose(first.asnumpy(), second.asnumpy())  # eager each call: the counter moves
    assert jf.cache_info().eager_calls >= 2


def rewrites_in_a_tensor_branch(x):
    if x.sum() > 0:
        y = x * 1
        y[0] = 7.0  # the converter refuses an in-place write under a tensor condition
    else:
        y = x * 2
    return y


def drops_out_in_a_tensor_branch(x):
    if x.sum() > 0:
        y = kiln.ops.dropout(x * 0 + 1, 0.5) * 3  # random ops can't live in graph control flow yet
    else:
        y = x * 2
    return y


@pytest.mark.parametrize("fn", [rewrites_in_a_tensor_branch, drops_out_in_a_tensor_branch])
def test_lax_runs_eagerly_control_flow_the_graph_cannot_hold(fn):
    # a trace would freeze the branch taken first: LAX keeps eager's results on both paths, STRICT raises
    pos, neg = T([1.0, 2.0]), T([-1.0, -2.0])
    jf = kiln.jit(fn)
    with pytest.warns(RuntimeWarning) as record:
        results = [jf(x) for x in (pos, neg, pos)]
    for x, r in zip((pos, neg, pos), results):
        if fn is drops_out_in_a_tensor_branch and x is pos:  # each element dropped (0) or kept (1 * 2 * 3)
            assert set(np.unique(r.asnumpy())) <= {0.0, 6.0}
        else:
            np.testing.assert_array_equal(r.asnumpy(), fn(x).asnumpy())
    assert any("runs eagerly" in str(w.message) for w in record), [str(w.message) for w in record]
    assert jf.cache_info().compiles == 0
    with pytest.raises((NotImplementedError, kiln.JitSyntaxError)):
        kiln.jit(fn, fullgraph=True)(pos)


def test_trace_mode_runs_eagerly_when_a_traced_value_steers_python():
    """The branch taken on the first call must not be fixed for later calls with other values."""
    def f(x):
        if x.sum() > 0:
            return x * 1
        return x * 2

    jf = kiln.jit(f, capture_mode="trace")
    with pytest.warns(RuntimeWarning, match=r"runs eagerly: .*value is read into Python .*test_ast_syntax.py:\d+"):
        jf(T([1.0, 2.0]))
    np.testing.assert_array_equal(jf(T([-1.0, -2.0])).asnumpy(), [-2.0, -4.0])
    assert jf.cache_info().compiles == 0
    with pytest.raises(kiln.JitSyntaxError, match="read into Python"):
        kiln.jit(f, capture_mode="trace", fullgraph=True)(T([1.0, 2.0]))


# ---- syntax level through JitConfig / Cell.set_jit_config -------------------------------------


class TryCell(nn.Cell):
    def construct(self, x):
        try:
            return x * 2
        except ValueError:
            return x


@pytest.mark.parametrize("level, raises", [("STRICT", True), ("LAX", False), ("", False)])
def test_cell_set_jit_config_syntax_level(level, raises):
    net = TryCell()
    net.set_jit_config(kiln.JitConfig(jit_level="O0", jit_syntax_level=level))
    if raises:
        with pytest.raises(kiln.JitSyntaxError) as e:
            net(X)
        _assert_names(e.value, TryCell.construct, "try", "a try statement")
    else:
        with pytest.warns(RuntimeWarning, match="a try statement"):
            out = net(X)
        np.testing.assert_allclose(out.asnumpy(), X.asnumpy() * 2)


# ---- functions without source ---------------------------------------------------------------


def _exec_defined():
    namespace = {}
    exec("def made(x):\n    return x * 3\n", namespace)  # noqa: S102 - a function without a source file
    return namespace["made"]


@pytest.mark.parametrize("make, what", [
    (_exec_defined, "made"),
    (lambda: math.hypot, "hypot"),
], ids=["exec", "builtin"])
def test_source_unavailable_strict_raises(make, what):
    fn = make()
    with pytest.raises(kiln.JitSyntaxError) as e:
        kiln.jit(fn, fullgraph=True)(X) if what == "made" else kiln.jit(fn, fullgraph=True)(3.0, 4.0)
    assert "source" in str(e.value) and what in str(e.value), str(e.value)


def test_source_unavailable_lax_falls_back():
    fn = _exec_defined()
    jf = kiln.jit(fn)
    with pytest.warns(RuntimeWarning, match="source is unavailable"):
        out = jf(X)
    np.testing.assert_allclose(out.asnumpy(), X.asnumpy() * 3)
    np.testing.assert_allclose(jf(X).asnumpy(), X.asnumpy() * 3)


def test_source_unavailable_callee_strict_raises_lax_traces():
    fn = _exec_defined()

    def outer(x):
        return fn(x) + 1

    with pytest.raises(kiln.JitSyntaxError, match="made"):
        kiln.jit(outer, fullgraph=True)(X)
    with pytest.warns(RuntimeWarning, match="made"):
        out = kiln.jit(outer)(X)
    np.testing.assert_allclose(out.asnumpy(), X.asnumpy() * 3 + 1)


def test_lambdas_are_captured_by_tracing_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = kiln.jit(lambda a, b: a * b + 1, fullgraph=True)(X, X)
    np.testing.assert_allclose(out.asnumpy(), X.asnumpy() ** 2 + 1)


def test_jit_syntax_level_validation():
    with pytest.raises(ValueError, match="'STRICT', 'LAX'"):
        kiln.jit(uses_try, jit_syntax_level="loose")


def bound_only_in_tensor_loop(x):
    while x.sum() < 10:
        y = x * 2
        x = y
    return y


def test_variable_bound_only_inside_a_tensor_loop():
    x = T(np.ones((2, 3)))
    with pytest.raises(kiln.JitSyntaxError) as e:
        kiln.jit(bound_only_in_tensor_loop, fullgraph=True)(x)
    _assert_names(e.value, bound_only_in_tensor_loop, "while", "variable 'y' used after a tensor-dependent")
    with pytest.warns(RuntimeWarning, match="variable 'y'"):
        out = kiln.jit(bound_only_in_tensor_loop)(x)
    np.testing.assert_allclose(out.asnumpy(), bound_only_in_tensor_loop(x).asnumpy())
