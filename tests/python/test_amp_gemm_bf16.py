"""bfloat16 products on both paths (src/ops/gemm_bf16.h): the hardware path (oneDNN's bfloat16
matmul, where oneDNN's instruction set has bf16 arithmetic) and the fp32-compute fallback. Every
bfloat16 product op (matmul, linear, bmm, attention; forward and gradients) against its float32
result within the documented tolerance, eagerly and under every kiln.jit variant; the two paths
agree; the hardware path is seen to run (its call counter, `python -m kiln`); and the ISA switch
(KILN_MAX_CPU_ISA, in a child process) leaves only the fallback. Only the hardware-path cases skip on
CPUs without avx512_bf16 (or with oneDNN capped below avx512_core_bf16)."""
import json
import types

import numpy as np
import pytest

import kiln
from kiln import ops
from compiled_equal import assert_compiled_equal
from conftest import run_isolated

TOL = 2e-2  # docs/guide/mixed_precision.md: one bfloat16 product, forward or gradient
HARDWARE = kiln._C.gemm_bf16_info()["hardware"]
NO_HARDWARE = "no bfloat16 hardware path: the CPU has no avx512_bf16, or oneDNN's instruction set is capped below it"


def t(rng, *shape):
    return kiln.tensor(rng.standard_normal(shape).astype(np.float32))


# shapes past the tiny-product loop (64 multiply-adds), a split over threads (>= 262144), transposed
# operands (views BLAS takes as Trans), broadcast batches, a bias, and one tiny product (the plain
# reference loop)
CASES = {
    "matmul": (lambda a, b: ops.matmul(a, b), lambda r: (t(r, 40, 96), t(r, 96, 72))),
    "matmul_tiny": (lambda a, b: ops.matmul(a, b), lambda r: (t(r, 2, 4), t(r, 4, 3))),
    "matmul_transposed": (lambda a, b: ops.matmul(a.T, b.T), lambda r: (t(r, 64, 48), t(r, 80, 64))),
    "matmul_vector": (lambda a, b: ops.matmul(a, b), lambda r: (t(r, 96), t(r, 96, 40))),
    "matmul_broadcast": (lambda a, b: ops.matmul(a, b), lambda r: (t(r, 2, 3, 24, 32), t(r, 3, 32, 20))),
    "linear": (lambda x, w, b: ops.dense(x, w, b), lambda r: (t(r, 3, 40, 64), t(r, 72, 64), t(r, 72))),
    "linear_split": (lambda x, w, b: ops.dense(x, w, b), lambda r: (t(r, 64, 128), t(r, 96, 128), t(r, 96))),
    "linear_nobias": (lambda x, w: ops.dense(x, w), lambda r: (t(r, 33, 70), t(r, 19, 70))),
    "bmm": (lambda a, b: ops.bmm(a, b), lambda r: (t(r, 3, 24, 48), t(r, 3, 48, 40))),
    "attention": (lambda q, k, v: ops.scaled_dot_product_attention(q, k, v),
                  lambda r: (t(r, 1, 2, 8, 16), t(r, 1, 2, 64, 16), t(r, 1, 2, 64, 16))),
}
GEMM_CASES = [n for n in CASES if n not in ("attention", "matmul_tiny")]


@pytest.fixture(params=["hardware", "fallback"])
def path(request):
    """The path bfloat16 products take in the test: forced on (skipped without the hardware) or off."""
    if request.param == "hardware" and not HARDWARE:
        pytest.skip(NO_HARDWARE)
    kiln._C.gemm_bf16_force(1 if request.param == "hardware" else 0)
    yield request.param
    kiln._C.gemm_bf16_force(-1)


def amp(fn, level="O1", tag=None):
    def run(*args):
        with kiln.amp.autocast(low_prec_dtype=kiln.bfloat16, level=level):
            return fn(*args)
    if tag:  # a code object of its own: kiln.jit's bytecode capture keeps what it saw per code object
        run = types.FunctionType(run.__code__.replace(co_name=f"run_{tag}"), run.__globals__, closure=run.__closure__)
    return run


def rel_err(got, want):
    got = np.asarray(got.astype(kiln.float32).numpy(), np.float64)
    want = np.asarray(want.astype(kiln.float32).numpy(), np.float64)
    return np.abs(got - want).max() / max(np.abs(want).max(), 1e-6)


