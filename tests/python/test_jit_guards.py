"""Compiled functions never silently disagree with eager: each symptom of Python state changing
between calls (globals, closures, Cell and argument attributes, side effects, scalar keys,
runtime checks) written as the user code that showed it, under ast and trace capture, O1 and the
sink backend; a randomized test mutating state between calls; the cache-key function over
every Python scalar kind."""
import copy
import decimal
import fractions
import importlib.util
import math
import random
import struct
import warnings

import numpy as np
import pytest

import kiln
from kiln import nn, ops
from kiln.jit import tree

MODES = {
    "ast": dict(capture_mode="ast"),
    "trace": dict(capture_mode="trace"),
    "O1": dict(jit_level="O1"),
    "sink": dict(backend="sink"),
}
AST_MODES = {k: v for k, v in MODES.items() if k != "trace"}


def T(a):
    return kiln.Tensor(np.asarray(a, np.float32), kiln.float32)


def same(got, want):
    np.testing.assert_array_equal(np.asarray(got.asnumpy()), np.asarray(want.asnumpy()))


@pytest.fixture(params=list(MODES), ids=list(MODES))
def mode(request):
    return MODES[request.param]


@pytest.fixture(params=list(AST_MODES), ids=list(AST_MODES))
def ast_mode(request):
    return AST_MODES[request.param]


# ---- globals -------------------------------------------------------------------------------

data = label = None
USE_RELU = True
SCALE = 2.0
OFFSET = None


def relu_if_flag(x):
    y = x * SCALE
    if USE_RELU:
        y = ops.relu(y)
    return y + OFFSET


def test_global_numbers_bools_and_tensors_rebound_between_calls(mode):
    global USE_RELU, SCALE, OFFSET
    USE_RELU, SCALE, OFFSET = True, 2.0, T([1.0, 1.0])
    jf = kiln.jit(relu_if_flag, **mode)
    x = T([-1.0, 2.0])
    for use_relu, scale, offset in [(True, 2.0, None), (True, 2.0, None), (False, 2.0, None), (False, -3.5, None),
                                    (False, -3.5, T([5.0, 6.0])), (True, -3.5, None)]:
        USE_RELU, SCALE = use_relu, scale
        if offset is not None:
            OFFSET = offset
        same(jf(x), relu_if_flag(x))
    info = jf.cache_info()
    assert info.hits >= 1 and info.eager_calls == 0, info  # unchanged state is served compiled


def test_training_step_reading_the_batch_from_globals(mode):
    global data, label
    kiln.manual_seed(0)
    net = nn.Dense(3, 1)
    ref = copy.deepcopy(net)
    rng = np.random.default_rng(0)
    batches = [(T(rng.standard_normal((4, 3))), T(rng.standard_normal((4, 1)))) for _ in range(4)]

    def make_step(model):
        opt = nn.SGD(model.trainable_params(), learning_rate=0.1)
        loss_fn = nn.MSELoss()
        grad_fn = kiln.value_and_grad(lambda x, t: loss_fn(model(x), t), None, model.trainable_params())

        def train_step():
            loss, grads = grad_fn(data, label)
            opt(grads)
            return loss

        return train_step

    step, eager_step = kiln.jit(make_step(net), **mode), make_step(ref)
    for data, label in batches:
        same(step(), eager_step())
    same(net.weight, ref.weight)
    same(net.bias, ref.bias)


def test_closure_and_nonlocal_variables_changed(mode):
    k, w = 2.0, T([1.0, 2.0])

    def f(x):
        return x * k + w

    def set_k(v):
        nonlocal k
        k = v

    jf = kiln.jit(f, **mode)
    x = T([3.0, 4.0])
    same(jf(x), f(x))
    set_k(-0.5)
    same(jf(x), f(x))
    w = T([10.0, 20.0])
    same(jf(x), f(x))
    assert jf.cache_info().compiles == 3


# ---- attributes ----------------------------------------------------------------------------


class Scaled(nn.Cell):
    def __init__(self):
        super().__init__()
        self.temperature = 1.0
        self.mask = T([1.0, 0.0])
        self.fc = nn.Dense(2, 2)

    def construct(self, x):
        return self.fc(x * self.mask) / self.temperature


def test_cell_attributes_changed_after_compiling(mode):
    kiln.manual_seed(1)
    net = Scaled()
    jn = kiln.jit(net, **mode)
    x = T([[1.0, 2.0]])
    same(jn(x), net.construct(x))
    same(jn(x), net.construct(x))
    net.temperature = 0.5
    same(jn(x), net.construct(x))
    net.mask = T([0.0, 1.0])
    same(jn(x), net.construct(x))
    net.fc = nn.Dense(2, 2)
    same(jn(x), net.construct(x))
    info = jn.cache_info()
    assert info.compiles == 4 and info.hits >= 1 and info.eager_calls == 0, info


