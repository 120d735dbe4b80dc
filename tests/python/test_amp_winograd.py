"""16-bit convolutions take Winograd F(4x4, 3x3) in training graphs at O1, as float32 ones do (issue
31; the pass conv_algorithm, src/passes/conv_algorithm.c): the fp32-compute fallback widens their
operands and computes in float32 anyway, so the same rule chooses the same algorithm, and a
16-bit Winograd convolution is the float32 Winograd convolution of the widened operands rounded
once — checked bit for bit, forward and both gradients, bfloat16 and float16, in every capture
mode x O0/O1 x kbk/sink. Against eager amp (direct) the documented tolerance
(docs/guide/mixed_precision.md): per element, Winograd's float32 bound (1e-5 * S, docs/guide/jit.md)
plus one unit in the last place of the 16-bit result. O0, and the convolutions the rule leaves
direct, stay eager's bit for bit; so does the bf16 hardware path (oneDNN has no bf16 Winograd and
runs the convolution direct whatever the attribute says). kiln.jit.explain lists the choice."""
import re

import numpy as np
import pytest

import kiln
from kiln import ops

from test_winograd_training import (TOL, WINOGRAD, conv_exact, conv_grads_exact, expected_algorithm, winograd_backward_input,
                                    winograd_backward_weight, winograd_forward)

MODES = ["ast", "bytecode", "trace"]
DTYPES = [kiln.bfloat16, kiln.float16]
PADS = (1, 1, 1, 1)
NATIVE = kiln._C.gemm_bf16_info()["hardware"]


@pytest.fixture(autouse=True)
def fallback_path():
    """The fp32-compute fallback for bfloat16 (float16 always takes it); tests that want the
    hardware path force it themselves."""
    kiln._C.gemm_bf16_force(0)
    yield
    kiln._C.gemm_bf16_force(-1)


def problem(c=64, hw=32, seed=0):
    """x, w, r (float32): the shapes where the rule picks Winograd for the forward and both
    gradients on AVX-512 (the forward and the input gradient elsewhere)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    w = (rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    r = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    return x, w, r


def loss_of(dtype):
    """(sum(conv2d in dtype * r), the convolution's output widened): amp's arithmetic, the casts
    written out (autocast is a with statement, which the ast capture does not take)."""
    def f(x, w, r):
        y = ops.conv2d(x.astype(dtype), w.astype(dtype), padding=1).astype(kiln.float32)
        return (y * r).sum(), y
    return f


def run(fn, x, w, r):
    """((loss, y), (gx, gw)) of value_and_grad(fn, (0, 1), has_aux) as NumPy."""
    (loss, y), grads = kiln.value_and_grad(fn, grad_position=(0, 1), has_aux=True)(*(kiln.Tensor(a) for a in (x, w, r)))
    return (loss.asnumpy(), y.asnumpy()), [g.asnumpy() for g in grads]


def rounded(t, dtype):
    """A float32 kiln tensor rounded to dtype (round to nearest even, as every kiln cast) and
    widened back, as NumPy."""
    return t.astype(dtype).astype(kiln.float32).asnumpy()


def widened(a, dtype):
    return kiln.Tensor(a).astype(dtype).astype(kiln.float32)


def winograd_references(x, w, r, dtype):
    """{name: the float32 Winograd op on the widened 16-bit operands, rounded to dtype}: what the
    fallback must compute, bit for bit (y; gx and gw with the output gradient dtype(r))."""
    xw, ww, gyw = widened(x, dtype), widened(w, dtype), widened(r, dtype)
    return {"y": rounded(winograd_forward(xw, ww, PADS), dtype),
            "gx": rounded(winograd_backward_input(gyw, ww, x.shape, PADS), dtype),
            "gw": rounded(winograd_backward_weight(xw, gyw, w.shape, PADS), dtype)}


def ulp(v, dtype):
    """The spacing of dtype's numbers at |v| (bfloat16: 8 significant bits; float16: 11, and
    subnormals' spacing below 2^-14)."""
    e = np.floor(np.log2(np.maximum(np.abs(v), 1e-30)))
    return np.exp2(e - 7) if dtype == kiln.bfloat16 else np.exp2(np.maximum(e, -14) - 10)


def check_tolerance(got, eager, scale, dtype, what):
    """|got - eager| <= 1e-5 * max S + one ulp of dtype at the larger magnitude, element by element
    (docs/guide/mixed_precision.md: Winograd in amp)."""
    bound = TOL * float(np.max(scale)) + ulp(np.maximum(np.abs(got), np.abs(eager)), dtype)
    err = np.abs(got.astype(np.float64) - eager)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), f"{what}: {got[worst]} against eager {eager[worst]} at {worst}, bound {bound[worst]:.3g}"


