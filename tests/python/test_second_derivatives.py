"""Second derivatives (kiln.grad of kiln.grad): exact where the first-order backward ops have
gradient rules (tanh, sigmoid, relu, gelu, silu, softmax, log_softmax, and the piecewise constant
sign and floor division, whose derivative is 0; the backward ops of layer_norm, rms_norm,
batch_norm, the convolutions, the pools and the fused attention op), checked against closed forms
and finite differences of the first derivative, eagerly and compiled in every kiln.jit variant;
kiln.hessian of a small convolutional network, of a LayerNorm MLP and of causal attention; a
WGAN-GP gradient penalty step. A clear error where
a backward op has no rule (NOT_TWICE, which may only shrink) -- never a silent zero, which is what a
backward op left off the tape used to give."""
import numpy as np
import pytest

import os
import sys
import warnings

import kiln
from kiln import ops
from kiln._optable import INFO, OP

sys.path.insert(0, os.path.dirname(__file__))
from conformance import ENV, VARIANTS, environment  # noqa: E402

X = np.array([0.5, 1.0, -0.35, 2.2], np.float64)  # away from the jumps of x // 0.3


def second(f):
    return kiln.grad(lambda a: kiln.grad(f)(a).sum())


def fd_of_first(f, x, eps=1e-6):
    """d/dx_i of sum_j df/dx_j, by central differences of the first derivative."""
    first = lambda v: kiln.grad(f)(kiln.Tensor(v)).asnumpy().sum()  # noqa: E731
    out = np.zeros_like(x)
    for i in range(x.size):
        hi, lo = x.copy(), x.copy()
        hi[i] += eps
        lo[i] -= eps
        out[i] = (first(hi) - first(lo)) / (2 * eps)
    return out


