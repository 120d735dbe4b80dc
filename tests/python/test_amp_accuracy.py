"""What mixed precision keeps of float32's accuracy: an all-bfloat16 (O3) Llama-style attention at
512 tokens, whose positions and rotary angles stay float32, against float32; and LeNet5 trained in
bfloat16 (O2, build_train_network) on scikit-learn's digits reaching the float32 run's accuracy
(docs/guide/mixed_precision.md states these margins)."""
import importlib.util
import pathlib
import sys

import numpy as np
import pytest

import kiln
from kiln import nn, ops

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def rotary(x, positions):
    """Rotary embedding of x (b, h, L, d) at the positions (L,): angles computed here, in the model."""
    d = x.shape[-1]
    inv = 1.0 / (10000.0 ** (ops.arange(0, d, 2, dtype=kiln.float32) / d))
    angles = ops.reshape(positions, (-1, 1)) * ops.reshape(inv, (1, d // 2))
    angles = ops.concat((angles, angles), -1)
    half = d // 2
    return x * ops.cos(angles) + ops.concat((-x[..., half:], x[..., :half]), -1) * ops.sin(angles)


class LlamaAttention(nn.Cell):
    def __init__(self, dim=64, heads=4):
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.qkv = nn.Dense(dim, 3 * dim, has_bias=False)
        self.o = nn.Dense(dim, dim, has_bias=False)
        self.norm = nn.RMSNorm((dim,))
        self.round_positions = False  # the positions rounded to bfloat16 (what amp must not do)

    def construct(self, x):
        b, n, _ = x.shape
        q, k, v = ops.split(self.qkv(self.norm(x)).reshape(b, n, 3, self.heads, self.hd).transpose(2, 0, 3, 1, 4), 1)
        q, k, v = q.squeeze(0), k.squeeze(0), v.squeeze(0)
        pos = ops.arange(n, dtype=kiln.float32)
        if self.round_positions:
            pos = pos.astype(kiln.bfloat16).astype(kiln.float32)
        q, k = rotary(q, pos), rotary(k, pos)
        out = ops.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(0, 2, 1, 3).reshape(b, n, -1))


def rel_err(got, want):
    got, want = got.astype(kiln.float32).numpy().astype(np.float64), want.numpy().astype(np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_all_bf16_llama_attention_at_512_tokens_stays_close_to_float32():
    kiln.manual_seed(0)
    net = LlamaAttention()
    x = kiln.tensor(np.random.default_rng(0).standard_normal((1, 512, 64)).astype(np.float32))
    want = net(x)
    low = kiln.amp.auto_mixed_precision(net, "O3", kiln.bfloat16)
    got = low(x)
    assert got.dtype is kiln.bfloat16
    err = rel_err(got, want)
    assert err < 0.015, err
    # what the float32 positions buy: the same network with the positions rounded to bfloat16
    # (positions past 256 lose their low bits) is several times further off
    rounded = ops.arange(512, dtype=kiln.float32).astype(kiln.bfloat16).astype(kiln.float32)
    assert float(ops.max(ops.abs(rounded - ops.arange(512, dtype=kiln.float32)))) >= 1.0
    net.round_positions = True
    bad = rel_err(low(x), want)
    assert bad > 3 * err, (bad, err)


def test_o3_keeps_the_positions_float32_in_the_graph():
    net = LlamaAttention()
    low = kiln.amp.auto_mixed_precision(net, "O3", kiln.bfloat16)
    x = kiln.tensor(np.random.default_rng(1).standard_normal((1, 300, 64)).astype(np.float32))
    jf = kiln.jit(lambda x: low(x), capture_mode="trace")
    np.testing.assert_array_equal(jf(x).astype(kiln.float32).numpy(), low(x).astype(kiln.float32).numpy())
    text = jf.graph_str(x)
    assert "float32[300, 16] = cos" in text and "float32[300, 16] = sin" in text, text


def load_lenet():
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location("lenet_digits", EXAMPLES / "lenet_digits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train_lenet(lenet, level, epochs=1, seed=0):
    from kiln import dataset as ds

    kiln.manual_seed(seed)
    x_train, y_train, x_test, y_test = lenet.load_digits_split(seed)
    net = lenet.LeNet5()
    net.set_train()
    opt = nn.Adam(net.trainable_params(), 0.004)
    step = kiln.amp.build_train_network(net, opt, nn.CrossEntropyLoss(), level=level, dtype=kiln.bfloat16,
                                        loss_scale_manager=None)
    ds.config.set_seed(seed)
    data = ds.NumpySlicesDataset((x_train, y_train), column_names=["image", "label"], shuffle=True).batch(32)
    for _ in range(epochs):
        for x, y in data.create_tuple_iterator():
            step(x, y.astype(kiln.int64))
    net.set_train(False)
    low = kiln.amp.auto_mixed_precision(net, level, kiln.bfloat16)
    predicted = low(kiln.Tensor(x_test)).astype(kiln.float32).asnumpy().argmax(axis=1)
    return float((predicted == y_test).mean()), net


def test_bf16_lenet_on_digits_reaches_the_float32_accuracy():
    pytest.importorskip("sklearn")
    lenet = load_lenet()
    acc32, net32 = train_lenet(lenet, "O0")
    acc16, net16 = train_lenet(lenet, "O2")
    assert all(p.dtype is kiln.float32 for p in net16.trainable_params())  # master weights stay float32
    # one epoch (45 steps of 32 images) from the same weights and batches: float32 reaches about 85%
    assert acc32 >= 0.8, acc32
    assert acc16 >= acc32 - 0.03, (acc16, acc32)
