"""Generated code for float16 fused groups (amp's float16 casts around elementwise chains): the
elementwise fusion's C loads float16 operands widened to float (exact) and rounds the result to
nearest even as it stores it, as eager's cast does. Bit for bit eager's and the interpreted path's
(KILN_DISABLE_CODEGEN=1), NaN, infinities, ties, subnormals and overflow included, on every
capture mode, level and backend; and the group really runs generated code."""
import numpy as np
import pytest

import kiln
from kiln import _C, ops

F16 = kiln.float16


def _values():
    rng = np.random.default_rng(16)
    v = (rng.standard_normal((64, 33)) * 4).astype(np.float32)
    specials = [np.nan, np.inf, -np.inf, -0.0,
                1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11,  # ties: to even, down and up
                65519.0, 65520.0, 7e4, -7e4,  # the largest float16, the first that overflows
                2 ** -24, 2 ** -25, 3 * 2 ** -26, 2 ** -14 - 2 ** -25, 1e-8]  # subnormals, their ties
    v[0, :len(specials)] = specials
    return v


def _generated_runs():
    s = _C.codegen_stats()
    return s["compiles"] + s["disk_hits"] + s["memory_hits"]


def _f(x, xh):
    """One fused group: a float16 operand widened, float32 arithmetic, the result rounded to float16."""
    return (ops.relu(xh.astype(kiln.float32)) * 3.0 + x).astype(F16)


def _g(x):
    """Rounding inside the computation: the float16 value is read again (two groups, the first ends
    at the cast, the second starts from it)."""
    h = (x * 0.75 - 1.0).astype(F16)
    return (ops.exp(h.astype(kiln.float32) * 0.01) + h.astype(kiln.float32)).astype(F16)


VARIANTS = [(mode, level, backend) for mode in ("ast", "bytecode", "trace") for level in ("O0", "O1", "O2")
            for backend in ("kbk", "sink")]


def _bits(t):
    return t.numpy().view(np.uint16)


@pytest.mark.parametrize("fn", [_f, _g], ids=["one_group", "two_groups"])
def test_float16_generated_code_is_eager_bit_for_bit(monkeypatch, fn):
    x = kiln.tensor(_values())
    xh = x.astype(F16)
    args = (x, xh) if fn is _f else (x,)
    want = _bits(fn(*args))
    for path in ("generated", "interpreted"):
        if path == "generated":
            monkeypatch.delenv("KILN_DISABLE_CODEGEN", raising=False)
        else:
            monkeypatch.setenv("KILN_DISABLE_CODEGEN", "1")
        for mode, level, backend in VARIANTS:
            jf = kiln.jit(fn, capture_mode=mode, jit_level=level, backend=backend)
            for _ in range(2):  # the recording call and a compiled one
                got = jf(*args)
                assert got.dtype == F16
                np.testing.assert_array_equal(_bits(got), want, err_msg=f"{path} {mode} {level} {backend}")


def test_float16_group_runs_generated_code(monkeypatch):
    """Before, a group with float16 operands ran interpreted: no generated kernel was built."""
    monkeypatch.delenv("KILN_DISABLE_CODEGEN", raising=False)
    rng = np.random.default_rng(17)
    x = kiln.tensor(rng.standard_normal((32, 40)).astype(np.float32))
    xh = x.astype(F16)
    before = _generated_runs()
    jf = kiln.jit(_f, capture_mode="trace", jit_level="O1", backend="kbk")
    jf(x, xh)
    got = jf(x, xh)
    assert _generated_runs() > before, _C.codegen_stats()
    np.testing.assert_array_equal(_bits(got), _bits(_f(x, xh)))


def test_float16_graph_text_has_one_group():
    x = kiln.tensor(np.ones((4, 8), np.float32))
    jf = kiln.jit(_f, capture_mode="trace", jit_level="O1")
    text = jf.graph_str(x, x.astype(F16))
    main = text.split("subgraph")[0]
    assert main.count("fused(") == 1 and "cast(" not in main, text
    assert "float16[4, 8] = fused(" in main, text


def test_float16_conversions_without_float16_type(tmp_path):
    """Compilers without _Float16 for the target get the prelude's integer conversions (as
    src/core/internal.h's): the same bits. Run in a child process whose compiler is told the type
    is absent (CC="cc -U__FLT16_MAX__"), with its own kernel cache."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np, kiln\n"
        "from kiln import _C\n"
        "import test_amp_codegen_f16 as t\n"
        "x = kiln.tensor(t._values()); xh = x.astype(t.F16)\n"
        "n = t._generated_runs()\n"
        "for fn, args in ((t._f, (x, xh)), (t._g, (x,))):\n"
        "    for backend in ('kbk', 'sink'):\n"
        "        jf = kiln.jit(fn, capture_mode='trace', jit_level='O1', backend=backend)\n"
        "        jf(*args)\n"
        "        np.testing.assert_array_equal(t._bits(jf(*args)), t._bits(fn(*args)), err_msg=backend)\n"
        "assert t._generated_runs() > n, _C.codegen_stats()\n"
        "print('ok')\n")
    env = dict(os.environ, CC="cc -U__FLT16_MAX__", KILN_CACHE_DIR=str(tmp_path), KILN_BACKGROUND_COMPILE="0")
    env.pop("KILN_DISABLE_CODEGEN", None)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
