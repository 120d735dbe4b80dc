"""The instruction set kiln uses (issue 17 part 2): KILN_MAX_CPU_ISA caps the CPU's, and the
kernel families compiled once per instruction set (src/ops/isa_dispatch.h) run the variant of the
level chosen. Here: every variant this CPU runs computes the float32 norm kernels (layer_norm,
rms_norm, batch_norm) and the softmax family (softmax, log_softmax), forward and backward, and
the elementwise loops, as NumPy's float64 formulas do (the Winograd
family's variants are checked by tests/c/test_conv_winograd.c); the AVX-512 variant only on CPUs
with AVX-512 (skipped elsewhere, saying so). In fresh interpreters: KILN_MAX_CPU_ISA=avx2 gives
the AVX2 choices (variants, oneDNN's ISA, the 8-channel block, kiln's Winograd, generated C
without AVX-512) and the results of the uncapped run; a bad value stops the import."""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln import ops
from kiln._optable import OP
from kiln.ops._util import apply

VARIANTS = ("baseline", "avx2", "avx512")


@pytest.fixture
def variant(request):
    name = request.param
    if name not in kiln._C.isa_variants():
        pytest.skip(f"this CPU ({kiln._C.build_info()['cpu_isa_level']}) cannot run the {name} variant")
    kiln._C.isa_select(name)
    yield name
    kiln._C.isa_select(None)


def _grads(fn, *arrays, seed=5):
    """fn's float32 output and the gradients of sum(out * W) for fixed random W, as float64 arrays."""
    tensors = [kiln.Tensor(a.astype(np.float32)) for a in arrays]
    with kiln.no_grad():
        out = fn(*tensors)
    weight = np.random.default_rng(seed).standard_normal(out.shape)
    wt = kiln.Tensor(weight.astype(np.float32))
    grads = kiln.grad(lambda *ts: (fn(*ts) * wt).sum(), grad_position=tuple(range(len(tensors))))(*tensors)
    return out.asnumpy().astype(np.float64), weight, [g.asnumpy().astype(np.float64) for g in grads]


def _close(got, want, what):
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4 * max(1.0, float(np.abs(want).max())), err_msg=what)


def _row_norm_ref(x, w, b, gy, centered, eps):
    """layer_norm (centered) / rms_norm over the last axis and its gradients, float64."""
    mu = x.mean(-1, keepdims=True) if centered else 0.0
    rs = 1 / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    xh = (x - mu) * rs
    y = xh * w + (b if b is not None else 0)
    g = gy * w
    gx = rs * (g - (g.mean(-1, keepdims=True) if centered else 0) - xh * (g * xh).mean(-1, keepdims=True))
    rows = tuple(range(x.ndim - 1))
    return y, gx, (gy * xh).sum(rows), gy.sum(rows)


def _batch_norm_ref(x, gamma, beta, gy, eps):
    """batch_norm with batch statistics over every axis but 1, and its gradients, float64."""
    axes = (0,) + tuple(range(2, x.ndim))
    shape = [1, -1] + [1] * (x.ndim - 2)
    mu, var = x.mean(axes, keepdims=True), x.var(axes, keepdims=True)
    rs = 1 / np.sqrt(var + eps)
    xh = (x - mu) * rs
    y = xh * gamma.reshape(shape) + beta.reshape(shape)
    g = gy * gamma.reshape(shape)
    gx = rs * (g - g.mean(axes, keepdims=True) - xh * (g * xh).mean(axes, keepdims=True))
    return y, gx, (gy * xh).sum(axes), gy.sum(axes)


