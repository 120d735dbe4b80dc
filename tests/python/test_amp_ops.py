"""Every op with a low-precision path under kiln.amp (products: matmul, linear, bmm, conv2d forward
and backward, attention forward and backward), against its float32 result within the low dtype's
tolerance, eagerly; and every compiled variant (capture ast / bytecode / trace x jit_level O0 / O1 /
O2 x kbk / sink) equal to eager amp, forward and gradients, at amp levels O1, O2 and O3."""
import numpy as np
import pytest

import kiln
from kiln import ops
from compiled_equal import assert_compiled_equal

LOW = (kiln.bfloat16, kiln.float16)
# relative to the largest magnitude of the float32 result: bfloat16 keeps 8 significant bits,
# float16 11; products accumulate in float32, so the error is the inputs' rounding
TOL = {kiln.bfloat16: 2e-2, kiln.float16: 4e-3}


def t(rng, *shape, scale=1.0):
    return kiln.tensor((rng.standard_normal(shape) * scale).astype(np.float32))


def matmul_case(rng):
    return (lambda a, b: ops.matmul(a, b)), (t(rng, 5, 24), t(rng, 24, 7))


def linear_case(rng):
    return (lambda x, w, b: ops.dense(x, w, b)), (t(rng, 6, 16), t(rng, 9, 16), t(rng, 9))


def bmm_case(rng):
    return (lambda a, b: ops.bmm(a, b)), (t(rng, 3, 4, 16), t(rng, 3, 16, 5))


def conv_case(rng):
    return (lambda x, w, b: ops.conv2d(x, w, b, padding=1)), (t(rng, 2, 3, 8, 8), t(rng, 4, 3, 3, 3), t(rng, 4))


def attention_case(rng):
    # 64 keys: the fused blockwise op (the unfused path is matmul + softmax + matmul)
    return ((lambda q, k, v: ops.scaled_dot_product_attention(q, k, v)),
            (t(rng, 1, 2, 8, 16), t(rng, 1, 2, 64, 16), t(rng, 1, 2, 64, 16)))


CASES = {"matmul": matmul_case, "linear": linear_case, "bmm": bmm_case, "conv2d": conv_case,
         "attention": attention_case}


def amp_fn(fn, dtype, level="O1"):
    def run(*args):
        with kiln.amp.autocast(low_prec_dtype=dtype, level=level):
            return fn(*args)
    return run


def close_to(got, want, dtype, what):
    got = np.asarray(got.astype(kiln.float32).numpy(), np.float64)
    want = np.asarray(want.numpy(), np.float64)
    err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-6)
    assert err <= TOL[dtype], f"{what}: relative error {err:.3g} > {TOL[dtype]}"


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name", CASES)
def test_forward_runs_low_and_matches_float32(name, dtype):
    fn, args = CASES[name](np.random.default_rng(1))
    want = fn(*args)
    got = amp_fn(fn, dtype)(*args)
    assert got.dtype is dtype  # a product runs in the low dtype at O1
    close_to(got, want, dtype, name)


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name", CASES)
def test_gradients_match_float32_and_keep_the_inputs_dtype(name, dtype):
    fn, args = CASES[name](np.random.default_rng(2))
    loss = lambda *a: fn(*a).astype(kiln.float32).sum()  # noqa: E731
    positions = tuple(range(len(args)))
    _, want = kiln.value_and_grad(loss, grad_position=positions)(*args)
    _, got = kiln.value_and_grad(amp_fn(loss, dtype), grad_position=positions)(*args)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype is kiln.float32  # the gradient of a float32 input (master weights stay float32)
        close_to(g, w, dtype, f"{name} gradient {k}")


@pytest.mark.parametrize("level", ["O1", "O2", "O3"])
@pytest.mark.parametrize("name", CASES)
def test_compiled_equals_eager_amp(name, level):
    fn, args = CASES[name](np.random.default_rng(3))
    assert_compiled_equal(amp_fn(fn, kiln.bfloat16, level), args)


@pytest.mark.parametrize("name", ["linear", "conv2d", "attention"])
def test_compiled_gradients_equal_eager_amp(name):
    fn, args = CASES[name](np.random.default_rng(4))
    assert_compiled_equal(amp_fn(lambda *a: fn(*a).astype(kiln.float32).sum(), kiln.bfloat16, "O2"), args, grad=True)