def algorithms(jf):
    text = str(jf.explain())
    return re.findall(r"^  convolution \d+: (\S+) \[[^\]]*\].*: (direct|winograd F\(4x4, 3x3\))", text, re.M), text


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("level", ["O0", "O1"])
@pytest.mark.parametrize("backend", ["kbk", "sink"])
def test_16bit_training_convolutions_take_winograd_at_O1(dtype, mode, level, backend):
    x, w, r = problem()
    f = loss_of(dtype)
    (v_e, y_e), (gx_e, gw_e) = run(f, x, w, r)
    jf = kiln.jit(f, capture_mode=mode, jit_level=level, backend=backend)
    run(jf, x, w, r)
    (v, y), (gx, gw) = run(jf, x, w, r)
    assert jf.cache_info().eager_calls == 0
    algos, text = algorithms(jf)
    chosen = {op: a for op, a in algos}
    assert {"conv2d_backward_input", "conv2d_backward_weight"} <= set(chosen), text
    got = {"y": y, "gx": gx, "gw": gw}
    eager = {"y": y_e, "gx": gx_e, "gw": gw_e}
    if level == "O0":  # the graph as recorded: eager's direct kernels, eager's bits
        assert all(a == "direct" for _, a in algos), text
        for name in got:
            np.testing.assert_array_equal(got[name], eager[name], err_msg=name)
        np.testing.assert_array_equal(v, v_e)
        return
    # bytecode capture also compiles the forward on its own (no gradient: direct); the forward of
    # the graph with the backward takes Winograd in every mode
    forward = [a for op, a in algos if not op.startswith("conv2d_backward")]
    assert WINOGRAD in forward, text
    which = {"y": WINOGRAD, "gx": expected_algorithm("conv2d_backward_input"),
             "gw": expected_algorithm("conv2d_backward_weight")}
    assert chosen["conv2d_backward_input"] == which["gx"] and chosen["conv2d_backward_weight"] == which["gw"], text
    refs = winograd_references(x, w, r, dtype)
    xs, ws, rs = (widened(a, dtype).asnumpy().astype(np.float64) for a in (x, w, r))
    _, sy = conv_exact(xs, ws)
    _, sgx, _, sgw = conv_grads_exact(xs, ws, rs)
    scales = {"y": sy, "gx": sgx, "gw": sgw}
    for name in got:
        if which[name] != WINOGRAD:
            np.testing.assert_array_equal(got[name], eager[name], err_msg=name)
            continue
        assert not np.array_equal(refs[name], eager[name]), f"{name}: the check cannot tell Winograd from direct"
        check_tolerance(got[name], eager[name], scales[name], dtype, name)
        if mode == "bytecode" and np.array_equal(got[name], eager[name]):
            # value_and_grad of a bytecode-captured function computes eager's direct convolutions
            # today, float32 ones too (its forward compiled on its own, its gradient alike): bit
            # for bit eager's, which is within the tolerance
            continue
        # the float32 Winograd of the widened operands, rounded once
        np.testing.assert_array_equal(got[name], refs[name], err_msg=f"{name}: not the rounded float32 Winograd")


def test_the_tolerance_is_not_met_by_a_wrong_result():
    """check_tolerance fails a result one 16-bit ulp and a bit off (it can fail)."""
    x, w, r = problem(c=16, hw=8)
    (_, y), _ = run(loss_of(kiln.bfloat16), x, w, r)
    xs, ws = (widened(a, kiln.bfloat16).asnumpy().astype(np.float64) for a in (x, w))
    _, sy = conv_exact(xs, ws)
    check_tolerance(y, y, sy, kiln.bfloat16, "y")
    off = y.copy()
    k = np.unravel_index(np.argmax(np.abs(y)), y.shape)
    off[k] += 2.5 * ulp(y[k], kiln.bfloat16)
    with pytest.raises(AssertionError, match="y: "):
        check_tolerance(off, y, sy, kiln.bfloat16, "y")


