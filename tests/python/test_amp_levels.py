"""Which ops run in the low dtype at each amp level, read off the graph text: the casts eager amp
records (kiln.amp.autocast at dispatch), the casts the amp graph pass inserts (Graph.amp, the same
KILN_AMP table of ops.def) and what the O1 passes make of cast pairs."""
import re

import numpy as np
import pytest

import kiln
from kiln import _C, ops
from compiled_equal import assert_compiled_equal

BF = kiln.bfloat16
NODE = re.compile(r"^\s*%\d+: (\w+)\[[^\]]*\](?:, %\d+: \w+\[[^\]]*\])* = (\w+)\(", re.M)


def record(fn, *args, level=None, dtype=BF):
    """The graph of fn(*args) as the tracer records it (under autocast at level when given)."""
    tr = _C.Tracer()
    ins = [a.detach() for a in args]
    for a in ins:
        tr.add_input(a)
    if level is None:
        out = fn(*ins)
    else:
        with kiln.amp.autocast(low_prec_dtype=dtype, level=level):
            out = fn(*ins)
    return tr.finish_graph(list(out) if isinstance(out, tuple) else [out])


def op_dtypes(graph, skip_casts=True):
    """[(op, output dtype)] of the graph's nodes, in order."""
    return [(op, dt) for dt, op in NODE.findall(str(graph)) if op != "constant" and not (skip_casts and op == "cast")]


def dtype_of(graph, op):
    found = {dt for o, dt in op_dtypes(graph) if o == op}
    assert len(found) == 1, f"{op}: {found} in\n{graph}"
    return found.pop()


def test_the_table_names_each_class():
    assert [_C.amp_class(n) for n in ("matmul", "linear", "conv2d", "attention", "conv2d_backward_weight")] == \
        ["low"] * 5
    assert [_C.amp_class(n) for n in ("layer_norm", "batch_norm", "rms_norm")] == ["fp32"] * 3
    assert [_C.amp_class(n) for n in ("softmax", "log_softmax", "sum", "mean", "var", "exp", "log", "pow",
                                      "cumsum")] == ["accum"] * 9
    assert [_C.amp_class(n) for n in ("add", "relu", "gelu", "reshape", "concat")] == ["promote"] * 5
    with pytest.raises(ValueError, match="unknown op"):
        _C.amp_class("no_such_op")


def block(x, w, g, b):
    """A transformer-ish block: a product, softmax, an elementwise chain, a norm, a reduction."""
    h = ops.dense(x, w)
    p = ops.softmax(h, -1)
    y = ops.gelu(h) * p + 1.0
    n = ops.layer_norm(y, (y.shape[-1],), g, b)
    return ops.exp(n).mean(-1)


def block_args(rng):
    f = lambda *s: kiln.tensor(rng.standard_normal(s).astype(np.float32))  # noqa: E731
    w = kiln.nn.Parameter(f(16, 8))
    return f(4, 8), w, kiln.nn.Parameter(f(16)), kiln.nn.Parameter(f(16))


# the dtype each op runs in (its output's), per level: products low from O1 on, softmax/exp/mean
# float32 at O1 and following their input at O2, norms float32 but at O3, the rest following inputs
EXPECTED = {
    "O1": {"linear": "bfloat16", "softmax": "float32", "gelu": "bfloat16", "mul": "float32", "add": "float32",
           "layer_norm": "float32", "exp": "float32", "mean": "float32"},
    "O2": {"linear": "bfloat16", "softmax": "bfloat16", "gelu": "bfloat16", "mul": "bfloat16", "add": "bfloat16",
           "layer_norm": "float32", "exp": "float32", "mean": "float32"},
    "O3": {"linear": "bfloat16", "softmax": "bfloat16", "gelu": "bfloat16", "mul": "bfloat16", "add": "bfloat16",
           "layer_norm": "bfloat16", "exp": "bfloat16", "mean": "bfloat16"},
}


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_eager_amp_records_each_levels_casts(level):
    g = record(block, *block_args(np.random.default_rng(0)), level=level)
    got = {op: dtype_of(g, op) for op in EXPECTED[level]}
    assert got == EXPECTED[level], str(g)


def test_no_amp_records_no_cast():
    g = record(block, *block_args(np.random.default_rng(0)))
    assert "cast" not in str(g) and "bfloat16" not in str(g)
    g0 = record(block, *block_args(np.random.default_rng(0)), level="O0")
    assert str(g0) == str(g)


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
def test_the_graph_pass_makes_what_eager_amp_records(level):
    """Graph.amp(level) of the plain recording runs each op in the dtype eager amp ran it in (the
    graph's input x feeds only the product, so the pass's 'inputs are parameters' rule agrees)."""
    args = block_args(np.random.default_rng(1))
    plain = record(block, *args)
    rewritten = plain.amp(int(level[1]), BF)
    assert op_dtypes(rewritten) == op_dtypes(record(block, *args, level=level))
    # and it computes what eager amp computes
    exe = _C.compile_graph(rewritten)
    got = exe(*args)
    got = got[0] if isinstance(got, (list, tuple)) else got
    with kiln.amp.autocast(low_prec_dtype=BF, level=level):
        want = block(*args)
    np.testing.assert_allclose(got.astype(kiln.float32).numpy(), want.astype(kiln.float32).numpy(), rtol=1e-6, atol=1e-6)


def test_graph_pass_rejects_bad_levels_and_dtypes():
    g = record(block, *block_args(np.random.default_rng(0)))
    with pytest.raises(ValueError, match="O0, O1, O2 or O3"):
        g.amp(4, BF)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        g.amp(1, kiln.int32)