def calls():
    return kiln._C.gemm_bf16_info()["calls"]


@pytest.mark.parametrize("name", CASES)
def test_forward_matches_float32(name, path):
    fn, make = CASES[name]
    args = make(np.random.default_rng(1))
    before = calls()
    got = amp(fn)(*args)
    ran = calls() - before
    assert got.dtype is kiln.bfloat16
    assert rel_err(got, fn(*args)) <= TOL, name
    if name in GEMM_CASES:  # the hardware path ran its primitives; the fallback none
        assert (ran > 0) == (path == "hardware"), (name, path, ran)


@pytest.mark.parametrize("name", CASES)
def test_gradients_match_float32(name, path):
    fn, make = CASES[name]
    args = make(np.random.default_rng(2))
    loss = lambda *a: fn(*a).astype(kiln.float32).sum()  # noqa: E731
    positions = tuple(range(len(args)))
    _, want = kiln.value_and_grad(loss, grad_position=positions)(*args)
    before = calls()
    _, got = kiln.value_and_grad(amp(loss), grad_position=positions)(*args)
    ran = calls() - before
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype is kiln.float32
        assert rel_err(g, w) <= TOL, f"{name} gradient {k}"
    if name in GEMM_CASES:  # forward and the gradient products
        assert (ran >= 2) == (path == "hardware"), (name, path, ran)


@pytest.mark.parametrize("name", ["matmul", "matmul_transposed", "linear", "bmm", "attention"])
def test_compiled_equals_eager(name, path):
    fn, make = CASES[name]
    args = make(np.random.default_rng(3))
    before = calls()
    assert_compiled_equal(amp(fn, "O2", f"{path}_forward"), args)
    assert_compiled_equal(amp(lambda *a: fn(*a).astype(kiln.float32).sum(), "O2", f"{path}_grad"), args, grad=True)
    if name != "attention":
        assert (calls() > before) == (path == "hardware")


def results(names, seed):
    out = {}
    for name in names:
        fn, make = CASES[name]
        args = make(np.random.default_rng(seed))
        loss = lambda *a, fn=fn: fn(*a).astype(kiln.float32).sum()  # noqa: E731
        y = amp(fn)(*args)
        _, g = kiln.value_and_grad(amp(loss), grad_position=tuple(range(len(args))))(*args)
        out[name] = [y.astype(kiln.float32).numpy()] + [x.numpy() for x in g]
    return out


def agree(a, b):
    """Both paths sum in float32 and round once: the orders of their sums differ, so a result may
    round to a neighbouring bfloat16 (2^-8 apart relatively) -- within 1% of the largest magnitude."""
    for name in a:
        for k, (x, y) in enumerate(zip(a[name], b[name])):
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-2 * max(np.abs(y).max(), 1e-6), err_msg=f"{name} {k}")


@pytest.mark.skipif(not HARDWARE, reason=NO_HARDWARE)
def test_the_two_paths_agree():
    kiln._C.gemm_bf16_force(1)
    try:
        before = calls()
        hw = results(CASES, 4)
        assert calls() > before
        kiln._C.gemm_bf16_force(0)
        before = calls()
        fb = results(CASES, 4)
        assert calls() == before
    finally:
        kiln._C.gemm_bf16_force(-1)
    agree(hw, fb)


PROBE = """
import json, sys
sys.path.insert(0, {tests!r})
import kiln
from kiln.config import amp_kernel_path, show_config
import io
import test_amp_gemm_bf16 as T
out = {{k: [a.tolist() for a in v] for k, v in T.results(T.GEMM_CASES, 5).items()}}
buf = io.StringIO()
show_config(buf)
print(json.dumps({{"info": kiln._C.gemm_bf16_info(), "path": amp_kernel_path(), "config": buf.getvalue(),
                  "out": out}}))
"""


def probe(**env):
    import os
    code = PROBE.format(tests=os.path.dirname(os.path.abspath(__file__)))
    rc, out = run_isolated(code, timeout=300, KILN_GEMM_CALIBRATION="off", **env)
    assert rc == 0, out
    r = json.loads(out.strip().splitlines()[-1])
    r["out"] = {k: [np.array(a) for a in v] for k, v in r["out"].items()}
    return r


