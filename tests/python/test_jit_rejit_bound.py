"""kiln.jit of a method that is itself @kiln.jit, reached through an instance (kiln.jit(net.construct)),
keeps the instance (issue 27: it raised "missing 1 required positional argument"), in every mode."""
import numpy as np
import pytest

import kiln


class Scale(kiln.nn.Cell):
    def __init__(self, w):
        super().__init__()
        self.w = kiln.Tensor(np.array([w], np.float32))

    @kiln.jit
    def construct(self, x):
        return x * self.w + 1.0


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_rejitted_bound_construct_keeps_its_instance(mode):
    a, b = Scale(2.0), Scale(-3.0)
    x = kiln.Tensor(np.array([1.0, 4.0], np.float32))
    for net in (a, b):
        jf = kiln.jit(net.construct, capture_mode=mode)
        for _ in range(2):
            np.testing.assert_allclose(jf(x).numpy(), net(x).numpy())
