"""float32 exp, log, tanh, erf and the ops built on them (sigmoid, silu, gelu, their gradients):
eager kernels and generated C compute them with the same vectorizable approximations
(src/core/approx_f32.h), so

* over a dense sweep of float32 values each stays within its documented error against the float64
  kernel of the same op (libm: the reference beside each fast float32 loop) and NumPy's float64;
* the IEEE edge cases hold (nan stays nan, tanh(+-inf) = +-1, exp overflows to inf, log(0) = -inf,
  log of a negative is nan, ...);
* eager results equal every compiled variant's (capture ast / bytecode / trace, O0 / O1, kbk /
  sink) bit for bit, forward and gradients, and every instruction-set variant of the eager
  kernels gives the same bits;
* gradients match finite differences (float64) and the float64 gradient (float32)."""
import numpy as np
import pytest

import kiln
from kiln import ops
from conftest import check_grad, run_isolated, tol

FLT_MIN = np.float32(1.17549435e-38)

# max error against float64 libm, in float32 ulps of the result (src/core/approx_f32.h's measure)
ULP_BOUND = {"exp": 1.0, "log": 1.0, "tanh": 1.5, "erf": 7.0}
# built from exp: one rounding each of the add and the divide on top of exp's error, checked where
# |x| < 88 and the result is a normal float (beyond, exp(-x) overflows and the true value, under
# 3e-37, comes out 0: the formula's, as with libm)
ULP_BOUND_COMPOSED = {"sigmoid": 3.0, "silu": 3.0}

UNARY = {"exp": ops.exp, "log": ops.log, "tanh": ops.tanh, "erf": ops.erf, "sigmoid": ops.sigmoid,
         "silu": ops.silu, "gelu": ops.gelu}


def _sweep(step=1021):
    """Every step-th float32 bit pattern that is finite: both signs, zeros, subnormals, the largest."""
    bits = np.arange(0, 1 << 32, step, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = np.concatenate([x[np.isfinite(x)], np.array([0.0, -0.0, 1e-45, -1e-45, FLT_MIN, 3.4028235e38, -3.4028235e38],
                                                    np.float32)])
    return x


def _ulps(got, ref):
    """|got - ref| in units of the float32 spacing at ref, where both are finite."""
    sp = np.spacing(np.abs(ref.astype(np.float32))).astype(np.float64)
    return np.abs(got.astype(np.float64) - ref) / sp


def _both(name, x):
    f = UNARY[name]
    return f(kiln.Tensor(x)).numpy(), f(kiln.Tensor(x.astype(np.float64))).numpy()


@pytest.mark.parametrize("name", sorted(ULP_BOUND))
def test_dense_sweep_within_ulp_bound(name):
    x = _sweep()
    if name == "log":
        x = x[x > 0]
    got, ref = _both(name, x)
    assert got.dtype == np.float32
    with np.errstate(over="ignore"):
        ref32 = ref.astype(np.float32)
    # overflow, underflow and saturation where float64's result rounds to them
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref32), err_msg=f"{name}: infinities")
    assert not np.isnan(got).any(), f"{name}: nan for finite input {x[np.isnan(got)][:5]}"
    fin = np.isfinite(ref32)
    err = _ulps(got[fin], ref[fin])
    worst = int(np.argmax(err))
    assert err[worst] <= ULP_BOUND[name], f"{name}({x[fin][worst]!r}) = {got[fin][worst]!r}, float64 {ref[fin][worst]!r}: {err[worst]:.2f} ulp"
    # the float64 kernel is libm's: NumPy agrees where it has the function
    if name in ("exp", "log", "tanh"):
        with np.errstate(over="ignore"):
            want = getattr(np, name)(x.astype(np.float64))
        np.testing.assert_allclose(ref, want, rtol=1e-15, atol=0)


@pytest.mark.parametrize("name", sorted(ULP_BOUND_COMPOSED))
def test_dense_sweep_of_exp_compositions(name):
    x = _sweep()
    got, ref = _both(name, x)
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        want = 1 / (1 + np.exp(-x64)) if name == "sigmoid" else x64 / (1 + np.exp(-x64))
    np.testing.assert_allclose(ref, want, rtol=1e-15, atol=1e-300)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    fin = np.isfinite(ref) & np.isfinite(got)
    inside = fin & (np.abs(x) < 88) & (np.abs(ref) >= FLT_MIN)
    err = _ulps(got[inside], ref[inside])
    worst = int(np.argmax(err))
    assert err[worst] <= ULP_BOUND_COMPOSED[name], f"{name}({x[inside][worst]!r}): {err[worst]:.2f} ulp"
    assert np.abs(got[fin & ~inside] - ref[fin & ~inside]).max() < 3e-37