# D over 2048 takes the column-blocked backward (row sums first)
@pytest.mark.parametrize("variant", VARIANTS, indirect=True)
@pytest.mark.parametrize("rows,d", [(33, 64), (3, 2600)], ids=str)
def test_row_norms_every_variant(variant, rows, d):
    assert set(kiln._C.isa_kernels().values()) == {variant}
    rng = np.random.default_rng(rows + d)
    x = rng.standard_normal((rows, d)) * 2 + 0.5
    w, b = rng.uniform(0.5, 1.5, d), rng.standard_normal(d) * 0.1
    y, gy, (gx, gw, gb) = _grads(lambda xt, wt, bt: ops.layer_norm(xt, d, wt, bt), x, w, b)
    for got, want, what in zip((y, gx, gw, gb), _row_norm_ref(x, w, b, gy, True, 1e-5), ("y", "gx", "gw", "gb")):
        _close(got, want, f"layer_norm {what} ({variant})")
    y, gy, (gx, gw) = _grads(lambda xt, wt: ops.rms_norm(xt, wt), x, w)
    for got, want, what in zip((y, gx, gw), _row_norm_ref(x, w, None, gy, False, 1e-6), ("y", "gx", "gw")):
        _close(got, want, f"rms_norm {what} ({variant})")


# attention's blockwise float32 kernel (2 key blocks of 256, 2 query blocks of 64, 2 query heads
# per kv head) against its float64 reference kernel, forward and gradients
@pytest.mark.parametrize("variant", VARIANTS, indirect=True)
def test_attention_every_variant(variant):
    rng = np.random.default_rng(17)
    q, k, v = rng.standard_normal((1, 4, 70, 16)), rng.standard_normal((1, 2, 300, 16)), rng.standard_normal((1, 2, 300, 8))
    def attention(*ts):  # the op itself (kiln.ops' function may run the unfused ops)
        return apply(OP.attention, ts, (), (0.25,))[0]

    y, gy, grads = _grads(attention, q, k, v)
    t64 = [kiln.Tensor(a) for a in (q, k, v)]
    want_grads = kiln.grad(lambda *ts: (attention(*ts) * kiln.Tensor(gy)).sum(), grad_position=(0, 1, 2))(*t64)
    _close(y, attention(*t64).asnumpy(), f"attention ({variant})")
    for got, want, what in zip(grads, want_grads, "qkv"):
        _close(got, want.asnumpy(), f"attention grad {what} ({variant})")


# spatial extents below 32 take the expanded-coefficient loops, longer ones the per-row loops
@pytest.mark.parametrize("variant", VARIANTS, indirect=True)
@pytest.mark.parametrize("shape", [(4, 16, 5, 5), (2, 8, 6, 7), (24, 12)], ids=str)
def test_batch_norm_every_variant(variant, shape):
    rng = np.random.default_rng(sum(shape))
    c = shape[1]
    x = rng.standard_normal(shape) * 1.5 + 0.3
    gamma, beta = rng.uniform(0.5, 1.5, c), rng.standard_normal(c) * 0.1
    running = (kiln.Tensor(np.zeros(c, np.float32)), kiln.Tensor(np.ones(c, np.float32)))

    def bn(xt, gt, bt):
        return ops.batch_norm(xt, running[0], running[1], gt, bt, training=True, eps=1e-5)

    y, gy, (gx, gg, gb) = _grads(bn, x, gamma, beta)
    for got, want, what in zip((y, gx, gg, gb), _batch_norm_ref(x, gamma, beta, gy, 1e-5), ("y", "gx", "ggamma", "gbeta")):
        _close(got, want, f"batch_norm {what} ({variant})")


# the last axis (rows: I == 1) and a leading one (blocks of columns); values reaching exp's
# clamps (below -86.5 after the maximum is subtracted: 0)
@pytest.mark.parametrize("variant", VARIANTS, indirect=True)
@pytest.mark.parametrize("shape,axis", [((5, 300), -1), ((40, 3, 9), 0)], ids=str)
def test_softmax_every_variant(variant, shape, axis):
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape) * 4
    x.flat[::7] -= 95.0
    e = np.exp(x - x.max(axis, keepdims=True))
    soft = e / e.sum(axis, keepdims=True)
    y, gy, (gx,) = _grads(lambda t: ops.softmax(t, axis), x)
    _close(y, soft, f"softmax ({variant})")
    _close(gx, soft * (gy - (gy * soft).sum(axis, keepdims=True)), f"softmax gradient ({variant})")
    y, gy, (gx,) = _grads(lambda t: ops.log_softmax(t, axis), x)
    _close(y, np.log(soft), f"log_softmax ({variant})")
    _close(gx, gy - soft * gy.sum(axis, keepdims=True), f"log_softmax gradient ({variant})")


