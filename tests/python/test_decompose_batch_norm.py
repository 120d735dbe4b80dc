"""The O2 pass decompose_batch_norm (issue 33): a float32 batch_norm in inference mode whose
statistics outputs nothing reads becomes x * scale[c] + shift[c] (scale and shift computed in
float64 from the parameters at every call, as batch_norm's kernel computes them), so it fuses with
the ReLU / residual add after it and the channels-last layout flows through it. Checked: eager ==
every kiln.jit variant bit for bit (the same operations in the same precision), against a float64
NumPy reference, the graph text showing the rewrite (no batch_norm, one fused group per
normalization and what follows it, the layout carried from one convolution to the next), later
parameter updates seen, and the cases the pass must leave alone (O1 among them: its graphs keep
batch_norm without infer_boost, as test_jit_config.py asserts)."""
import numpy as np
import pytest

import kiln
from compiled_equal import STRICT_VARIANTS
from conformance import run_all_modes
from conftest import inference_basic_block
from kiln import nn, ops


def _x(shape, seed=1):
    return kiln.Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def _bn_reference(x, bn):
    """Inference-mode batch norm in float64: (x - mean) / sqrt(var + eps) * gamma + beta."""
    g, b, m, v = (t.asnumpy().astype(np.float64) for t in (bn.gamma, bn.beta, bn.moving_mean, bn.moving_variance))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x - m.reshape(shape)) / np.sqrt(v.reshape(shape) + bn.eps) * g.reshape(shape) + b.reshape(shape)


def _conv_reference(x, w):
    """3x3 convolution, padding 1, stride 1, in float64."""
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j])
    return out


def _basic_block_reference(block, x):
    relu = lambda t: np.maximum(t, 0)  # noqa: E731
    w1, w2 = (c.weight.asnumpy().astype(np.float64) for c in (block.conv1, block.conv2))
    x = x.astype(np.float64)
    h = relu(_bn_reference(_conv_reference(x, w1), block.bn1))
    return relu(_bn_reference(_conv_reference(h, w2), block.bn2) + x)


def _normalizations(text):
    return text.count("batch_norm(")


def test_basic_block_every_variant_matches_eager_bit_for_bit():
    block = inference_basic_block(16)
    x, x2 = _x((2, 16, 12, 12)), _x((2, 16, 12, 12), seed=2)
    want = block(x).asnumpy()
    np.testing.assert_allclose(want, _basic_block_reference(block, x.asnumpy()), rtol=1e-4, atol=1e-4)
    run_all_modes(block, (x,), (x2,), variants=STRICT_VARIANTS)  # every capture mode x O0/O1/O2 x kbk/sink
    for mode in ("ast", "bytecode", "trace"):
        for backend in ("kbk", "sink"):
            jf = kiln.jit(block, capture_mode=mode, jit_level="O2", backend=backend)
            for _ in range(3):  # the traced call, then the compiled plan
                np.testing.assert_array_equal(jf(x).asnumpy(), want)
    for backend in ("kbk", "sink"):
        jf = kiln.jit(block, jit_level="O2", backend=backend)
        for _ in range(3):  # the traced call, then the compiled plan
            np.testing.assert_array_equal(jf(x).asnumpy(), want)


@pytest.mark.parametrize("disable_format_transform", [False, True])
def test_graph_text_shows_the_rewrite(disable_format_transform):
    block = inference_basic_block(16)
    x = _x((2, 16, 12, 12))
    jf = kiln.jit(block, jit_level="O2", disable_format_transform=disable_format_transform)
    np.testing.assert_array_equal(jf(x).asnumpy(), block(x).asnumpy())
    text = jf.graph_str()
    for level in ("O0", "O1"):  # O1 keeps the op (test_jit_config.py)
        assert _normalizations(kiln.jit(block, jit_level=level).graph_str(x)) == 2
    assert _normalizations(text) == 0, text
    # each normalization is one group with the ops after it: mul, add, relu / mul, add, add, relu
    assert "= relu(" not in text.split("subgraph 0")[0], text
    subgraphs = text.split("subgraph ")[1:]
    groups = [" ".join(line.split("= ")[1].split("(")[0] for line in s.splitlines() if "= " in line and "return" not in line)
              for s in subgraphs]
    assert "mul add relu" in groups and "mul add add relu" in groups, groups
    if disable_format_transform:
        assert "relayout" not in text
    else:  # into the blocked (or NHWC) layout at the input, back at the second convolution's output only
        assert text.count("relayout(") == 2, text
        assert text.count("conv2d_fused(") == 2, text