@pytest.mark.skipif(not NATIVE, reason="oneDNN has no bf16 arithmetic on this CPU (or KILN_MAX_CPU_ISA caps it)")
def test_hardware_path_runs_the_chosen_convolutions_direct():
    """On oneDNN's bf16 primitives (no bf16 Winograd) the O1 graph that chose Winograd computes
    eager's direct convolutions, bit for bit, and the primitives ran."""
    x, w, r = problem()
    f = loss_of(kiln.bfloat16)
    kiln._C.gemm_bf16_force(1)
    before = kiln._C.amp_native()["conv_bf16_runs"]
    (v_e, y_e), g_e = run(f, x, w, r)
    jf = kiln.jit(f, capture_mode="trace", jit_level="O1")
    (v, y), g = run(jf, x, w, r)
    assert kiln._C.amp_native()["conv_bf16_runs"] - before == 6  # three eager, three compiled
    algos, text = algorithms(jf)
    assert WINOGRAD in [a for _, a in algos], text
    np.testing.assert_array_equal(y, y_e)
    for got, want in zip(g, g_e):
        np.testing.assert_array_equal(got, want)


def test_explain_says_where_a_16bit_winograd_runs():
    x, w, r = problem()
    jf = kiln.jit(loss_of(kiln.bfloat16), capture_mode="trace", jit_level="O1")
    run(jf, x, w, r)
    text = str(jf.explain())
    lines = [ln for ln in text.splitlines() if ln.startswith("  convolution") and ": winograd F(" in ln]
    assert lines and all("16-bit: the fp32-compute fallback runs it; oneDNN's bf16 primitives run it direct" in ln
                         for ln in lines), text
    conv = [c for c in jf.explain().convolutions if c["algorithm"] == WINOGRAD]
    assert conv and all(c["dtype"] == "bfloat16" for c in conv)
    # float32 Winograd lines carry no such note
    jf32 = kiln.jit(lambda x, w, r: ((ops.conv2d(x, w, padding=1) * r).sum(), r), capture_mode="trace", jit_level="O1")
    kiln.value_and_grad(jf32, grad_position=(0, 1), has_aux=True)(*(kiln.Tensor(a) for a in (x, w, r)))
    text32 = str(jf32.explain())
    assert "winograd F(4x4, 3x3)" in text32 and "16-bit" not in text32, text32


def test_amp_basic_block_at_O1_takes_winograd():
    """A BasicBlock under auto_mixed_precision O2 (bfloat16), forward and backward at O1: its 3x3
    convolutions are bfloat16 and take Winograd; the loss and the gradients stay within amp's
    tolerance of eager amp (docs/guide/mixed_precision.md: 2% of the largest magnitude)."""
    from kiln.models import BasicBlock
    rng = np.random.default_rng(3)
    block = BasicBlock(64)
    net = kiln.amp.auto_mixed_precision(block, "O2", kiln.bfloat16)
    x = kiln.Tensor(rng.standard_normal((1, 64, 32, 32)).astype(np.float32))
    params = block.trainable_params()
    step = kiln.value_and_grad(lambda x: net(x).astype(kiln.float32).sum(), None, params)
    v_e, g_e = step(x)
    jf = kiln.jit(step, jit_level="O1")
    jf(x)
    v, g = jf(x)
    text = jf.graph_str(x)
    assert re.search(r"bfloat16\[1, 64, 32, 32\] = conv2d_backward_input\([^)]*\) \{[^}]*, 1\}", text), text
    assert re.search(r"bfloat16\[1, 64, 32, 32\] = conv2d_fused\(", text), text
    assert abs(float(v.asnumpy()) - float(v_e.asnumpy())) <= 2e-2 * max(1.0, abs(float(v_e.asnumpy())))
    for got, want in zip(g, g_e):
        got, want = got.asnumpy(), want.asnumpy()
        assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max() + 1e-6
