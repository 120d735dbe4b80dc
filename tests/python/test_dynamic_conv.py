"""Dynamic shapes through convolution and pooling (issue 16): a forward-and-backward graph with
symbolic batch and image sizes made symbolic and optimized once (cache_info's optimized_once), each
new size only instantiated, checked against eager and central differences; and a backward whose
followed sizes are ambiguous at the capture (a sequence length equal to the head dimension)."""
import numpy as np

import kiln
from kiln import models, nn, ops

RNG = np.random.default_rng(1616)


def T(*shape):
    return kiln.Tensor(RNG.standard_normal(shape).astype(np.float32))


def close(got, want, tol):
    np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=tol, atol=tol)


def only_variant(jf):
    (variant,) = jf._grad_variants.values()
    return variant.cache_info()


def test_basic_block_forward_and_backward_is_optimized_once_over_batch_and_image_sizes():
    def block():
        kiln.manual_seed(5)
        return models.BasicBlock(channels=4)

    net, ref = block(), block()  # the same weights; each updates its batch norms' running statistics
    params, ref_params = net.trainable_params(), ref.trainable_params()
    jf = kiln.jit(lambda x: (net(x) ** 2).mean())  # automatic mode: the second size makes N, H, W symbolic
    step = kiln.value_and_grad(jf, 0, params)
    eager = kiln.value_and_grad(lambda x: (ref(x) ** 2).mean(), 0, ref_params)
    for shape in ((2, 4, 6, 6), (3, 4, 7, 7), (2, 4, 9, 9), (4, 4, 5, 5), (3, 4, 8, 8)):
        x = T(*shape)
        v, (gx, grads) = step(x)
        ev, (egx, egrads) = eager(x)
        close(v, ev, 1e-5)
        close(gx, egx, 1e-4)
        for got, want in zip(grads, egrads):
            close(got, want, 1e-4)
    info = only_variant(jf)
    assert info.compiles == 2 and info.instances == 3, info
    assert info.dynamic[-1]["optimized_once"] is True, info.dynamic
    # dynamic=True: the channels, symbolic too, meet the weights: specialized when the recording is
    # made symbolic, a call with other channels then compiling a new entry
    jf = kiln.jit(lambda x: (net(x) ** 2).mean(), dynamic=True)
    step = kiln.value_and_grad(jf, 0, params)
    for shape in ((2, 4, 6, 6), (3, 4, 7, 7), (5, 4, 5, 5)):
        x = T(*shape)
        v, (gx, grads) = step(x)
        ev, (egx, egrads) = eager(x)
        close(v, ev, 1e-5)
        close(gx, egx, 1e-4)
    info = only_variant(jf)
    assert info.compiles == 1 and info.instances == 2 and info.dynamic[0]["optimized_once"] is True, info
    assert "specialized" in info.dynamic[0]["symbols"]["s1"], info.dynamic


def test_strided_convolution_and_pooling_gradients_follow_the_sizes():
    w = nn.Parameter(kiln.Tensor(RNG.standard_normal((3, 2, 3, 3)).astype(np.float32)), name="w")

    def loss(x):  # stride 2 and padding: the sizes are floor divisions of the symbols
        y = ops.max_pool2d(ops.relu(x), 2, 1) + ops.avg_pool2d(x, 2, 1)  # windows that fit every size >= 2
        y = ops.conv2d(y, w, stride=2, padding=1)
        return (ops.tanh(y) ** 2).sum()

    jf = kiln.jit(loss, dynamic=True)
    step = kiln.value_and_grad(jf, 0, [w])
    for shape in ((2, 2, 9, 8), (3, 2, 12, 7), (4, 2, 10, 11)):
        x = T(*shape)
        kiln.mark_static(x, 1)  # the channels meet the weight's: a constant
        v, (gx, (gw,)) = step(x)
        ev, (egx, (egw,)) = kiln.value_and_grad(loss, 0, [w])(x)
        close(v, ev, 1e-4)
        close(gx, egx, 1e-4)
        close(gw, egw, 1e-3)
    info = only_variant(jf)
    assert info.compiles == 1 and info.instances == 2 and info.dynamic[0]["optimized_once"] is True, info
    x = T(2, 2, 13, 9)  # central differences of the compiled gradient at a size no capture saw
    gx = step(x)[1][0].asnumpy()
    xn, eps = x.asnumpy().astype(np.float64), 1e-2
    for idx in ((0, 0, 0, 0), (1, 1, 12, 8), (0, 1, 6, 3)):
        hi, lo = xn.copy(), xn.copy()
        hi[idx] += eps
        lo[idx] -= eps
        fd = (loss(kiln.Tensor(hi.astype(np.float32))).item() - loss(kiln.Tensor(lo.astype(np.float32))).item()) / (2 * eps)
        assert abs(fd - gx[idx]) < 2e-2 * max(1.0, abs(fd)), (idx, fd, gx[idx])