def test_the_isa_switch_forces_the_fallback():
    """KILN_MAX_CPU_ISA=avx512_core caps oneDNN below bf16 arithmetic: no hardware path, no primitive
    run, `python -m kiln` says the fallback runs; its results agree with the hardware path's here."""
    capped = probe(KILN_MAX_CPU_ISA="avx512_core")
    assert not capped["info"]["hardware"] and capped["info"]["path"] is None and capped["info"]["calls"] == 0
    assert capped["path"][0] == "fp32" and "bf16: fp32-compute fallback" in capped["path"][1]
    assert "mixed precision: fp32 path; bf16: fp32-compute fallback" in capped["config"]
    assert "fp16: fp32-compute fallback" in capped["config"]
    if not HARDWARE:
        pytest.skip(NO_HARDWARE + " (the capped run passed; nothing to compare it with)")
    on = probe(KILN_BF16_GEMM="onednn")
    assert on["info"]["calls"] > 0
    assert on["path"][0] == "bf16" and on["info"]["path"] in on["config"]
    assert "mixed precision: bf16 path; bf16: oneDNN avx512_core_" in on["config"]
    agree(on["out"], capped["out"])


@pytest.mark.skipif(not HARDWARE, reason=NO_HARDWARE)
def test_kiln_bf16_gemm_chooses_and_the_measurement_says_why():
    off = probe(KILN_BF16_GEMM="fallback")
    assert off["info"]["hardware"] and off["info"]["path"] is None and off["info"]["calls"] == 0
    assert "KILN_BF16_GEMM=fallback" in off["path"][1]
    auto = probe()
    assert "measured" in auto["info"]["why"] and ("GFLOP/s" in auto["config"])
    assert (auto["info"]["path"] is not None) == (auto["info"]["calls"] > 0)
    agree(auto["out"], off["out"])


@pytest.mark.skipif(not HARDWARE, reason=NO_HARDWARE)
def test_the_primitive_cache_is_bounded_and_serves_many_shapes():
    kiln._C.gemm_bf16_force(1)
    try:
        rng = np.random.default_rng(6)
        for n in range(8, 8 + 300):  # more shapes than the cache holds (256)
            a = t(rng, 5, n).astype(kiln.bfloat16)
            b = t(rng, n, 6).astype(kiln.bfloat16)
            y = ops.matmul(a, b)
            want = a.astype(kiln.float32).numpy() @ b.astype(kiln.float32).numpy()
            assert rel_err(y, kiln.tensor(want)) <= TOL
        assert kiln._C.gemm_bf16_info()["cached"] <= 256
    finally:
        kiln._C.gemm_bf16_force(-1)


def test_float16_keeps_the_fallback():
    rng = np.random.default_rng(7)
    a, b = t(rng, 40, 96), t(rng, 96, 72)
    before = calls()
    with kiln.amp.autocast(low_prec_dtype=kiln.float16):
        y = ops.matmul(a, b)
    assert y.dtype is kiln.float16 and calls() == before
    assert rel_err(y, ops.matmul(a, b)) <= 4e-3


def test_deterministic_keeps_the_fallback():
    """set_deterministic(True): bfloat16 products take the fp32-compute fallback in every process,
    whatever the per-process timing chose (the two paths differ within bfloat16 rounding)."""
    a = kiln.Tensor(np.random.default_rng(5).standard_normal((64, 64)).astype(np.float32)).astype(kiln.bfloat16)
    kiln.set_deterministic(True)
    try:
        before = kiln._C.gemm_bf16_info()["calls"]
        out = ops.matmul(a, a)
        info = kiln._C.gemm_bf16_info()
        assert info["calls"] == before and info["path"] is None
        if HARDWARE:  # (without bf16 arithmetic the fallback's reason is the instruction set)
            assert "set_deterministic" in info["why"], info["why"]
    finally:
        kiln.set_deterministic(False)
    kiln._C.gemm_bf16_force(0)
    try:
        np.testing.assert_array_equal(ops.matmul(a, a).astype(kiln.float32).numpy(), out.astype(kiln.float32).numpy())
    finally:
        kiln._C.gemm_bf16_force(-1)
