"""bfloat16 convolutions on the CPU's bf16 arithmetic (oneDNN's bf16 primitives, float32
accumulation; src/ops/conv.c, conv_dnnl.c) and on the fp32-compute fallback: conv2d forward, its
input gradient and its weight gradient (strides, padding, dilation, groups, bias) against float32
within bfloat16's documented tolerance (docs/guide/mixed_precision.md: 2% of the largest magnitude),
eagerly and under every kiln.jit variant; the hardware path checked to have run (a counter) and
compared with the fallback forced by KILN_MAX_CPU_ISA in a subprocess."""
import json

import numpy as np
import pytest

import kiln
from kiln import ops
from compiled_equal import assert_compiled_equal
from conftest import run_isolated

TOL = {kiln.bfloat16: 2e-2, kiln.float16: 4e-3}
# the CPU and oneDNN's cap give the bf16 primitives; this module forces the hardware path (on a CPU
# where oneDNN's bf16 is slower, kiln's own timing would keep the fallback: gemm_bf16.h)
NATIVE = kiln._C.gemm_bf16_info()["hardware"]
NEEDS_BF16 = pytest.mark.skipif(not NATIVE, reason="oneDNN has no bf16 arithmetic on this CPU (no avx512_bf16 / AMX, "
                                                   "or KILN_MAX_CPU_ISA caps it): only the fallback runs here")



@pytest.fixture(autouse=True)
def hardware_path():
    kiln._C.gemm_bf16_force(1)
    yield
    kiln._C.gemm_bf16_force(-1)


# (x shape, w shape, conv2d keywords, bias): the geometry the op supports
CASES = {
    "3x3 pad 1 bias": ((2, 16, 10, 10), (32, 16, 3, 3), dict(padding=1), True),
    "3x3 stride 2 asym pad": ((1, 16, 11, 9), (16, 16, 3, 3), dict(stride=2, padding=(1, 0)), False),
    "dilation 2 groups 4": ((2, 16, 9, 9), (32, 4, 3, 3), dict(padding=2, dilation=2, groups=4), True),
    "1x1 stride 2": ((2, 32, 8, 8), (16, 32, 1, 1), dict(stride=2), False),
    "5x5 rgb stride (2, 1)": ((1, 3, 12, 12), (8, 3, 5, 5), dict(stride=(2, 1), padding=2), True),
    "depthwise": ((1, 16, 7, 7), (16, 1, 3, 3), dict(padding=1, groups=16), False),
}


def case_args(name, seed):
    xs, ws, kw, bias = CASES[name]
    rng = np.random.default_rng(seed)
    x = kiln.tensor(rng.standard_normal(xs).astype(np.float32))
    w = kiln.tensor((rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32))
    b = kiln.tensor(rng.standard_normal(ws[0]).astype(np.float32)) if bias else None
    y_shape = ops.conv2d(x, w, b, **kw).shape
    r = kiln.tensor(rng.standard_normal(y_shape).astype(np.float32))  # weights the loss: gy is not all ones
    return kw, x, w, b, r


def conv_fn(kw, bias):
    if bias:
        return lambda x, w, b: ops.conv2d(x, w, b, **kw)
    return lambda x, w: ops.conv2d(x, w, **kw)


def loss_fn(kw, bias):
    conv = conv_fn(kw, bias)
    return lambda r, *a: (conv(*a).astype(kiln.float32) * r).sum()


def amp(fn, dtype=kiln.bfloat16, level="O1"):
    def run(*args):
        with kiln.amp.autocast(low_prec_dtype=dtype, level=level):
            return fn(*args)
    return run


def rel_err(got, want):
    got = np.asarray(got.astype(kiln.float32).numpy(), np.float64)
    want = np.asarray(want.numpy(), np.float64)
    return np.abs(got - want).max() / max(np.abs(want).max(), 1e-6)


def runs():
    return kiln._C.amp_native()["conv_bf16_runs"]


@pytest.mark.parametrize("dtype", [kiln.bfloat16, kiln.float16], ids=str)
@pytest.mark.parametrize("name", CASES)
def test_forward_and_gradients_match_float32(name, dtype):
    kw, x, w, b, r = case_args(name, 1)
    bias = b is not None
    args = (x, w, b) if bias else (x, w)
    want = conv_fn(kw, bias)(*args)
    before = runs()
    got = amp(conv_fn(kw, bias), dtype)(*args)
    assert got.dtype is dtype
    assert rel_err(got, want) <= TOL[dtype], f"{name}: forward"
    positions = tuple(range(1, len(args) + 1))
    _, gwant = kiln.value_and_grad(loss_fn(kw, bias), grad_position=positions)(r, *args)
    _, ggot = kiln.value_and_grad(amp(loss_fn(kw, bias), dtype), grad_position=positions)(r, *args)
    for what, g, gw in zip(("input", "weight", "bias"), ggot, gwant):
        assert g.dtype is kiln.float32
        assert rel_err(g, gw) <= TOL[dtype], f"{name}: {what} gradient"
    # forward twice (once in the loss) and both gradients: bf16 primitives where the CPU has them;
    # float16 always converts (oneDNN 2.x has no f16 convolution)
    want_runs = 4 if dtype is kiln.bfloat16 and NATIVE else 0
    assert runs() - before == want_runs, f"{name}: {runs() - before} bf16 convolutions ran, expected {want_runs}"


