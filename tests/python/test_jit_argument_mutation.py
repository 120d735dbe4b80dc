"""kiln.jit on functions that change the lists and dicts passed to them, or return them: every
capture mode must leave the caller's objects as eager does (changed in place, returned by identity)."""
import warnings

import numpy as np
import pytest

import kiln

MODES = [("ast", "O0"), ("ast", "O1"), ("bytecode", "O0"), ("bytecode", "O1"), ("trace", "O0"), ("trace", "O1")]


def _jit(fn, mode, level):
    return kiln.jit(fn, capture_mode=mode, jit_level=level)


def _values(seq):
    return [t.asnumpy().tolist() if isinstance(t, kiln.Tensor) else t for t in seq]


def _quiet(call, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return call(*args)


def _run(fn, mode, level, make_args, calls=3):
    """The arguments after each of `calls` calls, eager and jitted, and the results."""
    jf = _jit(fn, mode, level)
    got, want = [], []
    for k in range(calls):
        e_args, j_args = make_args(k), make_args(k)
        e_out = fn(*e_args)
        j_out = _quiet(jf, *j_args)
        want.append((e_args, e_out))
        got.append((j_args, j_out))
    return got, want


@pytest.mark.parametrize("mode,level", MODES)
def test_history_append_kept_across_calls(mode, level):
    def step(x, history):
        history.append((x * x).sum())
        return x

    f, h, e = _jit(step, mode, level), [], []
    for k in range(3):
        x = kiln.Tensor([1.0, 2.0 + k])
        out = _quiet(f, x, h)
        step(x, e)
        np.testing.assert_allclose(out.asnumpy(), x.asnumpy())
    assert len(h) == 3
    np.testing.assert_allclose(_values(h), _values(e))


@pytest.mark.parametrize("mode,level", MODES)
def test_item_write_and_returned_argument_is_the_callers(mode, level):
    def put(a, t):
        a[0] = t
        return a

    f = _jit(put, mode, level)
    for k in range(3):
        a = [kiln.Tensor([0.0])]
        t = kiln.Tensor([float(k)])
        out = _quiet(f, a, t)
        assert out is a
        assert a[0] is t


@pytest.mark.parametrize("mode,level", MODES)
def test_unchanged_argument_returned_by_identity(mode, level):
    def scale(x, a):
        return x * 2.0, a

    f = _jit(scale, mode, level)
    for k in range(3):
        a = [kiln.Tensor([1.0])]
        x = kiln.Tensor([float(k)])
        y, out = _quiet(f, x, a)
        assert out is a
        np.testing.assert_allclose(y.asnumpy(), [2.0 * k])


@pytest.mark.parametrize("mode,level", MODES)
def test_delete_pop_and_item_add(mode, level):
    def edit(x, a, d, lst):
        del a[0]
        d.pop("b")
        lst[0] += x
        return x + 1.0

    def make(k):
        return (kiln.Tensor([float(k), 1.0]), [1, 2, 3], {"a": 1, "b": 2},
                [kiln.Tensor([10.0, 20.0])])

    got, want = _run(edit, mode, level, make)
    for (g_args, g_out), (w_args, w_out) in zip(got, want):
        np.testing.assert_allclose(g_out.asnumpy(), w_out.asnumpy())
        assert g_args[1] == w_args[1]
        assert g_args[2] == w_args[2]
        np.testing.assert_allclose(_values(g_args[3]), _values(w_args[3]))


@pytest.mark.parametrize("mode,level", MODES)
def test_dict_argument_filled(mode, level):
    def fill(x, cache):
        cache["y"] = x * 3.0
        return cache["y"] + 1.0

    f = _jit(fill, mode, level)
    for k in range(3):
        cache = {}
        x = kiln.Tensor([float(k)])
        out = _quiet(f, x, cache)
        np.testing.assert_allclose(out.asnumpy(), [3.0 * k + 1.0])
        np.testing.assert_allclose(cache["y"].asnumpy(), [3.0 * k])


@pytest.mark.parametrize("mode,level", MODES)
def test_unchanged_arguments_still_compile(mode, level):
    def read(x, cfg):
        return x * cfg["w"][0]

    f = _jit(read, mode, level)
    w = kiln.Tensor([2.0])
    for k in range(3):
        cfg = {"w": [w]}
        out = _quiet(f, kiln.Tensor([float(k)]), cfg)
        np.testing.assert_allclose(out.asnumpy(), [2.0 * k])
        assert cfg == {"w": [w]}
    assert f.stats.compiles >= 1 and f.stats.eager_calls == 0