def test_gelu_within_float32_tolerance():
    """gelu = x/2 (1 + erf(x / sqrt 2)): erf's absolute error (under 4e-7) scaled by |x| / 2 where erf
    nears -1; within the float32 tolerance of the tests (conftest.tol) everywhere."""
    x = _sweep()
    got, ref = _both("gelu", x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    fin = np.isfinite(ref) & (np.abs(ref) < 3e38)
    np.testing.assert_allclose(got[fin], ref[fin], **tol(kiln.float32))


def test_edge_cases():
    inf, nan = np.float32(np.inf), np.float32(np.nan)
    x = np.array([0.0, -0.0, inf, -inf, nan, 1e-45, -1e-45, 1e-40, 88.72, 88.73, 200.0, -87.3, -103.0, -104.5, -200.0],
                 np.float32)
    ex = ops.exp(kiln.Tensor(x)).numpy()
    assert ex[0] == 1 and ex[1] == 1 and ex[2] == inf and ex[3] == 0 and np.isnan(ex[4])
    assert ex[5:8].tolist() == [1.0, 1.0, 1.0]
    assert np.isfinite(ex[8]) and ex[9] == inf and ex[10] == inf, ex  # exp(88.72) < FLT_MAX < exp(88.73)
    assert abs(float(ex[11]) - np.exp(np.float64(x[11]))) <= np.spacing(ex[11])  # normal, just above FLT_MIN
    assert 0 < ex[12] < FLT_MIN and ex[13] == 0 and ex[14] == 0  # subnormal, then underflow to 0

    th = ops.tanh(kiln.Tensor(x)).numpy()
    assert th[:4].tolist() == [0.0, -0.0, 1.0, -1.0] and np.signbit(th[1]) and not np.signbit(th[0])
    assert np.isnan(th[4]) and th[5] == x[5] and th[6] == x[6] and th[7] == x[7]  # tanh(x) = x for tiny x
    assert th[10] == 1.0 and th[14] == -1.0

    lg = ops.log(kiln.Tensor(np.array([0.0, -0.0, inf, -inf, nan, -1.0, -1e-45, 1e-45, 1.0, FLT_MIN], np.float32))).numpy()
    assert lg[0] == -inf and lg[1] == -inf and lg[2] == inf
    assert np.isnan(lg[3]) and np.isnan(lg[4]) and np.isnan(lg[5]) and np.isnan(lg[6])
    assert abs(float(lg[7]) - np.log(np.float64(np.float32(1e-45)))) < 1e-5  # the smallest subnormal
    assert lg[8] == 0.0 and lg[9] == np.float32(np.log(np.float64(FLT_MIN)))

    er = ops.erf(kiln.Tensor(x)).numpy()
    assert er[:4].tolist() == [0.0, -0.0, 1.0, -1.0] and np.signbit(er[1]) and np.isnan(er[4])

    sg = ops.sigmoid(kiln.Tensor(x)).numpy()
    assert sg[0] == 0.5 and sg[2] == 1.0 and sg[3] == 0.0 and np.isnan(sg[4])
    for name in ("silu", "gelu"):
        y = UNARY[name](kiln.Tensor(x)).numpy()
        assert y[0] == 0 and y[2] == inf and np.isnan(y[4]), (name, y)


# ---- eager against every compiled variant, bit for bit ---------------------------------------


def lstm_cell(x, h, c):
    """The gates of an LSTM cell written with ops: sigmoid, tanh, and exp-based ones fused."""
    i, f, g, o = ops.sigmoid(x + h), ops.sigmoid(x - h), ops.tanh(x * h), ops.sigmoid(h)
    c2 = f * c + i * g
    return o * ops.tanh(c2)


def mixed(x, h, c):
    """exp, log, erf, silu and gelu in one fused group, plus their float64 neighbour untouched."""
    return ops.exp(x * 0.5) + ops.log(ops.abs(h) + 1e-3) - ops.erf(c) * ops.silu(x) + ops.gelu(h)


def tanh_only(x, h, c):
    return ops.tanh(x)


def exp_only(x, h, c):
    return ops.exp(x)


def log_only(x, h, c):
    return ops.log(c)


FUNCS = {"lstm_cell": lstm_cell, "mixed": mixed, "tanh": tanh_only, "exp": exp_only, "log": log_only}
VARIANTS = [(mode, level, backend) for mode in ("ast", "bytecode", "trace") for level in ("O0", "O1")
            for backend in ("kbk", "sink")]


def _inputs(seed=3, shape=(64, 33)):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    x.flat[:8] = [0.0, -0.0, 1e-40, -30.0, 30.0, 90.0, -90.0, 0.6]
    h = (rng.standard_normal(shape) * 2).astype(np.float32)
    c = (np.abs(rng.standard_normal(shape)) * 3 + 1e-30).astype(np.float32)
    return x, h, c


def _generated_kernels_used():
    s = kiln._C.codegen_stats()
    return s["compiles"] + s["disk_hits"] + s["memory_hits"]


@pytest.mark.parametrize("fname", sorted(FUNCS))
def test_eager_equals_every_compiled_variant(fname):
    fn = FUNCS[fname]
    arrays = _inputs()
    args = [kiln.Tensor(a) for a in arrays]
    eager = fn(*args).numpy()
    assert eager.dtype == np.float32
    before = _generated_kernels_used()
    for mode, level, backend in VARIANTS:
        jf = kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)
        for _ in range(3):  # the first call may run interpreted while it records, the next ones what was built
            got = jf(*args).numpy()
            np.testing.assert_array_equal(got.view(np.uint32), eager.view(np.uint32),
                                          err_msg=f"{fname}: {mode} {level} {backend} differs from eager")
    if kiln._C.codegen_info().get("command"):
        assert _generated_kernels_used() > before, "no generated kernel ran: the check compared eager with eager"


