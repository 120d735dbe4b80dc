"""BatchNorm+ReLU backward fused (the fuse_bn_relu_backward pass of O1): a compiled relu(batch_norm(x))
runs one batch_norm_relu_backward kernel instead of relu_backward and batch_norm_backward, and its
gradients match kiln eager's (the unfused ops), NumPy's formulas and central differences."""
import numpy as np
import pytest

import kiln
from kiln import ops, profiler

from conftest import check_grad


def bn_relu(training, rm, rv, w):
    def f(x, gamma, beta):
        y = ops.batch_norm(x, rm, rv, gamma, beta, training=training, momentum=0.1, eps=1e-5)
        return (ops.relu(y) * w).sum()
    return f


def numpy_grads(x, gamma, beta, w, training, rm, rv, eps=1e-5):
    """(dx, dgamma, dbeta) of sum(relu(batch_norm(x)) * w) for NCHW x."""
    axes = (0, 2, 3)
    shape = (1, -1, 1, 1)
    mean = x.mean(axes) if training else rm
    var = x.var(axes) if training else rv
    invstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - mean.reshape(shape)) * invstd.reshape(shape)
    y = xhat * gamma.reshape(shape) + beta.reshape(shape)
    gy = w * (y > 0)
    dbeta, dgamma = gy.sum(axes), (gy * xhat).sum(axes)
    if training:
        m = x.size / x.shape[1]
        dx = (gamma * invstd / m).reshape(shape) * (m * gy - dbeta.reshape(shape) - xhat * dgamma.reshape(shape))
    else:
        dx = gy * (gamma * invstd).reshape(shape)
    return dx, dgamma, dbeta


@pytest.mark.parametrize("training", [True, False])
def test_fused_kernel_runs_and_matches_eager_and_numpy(training):
    rng = np.random.default_rng(3)
    n, c, h, wd = 2, 5, 6, 7
    x = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, c).astype(np.float32)
    beta = rng.uniform(-0.5, 0.5, c).astype(np.float32)
    w = rng.standard_normal((n, c, h, wd)).astype(np.float32)
    rm0 = rng.uniform(-0.2, 0.2, c).astype(np.float32)
    rv0 = rng.uniform(0.5, 2.0, c).astype(np.float32)
    args = [kiln.Tensor(a) for a in (x, gamma, beta)]

    def run(compiled):
        rm, rv = kiln.Tensor(rm0.copy()), kiln.Tensor(rv0.copy())
        f = bn_relu(training, rm, rv, kiln.Tensor(w))
        fn = kiln.value_and_grad(kiln.jit(f, jit_level="O1") if compiled else f, grad_position=(0, 1, 2))
        fn(*args)  # compiles
        with profiler.profile(record_shapes=False, profile_memory=False) as prof:
            value, grads = fn(*args)
        names = {e["name"] for e in prof.events() if e["kind"] == "kernel"}
        return value.asnumpy(), [g.asnumpy() for g in grads], names

    v_eager, g_eager, eager_names = run(False)
    v_jit, g_jit, jit_names = run(True)
    assert "relu_backward" in eager_names and "batch_norm_backward" in eager_names
    assert "batch_norm_relu_backward" in jit_names, jit_names
    assert not {"relu_backward", "batch_norm_backward"} & jit_names, jit_names
    np.testing.assert_allclose(v_jit, v_eager, rtol=1e-5, atol=1e-5)
    ref = numpy_grads(x.astype(np.float64), gamma.astype(np.float64), beta, w, training, rm0.astype(np.float64),
                      rv0.astype(np.float64))
    for got, eager, want in zip(g_jit, g_eager, ref):
        np.testing.assert_allclose(got, eager, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_fused_gradients_match_central_differences():
    rng = np.random.default_rng(4)
    c = 3
    x = rng.standard_normal((2, c, 3, 4))
    gamma = rng.uniform(0.5, 1.5, c)
    beta = rng.uniform(-0.5, 0.5, c)
    rm, rv = kiln.Tensor(np.zeros(c), kiln.float64), kiln.Tensor(np.ones(c), kiln.float64)
    w = kiln.Tensor(rng.standard_normal((2, c, 3, 4)), kiln.float64)
    f = kiln.jit(bn_relu(True, rm, rv, w), jit_level="O1")
    check_grad(f, x, gamma, beta, rtol=1e-5, atol=1e-6)
    g = kiln.grad(f, grad_position=(0, 1, 2))
    args = [kiln.Tensor(a, kiln.float64) for a in (x, gamma, beta)]
    g(*args)
    with profiler.profile(record_shapes=False, profile_memory=False) as prof:
        g(*args)
    assert "batch_norm_relu_backward" in {e["name"] for e in prof.events() if e["kind"] == "kernel"}
