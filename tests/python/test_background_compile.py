"""set_context(background_compile=True): generated C is built on a background thread while calls
run kiln's interpreted kernels, then switch to the native code. Every call, before and after the
switch, must give eager's result, bit for bit (generated code computes float32 exp and tanh
with eager's approximations, src/core/approx_f32.h); functions freed while their code is still
building, forked children and dynamic shapes must not be disturbed."""
import gc
import os

import numpy as np
import pytest

import kiln
from kiln import _C, ops


@pytest.fixture
def background(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))  # nothing built before: compiles happen
    was = kiln.get_context("background_compile")
    kiln.set_context(background_compile=True)
    yield
    kiln.wait_compiles()
    kiln.set_context(background_compile=was)


def chain(x, y, k):
    return ops.tanh(x * k + y) * ops.exp(-y * y) - x / (1.0 + y * y)


def close(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def same(got, want):
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def t(shape, seed):
    return kiln.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("backend", ["kbk", "sink"])
@pytest.mark.parametrize("mode", ["trace", "ast", "bytecode"])
def test_every_call_equals_eager_before_and_after_the_switch(background, backend, mode):
    k = 1.0 + 0.01 * (len(backend) + 7 * len(mode))  # a constant of this case: code nobody built yet
    x, y = t((37, 29), 1), t((37, 29), 2)
    want = chain(x, y, k).asnumpy()
    f = kiln.jit(lambda a, b: chain(a, b, k), capture_mode=mode, jit_level="O1", backend=backend)
    for _ in range(3):
        same(f(x, y).asnumpy(), want)
    kiln.wait_compiles()
    for _ in range(3):
        same(f(x, y).asnumpy(), want)


def test_training_step_converges_the_same(background):
    def make():
        kiln.manual_seed(3)
        net = kiln.nn.SequentialCell(kiln.nn.Dense(6, 16), kiln.nn.Tanh(), kiln.nn.Dense(16, 1))
        opt = kiln.nn.SGD(net.trainable_params(), learning_rate=0.05)
        grad = kiln.value_and_grad(lambda a, b: ((net(a) - b) ** 2).mean(), None, opt.parameters)

        def step(a, b):
            loss, g = grad(a, b)
            opt(g)
            return loss
        return step

    x, y = t((32, 6), 4), t((32, 1), 5)
    eager = make()
    want = [eager(x, y).asnumpy() for _ in range(6)]
    f = kiln.jit(make(), capture_mode="trace", jit_level="O1", backend="sink")
    got = [f(x, y).asnumpy() for _ in range(3)]
    kiln.wait_compiles()
    got += [f(x, y).asnumpy() for _ in range(3)]
    close(np.array(got), np.array(want))


def test_functions_freed_while_their_code_builds(background):
    x, y = t((8, 5), 6), t((8, 5), 7)
    for j in range(12):
        k = 2.0 + j / 64
        f = kiln.jit(lambda a, b, k=k: chain(a, b, k), capture_mode="trace", jit_level="O1",
                     backend="sink" if j % 2 else "kbk")
        same(f(x, y).asnumpy(), chain(x, y, k).asnumpy())
        del f
        gc.collect()
    kiln.wait_compiles()  # the builder wrote into no freed executable (nothing crashed)
    g = kiln.jit(lambda a, b: chain(a, b, 2.0), capture_mode="trace", jit_level="O1")
    same(g(x, y).asnumpy(), chain(x, y, 2.0).asnumpy())


def test_dynamic_shapes_each_binding_equal(background):
    f = kiln.jit(lambda a, b: chain(a, b, 3.25), capture_mode="trace", jit_level="O1", backend="sink", dynamic=True)
    for n in (5, 9, 17, 9, 33):
        x, y = t((n, 7), n), t((n, 7), n + 1)
        same(f(x, y).asnumpy(), chain(x, y, 3.25).asnumpy())
    kiln.wait_compiles()
    for n in (5, 40):
        x, y = t((n, 7), n), t((n, 7), n + 1)
        same(f(x, y).asnumpy(), chain(x, y, 3.25).asnumpy())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_runs_with_builds_pending(background):
    x, y = t((16, 3), 8), t((16, 3), 9)
    f = kiln.jit(lambda a, b: chain(a, b, 4.5), capture_mode="trace", jit_level="O1", backend="sink")
    want = chain(x, y, 4.5).asnumpy()
    f(x, y)
    pid = os.fork()
    if pid == 0:  # the child: no builder thread; its calls stay interpreted, still right
        ok = all(np.array_equal(f(x, y).asnumpy(), want) for _ in range(3))
        g = kiln.jit(lambda a, b: chain(a, b, 5.5), capture_mode="trace", jit_level="O1")
        ok = ok and np.array_equal(g(x, y).asnumpy(), chain(x, y, 5.5).asnumpy())
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    same(f(x, y).asnumpy(), want)


GATED_RUN = r"""
import os, sys, time, numpy as np, kiln
from kiln import _C, ops
kiln.set_context(background_compile=True)
x = kiln.Tensor(np.linspace(-2, 2, 60, dtype=np.float32).reshape(6, 10))
f = kiln.jit(lambda a: ops.tanh(a * 1.7 + 0.3) * ops.exp(-a * a), capture_mode="ast", jit_level="O1", backend="sink")
want = (np.tanh(x.asnumpy() * 1.7 + 0.3) * np.exp(-x.asnumpy() ** 2))
for _ in range(3):  # the compiler waits at its gate: these calls cannot have waited for it
    assert np.allclose(f(x).asnumpy(), want, rtol=1e-5, atol=1e-6)
assert _C.codegen_stats()["compiles"] == 0
open(os.environ["GATE"], "w").close()
kiln.wait_compiles()
assert _C.codegen_stats()["compiles"] >= 1
assert np.allclose(f(x).asnumpy(), want, rtol=1e-5, atol=1e-6)
print("ok")
"""


def test_calls_do_not_wait_for_the_compiler(tmp_path):
    """A compiler that waits for a file: every call before the file exists returns (interpreted);
    after it, the builder compiles and the native code gives the same results."""
    import shutil
    import subprocess
    import sys

    cc = shutil.which(os.environ.get("CC", "cc").split()[0])
    if cc is None:
        pytest.skip("no C compiler")
    gate, script = tmp_path / "gate", tmp_path / "gated-cc"
    script.write_text(f"""#!/bin/sh
case "$*" in *--version*) exec {cc} "$@";; esac
while [ ! -e "{gate}" ]; do sleep 0.02; done
exec {cc} "$@"
""")
    script.chmod(0o755)
    env = dict(os.environ, CC=str(script), GATE=str(gate), KILN_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", GATED_RUN], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


def test_setting_is_checked_and_read_back():
    was = kiln.get_context("background_compile")
    with pytest.raises(ValueError, match="background_compile must be a bool"):
        kiln.set_context(background_compile=1)
    kiln.set_context(background_compile=not was)
    assert kiln.get_context("background_compile") is (not was)
    kiln.set_context(background_compile=was)
    assert kiln.get_context("background_compile") is was
