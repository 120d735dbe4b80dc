"""kiln.jit on functions that read a list, set or dict from a global or an enclosing scope: a
change of its contents between calls (s.add, lst.append, d[k] = v) must reach the compiled
function as it reaches eager (ast and trace capture: bytecode capture keeps no guard on contents yet,
as its graph breaks change such containers at every call)."""
import warnings

import numpy as np
import pytest

import kiln

MODES = [("ast", "O0"), ("ast", "O1"), ("trace", "O0"), ("trace", "O1")]

SEEN = set()
SCALES = [1.0]


def scaled_by_seen(x):
    return x * float(len(SEEN))


def scaled_by_list(x):
    out = x
    for s in SCALES:
        out = out * s
    return out


def _call(jf, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return jf(*args)


@pytest.mark.parametrize("mode,level", MODES)
def test_len_of_global_set_follows_add(mode, level):
    SEEN.clear()
    SEEN.add("a")
    jf = kiln.jit(scaled_by_seen, capture_mode=mode, jit_level=level)
    x = kiln.Tensor([1.0, 2.0])
    for name in "bcd":
        np.testing.assert_allclose(_call(jf, x).asnumpy(), scaled_by_seen(x).asnumpy())
        SEEN.add(name)
    np.testing.assert_allclose(_call(jf, x).asnumpy(), [4.0, 8.0])


@pytest.mark.parametrize("mode,level", MODES)
def test_global_list_contents_follow_append(mode, level):
    SCALES[:] = [1.0]
    jf = kiln.jit(scaled_by_list, capture_mode=mode, jit_level=level)
    x = kiln.Tensor([1.0, -2.0])
    for s in (2.0, 3.0):
        np.testing.assert_allclose(_call(jf, x).asnumpy(), scaled_by_list(x).asnumpy())
        SCALES.append(s)
    np.testing.assert_allclose(_call(jf, x).asnumpy(), [6.0, -12.0])


@pytest.mark.parametrize("mode,level", MODES)
def test_enclosing_dict_item_write(mode, level):
    table = {"w": 1.0}

    def f(x):
        return x * table["w"] + float(len(table))

    jf = kiln.jit(f, capture_mode=mode, jit_level=level)
    x = kiln.Tensor([1.0, 2.0])
    for k in range(3):
        np.testing.assert_allclose(_call(jf, x).asnumpy(), f(x).asnumpy())
        table[f"extra{k}"] = 0.0