# contiguous operands, a broadcast scalar on either side, strided (transposed) operands, three inputs
@pytest.mark.parametrize("variant", VARIANTS, indirect=True)
def test_elementwise_every_variant(variant):
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((37, 29)), rng.standard_normal((37, 29))
    s = np.float64(rng.standard_normal())
    ka, kb, ks = (kiln.Tensor(v.astype(np.float32)) for v in (a, b, np.array(s)))
    a, b, s = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, s))  # the float32 values
    kt = ops.swapaxes(kiln.Tensor(b.T.astype(np.float32).copy()), 0, 1)  # b again, strided
    checks = [
        ("add", ka + kb, a + b), ("mul by scalar", ka * ks, a * s), ("scalar minus", ks - ka, s - a),
        ("div strided", ka / kt, a / b), ("neg", -ka, -a), ("relu", ops.relu(ka), np.maximum(a, 0)),
        ("exp", ops.exp(ka), np.exp(a)), ("sigmoid", ops.sigmoid(ka), 1 / (1 + np.exp(-a))),
        ("greater", ops.greater(ka, kt), a > b), ("where", ops.where(ops.greater(ka, 0), ka, kb), np.where(a > 0, a, b)),
    ]
    for what, got, want in checks:
        got = got.asnumpy()
        if want.dtype == bool:
            np.testing.assert_array_equal(got, want, err_msg=f"{what} ({variant})")
        else:
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"{what} ({variant})")


def test_select_refuses_what_does_not_run():
    with pytest.raises(ValueError, match="no kernel variant named 'avx1024'"):
        kiln._C.isa_select("avx1024")
    missing = [v for v in VARIANTS if v not in kiln._C.isa_variants()]
    for name in missing:
        with pytest.raises(ValueError, match=f"kernel variant {name}: not compiled or not supported"):
            kiln._C.isa_select(name)
    assert kiln._C.isa_variants()[0] == "baseline"


def test_default_choice_follows_the_level():
    info = kiln._C.build_info()
    want = {"avx512_core": "avx512", "avx2": "avx2"}.get(info["isa"], "baseline")
    if info["max_cpu_isa"] is None and "KILN_MAX_CPU_ISA" not in os.environ:
        assert info["isa"] == info["cpu_isa_level"]
    assert set(kiln._C.isa_kernels()) == {"winograd", "norm_f32", "softmax_f32", "elementwise_f32", "attention_f32"}
    assert set(kiln._C.isa_kernels().values()) == {want}, (info, kiln._C.isa_kernels())


# ---- fresh interpreters ---------------------------------------------------------------------


