"""JitConfig, Cell.set_jit_config, and gradients across the jit boundary."""
import numpy as np
import pytest

import kiln
from kiln import nn


def _net():
    kiln.manual_seed(3)
    return nn.SequentialCell(nn.Dense(3, 5), nn.ReLU(), nn.Dense(5, 2))


def _x(seed=0):
    return kiln.Tensor(np.random.default_rng(seed).standard_normal((4, 3)).astype(np.float32))


def test_config_validation_lists_accepted_values():
    with pytest.raises(ValueError, match="'O0', 'O1', 'O2'"):
        kiln.JitConfig(jit_level="O3")
    with pytest.raises(ValueError, match="'auto', 'sink', 'no_sink'"):
        kiln.JitConfig(exc_mode="fast")
    with pytest.raises(ValueError, match="'STRICT', 'LAX'"):
        kiln.JitConfig(jit_syntax_level="loose")
    with pytest.raises(ValueError, match="unknown option 'speed'"):
        kiln.JitConfig(speed=3)
    assert kiln.JitConfig().jit_level == "O1" and kiln.JitConfig(exc_mode="no_sink").backend == "ms_backend"


def test_configured_cell_runs_compiled_and_matches_eager():
    net = _net()
    x = _x()
    eager = net(x).asnumpy()
    net.set_jit_config(kiln.JitConfig(jit_level="O0", exec_order="dfs"))
    for _ in range(3):
        np.testing.assert_array_equal(net(x).asnumpy(), eager)
    info = net._jitted.cache_info()
    assert info.compiles == 1 and info.hits == 2


def test_value_and_grad_of_a_configured_cell_compiles_the_backward():
    net = _net()
    x = _x(1)
    v_e, g_e = kiln.value_and_grad(net, None, net.trainable_params())(x)
    net.set_jit_config(kiln.JitConfig())
    for _ in range(2):
        v_j, g_j = kiln.value_and_grad(net, None, net.trainable_params())(x)
        np.testing.assert_allclose(v_j.asnumpy(), v_e.asnumpy(), rtol=1e-6, atol=1e-6)
        for a, b in zip(g_j, g_e):
            np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-6, atol=1e-6)
    variant = next(iter(net._jitted._grad_variants.values()))
    assert variant.cache_info().compiles == 1 and variant.cache_info().hits == 1


def test_gradients_through_a_jitted_call_inside_an_enclosing_grad_are_not_lost():
    net = _net()
    jnet = kiln.jit(net)
    x = _x(2)
    jnet(x)  # compiled outside any grad: its results carry no history
    loss_e = lambda x: (net(x) ** 2).sum()  # noqa: E731
    loss_j = lambda x: (jnet(x) ** 2).sum()  # noqa: E731
    _, g_e = kiln.value_and_grad(loss_e, None, net.trainable_params())(x)
    _, g_j = kiln.value_and_grad(loss_j, None, net.trainable_params())(x)
    for a, b in zip(g_j, g_e):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-6, atol=1e-6)
        assert np.abs(a.asnumpy()).sum() > 0


def test_infer_boost_folds_batch_norm_into_the_convolution():
    from kiln import models

    kiln.manual_seed(0)
    block = models.BasicBlock(8)
    block.set_train(False)
    x = kiln.Tensor(np.random.default_rng(4).standard_normal((2, 8, 10, 10)).astype(np.float32))
    with kiln.no_grad():
        eager = block(x).asnumpy()
        boosted = kiln.jit(block, jit_level="O1", infer_boost="on")
        for _ in range(2):
            np.testing.assert_allclose(boosted(x).asnumpy(), eager, rtol=1e-5, atol=1e-5)
        text = boosted.graph_str()
        assert "batch_norm" not in text and text.count("conv2d_fused(") == 2  # with their epilogues
        # the running statistics stay live: an update is seen without recompiling
        block.bn1.moving_mean.set_data(np.full(8, 0.5, np.float32))
        np.testing.assert_allclose(boosted(x).asnumpy(), block(x).asnumpy(), rtol=1e-5, atol=1e-5)
        assert boosted.cache_info().compiles == 1
        # without infer_boost (or in training mode) batch_norm stays
        assert "batch_norm" in kiln.jit(block, jit_level="O1").graph_str(x)
