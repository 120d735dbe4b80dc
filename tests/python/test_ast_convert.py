"""capture_mode="ast": the source conversion. Each function runs three ways and must agree:
eagerly as written, converted but not captured (tensor conditions go through kiln.ops.cond /
while_loop eagerly), and ast-jitted with fullgraph=True (the capture run and a compiled run)."""
import re

import numpy as np
import pytest

import kiln
from kiln import nn
from kiln.jit import ast_runtime
from kiln.jit.function import _convert_target


def T(a, dtype=np.float32):
    return kiln.tensor(np.asarray(a, dtype))


POS = T(np.arange(6).reshape(2, 3))
NEG = T(-np.arange(6).reshape(2, 3) - 1)
SMALL = T(np.full((2, 3), 0.25))


def _flat(r):
    if isinstance(r, (tuple, list)):
        return [x for item in r for x in _flat(item)]
    return [np.asarray(r.asnumpy()) if isinstance(r, kiln.Tensor) else r]


def assert_same(got, want):
    g, w = _flat(got), _flat(want)
    assert len(g) == len(w), (got, want)
    for a, b in zip(g, w):
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-6, atol=1e-6)


def check(fn, *args, **kwargs):
    """fn eager == converted == ast-jitted (first and second call)."""
    want = fn(*args, **kwargs)
    assert_same(_convert_target(fn)(*args, **kwargs), want)
    jf = kiln.jit(fn, fullgraph=True)
    assert_same(jf(*args, **kwargs), want)
    assert_same(jf(*args, **kwargs), want)
    assert jf.cache_info().compiles == 1
    return jf


# ---- branches --------------------------------------------------------------------------


def if_elif_else(x, mode):
    if mode == "double":
        y = x * 2
    elif mode == "neg":
        y = -x
    else:
        y = x + 1
    return y


def tensor_if(x):
    y = x * 2
    if y.sum() > 0:
        y = y + 1
        z = y * 3
    else:
        y = y - 1
        z = y
    return y + z


def tensor_if_number(x):
    k = 1.0
    if x.mean() > 1:
        k = 3.0
    return x * k


def shape_if(x):
    if x.shape[0] == 2 and x.ndim == 2:
        return x.sum(axis=0)
    return x


def nested_if(x):
    if x.sum() > 0:
        if x.max() > 4:
            y = x * 10
        else:
            y = x * 5
    else:
        y = x
    return y


@pytest.mark.parametrize("mode", ["double", "neg", "other"])
def test_static_if_elif_else(mode):
    jf = check(if_elif_else, POS, mode)
    assert "neg" not in jf.graph_str() or mode == "neg"


@pytest.mark.parametrize("x", [POS, NEG, SMALL], ids=["pos", "neg", "small"])
def test_tensor_branches(x):
    check(tensor_if, x)
    check(tensor_if_number, x)
    check(nested_if, x)


def test_shape_condition_is_decided_at_compile_time():
    jf = check(shape_if, POS)
    assert "sum" in jf.graph_str()
    check(shape_if, T(np.ones((3, 2))))


# ---- early returns ---------------------------------------------------------------------


def early_return(x):
    if x.sum() > 0:
        return x * 2
    y = x - 1
    if x.shape[0] == 2:
        return y
    return y * 3


def return_in_nested_branches(x):
    if x.sum() > 0:
        if x.max() > 4:
            return x * 10, 1.0
        x = x + 1
    return x, 2.0


def no_explicit_return(x, out):
    if x.sum() > 0:
        out.append(x * 2)


@pytest.mark.parametrize("x", [POS, NEG, SMALL], ids=["pos", "neg", "small"])
def test_early_returns(x):
    check(early_return, x)
    check(return_in_nested_branches, x)


def test_function_without_return_gives_none():
    out = []
    assert ast_runtime.convert_function(no_explicit_return)(POS, out) is None
    assert_same(out, [POS * 2])


# ---- loops -------------------------------------------------------------------------------


def static_while(x, n):
    i = 0
    while i < n:
        x = x * 2
        i += 1
    return x, i


def tensor_while(x):
    steps = 0
    while x.sum() < 50:
        x = x * 2 + 1
        steps += 1
    return x, steps


def while_break(x):
    i = 0
    while x.sum() < 1000:
        x = x * 2
        i += 1
        if i >= 3:
            break
    return x, i


def while_true_break(x):
    while True:
        x = x + 1
        if x.sum() > 40:
            break
    return x


def for_continue_else(x):
    s = x * 0
    for k in range(5):
        if k % 2 == 0:
            continue
        s = s + x * k
    else:
        s = s + 1
    return s


def for_break_else(x, limit):
    s = x * 0
    for k in range(6):
        s = s + k
        if k == limit:
            break
    else:
        s = s - 100
    return s


