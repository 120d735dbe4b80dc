"""Tensor.size is MindSpore's (the number of elements, an int) and, called, PyTorch's size():
x.size() is the shape and x.size(d) axis d. Training scripts ported from PyTorch call x.size(0);
before, that raised "'int' object is not callable". Eager and every kiln.jit variant agree."""
import pickle

import numpy as np
import pytest

import kiln
from kiln import ops
from conformance import run_all_modes

rng = np.random.default_rng(3)


def t(*shape):
    return kiln.Tensor(rng.standard_normal(shape).astype(np.float32))


def test_both_spellings_eagerly():
    x = t(3, 4)
    assert x.size == 12 and int(x.size) == 12 and x.size + 1 == 13
    assert x.size() == (3, 4) and x.size(0) == 3 and x.size(-1) == 4
    assert type(x.numel()) is int and x.numel() == 12
    assert pickle.loads(pickle.dumps(x.size)) == 12
    assert x.reshape(x.size).shape == (12,)
    with pytest.raises(IndexError, match=r"Tensor.size: dim 2 is out of range for a tensor of shape \(3, 4\)"):
        x.size(2)
    with pytest.raises(TypeError, match="Tensor.size: dim must be an int"):
        x.size("0")


def uses_sizes(x):
    n = x.size
    flat = x.reshape(n) * n
    rows = ops.arange(x.size(0)).astype(kiln.float32).sum()
    return flat + rows + x.size(-1), x.size(), x.numel()


def test_every_variant_matches_eager():
    run_all_modes(uses_sizes, (t(3, 4),), (t(2, 5),), (t(3, 4),))


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_dynamic_shapes_follow_each_call(mode):
    jitted = kiln.jit(uses_sizes, capture_mode=mode, dynamic=True)
    for shape in [(3, 4), (2, 5), (6, 4), (7, 7)]:
        x = t(*shape)
        got, want = jitted(x), uses_sizes(x)
        np.testing.assert_allclose(got[0].numpy(), want[0].numpy(), rtol=1e-6)
        assert got[1] == want[1] == shape and got[2] == want[2] == shape[0] * shape[1]
