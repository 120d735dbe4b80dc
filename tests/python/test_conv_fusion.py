"""Convolution epilogue fusion and layout propagation at O1 (passes fuse_conv_epilogue and
channels_last): jitted results against eager ones, forward (inference, infer_boost) and
forward+backward (value_and_grad), with the layout pass on and off; the IR text shows what
was fused and where the layout conversions went."""
import re

import numpy as np
import pytest

import kiln
from conftest import inference_basic_block
from kiln import nn, ops


def _x(channels, size=12, batch=2, seed=1):
    return kiln.Tensor(np.random.default_rng(seed).standard_normal((batch, channels, size, size)).astype(np.float32))


def _layout(channels):
    """The relayout attributes from NCHW into the layout the pass picks for convolutions of
    `channels` channels on this CPU: oneDNN's blocked layout of its block (16 with AVX-512:
    code 2, 8 with AVX2: code 3) where the channels divide into blocks, else NHWC (code 1)."""
    block = kiln._C.conv_block_size()
    return "{0, 1}" if channels % block else {16: "{0, 2}", 8: "{0, 3}"}[block]


@pytest.mark.parametrize("channels, level", [(16, "O1"), (32, "O1"), (8, "O1"), (16, "O2")])
@pytest.mark.parametrize("disable_format_transform", [False, True])
def test_basic_block_inference_matches_eager(channels, level, disable_format_transform):
    """O1's rewrites, and O2's, which runs every pass of O1 (it once lacked these, issue 17)."""
    layout = _layout(channels)
    block = inference_basic_block(channels)
    x = _x(channels)
    with kiln.no_grad():
        eager = block(x).asnumpy()
        jitted = kiln.jit(block, jit_level=level, infer_boost="on", disable_format_transform=disable_format_transform)
        for _ in range(3):  # the traced call, then the compiled graph (twice: cached primitives)
            np.testing.assert_allclose(jitted(x).asnumpy(), eager, rtol=1e-4, atol=1e-4)
        text = jitted.graph_str()
    # conv -> bn -> relu and conv -> bn -> + x -> relu: two fused convolutions, nothing else heavy
    assert text.count("conv2d_fused(") == 2 and "batch_norm" not in text and "relu(" not in text
    if disable_format_transform:
        assert "relayout" not in text
    else:  # in at the input (shared by the first convolution and the residual), out at the output
        assert text.count("relayout(") == 2 and f"relayout(%0) {layout}" in text


@pytest.mark.parametrize("act", ["relu", "gelu", "silu", "sigmoid", "tanh", "clamp"])
def test_conv_bias_activation_chains(act):
    kiln.manual_seed(3)
    c1 = nn.Conv2d(16, 16, 3, pad_mode="pad", padding=1, has_bias=True)
    c2 = nn.Conv2d(16, 32, 3, pad_mode="pad", padding=1, has_bias=False)
    bias = kiln.Tensor(np.linspace(-1, 1, 32, dtype=np.float32).reshape(32, 1, 1))
    fn = {"clamp": lambda t: ops.clamp(t, -0.5, 0.75)}.get(act, getattr(ops, act))

    def net(x, skip):
        y = fn(c1(x))
        return fn(c2(y) + bias + skip)

    x, skip = _x(16, size=9), _x(32, size=9, seed=5)
    with kiln.no_grad():
        eager = net(x, skip).asnumpy()
        for dft in (False, True):
            jitted = kiln.jit(net, jit_level="O1", infer_boost="on", disable_format_transform=dft)
            for _ in range(2):
                np.testing.assert_allclose(jitted(x, skip).asnumpy(), eager, rtol=1e-4, atol=1e-4)
            text = jitted.graph_str()
            assert text.count("conv2d_fused(") == 2 and f"{act}(" not in text and "add(" not in text


@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("disable_format_transform, infer_boost", [(False, "off"), (True, "off"), (False, "on")])
def test_basic_block_forward_backward_matches_eager(train, disable_format_transform, infer_boost):
    """infer_boost="on" keeps its rewrites in a forward+backward graph (the forward convolutions as
    conv2d_fused, Winograd allowed: per-op profiles of the bench's BasicBlock show it faster than
    the direct convolution there too, issue 17); the gradients still agree with eager."""
    block = inference_basic_block(16, seed=2)
    block.set_train(train)
    x = _x(16, size=8)
    weights = block.trainable_params()
    step_e = kiln.value_and_grad(block, None, weights)
    jblock = kiln.jit(block, jit_level="O1", disable_format_transform=disable_format_transform,
                      infer_boost=infer_boost)
    step_j = kiln.value_and_grad(jblock, None, weights)
    # training mode normalizes with batch statistics: the running ones moving between steps do not matter
    for _ in range(2):
        ve, ge = step_e(x)
        vj, gj = step_j(x)
        np.testing.assert_allclose(vj.asnumpy(), ve.asnumpy(), rtol=1e-4, atol=1e-4)
        for a, b in zip(gj, ge):
            np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-3, atol=1e-3)
    text = jblock._grad_variant(None, weights, False).executable(x).graph_str()
    # relu's output is saved for its backward (alone, or fused into batch norm's at O1): the
    # activation stays out of the convolution
    assert "relu(" in text and re.search(r"(^|[^\w])(batch_norm_)?relu_backward\(", text, re.M), text
    # the forward convolutions are conv2d_fused either way: infer_boost's rewrite, or (off) the
    # O1 pass conv_algorithm choosing Winograd for them in this training graph (16 channels, 8x8)
    assert text.count("conv2d_fused(") == 2, text