def for_tensor_break(x):
    for k in range(6):
        x = x * 2
        if x.max() > 30:
            break
    return x


def tensor_continue(x):
    s = x * 0
    for k in range(4):
        if (x * k).sum() > 20:
            continue
        s = s + x * k
    return s


def for_over_containers(x, ws):
    y = x
    for w in ws:
        y = y * w
    for i, w in enumerate((1.0, 2.0)):
        y = y + i * w
    for a, b in zip([x, x], [1.0, 3.0]):
        y = y + a * b
    for row in x:
        y = y + row.sum()
    return y


def return_in_loop(x):
    for k in range(4):
        x = x + 1
        if x.sum() > 20:
            return x * 10
    return x


def return_in_nested_loops(x):
    for i in range(3):
        for j in range(3):
            if i * j == 2:
                return x * (i + j)
    return x


def range_of_tensor(x, n):
    acc = x * 0
    for i in range(n):
        acc = acc + x * i
    return acc


def comprehension(x):
    parts = [x * k for k in range(3) if k != 1]
    return sum(parts[1:], parts[0])


def accumulators(x):
    total = 0
    count = 0
    while total < 20:
        total = total + x.abs().sum() + 1
        count += 1
    k = 0
    if x.sum() > 0:
        k = x * 2
    m = 1.0
    if x.max() > 2:
        m = 2.5
    j = 0
    while j < 3 and x.sum() > -100:
        j = j + 0.5
    return total, count, k, m, j


@pytest.mark.parametrize("x", [POS, NEG, SMALL], ids=["pos", "neg", "small"])
def test_python_numbers_that_become_tensors_on_some_paths(x):
    check(accumulators, x)


def int_or_float_by_path(x):
    m = 1
    if x.max() > 2:
        m = 2.5
    return x * m, m


@pytest.mark.parametrize("x", [POS, NEG], ids=["pos", "neg"])
def test_a_number_that_is_an_int_on_one_path_and_a_float_on_the_other_is_refused(x):
    # eager gives an int or a float by the path taken (and x * m an int or float dtype): one graph
    # cannot, so capture says so (fullgraph) or the function runs eagerly
    with pytest.raises(kiln.JitSyntaxError, match="'m' that is a Python float and int"):
        kiln.jit(int_or_float_by_path, fullgraph=True)(x)
    with pytest.warns(RuntimeWarning):
        got = kiln.jit(int_or_float_by_path)(x)
    want = int_or_float_by_path(x)
    assert type(got[1]) is type(want[1]) and got[1] == want[1] and got[0].dtype == want[0].dtype


@pytest.mark.parametrize("x", [POS, NEG, SMALL], ids=["pos", "neg", "small"])
def test_loops(x):
    check(static_while, x, 3)
    check(tensor_while, x * 0 + 1)
    check(while_break, x)
    check(while_true_break, x)
    check(for_continue_else, x)
    check(for_tensor_break, x)
    check(tensor_continue, x)
    check(return_in_loop, x)
    check(return_in_nested_loops, x)
    check(comprehension, x)


@pytest.mark.parametrize("limit", [2, 9])
def test_for_break_with_else(limit):
    check(for_break_else, POS, limit)


def test_for_over_lists_tuples_zip_enumerate_and_tensor_rows():
    check(for_over_containers, POS, [2.0, 0.5])


@pytest.mark.parametrize("n", [0, 3])
def test_range_over_a_tensor_bound(n):
    want = range_of_tensor(POS, n)
    got = ast_runtime.convert_function(range_of_tensor)(POS, kiln.tensor(n))
    assert_same(got, want)
    assert_same(kiln.jit(range_of_tensor, fullgraph=True)(POS, n), want)


# ---- expressions -------------------------------------------------------------------------


def bool_ops(x):
    a = x.sum() > 0 and x.max() < 10
    b = not (x.sum() > 0)
    c = x.sum() > 0 or x.min() > 100
    d = 1 < 2 < 3
    e = x * 2 if x.sum() > 3 else x * 3
    f = -1.0 < x.mean() < 4.0
    return a, b, c, d, e, f


def syntax_mix(x, *rest, scale=2.0, **named):
    a, (b, c) = x, (x * 2, x * 3)
    d = {"k": a + b}
    a += c
    y = x.clone()
    y[0] = y[0] * scale
    y[:, 1:] = 0.0
    total = len(rest) + len(named) + abs(-2) + int(1.5) + max(1, 2) + min(3, 4)
    f = (lambda v: v * total)(a)
    assert x.ndim == 2, "x must be a matrix"
    if isinstance(x, kiln.Tensor) and bool(named):
        f = f + named["bias"]
    return d["k"] + f + y + float(total) + sum(rest, x * 0)


