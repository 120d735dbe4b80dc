"""kiln's own Winograd convolution F(4x4, 3x3) (src/ops/conv_winograd.c) in inference graphs:
the BasicBlock of bench/bench_infer.py (128 channels, smaller images) jitted at O1 with
infer_boost against a float64 NumPy evaluation of the block, with the error bound of the C test
(tests/c/test_conv_winograd.c: each output within 1e-5 * S of the exact value, S the sum of
the magnitudes of the terms it adds up), carried through the second convolution; kiln eager
(a direct convolution) meets the same bound. On a CPU without AVX-512 the convolutions run
through kiln's Winograd (counted by kiln._C.conv_winograd_count); with AVX-512 oneDNN's
Winograd serves them and the same bound is checked. NaN in the input makes the convolution
take the direct kernel: the NaN positions are eager's."""
import numpy as np
import pytest

import kiln
from conftest import inference_basic_block
from kiln import nn

CHANNELS = 128
TOL = 1e-5  # per output, relative to S (see tests/c/test_conv_winograd.c for the derivation)


def _conv3x3(x, w):
    """conv2d, padding 1, float64: x (N, C, H, W), w (O, C, 3, 3)."""
    h, wd = x.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((x.shape[0], w.shape[0], h, wd))
    for kh in range(3):
        for kw in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, kh:kh + h, kw:kw + wd], w[:, :, kh, kw], optimize=True)
    return out


def _folded(conv, bn):
    """The convolution's weights and bias with the batch norm folded in (float64)."""
    scale = bn.gamma.asnumpy().astype(np.float64) / np.sqrt(bn.moving_variance.asnumpy().astype(np.float64) + bn.eps)
    w = conv.weight.asnumpy().astype(np.float64) * scale[:, None, None, None]
    b = bn.beta.asnumpy().astype(np.float64) - bn.moving_mean.asnumpy().astype(np.float64) * scale
    return w, b


def _exact_and_bound(block, x):
    """The block's output in float64 and, per output, the error a kernel within TOL * S per
    convolution may make: the second convolution's own plus the first's carried through it."""
    w1, b1 = _folded(block.conv1, block.bn1)
    w2, b2 = _folded(block.conv2, block.bn2)
    a1 = _conv3x3(x, w1) + b1[None, :, None, None]
    s1 = _conv3x3(np.abs(x), np.abs(w1)) + np.abs(b1)[None, :, None, None]
    y1 = np.maximum(a1, 0)
    a2 = _conv3x3(y1, w2) + b2[None, :, None, None] + x
    s2 = _conv3x3(y1, np.abs(w2)) + np.abs(b2)[None, :, None, None] + np.abs(x)
    bound = TOL * (s2 + _conv3x3(s1, np.abs(w2)))
    return np.maximum(a2, 0), bound


def _check(got, exact, bound, what):
    err = np.abs(got.astype(np.float64) - exact)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), (f"{what}: error {err[worst]:.3g} over the bound {bound[worst]:.3g} at {worst} "
                                  f"(largest error {err.max():.3g})")


@pytest.mark.parametrize("shape", [(1, 16, 16), (2, 13, 11)])
def test_basic_block_matches_exact_within_winograd_bound(shape):
    batch, h, w = shape
    block = inference_basic_block(CHANNELS)
    x_np = np.random.default_rng(1).standard_normal((batch, CHANNELS, h, w)).astype(np.float32)
    x = kiln.Tensor(x_np)
    exact, bound = _exact_and_bound(block, x_np.astype(np.float64))
    winograd = kiln._C.conv_block_size() != 16  # else oneDNN's Winograd
    with kiln.no_grad():
        _check(block(x).asnumpy(), exact, bound, "eager")
        jitted = kiln.jit(block, jit_level="O1", infer_boost="on")
        jitted(x)  # traced
        for _ in range(2):  # the compiled graph; the second call reuses the transformed weights
            before = kiln._C.conv_winograd_count()
            got = jitted(x).asnumpy()
            assert kiln._C.conv_winograd_count() - before == (2 if winograd else 0)
            _check(got, exact, bound, "O1 infer_boost")
    # the bound sees a wrong result: one of the 147,456 weights of conv2 off by half (the
    # bound is a worst case: the errors measured are about 1% of it)
    with kiln.no_grad():
        wt = block.conv2.weight.asnumpy().copy()
        wt[5, 7, 1, 1] *= 1.5
        block.conv2.weight.set_data(wt)
        changed = jitted(x).asnumpy()
    with pytest.raises(AssertionError):
        _check(changed, exact, bound, "changed weights")
    exact2, bound2 = _exact_and_bound(block, x_np.astype(np.float64))
    _check(changed, exact2, bound2, "changed weights, new exact values")  # the new weights were seen


def test_nan_input_takes_the_direct_kernel():
    # Winograd would spread a NaN over its whole 6x6 input tile; the direct kernel keeps it in
    # the 3x3 neighbourhood, and relu keeps it (eager's positions exactly)
    kiln.manual_seed(4)
    conv = nn.Conv2d(32, 32, 3, pad_mode="pad", padding=1, has_bias=True)
    relu = nn.ReLU()
    x = np.random.default_rng(5).standard_normal((1, 32, 12, 12)).astype(np.float32)
    x[0, 3, 5, 6] = np.nan
    f = lambda t: relu(conv(t))  # noqa: E731
    with kiln.no_grad():
        eager = f(kiln.Tensor(x)).asnumpy()
        assert np.isnan(eager).sum() == 32 * 9
        jitted = kiln.jit(f, jit_level="O1", infer_boost="on")
        jitted(kiln.Tensor(x))
        before = kiln._C.conv_winograd_count()
        got = jitted(kiln.Tensor(x)).asnumpy()
        assert kiln._C.conv_winograd_count() == before  # declined
        np.testing.assert_array_equal(np.isnan(got), np.isnan(eager))
        np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4, equal_nan=True)
        x[0, 3, 5, 6] = 0.5  # finite again: Winograd where chosen
        jitted(kiln.Tensor(x))
        assert kiln._C.conv_winograd_count() - before == (kiln._C.conv_block_size() != 16)