class Config:
    def __init__(self, alpha):
        self.alpha = alpha


def scaled_by_config(x, cfg):
    return x * cfg.alpha


def test_argument_object_attribute_changed(mode):
    jf = kiln.jit(scaled_by_config, **mode)
    cfg, x = Config(2.0), T([1.0, -1.0])
    same(jf(x, cfg), scaled_by_config(x, cfg))
    cfg.alpha = 3.0
    same(jf(x, cfg), scaled_by_config(x, cfg))


class Scales:
    factor = 2.0


def test_module_attribute_changed(mode):
    import types

    config = types.SimpleNamespace(X=2.0)
    jf = kiln.jit(lambda x: x * config.X, **mode)
    x = T([1.0, 2.0])
    same(jf(x), x * 2.0)
    config.X = 5.0
    same(jf(x), x * 5.0)


def test_bound_jitted_method_holds_its_instance():
    class Model:
        def __init__(self, k):
            self.k = k

        @kiln.jit
        def run(self, x):
            return x * self.k

    f = Model(3.0).run
    import gc

    gc.collect()
    x = T([1.0, 2.0])
    same(f(x), x * 3.0)
    same(f(x), x * 3.0)
    m = Model(2.0)
    same(m.run(x), x * 2.0)
    m.k = 4.0
    same(m.run(x), x * 4.0)


# ---- side effects --------------------------------------------------------------------------


class Counting(nn.Cell):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.acc = T([0.0, 0.0])

    def construct(self, x):
        self.calls += 1
        self.acc = self.acc + x
        return x * 2


def test_construct_mutating_self_runs_every_call(mode):
    net, ref = Counting(), Counting()
    jn = kiln.jit(net, **mode)
    x = T([1.0, 2.0])
    with pytest.warns(RuntimeWarning, match=r"side effect.*attribute 'calls'.*test_jit_guards.py:\d+"):
        for _ in range(4):
            same(jn(x), ref(x))
    assert net.calls == ref.calls == 4
    same(net.acc, ref.acc)


def test_side_effects_raise_in_strict_mode():
    with pytest.raises(kiln.JitSyntaxError, match="attribute 'calls'") as e:
        kiln.jit(Counting(), fullgraph=True)(T([1.0]))
    assert e.value.lineno > 0 and e.value.filename.endswith("test_jit_guards.py")


history = []


def step_with_history(x):
    loss = (x * x).sum()
    history.append(loss)
    return loss


def test_list_append_in_a_jitted_step_runs_every_call(mode):
    history.clear()
    jf = kiln.jit(step_with_history, **mode)
    x = T([1.0, 2.0])
    with pytest.warns(RuntimeWarning, match=r"global 'history'.*\.append"):
        for _ in range(4):
            jf(x)
    assert len(history) == 4


def test_global_and_nonlocal_writes_run_every_call(mode):
    count = 0

    def bump(x):
        nonlocal count
        count += 1
        return x + 1

    jf = kiln.jit(bump, **mode)
    with pytest.warns(RuntimeWarning, match="closure variable 'count'"):
        for _ in range(3):
            jf(T([1.0]))
    assert count == 3


def test_print_of_python_values_in_trace_capture_runs_every_call(capsys):
    def f(x):
        print("step")
        return x * 2

    jf = kiln.jit(f, capture_mode="trace")
    with pytest.warns(RuntimeWarning, match="print"):
        for _ in range(3):
            jf(T([1.0]))
    assert capsys.readouterr().out.count("step") == 3


# ---- scalars and cache keys ----------------------------------------------------------------


def divide(x, s):
    return x / s


def test_scalar_zero_and_negative_zero_are_different_constants(mode):
    jf = kiln.jit(divide, **mode)
    x = T([1.0, -2.0])
    same(jf(x, 0.0), divide(x, 0.0))
    same(jf(x, -0.0), divide(x, -0.0))
    assert np.signbit(jf(x, -0.0).asnumpy()[0])
    same(jf(x, 1), divide(x, 1))
    same(jf(x, True), divide(x, True))


def _nan(payload):
    return struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000 | payload))[0]