def nested_def_and_slice_writes(x, k):
    scale = 2.0

    def inner(v):
        if v.sum() > 0:
            return v * scale
        return v

    scale = 3.0  # the closure sees the rebinding, as in Python
    y = inner(x) + inner(-x)
    y[0] = y[0] * k
    if x.shape[0] > 1:
        y[1] += 1.0
    return y


@pytest.mark.parametrize("x", [POS, NEG], ids=["pos", "neg"])
def test_nested_functions_closures_and_subscript_writes(x):
    check(nested_def_and_slice_writes, x, 5.0)
    assert len([c for c, _file in ast_runtime._converted if c.co_name == "inner"]) == 0  # converted once, with outer


@pytest.mark.parametrize("x", [POS, NEG], ids=["pos", "neg"])
def test_boolean_operators_and_conditional_expressions(x):
    check(bool_ops, x)


def test_assignment_forms_literals_builtins_and_arguments():
    check(syntax_mix, POS, POS, POS, scale=3.0, bias=1.5)
    check(syntax_mix, POS)


# ---- calls: user functions, methods, Cells -----------------------------------------------


def helper(a, b=2.0):
    if a.max() > b:
        return a - b
    return a + b


def calls_helpers(x):
    return helper(x) + helper(x, b=100.0) + helper(b=0.5, a=x)


class Scaler:
    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return self.apply(x)

    def apply(self, x):
        if x.sum() > 0:
            return x * self.k
        return x


class Gate(nn.Cell):
    def __init__(self):
        super().__init__()
        kiln.manual_seed(0)
        self.d = nn.Dense(3, 3)

    def construct(self, x):
        if x.sum() > 0:
            x = self.d(x)
        return x


class Stack(nn.Cell):
    def __init__(self):
        super().__init__()
        self.first = Gate()
        self.blocks = nn.CellList([Gate(), Gate()])
        self.seq = nn.SequentialCell(nn.ReLU(), Gate())
        self.__scale = 2.0

    def construct(self, x):
        y = self.first(x)
        for block in self.blocks:
            y = block(y) * self.__scale
        return self.seq(y) + self._extra(y)

    def _extra(self, y):
        total = y * 0
        for i in range(len(self.blocks)):
            total = total + self.blocks[i](y)
        return total


class Child(Gate):
    def construct(self, x):
        return super().construct(x) * 2


def test_nested_user_functions_with_defaults_and_keywords():
    check(calls_helpers, POS)
    check(calls_helpers, NEG)


def test_methods_and_callable_objects():
    s = Scaler(3.0)
    check(lambda x: s(x) + s.apply(x), POS)
    check(s.apply, NEG)


@pytest.mark.parametrize("x", [POS, NEG], ids=["pos", "neg"])
def test_cells_calling_cells_lists_and_sequences(x):
    net = Stack()
    check(net, x)


def test_super_and_private_names_in_methods():
    check(Child(), POS)


def test_set_jit_config_compiles_a_cell_through_ast():
    net = Stack()
    x = POS
    want = net(x)
    net.set_jit_config(kiln.JitConfig(jit_level="O1", jit_syntax_level="STRICT"))
    assert net._jitted.options.capture_mode == "ast" and net._jitted.options.strict
    assert_same(net(x), want)
    assert_same(net(x), want)


# ---- gradients -----------------------------------------------------------------------------


def loss_with_control_flow(x, w):
    y = x * w
    if y.sum() > 0:
        y = y * y
    else:
        y = -y
    for _ in range(2):
        if y.mean() > 1:
            y = y * 0.5
    return y.sum()


@pytest.mark.parametrize("x", [POS, NEG], ids=["pos", "neg"])
def test_value_and_grad_through_converted_control_flow(x):
    w = T(np.full((2, 3), 0.7))
    v_e, g_e = kiln.value_and_grad(loss_with_control_flow, (0, 1))(x, w)
    jf = kiln.jit(loss_with_control_flow, fullgraph=True)
    for _ in range(2):
        v_j, g_j = kiln.value_and_grad(jf, (0, 1))(x, w)
        assert_same(v_j, v_e)
        assert_same(g_j, g_e)


def test_value_and_grad_of_a_cell_with_control_flow():
    net = Stack()
    x = POS
    v_e, g_e = kiln.value_and_grad(net, None, net.trainable_params())(x)
    net.set_jit_config(kiln.JitConfig(jit_level="O0"))
    for _ in range(2):
        v_j, g_j = kiln.value_and_grad(net, None, net.trainable_params())(x)
        assert_same(v_j, v_e)
        assert_same(g_j, g_e)


# ---- print ---------------------------------------------------------------------------------


def printing(x):
    y = x * 2
    print("y is", y, "sum", y.sum(), sep=" ")
    print(x.shape[0])
    return y + 1


