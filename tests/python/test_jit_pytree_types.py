"""kiln.jit with arguments and results of every container kind eager accepts: namedtuples,
OrderedDicts, dict subclasses, nested dict/list/tuple, sets, NumPy arrays and dict keys views.
Results come back with their own type and values equal to eager, in every capture mode."""
import collections
import dataclasses
import warnings

import numpy as np
import pytest

import kiln

MODES = [("ast", "O0"), ("ast", "O1"), ("bytecode", "O0"), ("bytecode", "O1"), ("trace", "O0"), ("trace", "O1")]

Pair = collections.namedtuple("Pair", "a b")


class Bag(dict):
    pass


def _same(got, want):
    assert type(got) is type(want)
    if isinstance(want, kiln.Tensor):
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-6)
    elif isinstance(want, dict):
        assert list(got.keys()) == list(want.keys())
        for k in want:
            _same(got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    else:
        assert got == want


def _check(fn, mode, level, make_args, calls=3):
    jf = kiln.jit(fn, capture_mode=mode, jit_level=level)
    for k in range(calls):
        args = make_args(k)
        want = fn(*args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got = jf(*args)
        _same(got, want)


def _t(k, n=2):
    return kiln.Tensor(np.arange(n, dtype=np.float32) + k)


@pytest.mark.parametrize("mode,level", MODES)
def test_namedtuple_result(mode, level):
    _check(lambda x: Pair(x + 1.0, x * 2.0), mode, level, lambda k: (_t(k),))


@pytest.mark.parametrize("mode,level", MODES)
def test_ordered_dict_and_dict_subclass_results(mode, level):
    def f(x):
        return collections.OrderedDict(b=x * 2.0, a=x + 1.0), Bag(y=x - 1.0)

    _check(f, mode, level, lambda k: (_t(k),))


@pytest.mark.parametrize("mode,level", MODES)
def test_namedtuple_argument(mode, level):
    def f(p):
        return p.a + p.b * 2.0

    _check(f, mode, level, lambda k: (Pair(_t(k), _t(2 * k)),))


@pytest.mark.parametrize("mode,level", MODES)
def test_ordered_dict_argument_nested(mode, level):
    def f(o):
        return {"s": o["a"] * 2.0 + o["n"][0][1], "t": [o["n"][1]]}

    _check(f, mode, level, lambda k: (collections.OrderedDict(a=_t(k), n=[(_t(0), _t(k)), _t(1)]),))


@pytest.mark.parametrize("mode,level", MODES)
def test_numpy_array_argument(mode, level):
    def f(x, n):
        return x + kiln.Tensor(n)

    _check(f, mode, level, lambda k: (_t(k), np.full(2, float(k), np.float32)))


@pytest.mark.parametrize("mode,level", MODES)
def test_set_argument(mode, level):
    def f(x, s):
        return x * float(len(s))

    _check(f, mode, level, lambda k: (_t(k), set(range(k + 1))))


@pytest.mark.parametrize("mode,level", MODES)
def test_dict_keys_result(mode, level):
    def f(x):
        d = {"a": x, "b": x + 1.0}
        return d.keys(), d["b"]

    jf = kiln.jit(f, capture_mode=mode, jit_level=level)
    for k in range(3):
        x = _t(k)
        keys, y = f(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            g_keys, g_y = jf(x)
        assert type(g_keys) is type(keys) and list(g_keys) == list(keys)
        np.testing.assert_allclose(g_y.asnumpy(), y.asnumpy())


def test_unsupported_argument_is_a_clear_error():
    class Opaque:
        __hash__ = None

    with pytest.raises(TypeError, match="Opaque"):
        kiln.jit(lambda x, o: x, capture_mode="trace")(_t(0), Opaque())


@dataclasses.dataclass
class State:
    w: object
    extra: object


class Box:
    """A user class registered as a pytree node."""

    def __init__(self, value, tag):
        self.value, self.tag = value, tag


kiln.tree.register_pytree_node(Box, lambda b: ((b.value,), b.tag), lambda tag, children: Box(children[0], tag))


@pytest.mark.parametrize("mode,level", MODES)
def test_dataclass_argument_and_result(mode, level):
    def f(s, x):
        return State(s.w * x, {"n": s.extra["n"] + x})

    jf = kiln.jit(f, capture_mode=mode, jit_level=level)
    for k in range(3):
        s, x = State(_t(k), {"n": _t(1)}), _t(2 * k)
        want = f(s, x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got = jf(s, x)
        assert type(got) is State
        _same(got.w, want.w)
        _same(got.extra, want.extra)


@pytest.mark.parametrize("mode,level", MODES)
def test_registered_node_argument_and_result(mode, level):
    def f(b):
        return Box(b.value * 3.0, b.tag + "!")

    jf = kiln.jit(f, capture_mode=mode, jit_level=level)
    for k in range(3):
        b = Box(_t(k), "t")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got = jf(b)
        assert type(got) is Box and got.tag == "t!"
        _same(got.value, f(b).value)
