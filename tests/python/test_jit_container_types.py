"""Named tuples, OrderedDicts and other container subclasses keep their type through kiln.jit,
as arguments and as results, in every capture mode (issue 27 item 13): eager returns a Pair or an
OrderedDict, so the compiled call must too, on the capturing call and on the compiled ones."""
import collections

import numpy as np
import pytest

import kiln

MODES = ("ast", "bytecode", "trace")
Pair = collections.namedtuple("Pair", "a b")


class Tagged(dict):
    pass


def swap(p):
    return Pair(p.b + 1.0, p.a * 2.0)


def ordered(x):
    return collections.OrderedDict([("z", x), ("a", x + 1.0)])


def tagged(x):
    out = Tagged()
    out["y"] = x * 3.0
    return out


def T(*v):
    return kiln.Tensor(np.array(v, np.float32))


@pytest.mark.parametrize("mode", MODES)
def test_named_tuple_argument_and_result(mode):
    jf = kiln.jit(swap, capture_mode=mode)
    for p in (Pair(T(1.0), T(2.0)), Pair(T(3.0), T(-1.0)), Pair(T(0.5), T(0.25))):
        got, want = jf(p), swap(p)
        assert type(got) is Pair
        np.testing.assert_allclose(got.a.numpy(), want.a.numpy())
        np.testing.assert_allclose(got.b.numpy(), want.b.numpy())


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fn, kind", [(ordered, collections.OrderedDict), (tagged, Tagged)])
def test_dict_subclass_results(fn, kind, mode):
    jf = kiln.jit(fn, capture_mode=mode)
    for x in (T(1.0, 2.0), T(-3.0, 0.5)):
        got, want = jf(x), fn(x)
        assert type(got) is kind and list(got) == list(want)
        for k in want:
            np.testing.assert_allclose(got[k].numpy(), want[k].numpy())
