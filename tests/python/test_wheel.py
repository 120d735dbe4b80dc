"""The portable wheel: `KILN_NATIVE=OFF pip wheel .` builds a wheel for any x86-64 CPU with AVX2,
which installs into a fresh virtual environment and runs there: an op through OpenBLAS, a
convolution through oneDNN, a jitted function whose fused kernels are generated C compiled at run
time by the user's compiler.

The wheel is built once per run, in scikit-build-core's persistent build-dir build/wheel-portable
(so a later run rebuilds only what changed), without build isolation when scikit-build-core is
installed here; otherwise pip fetches it, and the test skips only when pip cannot reach it."""
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_DIR = ROOT / "build" / "wheel-portable"

# what pip prints when it cannot download a build dependency (no index reachable, nothing cached)
_UNREACHABLE = re.compile(r"No matching distribution found for scikit-build-core|Could not find a version that "
                          r"satisfies the requirement scikit-build-core|Failed to establish a new connection|"
                          r"Temporary failure in name resolution|Network is unreachable")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    try:
        import scikit_build_core  # noqa: F401
        isolation = ["--no-build-isolation"]
    except ImportError:
        isolation = []  # pip fetches the build backend
    cmd = [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", *isolation, "-w", str(out),
           f"--config-settings=build-dir={BUILD_DIR}"]
    p = subprocess.run(cmd, env=_env(KILN_NATIVE="OFF"), capture_output=True, text=True, timeout=1800)
    if p.returncode != 0 and not isolation and _UNREACHABLE.search(p.stdout + p.stderr):
        pytest.skip("pip cannot reach the build dependency scikit-build-core (not installed, no index reachable)")
    assert p.returncode == 0, f"{' '.join(cmd)}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    wheels = list(out.glob("kiln-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_is_portable(wheel, tmp_path):
    """The extension in the wheel is the portable build: every object in it was compiled for
    x86-64-v3 (AVX2, FMA), none for the building CPU (-march=native records the CPU's own -march
    and its extensions) nor with AVX-512 enabled for the whole object (a kernel may still carry an
    AVX-512 variant chosen at run time, through a target attribute); it needs the shared libraries
    the README names, found by the dynamic loader at run time."""
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if re.fullmatch(r"kiln/_C\..*\.so", n)]
        assert len(names) == 1, z.namelist()
        so = tmp_path / "_C.so"
        so.write_bytes(z.read(names[0]))
        assert "kiln/__init__.py" in z.namelist()
    switches = subprocess.run(["readelf", "-p", ".GCC.command.line", str(so)], capture_output=True, text=True,
                              check=True).stdout
    lines = [line for line in switches.splitlines() if "-O3" in line]  # kiln's objects (not crt files)
    assert lines, switches
    for line in lines:
        assert re.findall(r"-march=(\S+)", line) == ["x86-64-v3"], line
        assert "-mavx512" not in line, line
    needed = set(re.findall(r"\(NEEDED\).*\[(.+)\]", subprocess.run(
        ["readelf", "-d", str(so)], capture_output=True, text=True, check=True).stdout))
    assert {"libopenblas.so.0", "libgomp.so.1"} <= needed and any(n.startswith("libdnnl.so") for n in needed)


SMOKE = textwrap.dedent("""
    import os, sys
    import numpy as np
    import kiln
    from kiln import ops
    assert kiln.__file__.startswith(sys.prefix), kiln.__file__   # the installed wheel, not the source tree
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 48)).astype(np.float32)
    b = rng.standard_normal((48, 32)).astype(np.float32)
    t = ops.relu(kiln.Tensor(a) @ kiln.Tensor(b) + 1.0)          # matmul: OpenBLAS
    np.testing.assert_allclose(t.asnumpy(), np.maximum(a @ b + 1, 0), rtol=1e-4, atol=1e-4)
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    y = ops.conv2d(kiln.Tensor(x), kiln.Tensor(w))                 # convolution: oneDNN
    win = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))  # (1, 2, 4, 4, 3, 3)
    np.testing.assert_allclose(y.asnumpy(), np.einsum("ncijkl,ockl->noij", win, w), rtol=1e-4, atol=1e-4)
    f = kiln.jit(lambda p, q: ops.softmax(p * q + 1.0, -1), jit_level="O1", backend="sink")
    p, q = a[:32, :32], b[:32]
    f(kiln.Tensor(p), kiln.Tensor(q))
    r = f(kiln.Tensor(p), kiln.Tensor(q))                           # the compiled graph
    assert f._last.executable.native, "the generated C was not compiled"
    e = np.exp(p * q + 1 - (p * q + 1).max(-1, keepdims=True))
    np.testing.assert_allclose(r.asnumpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert any(n.endswith(".so") for n in os.listdir(os.environ["KILN_CACHE_DIR"]))
    print("smoke ok", kiln.__version__)
""")


def test_wheel_installs_and_runs_in_a_fresh_venv(wheel, tmp_path):
    venv = tmp_path / "venv"
    # --system-site-packages: NumPy comes along, so nothing is downloaded
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    p = subprocess.run([str(py), "-m", "pip", "install", "--no-index", "--no-cache-dir", str(wheel)],
                       env=_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    p = subprocess.run([str(py), "-c", SMOKE], env=_env(KILN_CACHE_DIR=str(tmp_path / "cache")), cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "smoke ok 0.1.0" in p.stdout