def positions(n, d):
    """Rotary angles from positions (arange: integers) and frequencies."""
    pos = ops.arange(n, dtype=kiln.float32)
    inv = 1.0 / (10000.0 ** (ops.arange(0, d, 2, dtype=kiln.float32) / d))
    return ops.cos(ops.reshape(pos, (n, 1)) * ops.reshape(inv, (1, d // 2)))


def test_values_derived_from_integers_stay_float32_even_at_O3():
    with kiln.amp.autocast(low_prec_dtype=BF, level="O3"):
        got = positions(512, 8)
    assert got.dtype is kiln.float32
    np.testing.assert_allclose(got.numpy(), positions(512, 8).numpy(), rtol=0, atol=0)
    g = record(lambda: positions(512, 8), level="O3")
    assert "bfloat16" not in str(g)


def test_exact_widening_cast_pairs_cancel_at_O1_and_narrowing_pairs_stay():
    x = kiln.tensor(np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32))
    back = record(lambda x: ops.relu(x.astype(BF).astype(kiln.float32).astype(BF)), x)
    opt = str(_C.optimize_graph(back, level=1))
    assert opt.count("cast(") == 1, opt  # bf16 -> f32 -> bf16 is exact: only the first cast stays
    lossy = record(lambda x: ops.relu(x.astype(BF).astype(kiln.float32)), x)
    opt = _C.optimize_graph(lossy, level=1)
    assert str(opt).count("cast(") == 2, str(opt)  # f32 -> bf16 -> f32 rounds: both stay
    got = _C.compile_graph(lossy, _C.CompileOptions(level=1))(x)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_array_equal(got.numpy(), ops.relu(x.astype(BF).astype(kiln.float32)).numpy())


def test_elementwise_fusion_takes_the_casts_around_it():
    """At O1 a cast from bfloat16 opens an elementwise group and a cast to bfloat16 ends it: one
    fused node, no cast left outside; its result is eager's."""
    x = kiln.tensor(np.random.default_rng(4).standard_normal((8, 16)).astype(np.float32)).astype(BF)

    def f(x):
        return (ops.relu(x.astype(kiln.float32)) * 3.0 + 1.0).astype(BF)

    opt = str(_C.optimize_graph(record(f, x), level=1))
    main = opt.split("subgraph")[0]
    assert "cast(" not in main and main.count("fused(") == 1, opt
    assert "bfloat16[8, 16] = fused(" in main, opt
    assert_compiled_equal(f, (x,))


def test_a_cast_to_16_bits_never_sits_inside_a_group():
    x = kiln.tensor(np.random.default_rng(5).standard_normal((8, 16)).astype(np.float32))

    def f(x):  # the bfloat16 value is read again: rounding it is part of the computation
        return ops.exp(x.astype(BF).astype(kiln.float32)) + 1.0

    text = str(_C.optimize_graph(record(f, x), level=1))
    subs = text.split("subgraph")[1:]
    assert subs, text  # the exp and the add fused
    for sub in subs:
        halves = re.findall(r"%(\d+): bfloat16\[", sub.split(") {", 1)[1])
        returned = re.search(r"return \(%(\d+)\)", sub).group(1)
        assert all(v == returned for v in halves), sub
    assert_compiled_equal(f, (x,))


def test_writes_in_place_are_never_cast():
    """batch_norm updates its running statistics in place: amp casts x, never those."""
    rng = np.random.default_rng(3)
    x = kiln.tensor(rng.standard_normal((4, 3, 5, 5)).astype(np.float32))
    bn = kiln.nn.BatchNorm2d(3)
    bn.set_train(True)
    ref = kiln.nn.BatchNorm2d(3)
    ref.set_train(True)
    with kiln.amp.autocast(low_prec_dtype=BF, level="O3"):
        bn(x.astype(BF))
    ref(x.astype(BF).astype(kiln.float32))
    assert bn.moving_mean.dtype is kiln.float32
    np.testing.assert_allclose(bn.moving_mean.numpy(), ref.moving_mean.numpy(), rtol=2e-2, atol=2e-3)
    assert np.abs(bn.moving_mean.numpy()).max() > 0  # the update reached the running statistics


def test_generated_kernels_read_and_write_bfloat16_as_the_cast_op_does():
    """A fused group with bfloat16 operands runs generated code (loads widened, the store rounded to
    nearest even): bit for bit eager's, NaN, infinities, ties and overflow included, on every
    capture mode, backend and level."""
    rng = np.random.default_rng(6)
    vals = rng.standard_normal((64, 33)).astype(np.float32)
    vals[0, :6] = [np.nan, np.inf, -np.inf, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 3.4e38]
    x = kiln.tensor(vals)
    xb = x.astype(BF)

    def f(x, xb):
        return (ops.relu(xb.astype(kiln.float32)) * 3.0 + x).astype(BF)

    before = _C.codegen_stats()
    for mode in ("ast", "bytecode", "trace"):
        for backend in ("kbk", "sink"):
            for level in ("O1", "O2"):
                jf = kiln.jit(f, capture_mode=mode, jit_level=level, backend=backend)
                got, want = jf(x, xb), f(x, xb)
                np.testing.assert_array_equal(got.astype(kiln.float32).numpy(), want.astype(kiln.float32).numpy(),
                                              err_msg=f"{mode} {backend} {level}")
    after = _C.codegen_stats()
    assert after["compiles"] + after["disk_hits"] + after["memory_hits"] > \
        before["compiles"] + before["disk_hits"] + before["memory_hits"]  # generated code ran