def test_shared_intermediate_is_not_fused():
    kiln.manual_seed(4)
    conv = nn.Conv2d(16, 16, 3, pad_mode="pad", padding=1, has_bias=False)

    def net(x):
        y = conv(x)
        return ops.relu(y), y * 2  # y is read twice: relu stays a node of its own

    x = _x(16, size=6)
    with kiln.no_grad():
        eager = [t.asnumpy() for t in net(x)]
        jitted = kiln.jit(net, jit_level="O1")
        for _ in range(2):
            for got, want in zip(jitted(x), eager):
                np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-5, atol=1e-5)
    assert "relu(" in jitted.graph_str() and "conv2d(" in jitted.graph_str()


@pytest.mark.parametrize("disable_format_transform", [False, True])
def test_conv_chain_forward_backward_with_layout_pass(disable_format_transform):
    kiln.manual_seed(6)
    c1 = nn.Conv2d(16, 16, 3, pad_mode="pad", padding=1, has_bias=True)
    c2 = nn.Conv2d(16, 16, 3, pad_mode="pad", padding=1, has_bias=True)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = c1, c2

        def construct(self, x):
            return ops.silu(self.c2(ops.relu(self.c1(x))) + x)

    net = Net()
    x = _x(16, size=7)
    weights = net.trainable_params()
    step_e = kiln.value_and_grad(net, None, weights)
    jnet = kiln.jit(net, jit_level="O1", disable_format_transform=disable_format_transform)
    step_j = kiln.value_and_grad(jnet, None, weights)
    ve, ge = step_e(x)
    for _ in range(2):
        vj, gj = step_j(x)
        np.testing.assert_allclose(vj.asnumpy(), ve.asnumpy(), rtol=1e-4, atol=1e-4)
        for a, b in zip(gj, ge):
            np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-3, atol=1e-3)
    # graphs with backward convolutions keep NCHW (they read the saved activations in it)
    assert "relayout(" not in jnet._grad_variant(None, weights, False).executable(x).graph_str()
    with kiln.no_grad():  # the forward alone, without infer_boost, gets the layout pass
        jitted = kiln.jit(net, jit_level="O1", disable_format_transform=disable_format_transform)
        for _ in range(2):
            np.testing.assert_allclose(jitted(x).asnumpy(), ve.asnumpy(), rtol=1e-4, atol=1e-4)
        assert ("relayout(" in jitted.graph_str()) != disable_format_transform


@pytest.mark.parametrize("channels", [16, 8, 4])  # blocked; blocked with AVX2, NHWC with AVX-512; NHWC
@pytest.mark.parametrize("infer_boost", ["on", "off"])
def test_layout_pass_through_broadcasting_elementwise_ops(channels, infer_boost):
    kiln.manual_seed(7)
    c1 = nn.Conv2d(channels, channels, 3, pad_mode="pad", padding=1, has_bias=True)
    c2 = nn.Conv2d(channels, 2 * channels, 3, pad_mode="pad", padding=1, has_bias=False)
    rng = np.random.default_rng(8)
    per_channel = kiln.Tensor(rng.standard_normal((channels, 1, 1)).astype(np.float32))
    per_column = kiln.Tensor(rng.standard_normal(7).astype(np.float32))
    per_row = kiln.Tensor(rng.standard_normal((1, 1, 5, 1)).astype(np.float32))
    fill = kiln.Tensor(np.float32(0.25))

    def net(x, full):
        y = c1(x) * per_channel + per_column - per_row
        y = ops.where(y > 0, y, fill) * full  # a comparison, a 0-d operand, a full-size operand
        z = c2(ops.tanh(y))
        return z, y.sum(), ops.exp(y)  # y is also read outside the chain

    x = kiln.Tensor(np.random.default_rng(9).standard_normal((2, channels, 5, 7)).astype(np.float32))
    full = kiln.Tensor(np.random.default_rng(10).standard_normal((2, channels, 5, 7)).astype(np.float32))
    with kiln.no_grad():
        eager = [t.asnumpy() for t in net(x, full)]
        jitted = kiln.jit(net, jit_level="O1", infer_boost=infer_boost)
        for _ in range(2):
            for got, want in zip(jitted(x, full), eager):
                np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-4, atol=1e-4)
    assert "relayout(" in jitted.graph_str()


class _TwoBranches(nn.Cell):
    """conv_a(x) + conv_b(x) (+ a bias add on one branch): both convolutions reach the one add, which
    only one of them may absorb as its residual step."""

    def __init__(self, bias_on_b):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, pad_mode="same")
        self.b = nn.Conv2d(3, 8, 1, has_bias=not bias_on_b)
        self.bias = kiln.Parameter(kiln.Tensor(np.full((8, 1, 1), 0.25, np.float32)), name="bias") if bias_on_b else None

    def construct(self, x):
        y = self.b(x)
        if self.bias is not None:
            y = y + self.bias
        return ops.relu(self.a(x) + y)


@pytest.mark.parametrize("bias_on_b", [False, True])
@pytest.mark.parametrize("level", ["O1", "O2"])
@pytest.mark.parametrize("backend", ["kbk", "sink"])
def test_two_convolutions_into_one_add(bias_on_b, level, backend):
    net = _TwoBranches(bias_on_b)
    x = kiln.Tensor(np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32))
    for train in (False, True):
        net.set_train(train)
        want_y = net(x)
        want_g = kiln.grad(lambda v: net(v).sum())(x)
        f = kiln.jit(net, jit_level=level, backend=backend)
        np.testing.assert_allclose(f(x).asnumpy(), want_y.asnumpy(), rtol=1e-4, atol=1e-5)
        g = kiln.grad(lambda v: kiln.jit(lambda u: net(u).sum(), jit_level=level, backend=backend)(v))(x)
        np.testing.assert_allclose(g.asnumpy(), want_g.asnumpy(), rtol=1e-4, atol=1e-4)