@pytest.mark.parametrize("fname", ["lstm_cell", "mixed"])
def test_gradients_eager_equal_compiled(fname):
    fn = FUNCS[fname]
    arrays = _inputs(seed=4, shape=(16, 21))

    def loss(x, h, c):
        return (fn(x, h, c) * 0.5).sum()

    args = [kiln.Tensor(a) for a in arrays]
    eager = [g.numpy() for g in kiln.grad(loss, grad_position=(0, 1, 2))(*args)]
    for mode, level, backend in VARIANTS:
        gf = kiln.jit(kiln.grad(loss, grad_position=(0, 1, 2)), capture_mode=mode, jit_level=level, backend=backend)
        for _ in range(3):
            got = [g.numpy() for g in gf(*args)]
            for k, (a, b) in enumerate(zip(got, eager)):
                np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32),
                                              err_msg=f"{fname}: gradient {k}, {mode} {level} {backend}")


def test_every_isa_variant_gives_the_same_bits():
    x = _sweep(step=65537)
    names = kiln._C.isa_variants()
    results = {}
    try:
        for v in names:
            kiln._C.isa_select(v)
            results[v] = {n: f(kiln.Tensor(x)).numpy() for n, f in UNARY.items()}
    finally:
        kiln._C.isa_select(None)
    first = results[names[0]]
    for v in names[1:]:
        for n in UNARY:
            np.testing.assert_array_equal(results[v][n].view(np.uint32), first[n].view(np.uint32), err_msg=f"{n}: {v}")


CAPPED = """
import numpy as np, kiln
from kiln import ops
x = kiln.Tensor((np.random.default_rng(5).standard_normal((48, 40)) * 5).astype(np.float32))
def f(t):
    return ops.tanh(t) * ops.sigmoid(t * 0.5) + ops.exp(-t) - ops.log(ops.abs(t) + 1.0) + ops.gelu(t)
eager = f(x).numpy()
before = kiln._C.codegen_stats()["compiles"]
for backend in ("kbk", "sink"):
    jf = kiln.jit(f, capture_mode="trace", jit_level="O1", backend=backend)
    for _ in range(3):
        assert np.array_equal(jf(x).numpy().view(np.uint32), eager.view(np.uint32)), backend
assert kiln._C.codegen_stats()["compiles"] > before
print("flags", kiln._C.codegen_info()["flags"], kiln._C.build_info()["isa"])
"""


@pytest.mark.parametrize("isa", ["sse41", "avx2"])
def test_capped_instruction_set_gives_the_same_bits(isa, tmp_path):
    """Generated code of a capped level is built without FMA (sse41: -mno-avx) or without AVX-512,
    while eager runs the build's kernels: still the same bits (KF_FMA is always fused)."""
    if not kiln._C.codegen_info().get("command"):
        pytest.skip("no C compiler: no generated code to compare")
    rc, out = run_isolated(CAPPED, timeout=300, KILN_MAX_CPU_ISA=isa, KILN_CACHE_DIR=str(tmp_path / "cache"))
    assert rc == 0, out
    line = out.strip().splitlines()[-1]
    assert line.endswith(f" {isa}"), out
    if isa == "sse41" and kiln._C.build_info()["cpu_isa_level"] != "sse41":
        assert "-mno-avx" in line.split(), line  # generated code without AVX, so without FMA


# ---- gradients ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["exp", "log", "tanh", "erf", "sigmoid", "silu", "gelu"])
def test_gradient_by_finite_differences(name):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 5)) * 2
    if name == "log":
        x = np.abs(x) + 0.1
    check_grad(UNARY[name], x, rtol=1e-6, atol=1e-8)
    # float32's gradient, through the approximations, against float64's
    g32 = kiln.grad(lambda t: UNARY[name](t).sum())(kiln.Tensor(x.astype(np.float32))).numpy()
    g64 = kiln.grad(lambda t: UNARY[name](t).sum())(kiln.Tensor(x.astype(np.float32).astype(np.float64))).numpy()
    assert g32.dtype == np.float32
    np.testing.assert_allclose(g32, g64, **tol(kiln.float32))