def test_cache_key_distinguishes_every_python_scalar_kind():
    def key(v):
        return tree.flatten(v, [])

    must_differ = [
        (0.0, -0.0), (1, 1.0), (1, True), (1.0, True), (0, False), (0, None), (_nan(1), _nan(2)),
        (complex(0, 0.0), complex(0, -0.0)), (complex(1, 0), 1.0), (np.float32(0.0), np.float32(-0.0)),
        (np.float32(1.0), np.float64(1.0)), (np.int32(1), np.int64(1)), (decimal.Decimal("0"), decimal.Decimal("-0")),
        (fractions.Fraction(1, 2), 0.5), ("1", 1), (b"1", "1"), ((0.0,), (-0.0,)), ((1, 2), (1.0, 2)),
        (float("inf"), float("-inf")), (math.pi, math.pi + 1e-16 * 4),
    ]
    for a, b in must_differ:
        assert key(a) != key(b), (a, b)
    must_equal = [
        (float("nan"), float("nan")), (_nan(3), _nan(3)), (0.5, 1 / 2), (10**20, 10**20), ("ab", "a" + "b"),
        (np.float32(2.0), np.float32(2.0)), (decimal.Decimal("1.5"), decimal.Decimal("3") / 2), (None, None),
        ((1, 2.0), (1, 2.0)), (complex(1, 2), complex(1, 2)),
    ]
    for a, b in must_equal:
        assert key(a) == key(b) and hash(key(a)) == hash(key(b)), (a, b)
    # and the constant itself comes back as it was given
    for v in (-0.0, _nan(5), np.float32(-0.0), decimal.Decimal("-0"), complex(0, -0.0)):
        back = tree.unflatten(key(v), [])[0]
        assert type(back) is type(v) and repr(back) == repr(v)


def test_nan_argument_compiles_once():
    jf = kiln.jit(divide)
    x = T([1.0])
    for _ in range(3):
        jf(x, float("nan"))
    assert jf.cache_info().compiles == 1


# ---- runtime checks ------------------------------------------------------------------------


def validated(x):
    if (x < 0).any():
        raise ValueError("negative input")
    assert (x < 100).all(), "input too large"
    return x * 3


def test_input_validation_raises_only_for_invalid_input(ast_mode):
    jf = kiln.jit(validated, **ast_mode)
    good = T([1.0, 2.0])
    for _ in range(3):
        same(jf(good), validated(good))
    info = jf.cache_info()
    assert info.compiles == 1 and info.eager_calls == 0 and info.hits == 2, info
    with pytest.raises(ValueError, match="negative input"):
        jf(T([1.0, -2.0]))
    with pytest.raises(AssertionError, match="input too large"):
        jf(T([1.0, 200.0]))
    same(jf(good), validated(good))
    assert "check(" in jf.graph_str()
    assert jf.cache_info().compiles == 1


def test_input_validation_under_value_and_grad(ast_mode):
    def loss(x):
        if (x < 0).any():
            raise ValueError("negative input")
        return (x * x).sum()

    jf = kiln.jit(loss, **ast_mode)
    vg = kiln.value_and_grad(jf)
    x = T([1.0, 3.0])
    for _ in range(2):
        value, grad = vg(x)
        np.testing.assert_allclose(value.asnumpy(), 10.0)
        np.testing.assert_allclose(grad.asnumpy(), [2.0, 6.0])
    with pytest.raises(ValueError, match="negative input"):
        vg(T([-1.0, 3.0]))


def test_a_failing_check_on_the_first_call_raises_then_compiles():
    jf = kiln.jit(validated)
    with pytest.raises(ValueError, match="negative input"):
        jf(T([-1.0]))
    same(jf(T([1.0])), T([3.0]))


def test_checks_on_python_values_stay_python():
    def f(x, n):
        if n < 0:
            raise ValueError("n must be >= 0")
        return x * n

    jf = kiln.jit(f)
    same(jf(T([1.0]), 2), T([2.0]))
    with pytest.raises(ValueError, match="n must be"):
        jf(T([1.0]), -1)


def test_check_on_a_tensor_of_several_elements_is_a_syntax_error():
    def f(x):
        if x < 0:
            raise ValueError("negative")
        return x

    with pytest.raises(kiln.JitSyntaxError, match=r"shape \(2,\)"):
        kiln.jit(f, fullgraph=True)(T([1.0, 2.0]))


# ---- randomized: state mutated between calls -----------------------------------------------

_PIECES = [
    ("y = y * G{i}", "G{i} = {f}", lambda m, i, r: setattr(m, f"G{i}", r.choice([0.5, 2.0, -0.0, 3.0]))),
    ("if B{i}:\n            y = ops.relu(y)", "B{i} = True", lambda m, i, r: setattr(m, f"B{i}", not getattr(m, f"B{i}"))),
    ("y = y + T{i}", "T{i} = kiln.Tensor(np.full((2, 3), {f}, np.float32))",
     lambda m, i, r: setattr(m, f"T{i}", kiln.Tensor(np.full((2, 3), r.uniform(-2, 2), np.float32)))),
    ("y = y * cell.scale", "", lambda m, i, r: setattr(m.cell, "scale", r.choice([1.0, -1.5, 0.25]))),
    ("y = y - C[{i}]", "", lambda m, i, r: m.set_c(i, r.uniform(-1, 1))),
    ("y = y * CFG.alpha", "CFG = types.SimpleNamespace(alpha={f})",
     lambda m, i, r: setattr(m.CFG, "alpha", r.choice([1.0, 2.5, -1.0]))),
]


