"""kiln.disable_jit() and KILN_DISABLE_JIT=1: every kiln.jit / kiln.trace function runs its Python
code eagerly (for debugging), with the same results, and compiles again once the switch is off."""
import numpy as np
import pytest

import kiln

from conftest import run_isolated, to_numpy

X = np.array([[1.0, -2.0, 3.0], [0.5, 0.25, -4.0]], dtype=np.float32)


def body(x):
    return (x * 2 + 1).relu().sum(axis=1)


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_disable_jit_runs_jitted_functions_eagerly(mode):
    x = kiln.tensor(X)
    expected = to_numpy(body(x))
    jf = kiln.jit(body, capture_mode=mode)
    np.testing.assert_allclose(to_numpy(jf(x)), expected)
    np.testing.assert_allclose(to_numpy(jf(x)), expected)
    compiles, eager = jf.stats.compiles, jf.stats.eager_calls
    with kiln.disable_jit():
        for _ in range(3):
            np.testing.assert_allclose(to_numpy(jf(x)), expected)
        y = kiln.tensor(X[:1])  # a new shape: nothing is captured either
        np.testing.assert_allclose(to_numpy(jf(y)), to_numpy(body(y)))
    assert jf.stats.compiles == compiles and jf.stats.eager_calls == eager + 4
    np.testing.assert_allclose(to_numpy(jf(x)), expected)  # compiled again (the kept graph)
    assert jf.stats.eager_calls == eager + 4


def test_disable_jit_reaches_the_c_fast_path_of_kiln_trace():
    seen = []

    def f(x):
        seen.append(1)  # a trace replays the recording without running Python
        return body(x)

    x = kiln.tensor(X)
    t = kiln.trace(f, verify=False)
    for _ in range(3):
        t(x)
    assert len(seen) == 1
    with kiln.disable_jit():
        np.testing.assert_allclose(to_numpy(t(x)), to_numpy(body(x)))
        t(x)
    assert len(seen) == 3
    t(x)
    assert len(seen) == 3


def test_disable_jit_nests_and_false_changes_nothing():
    x = kiln.tensor(X)
    jf = kiln.jit(body)
    jf(x)
    eager = jf.stats.eager_calls

    @kiln.disable_jit()
    def debug_call():
        return jf(x)

    with kiln.disable_jit(False):
        jf(x)
    assert jf.stats.eager_calls == eager
    with kiln.disable_jit():
        with kiln.disable_jit():
            jf(x)
        jf(x)  # still inside the outer one
        debug_call()
    jf(x)
    assert jf.stats.eager_calls == eager + 3
    with pytest.raises(TypeError, match="True or False"):
        kiln.disable_jit("yes")


def test_grad_of_a_jitted_function_under_disable_jit_equals_eager():
    x = kiln.tensor(X)
    jf = kiln.jit(lambda x: (body(x) ** 2, x.sum()))
    g = kiln.grad(jf)(x)
    with kiln.disable_jit():
        np.testing.assert_allclose(to_numpy(kiln.grad(jf)(x)), to_numpy(g), rtol=1e-6)


def test_environment_variable_disables_jit_for_the_process():
    code = """
        import numpy as np, kiln
        calls = []
        def f(x):
            calls.append(1)
            return x * 3
        t = kiln.trace(f, verify=False)
        jf = kiln.jit(lambda x: x + 1, capture_mode="trace")
        x = kiln.tensor(np.ones(2, np.float32))
        for _ in range(3):
            t(x); jf(x)
        print(len(calls), jf.stats.compiles, jf.stats.eager_calls)
    """
    rc, out = run_isolated(code, KILN_DISABLE_JIT="1")
    assert rc == 0, out
    assert out.split()[-3:] == ["3", "0", "3"]
    rc, out = run_isolated(code, KILN_DISABLE_JIT="0")
    assert rc == 0, out
    assert out.split()[-3:] == ["1", "1", "0"]
