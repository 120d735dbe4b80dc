"""The workloads of the just-in-time compilation tutorial (kiln.models) at reduced sizes: the
jitted forward and the jitted forward+backward (value_and_grad over the trainable parameters)
equal eager execution, with BatchNorm in training and in evaluation mode."""
import copy

import numpy as np
import pytest

import kiln
from kiln import models

FLOATS = (kiln.float32, kiln.float64)


def assert_same(got, expected, what="result"):
    """Same nesting, dtypes, shapes and values (bitwise: the graph runs eager's kernels)."""
    if isinstance(expected, (tuple, list)):
        assert type(got) is type(expected) and len(got) == len(expected), f"{what}: {type(got)} vs {type(expected)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            assert_same(g, e, f"{what}[{i}]")
        return
    assert isinstance(got, kiln.Tensor), f"{what}: {type(got).__name__}"
    assert got.dtype is expected.dtype and got.shape == expected.shape, \
        f"{what}: {got.dtype}{got.shape} vs {expected.dtype}{expected.shape}"
    np.testing.assert_array_equal(np.asarray(got.asnumpy()), np.asarray(expected.asnumpy()), err_msg=what,
                                  strict=True)


def inputs(x0, n=3):
    """The tutorial's inputs x * (i / n), i = 1..n."""
    return [x0 * ((i + 1) / n) for i in range(n)]


def state_of(cell):
    """Every parameter, trainable or not (BatchNorm's moving statistics included)."""
    return [p for p in cell.get_parameters()]


# ---- the simple function --------------------------------------------------------------------------


def test_simple_function():
    rng = np.random.default_rng(0)
    jf = kiln.jit(models.simple_function)
    for _ in range(5):
        a, b, c = (kiln.Tensor(rng.standard_normal((2, 3)).astype(np.float32)) for _ in range(3))
        assert_same(jf(a, b, c), models.simple_function(a, b, c))
    info = jf.cache_info()
    assert info.compiles == 1 and info.hits == 4, info


# ---- BasicBlock ------------------------------------------------------------------------------------


def make_block(dtype, train, seed=0):
    kiln.manual_seed(seed)
    block = models.BasicBlock(channels=8, dtype=dtype)
    # non-trivial BatchNorm affine parameters and statistics
    rng = np.random.default_rng(seed)
    for bn in (block.bn1, block.bn2):
        bn.gamma.set_data(kiln.Tensor(rng.uniform(0.5, 1.5, 8), dtype))
        bn.beta.set_data(kiln.Tensor(rng.uniform(-0.5, 0.5, 8), dtype))
        bn.moving_mean.set_data(kiln.Tensor(rng.uniform(-0.2, 0.2, 8), dtype))
        bn.moving_variance.set_data(kiln.Tensor(rng.uniform(0.5, 2.0, 8), dtype))
    block.set_train(train)
    return block


def block_input(dtype, seed=1):
    return kiln.Tensor(np.random.default_rng(seed).standard_normal((2, 8, 16, 16)), dtype)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_basic_block_forward(dtype, train):
    eager = make_block(dtype, train)
    block = copy.deepcopy(eager)
    jblock = kiln.jit(block)
    for i, x in enumerate(inputs(block_input(dtype))):
        assert_same(jblock(x), eager(x), f"forward {i}")
        # in training, BatchNorm's moving statistics are updated in place by the graph as well
        assert_same(state_of(block), state_of(eager), f"parameters after call {i}")
    info = jblock.cache_info()
    assert info.compiles == 1 and info.hits == 2 and info.eager_calls == 0, info


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_basic_block_forward_backward(dtype, train):
    eager = make_block(dtype, train)
    block = copy.deepcopy(eager)
    jblock = kiln.jit(block)
    grad_e = kiln.value_and_grad(eager, None, eager.trainable_params())
    grad_j = kiln.value_and_grad(jblock, None, block.trainable_params())
    for i, x in enumerate(inputs(block_input(dtype))):
        value_j, grads_j = grad_j(x)
        value_e, grads_e = grad_e(x)
        assert len(grads_j) == len(block.trainable_params()) == 6
        assert_same(value_j, value_e, f"value {i}")
        assert_same(grads_j, grads_e, f"gradients {i}")
        assert_same(state_of(block), state_of(eager), f"parameters after call {i}")
    # forward and backward were compiled once, as one graph
    variant = jblock._grad_variant(None, block.trainable_params(), False)
    assert variant.cache_info().compiles == 1 and variant.cache_info().hits == 2, variant.cache_info()