def test_print_shows_tensor_values_at_every_run(capfd):
    jf = kiln.jit(printing, fullgraph=True)
    jf(POS)
    jf(POS * 2)
    out = capfd.readouterr().out
    assert out.count("y is") == 2, out
    assert "y is [[0 2 4]\n [6 8 10]] sum 30\n2\n" in out, out
    assert "y is [[0 4 8]\n [12 16 20]] sum 60\n2\n" in out, out
    assert "print" in jf.graph_str()


@pytest.mark.parametrize("level", ["O0", "O1"])
def test_print_survives_the_passes(level, capfd):
    def unused_result_printed(x):
        print(x + 1)
        return x * 3

    jf = kiln.jit(unused_result_printed, jit_level=level)
    jf(POS)
    jf(POS)
    assert capfd.readouterr().out.count("[[1 2 3]\n [4 5 6]]") == 2


def test_print_op_eagerly_and_long_text(capfd):
    kiln.ops.print_("a" * 700, T([1.5, 2.0]), "é", sep="|")
    out = capfd.readouterr().out
    assert out == "a" * 700 + "|[1.5 2]|é\n", out


# ---- which helper a condition goes through -------------------------------------------------


def control_flow_nodes(jf):
    """The if and while nodes of a jitted function's graph, subgraphs included (what kiln.ops.cond
    and kiln.ops.while_loop record; counted in the graph rather than by wrapping those functions,
    which would be a Python side effect of the captured code)."""
    text = jf.graph_str()
    return {"cond": len(re.findall(r"= if\(", text)), "while_loop": len(re.findall(r"= while\(", text))}


@pytest.mark.parametrize("fn, args, conds, loops", [
    (if_elif_else, (POS, "neg"), 0, 0),
    (static_while, (POS, 3), 0, 0),
    (shape_if, (POS,), 0, 0),
    (tensor_if, (POS,), 1, 0),
    (nested_if, (POS,), 2, 0),
    (tensor_while, (POS,), 0, 1),
    (while_true_break, (POS,), 1, 1),
    (early_return, (NEG,), 1, 0),
], ids=lambda v: getattr(v, "__name__", None))
def test_tensor_conditions_and_only_they_become_cond_and_while_loop(fn, args, conds, loops):
    jf = kiln.jit(fn, fullgraph=True)
    jf(*args)
    control_flow_calls = control_flow_nodes(jf)
    assert control_flow_calls["cond"] >= conds and control_flow_calls["while_loop"] >= loops, control_flow_calls
    if conds == 0:
        assert control_flow_calls["cond"] == 0, control_flow_calls
    if loops == 0:
        assert control_flow_calls["while_loop"] == 0, control_flow_calls


def test_cells_inside_sequential_cells_and_with_loss_cells_are_converted():
    seq = nn.SequentialCell(nn.ReLU(), Gate())
    assert control_flow_nodes(check(seq, POS))["cond"] >= 1
    with_loss = nn.WithLossCell(Gate(), lambda y, t: ((y - t) * (y - t)).sum())
    assert control_flow_nodes(check(with_loss, NEG, POS))["cond"] >= 1


# ---- errors at run time ------------------------------------------------------------------


def gathers(x, idx):
    y = x * 2
    if x.shape[0] > 1:
        y = kiln.ops.gather(y, idx)
    return y


def test_run_time_errors_name_the_users_source_line():
    import inspect

    jf = kiln.jit(gathers, fullgraph=True)
    x = T(np.ones((4, 3)))
    jf(x, kiln.tensor(np.array([0, 1])))
    lines, first = inspect.getsourcelines(gathers)
    line = first + next(k for k, s in enumerate(lines) if "gather(y, idx)" in s)
    with pytest.raises(IndexError, match=rf"gather \({__file__}:{line}\).*index 7 is out of range"):
        jf(x, kiln.tensor(np.array([0, 7])))


def test_lambdas_are_converted():
    pick = lambda x: x * 2 if x.sum() > 0 else x - 1  # noqa: E731 (the jitted function is a lambda)
    jf = check(pick, POS)
    assert_same(jf(NEG), pick(NEG))  # one graph with an `if`: the other branch too
    assert jf.cache_info().compiles == 1
    s = Scaler(3.0)
    jc = check(lambda x: s(x), NEG)  # a callable object called from converted code is converted too
    assert_same(jc(POS), s(POS))
    # several lambdas on one line (told apart by where their code starts), and one over two lines
    for fn in (lambda x: x * 2 if x.sum() > 0 else -x, lambda x: x + 1 if x.sum() > 0 else x * 0):
        jl = check(fn, POS)
        assert_same(jl(NEG), fn(NEG))
    two_lines = (lambda x: x.exp() if x.sum() > 0
                 else x.abs())
    assert_same(check(two_lines, NEG)(POS), two_lines(POS))