def _random_program(seed, tmp_path):
    r = random.Random(seed)
    chosen = [(r.randrange(len(_PIECES)), i) for i in range(r.randint(2, 6))]
    body, setup = [], []
    for p, i in chosen:
        stmt, init, _ = _PIECES[p]
        body.append("        " + stmt.format(i=i))
        if init:
            setup.append(init.format(i=i, f=round(r.uniform(0.5, 2.0), 3)))
    src = "\n".join([
        "import types", "import numpy as np", "import kiln", "from kiln import nn, ops", *setup,
        "class Holder(nn.Cell):", "    def __init__(self):", "        super().__init__()", "        self.scale = 1.0",
        "    def construct(self, x):", "        return x",
        "cell = Holder()",
        "C = [0.0] * 8",
        "def make():",
        "    c = list(C)",
        "    def set_c(i, v):",
        "        c[i] = v",
        "    def f(x):",
        "        y = x",
        *[line.replace("C[", "c[") for line in body],
        "        return y",
        "    return f, set_c",
        "f, set_c = make()",
    ]) + "\n"
    path = tmp_path / f"guarded_{seed}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"guarded_{seed}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, chosen, r


@pytest.mark.parametrize("seed", range(12))
def test_random_state_mutations_between_calls_match_eager(seed, tmp_path):
    module, chosen, r = _random_program(seed, tmp_path)
    opts = list(MODES.values())[seed % len(MODES)]
    jf = kiln.jit(module.f, recompile_limit=64, **opts)
    x = kiln.Tensor(np.random.default_rng(seed).standard_normal((2, 3)).astype(np.float32), kiln.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to eager: every call compiled or served compiled
        for call in range(10):
            if call % 2:  # mutate a random subset of the state the function reads
                for p, i in r.sample(chosen, r.randint(1, len(chosen))):
                    _PIECES[p][2](module, i, r)
            same(jf(x), module.f(x))
    info = jf.cache_info()
    assert info.eager_calls == 0 and info.hits >= 4, info


# ---- constants that change -----------------------------------------------------------------


@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no_verify"])
def test_trace_capture_as_const_weights_updated_in_place_raise(verify):
    kiln.manual_seed(3)
    net = nn.Dense(3, 2)
    traced = kiln.trace(lambda x: net(x), capture_as_const=True, verify=verify)
    x = T(np.ones((1, 3)))
    same(traced(x), net(x))
    same(traced(x), net(x))
    with kiln.no_grad():  # an in-place update, as an optimizer step does
        net.weight[...] = net.weight * 2
    with pytest.raises(kiln.TraceMismatchError, match=r"captured constant %\d+ \(float32\[2, 3\].*changed in place"):
        traced(x)


def test_jit_sees_in_place_weight_updates():
    kiln.manual_seed(3)
    net = nn.Dense(3, 2)
    jf = kiln.jit(lambda x: net(x))
    x = T(np.ones((1, 3)))
    same(jf(x), net(x))
    with kiln.no_grad():
        net.weight[...] = net.weight * 2
    same(jf(x), net(x))
    assert jf.cache_info().compiles == 1  # weights are live references, not constants


def test_recompile_limit_on_a_changing_global_warns_naming_it_and_stays_correct():
    global SCALE, USE_RELU, OFFSET
    USE_RELU, OFFSET = False, T([0.0, 0.0])
    jf = kiln.jit(relu_if_flag, recompile_limit=3)
    x = T([1.0, -1.0])
    with pytest.warns(RuntimeWarning, match="compiled 3 times.*the value of global 'SCALE' keeps changing"):
        for k in range(6):
            SCALE = float(k)
            same(jf(x), relu_if_flag(x))
    info = jf.cache_info()
    assert info.compiles == 3 and info.eager_calls == 3, info


def test_closures_sharing_one_code_object_are_told_apart(mode):
    def make(k):
        def scaled(x):
            return x * k
        return scaled

    double, triple = make(2.0), make(3.0)

    def f(x):
        return double(x) + triple(x)

    jf = kiln.jit(f, **mode)
    x = T([1.0, 2.0])
    same(jf(x), f(x))
    triple.__closure__[0].cell_contents = 4.0
    same(jf(x), f(x))
    double.__closure__[0].cell_contents = -1.0
    same(jf(x), f(x))
