"""A compiled amp training step casts each float32 parameter once per call: the forward's cast is
the one the backward reads (no value is cast twice), in every capture mode, jit level and backend;
and the step's values equal eager amp's."""
import re

import numpy as np
import pytest

import kiln
from kiln import nn


def model():
    kiln.manual_seed(0)
    net = nn.SequentialCell([nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 4)])
    return net, kiln.amp.auto_mixed_precision(net, "O2", kiln.bfloat16)


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
@pytest.mark.parametrize("level", ["O0", "O1"])
@pytest.mark.parametrize("backend", ["kbk", "sink"])
def test_each_parameter_is_cast_once_per_step(mode, level, backend):
    net, low = model()
    x = kiln.Tensor(np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32))
    step = kiln.value_and_grad(lambda x: low(x).sum(), None, net.trainable_params())
    jf = kiln.jit(step, capture_mode=mode, jit_level=level, backend=backend)
    (got_v, got_g), (want_v, want_g) = jf(x), step(x)
    np.testing.assert_array_equal(got_v.numpy(), want_v.numpy())
    for g, w in zip(got_g, want_g):
        assert g.dtype == kiln.float32
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    sources = re.findall(r"= cast\((%\d+)\)", jf.plan_str(x))
    assert len(sources) >= 5  # x and the four parameters at least
    assert len(sources) == len(set(sources)), jf.plan_str(x)
