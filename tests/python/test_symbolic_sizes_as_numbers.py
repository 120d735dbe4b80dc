"""Sizes used as numbers while shapes are symbolic (issue 28, item 4): a size given to NumPy
(np.sqrt(x.shape[-1])), math, range, len and f-strings behaves as the Python int it is, in each
kiln.jit capture mode over several shapes, in kiln.trace(symbolic_shape=True) and in kiln.export;
the compiled entry specializes the size it needed and agrees with eager."""
import math
import os

import numpy as np
import pytest

import kiln
from kiln import nn


def scaled(x):
    d = x.shape[-1]
    rows = list(range(x.shape[0]))
    tag = f"{x.shape[0]}x{d}"
    y = x / np.sqrt(d) + len(rows) + math.log(d) + float(np.float32(d)) * 0.01
    return y, tag, int(np.prod(x.shape)), np.array([d, x.shape[0]]).tolist()


def _check(out, x):
    ref = scaled(x)
    np.testing.assert_allclose(out[0].asnumpy(), ref[0].asnumpy(), rtol=1e-6)
    assert out[1:] == ref[1:]


@pytest.mark.parametrize("mode", ["ast", "trace", "bytecode"])
def test_jit_sizes_to_numpy_math_range_and_text(mode):
    jf = kiln.jit(scaled, capture_mode=mode)
    for n in (2, 3, 5, 3):
        x = kiln.Tensor(np.random.default_rng(n).standard_normal((n, 4 * n)).astype(np.float32))
        _check(jf(x), x)


def test_megengine_trace_sizes_to_numpy():
    tr = kiln.trace(scaled, symbolic=True)
    for n in (2, 3, 4):
        x = kiln.Tensor(np.random.default_rng(n).standard_normal((n, 2 * n)).astype(np.float32))
        _check(tr(x), x)


class _Scaled(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(8, 8)

    def construct(self, x):
        return self.dense(x) / np.sqrt(x.shape[-1]) + math.log(x.shape[0])


def test_export_with_a_size_given_to_numpy(tmp_path):
    net = _Scaled()
    x = kiln.Tensor(np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32))
    kiln.export(net, x, file_name=str(tmp_path / "m"), file_format="KILN")
    loaded = kiln.load(str(tmp_path / "m.kiln"))
    np.testing.assert_allclose(loaded(x).asnumpy(), net(x).asnumpy(), rtol=1e-5)
