"""kiln.mutable: Python scalars (alone or in tuples, lists, dicts) passed to a jitted function as
variable inputs: one compile serves every value, and the results equal eager calls."""
import numpy as np
import pytest

import kiln

from conftest import to_numpy

MODES = ("ast", "bytecode", "trace")


def scaled(x, n, coefs):
    return x * n + coefs[0] * x.sum() - coefs[1], n * 2


@pytest.mark.parametrize("mode", MODES)
def test_one_compile_for_many_values(mode):
    x = kiln.tensor(np.array([1.0, -2.0, 0.5], np.float32))
    jf = kiln.jit(scaled, capture_mode=mode)
    for n, c0, c1 in ((1, 0.5, 2.0), (3, -1.25, 0.0), (7, 4.0, -3.5), (-2, 0.0, 1.0)):
        args = (x, kiln.mutable(n), kiln.mutable((c0, c1)))
        got, want = jf(*args), scaled(*args)
        for g, w in zip(got, want):
            np.testing.assert_allclose(to_numpy(g), to_numpy(w), rtol=1e-6)
        np.testing.assert_allclose(to_numpy(got[0]), to_numpy(x) * n + c0 * to_numpy(x).sum() - c1, rtol=1e-6)
    assert jf.stats.compiles == 1 and jf.stats.eager_calls == 0
    plain = kiln.jit(scaled, capture_mode=mode)  # without mutable: a constant per value
    for n in (1, 3):
        plain(x, n, (0.5, 2.0))
    assert plain.stats.compiles == 2


@pytest.mark.parametrize("mode", ["ast", "bytecode"])
def test_branch_on_a_mutable_value(mode):
    def f(x, n):
        if n > 2:
            return x - n
        return x + n

    x = kiln.tensor(np.array([1.0, 2.0], np.float32))
    jf = kiln.jit(f, capture_mode=mode)
    for n in (1, 3, 5, 2, 0):
        np.testing.assert_allclose(to_numpy(jf(x, kiln.mutable(n))), to_numpy(f(x, kiln.mutable(n))))
        np.testing.assert_allclose(to_numpy(jf(x, kiln.mutable(n))), to_numpy(x) + (-n if n > 2 else n))


def test_mutable_keeps_containers_and_tensors():
    t = kiln.tensor(np.ones(2, np.float32))
    m = kiln.mutable({"a": [1, 2.5, True], "b": (t,)})
    assert isinstance(m, dict) and isinstance(m["a"], list) and isinstance(m["b"], tuple)
    assert m["b"][0] is t
    assert [v.dtype for v in m["a"]] == [kiln.int64, kiln.float32, kiln.bool]
    assert [to_numpy(v).item() for v in m["a"]] == [1, 2.5, True]
    with pytest.raises(TypeError, match="str"):
        kiln.mutable("text")
    with pytest.raises(OverflowError):
        kiln.mutable(1 << 70)
    with pytest.raises(NotImplementedError, match="dynamic_len"):
        kiln.mutable([1, 2], dynamic_len=True)