def test_a_sequence_length_equal_to_the_head_dim_compiles_once():
    kiln.manual_seed(2)
    att = models.LlamaAttention(32, 4, 2)  # head dim 8
    params = att.trainable_params()

    def loss(x, pos):
        return (att(x, pos) ** 2).mean()

    jf = kiln.jit(loss, dynamic=True)
    step = kiln.value_and_grad(jf, None, params)
    for s in (8, 5, 11):  # captured at 8 = the head dim: both a (.., s, 8) and a (.., s, s) value held 8 x 8
        x = T(1, s, 32)
        pos = kiln.Tensor(np.arange(s, dtype=np.int64).reshape(1, s))
        v, grads = step(x, pos)
        ev, egrads = kiln.value_and_grad(loss, None, params)(x, pos)
        close(v, ev, 1e-5)
        for got, want in zip(grads, egrads):
            close(got, want, 1e-4)
    info = only_variant(jf)
    assert info.compiles == 1 and info.dynamic[0]["optimized_once"] is True, info


def test_inference_fusions_over_symbolic_sizes_match_eager():
    kiln.manual_seed(7)
    net = models.BasicBlock(channels=8)
    net.set_train(False)
    jf = kiln.jit(net, jit_level="O2", infer_boost="on")  # conv epilogues, batch norm folding, layouts
    for shape in ((1, 8, 6, 6), (2, 8, 7, 7), (3, 8, 5, 5), (2, 8, 9, 9)):
        x = T(*shape)
        close(jf(x), net(x), 1e-4)
    info = jf.cache_info()
    assert info.compiles == 2 and info.dynamic[-1]["optimized_once"] is True, info


def test_cond_while_loop_and_while_grad_are_optimized_once():
    w = nn.Parameter(kiln.Tensor(RNG.standard_normal((3,)).astype(np.float32)), name="w")

    def loss(x):  # the bodies take the symbolic sizes; the loop keeps its values' sizes
        y = ops.cond(x.sum() > 0, lambda a: a * w, lambda a: a * 2.0 + w, (x,))
        i = kiln.Tensor(np.zeros((), np.int64))
        v, _ = ops.while_loop(lambda v, i: i < 3, lambda v, i: (ops.tanh(v * w + v.mean(0)), i + 1), (y, i))
        return (v ** 2).mean()

    forward = kiln.jit(loss, dynamic=True)
    jf = kiln.jit(loss, dynamic=True)
    step = kiln.value_and_grad(jf, 0, [w])  # the loop's gradient: a while_grad node
    for n in (2, 5, 3, 7):
        x = T(n, 3)
        kiln.mark_static(x, 1)  # the columns meet w's size
        close(forward(x), loss(x), 1e-5)
        v, (gx, (gw,)) = step(x)
        ev, (egx, (egw,)) = kiln.value_and_grad(loss, 0, [w])(x)
        close(v, ev, 1e-5)
        close(gx, egx, 1e-4)
        close(gw, egw, 1e-4)
    for info in (forward.cache_info(), only_variant(jf)):
        assert info.compiles == 1 and info.instances == 3 and info.dynamic[0]["optimized_once"] is True, info
    x = T(6, 3)  # central differences of the compiled gradient at a size no capture saw
    kiln.mark_static(x, 1)
    gx = step(x)[1][0].asnumpy()
    xn, eps = x.asnumpy().astype(np.float64), 1e-2
    for idx in ((0, 0), (5, 2), (3, 1)):
        hi, lo = xn.copy(), xn.copy()
        hi[idx] += eps
        lo[idx] -= eps
        fd = (loss(kiln.Tensor(hi.astype(np.float32))).item() - loss(kiln.Tensor(lo.astype(np.float32))).item()) / (2 * eps)
        assert abs(fd - gx[idx]) < 2e-2 * max(1.0, abs(fd)), (idx, fd, gx[idx])