CASES = {
    "tanh squared": (lambda b: (b.tanh() ** 2).sum(),
                     lambda x: 2 * (1 - np.tanh(x) ** 2) ** 2 - 4 * np.tanh(x) ** 2 * (1 - np.tanh(x) ** 2)),
    "sigmoid": (lambda b: b.sigmoid().sum(), lambda x: (s := 1 / (1 + np.exp(-x))) * (1 - s) * (1 - 2 * s)),
    "relu times x": (lambda b: (b.relu() * b).sum(), lambda x: 2.0 * (x > 0)),
    "sign times x squared": (lambda b: (ops.sign(b) * b * b).sum(), lambda x: 2 * np.sign(x)),
    "floor division times x squared": (lambda b: ((b // 0.3) * b * b).sum(), lambda x: 2 * (x // 0.3)),
    "abs cubed": (lambda b: (abs(b) ** 3).sum(), lambda x: 6 * np.abs(x)),
    "tanh of sigmoid": (lambda b: b.sigmoid().tanh().sum(), None),
    "gelu": (lambda b: (ops.gelu(b) * b).sum(), None),
    "silu weighted": (lambda b: (ops.silu(b) * kiln.Tensor(np.arange(4.0) - 1.5)).sum(), None),
    "softmax weighted": (lambda b: (ops.softmax(b * b, -1) * kiln.Tensor(np.arange(4.0))).sum(), None),
    "softmax along rows": (lambda b: (ops.softmax(b.reshape(2, 2), 0) * (b * b * kiln.Tensor(np.arange(4.0)))
                                      .reshape(2, 2)).sum(), None),
    "log_softmax times x": (lambda b: (ops.log_softmax(b, -1) * b).sum(), None),
}

# ---- the normalizations, convolutions and pools: one flat input p holding the op's input and its
# parameters (sliced and reshaped), a nonlinearity after the op, so that the gradient reaching the
# backward op depends on p too and every input of the backward op is differentiated -----------------
RNG = np.random.default_rng(7)


def _c(*shape):
    return kiln.Tensor(RNG.standard_normal(shape))


def _parts(p, *shapes):
    out, k = [], 0
    for sh in shapes:
        n = int(np.prod(sh))
        out.append(p[k:k + n].reshape(*sh))
        k += n
    return out


C23, C232, C2222, C1233, C1222 = _c(2, 3), _c(2, 3, 2), _c(1, 2, 2, 2), _c(1, 2, 3, 3), _c(1, 2, 2, 2)
RUN_MEAN, RUN_VAR = kiln.Tensor(RNG.uniform(-0.2, 0.2, 3)), kiln.Tensor(RNG.uniform(0.5, 1.5, 3))
NO_STATS = kiln.Tensor(np.zeros(0))
ADAPTIVE_AVG = kiln.nn.AdaptiveAvgPool2d((2, 3))
CONV1D = kiln.nn.Conv1d(2, 3, 3, pad_mode="pad", padding=1, has_bias=True, dtype=kiln.float64)


def _ln(p):
    x, w, b = _parts(p, (2, 3), (3,), (3,))
    return (ops.tanh(ops.layer_norm(x, (3,), w, b)) * C23).sum()


def _ln_two_axes(p):
    x, w = _parts(p, (2, 3, 2), (3, 2))
    return (ops.tanh(ops.layer_norm(x, (3, 2), w)) * C232).sum()


def _rms(p):
    x, w = _parts(p, (2, 3), (3,))
    return (ops.tanh(ops.rms_norm(x, w)) * C23).sum()


def _bn(training, stats):
    def f(p):
        x, w, b = _parts(p, (2, 3, 2), (3,), (3,))
        return (ops.tanh(ops.batch_norm(x, stats[0], stats[1], w, b, training=training)) * C232).sum()
    return f


def _bn_relu(p):
    x, w, b = _parts(p, (2, 3, 2), (3,), (3,))
    y = ops.relu(ops.batch_norm(x, NO_STATS, NO_STATS, w, b, training=True))
    return (y * y * C232).sum()


def _conv(p):
    x, w, b = _parts(p, (1, 2, 4, 4), (2, 2, 3, 3), (2,))
    return (ops.tanh(ops.conv2d(x, w, b, stride=2, padding=1)) * C2222).sum()


def _conv_grouped(p):
    x, w = _parts(p, (1, 2, 5, 5), (4, 1, 2, 2))
    return (ops.tanh(ops.conv2d(x, w, padding=1, dilation=2, groups=2)) ** 2).sum()


def _conv_transpose(p):
    x, w = _parts(p, (1, 2, 2, 2), (2, 2, 2, 2))
    return (ops.tanh(ops.conv_transpose2d(x, w, stride=2)) ** 2).sum()


def _conv3d(p):
    x, w = _parts(p, (1, 1, 3, 3, 3), (2, 1, 2, 2, 2))
    return (ops.tanh(ops.conv3d(x, w)) ** 2).sum()


ATT_W = _c(1, 4, 3, 2)
ATT_BOOL_MASK = kiln.Tensor((RNG.random((1, 1, 3, 5)) > 0.3) | (np.arange(5) == 0))  # (no row masked whole)
ATT_FLOAT_MASK = _c(1, 4, 3, 5)


def _att(hq, hk, lk, causal=False, mask=None):
    """The fused attention op on (q, k, v) sliced from p (hq query heads, hk key/value heads, 3
    queries, lk keys, head size 2); its lse is used too, so glse reaches attention_backward."""
    def f(p):
        q, k, v = _parts(p, (1, hq, 3, 2), (1, hk, lk, 2), (1, hk, lk, 2))
        ins = (q, k, v) + ((mask,) if mask is not None else ())
        out, lse = kiln._C.apply(OP.attention, ins, (1,) if causal else (), (0.7,))
        return (ops.tanh(out) * ATT_W[:, :hq]).sum() + 0.3 * (lse * lse).sum()
    return f, None, RNG.standard_normal(hq * 6 + 4 * hk * lk)


CASES.update({
    "attention (q, k, v)": _att(2, 2, 5),
    "attention, grouped queries": _att(4, 2, 5),
    "attention, causal": _att(2, 1, 3, causal=True),
    "attention, bool mask": _att(4, 2, 5, mask=ATT_BOOL_MASK),
    "attention, float mask": _att(4, 4, 5, mask=ATT_FLOAT_MASK),
    "layer_norm (x, w, b)": (_ln, None, RNG.standard_normal(12)),
    "layer_norm over two axes (x, w)": (_ln_two_axes, None, RNG.standard_normal(18)),
    "rms_norm (x, w)": (_rms, None, RNG.standard_normal(9)),
    "batch_norm training (x, gamma, beta)": (_bn(True, (NO_STATS, NO_STATS)), None, RNG.standard_normal(18)),
    "batch_norm inference (x, gamma, beta)": (_bn(False, (RUN_MEAN, RUN_VAR)), None, RNG.standard_normal(18)),
    # (batch_norm_backward of relu_backward: what O1 fuses into batch_norm_relu_backward in a first
    # derivative; in a graph that differentiates it again the masked gradient has other readers, and
    # the compiled variants must still agree)
    "batch_norm then relu (x, gamma, beta)": (_bn_relu, None, RNG.standard_normal(18)),
    "conv2d (x, w, b)": (_conv, None, RNG.standard_normal(32 + 36 + 2)),
    "conv2d grouped, dilated (x, w)": (_conv_grouped, None, RNG.standard_normal(50 + 16)),
    "conv_transpose2d (x, w)": (_conv_transpose, None, RNG.standard_normal(8 + 16)),
    "conv3d (x, w)": (_conv3d, None, RNG.standard_normal(27 + 16)),
    "nn.Conv1d (x)": (lambda p: (ops.tanh(CONV1D(p.reshape(1, 2, 4))) ** 2).sum(), None, RNG.standard_normal(8)),
    "max_pool2d": (lambda p: (ops.tanh(ops.max_pool2d((p * p).reshape(1, 2, 4, 4), 2)) * C2222).sum(), None,
                   RNG.standard_normal(32)),
    "max_pool2d padded, strided": (lambda p: (ops.tanh(ops.max_pool2d(p.reshape(1, 2, 5, 5) ** 3, 3, stride=2, padding=1))
                                              * C1233).sum(), None, RNG.standard_normal(50)),
    "avg_pool2d": (lambda p: (ops.tanh(ops.avg_pool2d((p * p).reshape(1, 2, 4, 4), 2)) * C2222).sum(), None,
                   RNG.standard_normal(32)),
    "avg_pool2d padded, ceil, no pad count": (
        lambda p: (ops.tanh(ops.avg_pool2d((p * p).reshape(1, 2, 5, 5), 2, padding=1, ceil_mode=True,
                                           count_include_pad=False)) * C1233).sum(), None, RNG.standard_normal(50)),
    "adaptive_max_pool2d": (lambda p: (ops.tanh(ops.adaptive_max_pool2d((p * p).reshape(1, 2, 5, 5), (2, 2)))
                                       * C1222).sum(), None, RNG.standard_normal(50)),
    "nn.AdaptiveAvgPool2d": (lambda p: (ops.tanh(ADAPTIVE_AVG((p * p).reshape(1, 2, 5, 5))) ** 2).sum(), None,
                             RNG.standard_normal(50)),
})
NEW_RULES = [k for k in CASES if len(CASES[k]) == 3]


@pytest.mark.parametrize("case", sorted(CASES))
def test_second_derivative(case):
    f, closed, *given = CASES[case]
    x = given[0] if given else X
    got = second(f)(kiln.Tensor(x)).asnumpy()
    assert np.abs(got).max() > 1e-3  # (a case whose second derivative vanishes would check little)
    if closed is not None:
        np.testing.assert_allclose(got, closed(x), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got, fd_of_first(f, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["attention, grouped queries", "attention, causal", "attention, bool mask"])
def test_attention_second_derivative_in_float32(case):
    """float32 inputs run the fast kernels (which read out and lse where the float64 reference
    recomputes the scores): the second derivative agrees with float64's to float32's precision."""
    f, _, x = CASES[case]
    want = second(f)(kiln.Tensor(x)).asnumpy()
    got = second(f)(kiln.Tensor(x.astype(np.float32)))
    assert got.dtype == kiln.float32
    np.testing.assert_allclose(got.asnumpy(), want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_the_new_cases_reach_the_backward_ops_they_are_for():
    """(the table would check little if a case ran some other way than through these backward ops)"""
    wanted = {"attention_backward", "layer_norm_backward", "rms_norm_backward", "batch_norm_backward", "conv2d_backward_input",
              "conv2d_backward_weight", "max_pool2d_backward", "avg_pool2d_backward"}
    reached = set()
    for case in NEW_RULES:
        f, _, x = CASES[case]
        tracer = kiln._C.Tracer()
        try:
            kiln.grad(f)(kiln.Tensor(x))
        finally:
            tracer.end()
        reached |= {node[0] for node in tracer.recorded().structure()[2]}
    assert wanted <= reached, sorted(wanted - reached)


# backward ops that have no reverse rule: a second derivative through them raises naming them. This
# list may only shrink (test_no_other_backward_op_is_left_without_a_rule).
NOT_TWICE = {"rnn_layer_backward",
             "batch_norm_relu_backward"}  # (made by an O1 pass, after differentiation: never differentiated)


def test_no_other_backward_op_is_left_without_a_rule():
    without = {name for name, info in INFO.items() if name.endswith("_backward") and not info.differentiable}
    assert without <= NOT_TWICE, f"backward ops without a reverse rule (add one): {sorted(without - NOT_TWICE)}"
    assert without == NOT_TWICE, f"these have a reverse rule now, take them off NOT_TWICE: {sorted(NOT_TWICE - without)}"


def _attention(b):
    q = b.reshape(1, 1, 2, 2)
    return (kiln._C.apply(OP.attention, (q, q, q), (), (0.5,))[0] ** 2).sum()


_LSTM = kiln.nn.LSTM(1, 2)


def _lstm(b):
    return (_LSTM(ops.cast(b.reshape(4, 1, 1), kiln.float32))[0] ** 2).sum()


@pytest.mark.parametrize("name, f", [("rnn_layer_backward", _lstm)])
def test_no_second_derivative_raises_instead_of_zero(name, f):
    assert name in NOT_TWICE
    with pytest.raises(RuntimeError, match=f"{name} is not differentiable"):
        second(f)(kiln.Tensor(X))


def test_first_derivatives_of_piecewise_constant_ops_are_zero():
    """sign and // now have a gradient rule (0, as PyTorch's sign) instead of none: a first
    derivative through them is 0, as it was."""
    g = kiln.grad(lambda b: (ops.sign(b) + b // 0.7).sum())(kiln.Tensor(X))
    assert g.asnumpy().tolist() == [0.0] * 4


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_compiled_second_derivatives_agree_or_raise(mode):
    """kiln.jit over grad and over grad of grad: equal to eager where eager has the second
    derivative, the same error where it has not (never zeros)."""
    def tanh_cubed(b):
        return (b.tanh() * b * b).sum()

    def soft(b):
        return (ops.softmax(b, -1) * b).sum()

    def norm(b):
        return (ops.layer_norm(b.reshape(1, 4), (4,)) * kiln.Tensor(np.arange(4.0))).sum()

    x = kiln.Tensor(X)
    for f in (tanh_cubed, soft, norm):
        want = second(f)(x).asnumpy()
        np.testing.assert_allclose(want, fd_of_first(f, X), rtol=1e-5, atol=1e-6)
        jg = kiln.jit(kiln.grad(f), capture_mode=mode)
        np.testing.assert_allclose(kiln.grad(lambda a: jg(a).sum())(x).asnumpy(), want, rtol=1e-10)
        jh = kiln.jit(lambda a: second(f)(a), capture_mode=mode)
        np.testing.assert_allclose(jh(x).asnumpy(), want, rtol=1e-10)
    want = second(_attention)(x).asnumpy()
    np.testing.assert_allclose(want, fd_of_first(_attention, X), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(kiln.jit(lambda a: second(_attention)(a), capture_mode=mode)(x).asnumpy(), want,
                               rtol=1e-10)
    with pytest.raises(RuntimeError, match="not differentiable|gradients of gradients"):
        kiln.grad(lambda a: kiln.jit(kiln.grad(_lstm), capture_mode=mode)(a).sum())(x)
    with pytest.raises(RuntimeError, match="rnn_layer_backward is not differentiable"):
        kiln.jit(lambda a: second(_lstm)(a), capture_mode=mode)(x)


@pytest.mark.parametrize("case", NEW_RULES)
def test_new_rules_compiled_in_every_variant_equal_eager(case):
    """grad of grad compiled whole (capture ast / bytecode / trace x O0 / O1 x kbk / sink), and a
    compiled first derivative differentiated again eagerly: eager's values, on two calls (the second
    a cache hit on moved inputs); the whole-graph variant compiles, never falling back to eager."""
    f, _, x0 = CASES[case]
    xs = [kiln.Tensor(x0), kiln.Tensor(x0 * 0.9 + 0.05)]
    want = [second(f)(x).asnumpy() for x in xs]
    with environment(ENV):
        for v in VARIANTS:
            jh = v.wrap(lambda a: second(f)(a))
            jg = v.wrap(kiln.grad(f))
            for x, w in zip(xs, want):
                np.testing.assert_allclose(jh(x).asnumpy(), w, rtol=1e-10, atol=1e-12, err_msg=v.name)
                np.testing.assert_allclose(kiln.grad(lambda a: jg(a).sum())(x).asnumpy(), w, rtol=1e-10, atol=1e-12,
                                           err_msg=f"{v.name} (grad of a compiled grad)")
            info = jh.cache_info()
            assert info.compiles >= 1 and not info.eager_calls, (v.name, info)


# ---- kiln.hessian (forward over reverse: the backward ops' JVP rules) of a small convolutional network
# and of a LayerNorm MLP, against finite differences of the gradient, eagerly and compiled -------------
MLP_INPUT = _c(3, 4)


def _conv_net(p):
    x, w1, b1, w2 = _parts(p, (1, 1, 5, 5), (2, 1, 3, 3), (2,), (1, 2, 2, 2))
    h = ops.max_pool2d(ops.tanh(ops.conv2d(x, w1, b1, padding=1)), 2)
    return (ops.conv2d(h, w2) ** 2).sum() + (ops.avg_pool2d(h, 2) ** 2).sum()


def _layer_norm_mlp(p):
    w1, b1, g, beta, w2 = _parts(p, (4, 5), (5,), (5,), (5,), (5, 2))
    h = ops.tanh(ops.layer_norm(ops.matmul(MLP_INPUT, w1) + b1, (5,), g, beta))
    return (ops.matmul(h, w2) ** 2).sum()


def _fd_hessian(f, x, eps=1e-5):
    g = lambda v: kiln.grad(f)(kiln.Tensor(v)).asnumpy()  # noqa: E731
    cols = []
    for k in range(x.size):
        e = np.zeros_like(x)
        e[k] = eps
        cols.append((g(x + e) - g(x - e)) / (2 * eps))
    return np.stack(cols, 1)


def _batch_norm_conv_net(p):
    x, w1, g, b = _parts(p, (2, 1, 4, 4), (2, 1, 3, 3), (2,), (2,))
    h = ops.batch_norm(ops.conv2d(x, w1, padding=1), NO_STATS, NO_STATS, g, b, training=True)
    return (ops.tanh(ops.avg_pool2d(h, 2)) ** 2).sum()


HESSIAN_MASK = kiln.Tensor((RNG.random((1, 1, 3, 3)) > 0.3) | (np.arange(3) == 0))  # (no row masked whole)


def _causal_attention(p):
    """the fused op, grouped queries, a bool mask and the causal flag, out and lse both used"""
    q, k, v = _parts(p, (1, 2, 3, 2), (1, 1, 3, 2), (1, 1, 3, 2))
    out, lse = kiln._C.apply(OP.attention, (q, k, v, HESSIAN_MASK), (1,), (0.7,))
    return (ops.tanh(out) ** 2).sum() + 0.3 * (lse * lse).sum()


@pytest.mark.parametrize("f, n", [(_conv_net, 25 + 18 + 2 + 8), (_layer_norm_mlp, 20 + 5 + 5 + 5 + 10),
                                  (_batch_norm_conv_net, 32 + 18 + 2 + 2), (_causal_attention, 12 + 6 + 6)],
                         ids=["conv net", "LayerNorm MLP", "BatchNorm conv net", "causal attention"])
def test_hessian_of_networks(f, n):
    p = RNG.standard_normal(n)
    with warnings.catch_warnings():
        warnings.simplefilter("error", kiln.VmapFallbackWarning)  # every backward op batched by its rule
        h = kiln.hessian(f)(kiln.Tensor(p)).asnumpy()
    assert h.shape == (n, n) and np.abs(h).max() > 1.0
    np.testing.assert_allclose(h, h.T, rtol=0, atol=1e-12)
    np.testing.assert_allclose(h, _fd_hessian(f, p), rtol=1e-6, atol=1e-7)
    with environment(ENV):
        for v in VARIANTS:
            jh = v.wrap(lambda a: kiln.hessian(f)(a))
            np.testing.assert_allclose(jh(kiln.Tensor(p)).asnumpy(), h, rtol=1e-10, atol=1e-12, err_msg=v.name)
            info = jh.cache_info()
            assert info.compiles >= 1 and not info.eager_calls, (v.name, info)


# ---- a WGAN-GP step: the critic's parameters move along the gradient of the penalty
# mean((||grad_x D(x)|| - 1)^2), a gradient through the critic's backward (conv, max pool) ---------------
GP_POINTS = _c(2, 1, 5, 5)  # (the interpolates between real and generated samples)


def _critic(x, p):
    w1, b1, w2 = _parts(p, (3, 1, 3, 3), (3,), (1, 3, 2, 2))
    h = ops.max_pool2d(ops.tanh(ops.conv2d(x, w1, b1, padding=1)), 2, stride=1)
    return ops.conv2d(h, w2, stride=2).reshape(2, -1).sum(1)


def _gradient_penalty(p):
    gx = kiln.grad(lambda x: _critic(x, p).sum())(GP_POINTS)
    norms = ops.sqrt((gx * gx).reshape(2, -1).sum(1))
    return ((norms - 1.0) ** 2).mean()


def _gp_step(p):
    return p - 0.1 * kiln.grad(_gradient_penalty)(p)


def test_wgan_gp_step():
    p = RNG.standard_normal(27 + 3 + 12)
    g = kiln.grad(_gradient_penalty)(kiln.Tensor(p)).asnumpy()
    assert np.abs(g).max() > 1e-2
    fd, eps = np.zeros_like(p), 1e-6
    for k in range(p.size):
        e = np.zeros_like(p)
        e[k] = eps
        fd[k] = (_gradient_penalty(kiln.Tensor(p + e)).item() - _gradient_penalty(kiln.Tensor(p - e)).item()) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)
    want = [_gp_step(kiln.Tensor(p)).asnumpy()]
    want.append(_gp_step(kiln.Tensor(want[0])).asnumpy())  # a second step from where the first went
    np.testing.assert_allclose(want[0], p - 0.1 * g, rtol=1e-14, atol=1e-14)
    with environment(ENV):
        for v in VARIANTS:
            step = v.wrap(_gp_step)
            q = kiln.Tensor(p)
            for w in want:
                q = step(q)
                np.testing.assert_allclose(q.asnumpy(), w, rtol=1e-10, atol=1e-12, err_msg=v.name)
            info = step.cache_info()
            assert info.compiles >= 1 and not info.eager_calls, (v.name, info)


# ---- lower precision and symbolic sizes ---------------------------------------------------------------
W4, W3, WEIGHTING = _c(4), _c(3), _c(2, 3, 4)
NORMS = {"layer_norm": lambda a: (ops.tanh(ops.layer_norm(a, (4,), ops.cast(W4, a.dtype))) ** 2).sum(),
         "rms_norm": lambda a: (ops.tanh(ops.rms_norm(a, ops.cast(W4, a.dtype))) ** 2).sum(),
         "batch_norm": lambda a: (ops.tanh(ops.batch_norm(a, NO_STATS, NO_STATS, ops.cast(W3, a.dtype),
                                                          ops.cast(W3 * 0.5, a.dtype), training=True)) ** 2).sum()}


def _weighted_second(f):
    """the derivative of <grad f, WEIGHTING> (not of sum(grad f): a normalization's output does not
    change when its input moves along the ones, so the Hessian times the ones is 0 and checks nothing)"""
    return kiln.grad(lambda a: (kiln.grad(f)(a) * ops.cast(WEIGHTING, a.dtype)).sum())


@pytest.mark.parametrize("dtype, rtol", [(kiln.float32, 1e-5), (kiln.float16, 1e-2), (kiln.bfloat16, 6e-2)])
@pytest.mark.parametrize("norm", sorted(NORMS))
def test_lower_precision_follows_float64(norm, dtype, rtol):
    """the statistics are float32 for 16-bit inputs: the rules mix the dtypes and return the input's"""
    x = _c(2, 3, 4)
    want = _weighted_second(NORMS[norm])(x).asnumpy()
    got = _weighted_second(NORMS[norm])(ops.cast(x, dtype))
    assert got.dtype == dtype
    err = np.abs(ops.cast(got, kiln.float64).asnumpy() - want).max()
    assert err <= rtol * np.abs(want).max(), (err, np.abs(want).max())


@pytest.mark.parametrize("norm", sorted(NORMS))
@pytest.mark.parametrize("mode", ["trace", "bytecode"])
def test_symbolic_batch_size(norm, mode):
    """dynamic=True: one capture (or a specialization per shape where an op asks for one) over three
    batch sizes, each call eager's values"""
    f = NORMS[norm]
    # (weighted by sin of the input: any batch size; by the input itself the result would be 0, the
    # normalizations not changing when their input is scaled)
    w = kiln.grad(lambda a: (kiln.grad(f)(a) * ops.sin(a)).sum())
    jw = kiln.jit(lambda a: w(a), capture_mode=mode, dynamic=True)
    for n in (2, 3, 5):
        x = kiln.Tensor(RNG.standard_normal((n, 3, 4)))
        want = w(x).asnumpy()
        assert np.abs(want).max() > 1e-3
        np.testing.assert_allclose(jw(x).asnumpy(), want, rtol=1e-10, atol=1e-12)
    assert jw.cache_info().compiles >= 1 and not jw.cache_info().eager_calls


# ---- a MAML meta-gradient: the loss after one inner SGD step, differentiated through that step ----------
MAML_TRAIN, MAML_TEST = _c(2, 1, 4, 4), _c(2, 1, 4, 4)
MAML_TRAIN_Y, MAML_TEST_Y = _c(2, 2, 2, 2), _c(2, 2, 2, 2)


def _maml_loss(p, x, y):
    w, g, b = _parts(p, (2, 1, 3, 3), (2,), (2,))
    h = ops.batch_norm(ops.conv2d(x, w, padding=1), NO_STATS, NO_STATS, g, b, training=True)
    return ((ops.max_pool2d(ops.tanh(h), 2) - y) ** 2).mean()


def _meta_loss(p):
    adapted = p - 0.5 * kiln.grad(lambda q: _maml_loss(q, MAML_TRAIN, MAML_TRAIN_Y))(p)
    return _maml_loss(adapted, MAML_TEST, MAML_TEST_Y)


def test_maml_meta_gradient():
    """the weight gradient of the inner step (conv2d_backward_weight, batch_norm_backward's gamma,
    max_pool2d_backward) differentiated again, against finite differences of the meta-loss; compiled
    in every variant against eager"""
    p = RNG.standard_normal(18 + 2 + 2)
    g = kiln.grad(_meta_loss)(kiln.Tensor(p)).asnumpy()
    assert np.abs(g).max() > 1e-2
    fd, eps = np.zeros_like(p), 1e-6
    for k in range(p.size):
        e = np.zeros_like(p)
        e[k] = eps
        fd[k] = (_meta_loss(kiln.Tensor(p + e)).item() - _meta_loss(kiln.Tensor(p - e)).item()) / (2 * eps)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)
    # (without the second-order term, first-order MAML, the gradient would differ)
    first_order = kiln.grad(lambda q: _maml_loss(q, MAML_TEST, MAML_TEST_Y))(
        kiln.Tensor(p - 0.5 * kiln.grad(lambda q: _maml_loss(q, MAML_TRAIN, MAML_TRAIN_Y))(kiln.Tensor(p)).asnumpy()))
    assert np.abs(first_order.asnumpy() - g).max() > 1e-4
    with environment(ENV):
        for v in VARIANTS:
            jg = v.wrap(kiln.grad(_meta_loss))
            np.testing.assert_allclose(jg(kiln.Tensor(p)).asnumpy(), g, rtol=1e-10, atol=1e-12, err_msg=v.name)
            assert not jg.cache_info().eager_calls, (v.name, jg.cache_info())