def test_a_jitted_function_is_compiled_apart_under_amp():
    """The same jitted function called without amp, under autocast and without again: each call
    gives eager's dtype and values (a call under amp is keyed by its setting)."""
    rng = np.random.default_rng(5)
    a, b = t(rng, 4, 8), t(rng, 8, 3)
    for mode in ("ast", "bytecode", "trace"):
        f = kiln.jit(lambda x, y: ops.matmul(x, y) + 1.0, capture_mode=mode)
        plain = f(a, b)
        with kiln.autocast("cpu", dtype=kiln.bfloat16):
            low = f(a, b)
            want_low = ops.matmul(a, b) + 1.0
        again = f(a, b)
        assert (plain.dtype, low.dtype, again.dtype) == (kiln.float32, kiln.bfloat16, kiln.float32), mode
        np.testing.assert_array_equal(low.astype(kiln.float32).numpy(), want_low.astype(kiln.float32).numpy())
        np.testing.assert_allclose(again.numpy(), (ops.matmul(a, b) + 1.0).numpy(), rtol=1e-6)


def test_megengine_trace_records_apart_under_amp():
    rng = np.random.default_rng(6)
    a, b = t(rng, 4, 8), t(rng, 8, 3)
    traced = kiln.trace(lambda x, y: ops.matmul(x, y))
    assert traced(a, b).dtype is kiln.float32
    with kiln.amp.autocast(low_prec_dtype=kiln.bfloat16):
        got = traced(a, b)
    assert got.dtype is kiln.bfloat16
    close_to(got, ops.matmul(a, b), kiln.bfloat16, "traced matmul")
    assert traced(a, b).dtype is kiln.float32


ISA_PROBE = """
import json, numpy as np, kiln
from kiln import ops
from kiln.config import amp_kernel_path
rng = np.random.default_rng(7)
a = kiln.tensor(rng.standard_normal((33, 70)).astype(np.float32))
b = kiln.tensor(rng.standard_normal((70, 19)).astype(np.float32))
x = kiln.tensor(rng.standard_normal((2, 3, 9, 9)).astype(np.float32))
w = kiln.tensor(rng.standard_normal((5, 3, 3, 3)).astype(np.float32))
with kiln.amp.autocast(low_prec_dtype=kiln.bfloat16):
    mm, cv = ops.matmul(a, b), ops.conv2d(x, w, padding=1)
print(json.dumps({"path": amp_kernel_path()[0], "dnnl_isa": kiln._C.build_info()["dnnl_isa"],
                  "mm": mm.astype(kiln.float32).numpy().tolist(), "cv": cv.astype(kiln.float32).numpy().tolist()}))
"""


def test_the_isa_switch_selects_the_path_and_both_give_the_same_results():
    """KILN_MAX_CPU_ISA caps oneDNN: below avx512_core_bf16 the products take the float32 path,
    whatever the CPU has; the results agree with the default selection within bfloat16's rounding
    (float32 GEMMs of other instruction sets may round the last bit apart)."""
    import json

    from conftest import run_isolated

    runs = {}
    for cap in (None, "avx2"):
        rc, out = run_isolated(ISA_PROBE, **({"KILN_MAX_CPU_ISA": cap} if cap else {}))
        assert rc == 0, out
        runs[cap] = json.loads(out.strip().splitlines()[-1])
    assert runs["avx2"]["dnnl_isa"] == "avx2" and runs["avx2"]["path"] == "fp32"
    for key in ("mm", "cv"):
        got, want = np.array(runs["avx2"][key]), np.array(runs[None][key])
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
    if runs[None]["dnnl_isa"] not in ("avx512_core_bf16", "avx512_core_amx"):
        assert runs[None]["path"] == "fp32"


def test_low_precision_reductions_accumulate_in_float32():
    """Sums, means, scans, softmax and norms of bfloat16 values add float32 numbers and round once:
    10000 ones sum to bfloat16(10000) = 9984 (a bfloat16 accumulator stops at 256)."""
    ones = ops.ones((10000,), dtype=kiln.bfloat16)
    assert float(ones.sum()) == 9984.0 and float(ones.mean()) == 1.0
    assert float(ops.cumsum(ones, 0)[-1]) == 9984.0
    with kiln.amp.autocast(low_prec_dtype=kiln.bfloat16, level="O3"):  # softmax and norms run low at O3
        p = ops.softmax(kiln.tensor(np.full((2, 3000), 0.01, np.float32)), -1)
        z = kiln.tensor(np.random.default_rng(8).standard_normal((4, 4096)).astype(np.float32) + 100)
        n = ops.layer_norm(z, (4096,))
    assert p.dtype is kiln.bfloat16 and n.dtype is kiln.bfloat16
    np.testing.assert_allclose(p.astype(kiln.float32).numpy().sum(-1), 1.0, atol=5e-3)
    # statistics of values near 100 (bfloat16 spacing 0.5 there) still normalize to unit variance
    np.testing.assert_allclose(n.astype(kiln.float32).numpy().std(-1), 1.0, atol=5e-3)
