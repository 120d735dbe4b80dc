"""In-place writes after a product with a constant: `y[:, 1] *= 3`, `y /= 2` and the like change a
tensor that an earlier mul/div read, but no gradient needs that tensor's old value (d(a*c)/da = c),
so backward must work and give the right gradient, as PyTorch's does -- eagerly and in every
kiln.jit variant. Where a gradient does need the old value (a * w with w requiring grad, c / a),
backward still refuses clearly."""
import numpy as np
import pytest

import kiln
from conformance import run_all_modes

X = np.arange(12, dtype=np.float32).reshape(3, 4) / 7 - 0.5


def scaled_column(x):
    y = x * 1
    y[:, 1] *= 3
    y[0] /= 2
    return (y * y).sum()


def scaled_column_grad_numpy(x):
    scale = np.ones_like(x)
    scale[:, 1] *= 3
    scale[0] /= 2
    return 2 * x * scale * scale


def test_eager_gradient_matches_numpy():
    x = kiln.Tensor(X)
    g = kiln.grad(scaled_column)(x)
    np.testing.assert_allclose(g.numpy(), scaled_column_grad_numpy(X), rtol=1e-6)


def test_every_variant_matches_eager():
    x2 = kiln.Tensor(X[::-1].copy())
    run_all_modes(lambda x: kiln.grad(scaled_column)(x), (kiln.Tensor(X),), (x2,))


def test_a_value_a_gradient_needs_is_still_guarded():
    w = kiln.Parameter(kiln.Tensor(np.full((3, 4), 2.0, np.float32)), name="w")
    x = kiln.Tensor(X)
    x.requires_grad = True
    a = x * 1
    b = a * w            # d b / d w reads a
    a[0] = 0
    with pytest.raises(RuntimeError, match="mul: a tensor needed to compute gradients was modified in place"):
        b.sum().backward()
    c = x * 1
    d = 2 / c            # d d / d c reads c
    c[1] = 5
    with pytest.raises(RuntimeError, match="div: a tensor needed to compute gradients was modified in place"):
        d.sum().backward()


def test_dividend_written_after_division():
    x = kiln.Tensor(X)
    x.requires_grad = True
    a = x * 1
    b = a / 4            # d b / d a = 1/4 needs neither a nor its old value
    a[:, 0] = 100
    (b * b).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * (X / 4) / 4, rtol=1e-6)