def test_basic_block_input_gradient_and_parameter_update():
    eager = make_block(kiln.float32, True)
    block = copy.deepcopy(eager)
    jblock = kiln.jit(block)
    loss_e = lambda x: (eager(x) ** 2).mean()  # noqa: E731
    loss_j = kiln.jit(lambda x: (block(x) ** 2).mean())
    for i, x in enumerate(inputs(block_input(kiln.float32))):
        v_e, (gx_e, gw_e) = kiln.value_and_grad(loss_e, 0, eager.trainable_params())(x)
        v_j, (gx_j, gw_j) = kiln.value_and_grad(loss_j, 0, block.trainable_params())(x)
        assert_same((v_j, gx_j, gw_j), (v_e, gx_e, gw_e), f"call {i}")
        for (p, g), (q, h) in zip(zip(eager.trainable_params(), gw_e), zip(block.trainable_params(), gw_j)):
            p.set_data(p - 0.1 * g)
            q.set_data(q - 0.1 * h)
        assert_same(jblock(x), eager(x), f"forward after update {i}")


# ---- Llama attention ----------------------------------------------------------------------------------


def make_attention(dtype, seed=0):
    kiln.manual_seed(seed)
    return models.LlamaAttention(hidden_size=64, num_heads=4, num_kv_heads=2, rope_theta=500000.0, dtype=dtype)


def attention_inputs(dtype, batch=1, seq=16, seed=2):
    x = kiln.Tensor(np.random.default_rng(seed).standard_normal((batch, seq, 64)), dtype)
    pos = kiln.Tensor(np.tile(np.arange(seq, dtype=np.int64), (batch, 1)))
    return x, pos


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_attention_forward(dtype):
    attn = make_attention(dtype)
    jattn = kiln.jit(attn)
    x0, pos = attention_inputs(dtype)
    for i, x in enumerate(inputs(x0)):
        out = jattn(x, pos)
        assert out.shape == (1, 16, 64)
        assert_same(out, attn(x, pos), f"forward {i}")
    # positions are a graph input: shifted positions give the eager result too
    shifted = pos + 7
    assert_same(jattn(x0, shifted), attn(x0, shifted))
    info = jattn.cache_info()
    assert info.compiles == 1 and info.hits == 3, info


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_attention_forward_batched(dtype):
    attn = make_attention(dtype, seed=3)
    jattn = kiln.jit(attn)
    x, pos = attention_inputs(dtype, batch=2, seq=16, seed=4)
    for _ in range(2):
        assert_same(jattn(x, pos), attn(x, pos))


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: d.name)
def test_attention_forward_backward(dtype):
    attn = make_attention(dtype)
    jattn = kiln.jit(attn)
    params = attn.trainable_params()
    assert len(params) == 4
    grad_e = kiln.value_and_grad(attn, None, params)
    grad_j = kiln.value_and_grad(jattn, None, params)
    x0, pos = attention_inputs(dtype)
    for i, x in enumerate(inputs(x0)):
        value_j, grads_j = grad_j(x, pos)
        value_e, grads_e = grad_e(x, pos)
        assert_same(value_j, value_e, f"value {i}")
        assert_same(grads_j, grads_e, f"gradients {i}")
    variant = jattn._grad_variant(None, params, False)
    assert variant.cache_info().compiles == 1 and variant.cache_info().hits == 2, variant.cache_info()


def test_attention_gradient_matches_finite_differences():
    """The eager reference itself is right: a few weight entries against central differences."""
    attn = make_attention(kiln.float64, seed=5)
    x, pos = attention_inputs(kiln.float64, seed=6)
    loss = kiln.jit(lambda x, pos: (attn(x, pos) ** 2).sum())
    _, grads = kiln.value_and_grad(loss, None, attn.trainable_params())(x, pos)
    eps = 1e-3  # the loss is large: smaller steps lose more to rounding than they gain
    for p, g in zip(attn.trainable_params(), grads):
        for idx in [(0, 0), (5, 17), (p.shape[0] - 1, 63)]:
            old = float(p[idx].item())
            with kiln.no_grad():
                p[idx] = old + eps
                hi = float(loss(x, pos).item())
                p[idx] = old - eps
                lo = float(loss(x, pos).item())
                p[idx] = old
            np.testing.assert_allclose(float(g[idx].item()), (hi - lo) / (2 * eps), rtol=1e-5, atol=1e-8,
                                       err_msg=f"{p.name}{idx}")