def _child(tmp_path, name, **env):
    """Runs this file as a program with env added; returns what it printed (a dict)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    full = {k: v for k, v in os.environ.items() if k not in ("KILN_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
    full.update(env, KILN_CACHE_DIR=str(tmp_path / name))
    full["PYTHONPATH"] = os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, os.path.abspath(__file__)], env=full, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, f"child ({env}) failed:\n{run.stdout}\n{run.stderr}"
    return json.loads(run.stdout.strip().splitlines()[-1])


def _avx512_instructions(folder):
    """How many instructions of the generated objects in folder use AVX-512 registers (zmm, k masks)."""
    count = 0
    for so in sorted(p for p in os.listdir(folder) if p.endswith(".so")):
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", os.path.join(folder, so)], capture_output=True,
                              text=True, check=True).stdout
        count += len(re.findall(r"%zmm\d+|%k[1-7]\b", text))
    return count


def test_avx2_cap_makes_the_avx2_choices(tmp_path):
    if kiln._C.build_info()["cpu_isa_level"] not in ("avx2", "avx512_core"):
        pytest.skip("this CPU has no AVX2")
    plain = _child(tmp_path, "plain")
    capped = _child(tmp_path, "capped", KILN_MAX_CPU_ISA="AVX2")  # any case
    assert capped["isa"] == "avx2" and capped["max_cpu_isa"] == "avx2", capped
    assert capped["dnnl_isa"] == "avx2", capped
    assert set(capped["kernels"].values()) == {"avx2"}, capped
    assert capped["block"] == 8, capped
    assert capped["winograd"] == 2, capped  # both convolutions of the block on kiln's Winograd
    avx512_cpu = plain["cpu_isa_level"] == "avx512_core"
    assert ("-mno-avx512f" in capped["cc_flags"].split()) == avx512_cpu, capped["cc_flags"]
    if shutil.which("objdump"):
        assert capped["generated"] > 0
        assert _avx512_instructions(str(tmp_path / "capped")) == 0
    # the results of the run at the CPU's own level: the same on an AVX2 CPU; on an AVX-512 one
    # close (other vector widths sum in another order, and the block's convolutions run on
    # oneDNN's kernels there, on kiln's Winograd capped: within its error, ~1e-5 of the terms' sum)
    for key in ("layer_norm", "softmax", "block"):
        got, want = np.array(capped["out"][key]), np.array(plain["out"][key])
        if avx512_cpu:
            tol = 2e-4 if key == "block" else 1e-5
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=key)
        else:
            np.testing.assert_array_equal(got, want, err_msg=key)


def test_sse41_cap_leaves_the_build_kernels(tmp_path):
    capped = _child(tmp_path, "sse41", KILN_MAX_CPU_ISA="sse41")
    assert capped["isa"] == "sse41" and capped["dnnl_isa"] == "sse41", capped
    assert set(capped["kernels"].values()) == {"baseline"}, capped
    if capped["cpu_isa_level"] != "sse41":
        assert "-mno-avx" in capped["cc_flags"].split(), capped["cc_flags"]


def test_bad_value_stops_the_import():
    env = dict(os.environ, KILN_MAX_CPU_ISA="avx3")
    package = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p)
    run = subprocess.run([sys.executable, "-c", "import kiln"], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "ValueError: KILN_MAX_CPU_ISA=avx3: not an instruction set kiln knows" in run.stderr, run.stderr
    assert "avx512_core" in run.stderr, run.stderr


def _child_main():
    """The child of the tests above: the choices it sees and a few results (as lists)."""
    from conftest import inference_basic_block

    info = kiln._C.build_info()
    rng = np.random.default_rng(3)
    x = kiln.Tensor(rng.standard_normal((6, 40)).astype(np.float32))
    w = kiln.Tensor(rng.uniform(0.5, 1.5, 40).astype(np.float32))
    out = {"layer_norm": ops.layer_norm(x, 40, w, None).asnumpy().tolist()}
    before = kiln._C.codegen_stats()
    fused = kiln.jit(lambda t: ops.softmax(t * 0.5 + 1.0, -1))
    out["softmax"] = fused(x).asnumpy().tolist()
    block = inference_basic_block(32)
    image = kiln.Tensor(rng.standard_normal((1, 32, 8, 8)).astype(np.float32))
    with kiln.no_grad():
        jitted = kiln.jit(block, jit_level="O1", infer_boost="on")
        jitted(image)  # traced
        count = kiln._C.conv_winograd_count()
        out["block"] = jitted(image).asnumpy().ravel().tolist()
        winograd = kiln._C.conv_winograd_count() - count
    after = kiln._C.codegen_stats()
    print(json.dumps({
        "isa": info["isa"], "cpu_isa_level": info["cpu_isa_level"], "max_cpu_isa": info["max_cpu_isa"],
        "dnnl_isa": info["dnnl_isa"], "kernels": kiln._C.isa_kernels(), "block": kiln._C.conv_block_size(),
        "cc_flags": kiln._C.codegen_info()["flags"], "winograd": winograd,
        "generated": after["compiles"] - before["compiles"], "out": out}))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    _child_main()