@pytest.mark.parametrize("name", ["3x3 pad 1 bias", "dilation 2 groups 4", "5x5 rgb stride (2, 1)"])
def test_compiled_equals_eager(name):
    kw, x, w, b, r = case_args(name, 2)
    bias = b is not None
    args = (x, w, b) if bias else (x, w)
    before = runs()
    assert_compiled_equal(amp(conv_fn(kw, bias)), args)
    assert_compiled_equal(amp(loss_fn(kw, bias), level="O2"), (r, *args), grad=True)
    assert (runs() > before) == NATIVE


def test_bf16_operands_without_amp_run_the_hardware_path():
    """A conv2d of bfloat16 tensors (no autocast: a model cast to bfloat16) takes the same path."""
    kw, x, w, b, _ = case_args("3x3 pad 1 bias", 3)
    before = runs()
    got = ops.conv2d(x.astype(kiln.bfloat16), w.astype(kiln.bfloat16), b.astype(kiln.bfloat16), **kw)
    assert got.dtype is kiln.bfloat16
    assert rel_err(got, ops.conv2d(x, w, b, **kw)) <= TOL[kiln.bfloat16]
    assert runs() - before == (1 if NATIVE else 0)


PROBE = """
import json, sys, numpy as np, kiln
sys.path.insert(0, %r)
from test_amp_conv_bf16 import CASES, case_args, conv_fn, loss_fn, amp
out = {"native": kiln._C.amp_native()["bf16"], "path": kiln.config.amp_kernel_path()[0], "cases": {}}
for name in CASES:
    kw, x, w, b, r = case_args(name, 4)
    bias = b is not None
    args = (x, w, b) if bias else (x, w)
    y = amp(conv_fn(kw, bias))(*args)
    _, g = kiln.value_and_grad(amp(loss_fn(kw, bias)), grad_position=tuple(range(1, len(args) + 1)))(r, *args)
    out["cases"][name] = [y.astype(kiln.float32).numpy().tolist()] + [t.numpy().tolist() for t in g]
out["runs"] = kiln._C.amp_native()["conv_bf16_runs"]
print(json.dumps(out))
"""


def probe(**env):
    import os
    rc, text = run_isolated(PROBE % os.path.dirname(os.path.abspath(__file__)), timeout=300, **env)
    assert rc == 0, text
    return json.loads(text.strip().splitlines()[-1])


def test_forced_fallback_runs_no_bf16_primitive():
    """KILN_MAX_CPU_ISA=avx512_core (below avx512_core_bf16) forces the fp32-compute fallback on
    any CPU: no bf16 primitive runs, `python -m kiln` says fp32, and the results hold float32's
    within bfloat16's tolerance."""
    fb = probe(KILN_MAX_CPU_ISA="avx512_core")
    assert not fb["native"] and fb["path"] == "fp32" and fb["runs"] == 0
    for name, outs in fb["cases"].items():
        kw, x, w, b, r = case_args(name, 4)
        bias = b is not None
        args = (x, w, b) if bias else (x, w)
        _, g = kiln.value_and_grad(loss_fn(kw, bias), grad_position=tuple(range(1, len(args) + 1)))(r, *args)
        for k, (got, want) in enumerate(zip(outs, [conv_fn(kw, bias)(*args)] + list(g))):
            want = want.numpy().astype(np.float64)
            err = np.abs(np.array(got) - want).max() / max(np.abs(want).max(), 1e-6)
            assert err <= TOL[kiln.bfloat16], f"{name} output {k}: {err:.3g}"


@NEEDS_BF16
def test_hardware_path_and_forced_fallback_agree():
    """The default selection runs oneDNN's bf16 primitives (counted; `python -m kiln` says bf16),
    the capped one none; every forward and gradient agrees within bfloat16's rounding (both
    accumulate in float32 and round once, in different orders)."""
    hw, fb = probe(KILN_BF16_GEMM="onednn"), probe(KILN_MAX_CPU_ISA="avx512_core")
    assert hw["native"] and hw["path"] == "bf16" and hw["runs"] == 4 * len(CASES)  # the forward twice (once in the loss), both gradients
    assert not fb["native"] and fb["runs"] == 0
    for name in CASES:
        for k, (a, b) in enumerate(zip(hw["cases"][name], fb["cases"][name])):
            a, b = np.array(a), np.array(b)
            err = np.abs(a - b).max() / max(np.abs(b).max(), 1e-6)
            assert err <= 1e-2, f"{name} output {k}: hardware and fallback differ by {err:.3g}"


@NEEDS_BF16
def test_the_switch_selects_the_path_in_one_process():
    """kiln._C.amp_native_allow(False) forbids the bf16 convolution primitives (python -m kiln says so):
    the same eager and compiled convolution and gradients take the fallback, agree with the
    hardware path within bfloat16's rounding, and compiled still equals eager on the fallback."""
    kw, x, w, b, r = case_args("3x3 pad 1 bias", 5)
    loss = amp(loss_fn(kw, True), level="O2")
    step = kiln.value_and_grad(loss, grad_position=(1, 2, 3))
    before = runs()
    hw = step(r, x, w, b)
    assert runs() - before == 3
    prev = kiln._C.amp_native_allow(False)
    try:
        assert not kiln._C.amp_native()["bf16"] and "not convolutions" in kiln.config.amp_kernel_path()[1]
        fb = step(r, x, w, b)
        assert_compiled_equal(loss, (r, x, w, b), grad=True)
        assert runs() - before == 3
    finally:
        kiln._C.amp_native_allow(prev)
    assert kiln.config.amp_kernel_path()[0] == "bf16"
    for what, a, c in zip(("value", "input", "weight", "bias"), (hw[0], *hw[1]), (fb[0], *fb[1])):
        assert rel_err(a, c) <= 1e-2, what