def test_batch_norm_1d_and_3d_inputs():
    for shape, layer in (((6, 5), nn.BatchNorm1d(5)), ((3, 4, 7), nn.BatchNorm1d(4))):
        rng = np.random.default_rng(len(shape))
        c = shape[1]
        layer.gamma.set_data(rng.uniform(0.5, 1.5, c).astype(np.float32))
        layer.beta.set_data(rng.standard_normal(c).astype(np.float32))
        layer.moving_mean.set_data(rng.standard_normal(c).astype(np.float32))
        layer.moving_variance.set_data(rng.uniform(0.1, 3.0, c).astype(np.float32))
        layer.set_train(False)

        def f(x):
            return ops.relu(layer(x)) * 2.0

        x = _x(shape, seed=5)
        want = f(x).asnumpy()
        np.testing.assert_allclose(want, np.maximum(_bn_reference(x.asnumpy().astype(np.float64), layer), 0) * 2,
                                   rtol=1e-5, atol=1e-5)
        x2 = _x(shape, seed=6)
        run_all_modes(f, (x,), (x2,), (x,), variants=STRICT_VARIANTS)  # the later calls run the compiled graph
        jf = kiln.jit(f, jit_level="O2")
        for _ in range(3):  # the traced call, then the compiled graph
            np.testing.assert_array_equal(jf(x).asnumpy(), want)
        assert _normalizations(jf.graph_str()) == 0, jf.graph_str()


def test_parameter_updates_are_seen():
    block = inference_basic_block(16)
    x = _x((1, 16, 8, 8))
    jf = kiln.jit(block, jit_level="O2")
    for _ in range(2):  # the traced call, then the compiled graph
        np.testing.assert_array_equal(jf(x).asnumpy(), block(x).asnumpy())
    rng = np.random.default_rng(9)
    block.bn1.moving_variance.set_data(rng.uniform(2.0, 4.0, 16).astype(np.float32))
    block.bn2.gamma.set_data(rng.uniform(-1.0, 1.0, 16).astype(np.float32))
    block.bn2.moving_mean.set_data(rng.standard_normal(16).astype(np.float32))
    want = block(x).asnumpy()
    np.testing.assert_array_equal(jf(x).asnumpy(), want)
    np.testing.assert_allclose(want, _basic_block_reference(block, x.asnumpy()), rtol=1e-4, atol=1e-4)


def test_cases_left_alone():
    # training mode: batch statistics and running-statistics updates stay the op's
    layer, twin = nn.BatchNorm2d(4), nn.BatchNorm2d(4)
    layer.set_train(True), twin.set_train(True)
    x = _x((2, 4, 5, 5))
    jf = kiln.jit(lambda t: layer(t), jit_level="O2")
    for _ in range(2):
        np.testing.assert_array_equal(jf(x).asnumpy(), twin(x).asnumpy())
    np.testing.assert_array_equal(layer.moving_mean.asnumpy(), twin.moving_mean.asnumpy())
    assert _normalizations(jf.graph_str()) == 1
    # a graph that computes gradients reads the statistics outputs
    block = inference_basic_block(16)
    xb = _x((1, 16, 8, 8))
    jb = kiln.jit(block, jit_level="O2")
    grad = kiln.value_and_grad(jb, None, block.trainable_params())
    grad(xb)  # the traced call; then the compiled graph
    v, g = grad(xb)
    v_e, g_e = kiln.value_and_grad(block, None, block.trainable_params())(xb)
    # (O2 runs a training graph's convolutions as Winograd where it pays: eager's results up to rounding)
    np.testing.assert_allclose(v.asnumpy(), v_e.asnumpy(), rtol=1e-4, atol=1e-4 * np.abs(v_e.asnumpy()).max())
    for a, b in zip(g, g_e):
        np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-3, atol=1e-3 * np.abs(b.asnumpy()).max())
    assert "batch_norm(" in jb._grad_variant(None, block.trainable_params(), False).graph_str(xb)
    # float64 inputs keep the op (its kernel computes in float64 throughout)
    layer64 = nn.BatchNorm2d(3, dtype=kiln.float64)
    layer64.set_train(False)
    x64 = kiln.Tensor(np.random.default_rng(3).standard_normal((2, 3, 4, 4)))
    j64 = kiln.jit(lambda t: layer64(t), jit_level="O2")
    for _ in range(2):
        np.testing.assert_array_equal(j64(x64).asnumpy(), layer64(x64).asnumpy())
    assert _normalizations(j64.graph_str()) == 1
