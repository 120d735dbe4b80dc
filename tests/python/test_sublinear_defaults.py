"""SublinearMemoryConfig() with its defaults (issue 33 item 6): on a deep tanh-residual MLP and a
20-block conv3x3/BatchNorm/ReLU residual CNN, a compiled training step's measured peak (kiln's
allocator high-water mark during a call) is at most half the same step's without it, and its
losses, gradients, parameters and BatchNorm running statistics are bitwise the step's without it
in every variant (kiln.trace at both levels, kiln.jit O0/O1 x kbk/sink)."""
from functools import partial

import numpy as np
import pytest

import kiln
from kiln.bench import training as T
from kiln.jit import SublinearMemoryConfig

WORKLOADS = {
    # batch wider than the layers: activations, not weights, make the step's peak
    "tanh MLP 24x64": (partial(T.tanh_residual_mlp, 24, 64), (256, 64)),
    "CNN 20 blocks": (partial(T.conv_residual_cnn, 20, 8), (4, 8, 8, 8)),
}
VARIANTS = {
    "trace": {"entry": "trace"},
    "trace O0": {"entry": "trace", "opt_level": 1},
    "jit O0 kbk": {"jit_level": "O0"},
    "jit O1 kbk": {"jit_level": "O1"},
    "jit O0 sink": {"jit_level": "O0", "backend": "sink"},
    "jit O1 sink": {"jit_level": "O1", "backend": "sink"},
}


def all_state(step):
    """every parameter of the step's network, BatchNorm's running statistics included"""
    return [p.asnumpy().copy() for p in step.net.get_parameters()]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_default_config_halves_the_measured_peak_and_trains_bitwise_the_same(workload, variant):
    build, shape = WORKLOADS[workload]
    x = T.inputs(shape)
    options = VARIANTS[variant]
    base = T.Step(build, **options)
    base.first_call(x)
    base_peak = base.measured_peak(x)
    sub = T.Step(build, sublinear_memory_config=SublinearMemoryConfig(), **options)
    sub.first_call(x)
    sub_peak = sub.measured_peak(x)
    r = sub.report()
    assert r["recompute"] == "search" and r["recomputed_ops"] > 0, r
    assert sub_peak <= 0.5 * base_peak, (workload, variant, sub_peak, base_peak, r)
    # both have run two steps: the same losses from here on, and the same state after each
    for _ in range(2):
        assert sub(x).item() == base(x).item()
        for k, (a, b) in enumerate(zip(all_state(sub), all_state(base))):
            assert np.array_equal(a, b), f"{workload} {variant}: parameter {k} differs by {np.max(np.abs(a - b))}"


def grads_of(build):
    kiln.manual_seed(0)
    net = build()
    net.set_train(True)
    params = net.trainable_params()
    return kiln.value_and_grad(lambda x: (net(x) ** 2).mean(), None, params), net


@pytest.mark.parametrize("variant", [v for v in VARIANTS if not v.startswith("trace")])
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_gradients_are_bitwise_the_baselines_and_match_eager(workload, variant):
    build, shape = WORKLOADS[workload]
    x = T.inputs(shape)
    options = VARIANTS[variant]
    results = []
    for config in (None, SublinearMemoryConfig()):
        grad_fn, net = grads_of(build)
        f = kiln.jit(grad_fn, capture_mode="trace", sublinear_memory_config=config, **options)
        loss, grads = f(x)
        results.append((loss.item(), [g.asnumpy() for g in grads], [p.asnumpy() for p in net.get_parameters()]))
        if config is not None:
            assert f.memory_report()["recomputed_ops"] > 0
    (l0, g0, s0), (l1, g1, s1) = results
    assert l0 == l1
    for k, (a, b) in enumerate(zip(g1, g0)):
        assert np.array_equal(a, b), f"{workload} {variant}: gradient {k} differs by {np.max(np.abs(a - b))}"
    for a, b in zip(s1, s0):  # running statistics updated once, as without recomputation
        assert np.array_equal(a, b)
    grad_fn, net = grads_of(build)
    loss, grads = grad_fn(x)
    np.testing.assert_allclose(l1, loss.item(), rtol=1e-5)
    for a, b in zip(g1, grads):
        np.testing.assert_allclose(a, b.asnumpy(), rtol=1e-4, atol=1e-5)
    for a, b in zip(s1, net.get_parameters()):
        np.testing.assert_allclose(a, b.asnumpy(), rtol=1e-5, atol=1e-6)
