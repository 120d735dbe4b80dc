"""nn.MultiheadAttention and the Transformer layers (issue 30) against PyTorch's formulas written out in
NumPy (and PyTorch itself with the same state dict when importable): values over masks, layouts and
options, gradients against finite differences, parameter names that map one to one, and every
compiled variant (ast / bytecode / trace x O0 / O1 x kbk / sink) equal to eager, forward and
backward."""
import copy

import numpy as np
import pytest

import kiln
from kiln import nn
from conformance import TRACE_VARIANTS, run_all_modes
from conftest import check_grad
import onnx_runtime

RNG = np.random.default_rng(32)
F64 = kiln.float64


def params(cell):
    return {n: p.asnumpy().astype(np.float64) for n, p in cell.parameters_and_names()}


def randomize(cell, scale=0.5):
    """Non-zero biases and norms, so every parameter shows in the results."""
    for _, p in cell.parameters_and_names():
        p.set_data(kiln.Tensor(RNG.standard_normal(tuple(p.shape)) * scale, p.dtype))
    return cell


def np_softmax(s):
    with np.errstate(invalid="ignore"):  # a row masked whole is NaN, as PyTorch's
        e = np.exp(s - s.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


def np_mha(p, prefix, q, k, v, heads, batch_first=False, attn_mask=None, key_padding_mask=None, causal=False,
           average=True):
    """PyTorch's multi_head_attention_forward, in float64. q, k, v batched."""
    if not batch_first:
        q, k, v = (a.transpose(1, 0, 2) for a in (q, k, v))
    n, lq, e = q.shape
    ls, d = k.shape[1], e // heads
    if prefix + "in_proj_weight" in p:
        w = p[prefix + "in_proj_weight"]
        wq, wk, wv = w[:e], w[e:2 * e], w[2 * e:]
    else:
        wq, wk, wv = (p[prefix + f"{c}_proj_weight"] for c in "qkv")
    b = p.get(prefix + "in_proj_bias", np.zeros(3 * e))
    qh = (q @ wq.T + b[:e]).reshape(n, lq, heads, d).transpose(0, 2, 1, 3)
    kh = (k @ wk.T + b[e:2 * e]).reshape(n, ls, heads, d).transpose(0, 2, 1, 3)
    vh = (v @ wv.T + b[2 * e:]).reshape(n, ls, heads, d).transpose(0, 2, 1, 3)
    s = (qh / np.sqrt(d)) @ kh.transpose(0, 1, 3, 2)
    if attn_mask is not None:
        m = np.where(attn_mask, -np.inf, 0.0) if attn_mask.dtype == bool else attn_mask
        s = s + (m.reshape(n, heads, lq, ls) if m.ndim == 3 else m)
    elif causal:
        s = s + np.triu(np.full((lq, ls), -np.inf), 1)
    if key_padding_mask is not None:
        m = np.where(key_padding_mask, -np.inf, 0.0) if key_padding_mask.dtype == bool else key_padding_mask
        s = s + m[:, None, None, :]
    a = np_softmax(s)
    o = (a @ vh).transpose(0, 2, 1, 3).reshape(n, lq, e) @ p[prefix + "out_proj.weight"].T
    o = o + p.get(prefix + "out_proj.bias", 0.0)
    if not batch_first:
        o = o.transpose(1, 0, 2)
    return o, (a.mean(1) if average else a)


def np_norm(p, name, x, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps) * p[name + ".weight"] + p[name + ".bias"]


def np_ff(p, pre, x, act):
    h = x @ p[pre + "linear1.weight"].T + p[pre + "linear1.bias"]
    if act == "relu":
        h = np.maximum(h, 0)
    else:
        from math import erf
        h = 0.5 * h * (1 + np.vectorize(erf)(h / np.sqrt(2)))
    return h @ p[pre + "linear2.weight"].T + p[pre + "linear2.bias"]


def np_encoder_layer(p, pre, x, heads, act, norm_first, mask=None, padding=None, causal=False):
    def sa(y):
        return np_mha(p, pre + "self_attn.", y, y, y, heads, attn_mask=mask, key_padding_mask=padding, causal=causal)[0]

    if norm_first:
        x = x + sa(np_norm(p, pre + "norm1", x))
        return x + np_ff(p, pre, np_norm(p, pre + "norm2", x), act)
    x = np_norm(p, pre + "norm1", x + sa(x))
    return np_norm(p, pre + "norm2", x + np_ff(p, pre, x, act))


def np_decoder_layer(p, pre, x, mem, heads, act, norm_first, tgt_mask=None, causal=False):
    def sa(y):
        return np_mha(p, pre + "self_attn.", y, y, y, heads, attn_mask=tgt_mask, causal=causal)[0]

    def ca(y):
        return np_mha(p, pre + "multihead_attn.", y, mem, mem, heads)[0]

    if norm_first:
        x = x + sa(np_norm(p, pre + "norm1", x))
        x = x + ca(np_norm(p, pre + "norm2", x))
        return x + np_ff(p, pre, np_norm(p, pre + "norm3", x), act)
    x = np_norm(p, pre + "norm1", x + sa(x))
    x = np_norm(p, pre + "norm2", x + ca(x))
    return np_norm(p, pre + "norm3", x + np_ff(p, pre, x, act))


def T(a, dtype=F64):
    return kiln.Tensor(a, dtype) if a.dtype != bool else kiln.Tensor(a)


L, S, N, E, H = 5, 6, 3, 8, 2
CAUSAL = np.triu(np.ones((L, S), bool), 1)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("masks", ["none", "bool-attn", "float-attn-per-head", "padding", "both", "causal"])
def test_multihead_attention_against_the_formula(batch_first, masks):
    m = randomize(nn.MultiheadAttention(E, H, batch_first=batch_first, dtype=F64))
    shape = (lambda l: (N, l, E)) if batch_first else (lambda l: (l, N, E))
    q, k, v = RNG.standard_normal(shape(L)), RNG.standard_normal(shape(S)), RNG.standard_normal(shape(S))
    padding = np.zeros((N, S), bool)
    padding[0, -2:] = True
    padding[2, 0] = True
    kw = {"none": {}, "bool-attn": dict(attn_mask=CAUSAL),
          "float-attn-per-head": dict(attn_mask=RNG.standard_normal((N * H, L, S))),
          "padding": dict(key_padding_mask=padding), "both": dict(attn_mask=CAUSAL, key_padding_mask=padding),
          "causal": dict(causal=True)}[masks]
    want, want_w = np_mha(params(m), "", q, k, v, H, batch_first, **kw)
    call = {("is_causal" if a == "causal" else a): (T(b) if isinstance(b, np.ndarray) else b) for a, b in kw.items()}
    out, w = m(T(q), T(k), T(v), **call)
    np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w.asnumpy(), want_w, rtol=1e-10, atol=1e-12)
    out2, none = m(T(q), T(k), T(v), need_weights=False, **call)
    assert none is None
    np.testing.assert_allclose(out2.asnumpy(), want, rtol=1e-10, atol=1e-12)
    _, per_head = m(T(q), T(k), T(v), average_attn_weights=False, **call)
    np.testing.assert_allclose(per_head.asnumpy(), np_mha(params(m), "", q, k, v, H, batch_first, average=False,
                                                          **kw)[1], rtol=1e-10, atol=1e-12)


def test_multihead_attention_kdim_vdim_unbatched_and_no_bias():
    m = randomize(nn.MultiheadAttention(E, 4, kdim=5, vdim=3, dtype=F64))
    assert [n for n, _ in m.parameters_and_names()] == ["q_proj_weight", "k_proj_weight", "v_proj_weight",
                                                        "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    q, k, v = RNG.standard_normal((L, N, E)), RNG.standard_normal((S, N, 5)), RNG.standard_normal((S, N, 3))
    want, want_w = np_mha(params(m), "", q, k, v, 4)
    out, w = m(T(q), T(k), T(v))
    np.testing.assert_allclose(out.asnumpy(), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w.asnumpy(), want_w, rtol=1e-10, atol=1e-12)
    out1, w1 = m(T(q[:, 1]), T(k[:, 1]), T(v[:, 1]))  # unbatched (L, E)
    np.testing.assert_allclose(out1.asnumpy(), want[:, 1], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w1.asnumpy(), want_w[1], rtol=1e-10, atol=1e-12)
    plain = nn.MultiheadAttention(E, 2, bias=False)
    assert [n for n, _ in plain.parameters_and_names()] == ["in_proj_weight", "out_proj.weight"]


def test_multihead_attention_gradients_by_finite_differences():
    m = randomize(nn.MultiheadAttention(4, 2, dtype=F64))
    q, k, v = RNG.standard_normal((3, 2, 4)), RNG.standard_normal((4, 2, 4)), RNG.standard_normal((4, 2, 4))
    mask = np.triu(np.ones((3, 4), bool), 2)
    check_grad(lambda q, k, v: m(q, k, v, attn_mask=T(mask)), q, k, v, rtol=1e-6, atol=1e-8)
    # the parameters' gradients, against central differences of a few entries of each
    gy = RNG.standard_normal((3, 2, 4))
    loss = lambda: (m(T(q), T(k), T(v), attn_mask=T(mask))[0] * T(gy)).sum()  # noqa: E731
    grads = kiln.grad(lambda: loss(), None, m.trainable_params())()
    for p, g in zip(m.trainable_params(), grads):
        base = p.asnumpy().copy()
        for idx in list(np.ndindex(base.shape))[::5]:
            for sign in (1, -1):
                bumped = base.copy()
                bumped[idx] += sign * 1e-6
                p.set_data(kiln.Tensor(bumped))
                if sign == 1:
                    hi = float(loss().asnumpy())
                else:
                    lo = float(loss().asnumpy())
            p.set_data(kiln.Tensor(base))
            np.testing.assert_allclose(g.asnumpy()[idx], (hi - lo) / 2e-6, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_and_decoder_layers_against_the_formula(norm_first, activation):
    enc = randomize(nn.TransformerEncoderLayer(E, H, 16, 0.1, activation, norm_first=norm_first, dtype=F64))
    dec = randomize(nn.TransformerDecoderLayer(E, H, 16, 0.1, activation, norm_first=norm_first, dtype=F64))
    x, mem = RNG.standard_normal((L, N, E)), RNG.standard_normal((S, N, E))
    padding = np.zeros((N, L), bool)
    padding[1, -1] = True
    mask = np.triu(np.ones((L, L), bool), 1)
    p = params(enc)
    np.testing.assert_allclose(enc(T(x)).asnumpy(), np_encoder_layer(p, "", x, H, activation, norm_first),
                               rtol=1e-10, atol=1e-10)  # eval mode (the default): no dropout
    np.testing.assert_allclose(enc(T(x), T(mask), T(padding)).asnumpy(),
                               np_encoder_layer(p, "", x, H, activation, norm_first, mask, padding), rtol=1e-10,
                               atol=1e-10)
    np.testing.assert_allclose(enc(T(x), is_causal=True).asnumpy(),
                               np_encoder_layer(p, "", x, H, activation, norm_first, causal=True), rtol=1e-10,
                               atol=1e-10)
    pd = params(dec)
    np.testing.assert_allclose(dec(T(x), T(mem)).asnumpy(), np_decoder_layer(pd, "", x, mem, H, activation,
                                                                            norm_first), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dec(T(x), T(mem), tgt_is_causal=True).asnumpy(),
                               np_decoder_layer(pd, "", x, mem, H, activation, norm_first, causal=True), rtol=1e-10,
                               atol=1e-10)


def test_stacks_are_deep_copies_with_pytorch_names():
    layer = nn.TransformerEncoderLayer(E, H, 16, batch_first=True, dtype=F64)
    stack = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(E, dtype=F64))
    names = [n for n, _ in stack.parameters_and_names()]
    assert names[:12] == ["layers.0.self_attn.in_proj_weight", "layers.0.self_attn.in_proj_bias",
                          "layers.0.self_attn.out_proj.weight", "layers.0.self_attn.out_proj.bias",
                          "layers.0.linear1.weight", "layers.0.linear1.bias", "layers.0.linear2.weight",
                          "layers.0.linear2.bias", "layers.0.norm1.weight", "layers.0.norm1.bias",
                          "layers.0.norm2.weight", "layers.0.norm2.bias"]
    a, b = stack.layers[0].linear1.weight, stack.layers[1].linear1.weight
    np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())  # copies of one layer: equal at first...
    randomize(stack)
    assert not np.array_equal(a.asnumpy(), b.asnumpy()) and a is not layer.linear1.weight  # ...not shared
    x = RNG.standard_normal((N, L, E))
    p = params(stack)
    want = x
    for i in range(2):
        want = np_encoder_layer(p, f"layers.{i}.", want.transpose(1, 0, 2), H, "relu", False).transpose(1, 0, 2)
    mu, var = want.mean(-1, keepdims=True), want.var(-1, keepdims=True)
    want = (want - mu) / np.sqrt(var + 1e-5) * p["norm.gamma"] + p["norm.beta"]
    np.testing.assert_allclose(stack(T(x)).asnumpy(), want, rtol=1e-10, atol=1e-10)
    dstack = randomize(nn.TransformerDecoder(nn.TransformerDecoderLayer(E, H, 16, dtype=F64), 2))
    mem = RNG.standard_normal((S, N, E))
    pd, want = params(dstack), x.transpose(1, 0, 2)
    for i in range(2):
        want = np_decoder_layer(pd, f"layers.{i}.", want, mem, H, "relu", False, causal=True)
    np.testing.assert_allclose(dstack(T(x.transpose(1, 0, 2)), T(mem), tgt_is_causal=True).asnumpy(), want,
                               rtol=1e-10, atol=1e-10)


def test_dropout_only_in_training():
    m = randomize(nn.MultiheadAttention(E, H, dropout=0.5))
    x = T(RNG.standard_normal((L, N, E)), kiln.float32)
    eval_out = m(x, x, x)[0].asnumpy()
    m.set_train(True)
    kiln.manual_seed(1)
    _, w = m(x, x, x, average_attn_weights=False)
    dropped = w.asnumpy()
    assert (dropped == 0).mean() > 0.3 and (dropped == 0).mean() < 0.7  # about half the weights zeroed
    assert not np.allclose(m(x, x, x)[0].asnumpy(), eval_out)
    m.set_train(False)
    np.testing.assert_array_equal(m(x, x, x)[0].asnumpy(), eval_out)


def test_bad_arguments_and_shapes_raise_naming_the_layer():
    with pytest.raises(ValueError, match="MultiheadAttention: embed_dim 6 must be divisible by num_heads 4"):
        nn.MultiheadAttention(6, 4)
    m = nn.MultiheadAttention(E, H)
    x = T(RNG.standard_normal((L, N, E)), kiln.float32)
    with pytest.raises(ValueError, match=r"MultiheadAttention: key of shape \[5, 3, 7\] must end in 8"):
        m(x, T(RNG.standard_normal((L, N, 7)), kiln.float32), x)
    with pytest.raises(ValueError, match=r"MultiheadAttention: attn_mask of shape \[4, 4\] must be \(L, S\) = \[5, 5\]"):
        m(x, x, x, attn_mask=T(np.zeros((4, 4), bool)))
    with pytest.raises(ValueError, match=r"MultiheadAttention: key_padding_mask of shape \[5, 3\] must be \(N, S\)"):
        m(x, x, x, key_padding_mask=T(np.zeros((5, 3), bool)))
    with pytest.raises(ValueError, match="MultiheadAttention: query, key and value must all be 3-D"):
        m(x, T(RNG.standard_normal((L, E)), kiln.float32), x)
    with pytest.raises(ValueError, match="MultiheadAttention: query .* and key .* have different batch sizes"):
        y = T(RNG.standard_normal((L, 2, E)), kiln.float32)
        m(x, y, y)
    with pytest.raises(ValueError, match=r"TransformerEncoderLayer: src must be \(L, N, 8\), .* got \[5, 3, 6\]"):
        nn.TransformerEncoderLayer(E, H, 16)(T(RNG.standard_normal((L, N, 6)), kiln.float32))
    with pytest.raises(ValueError, match=r"TransformerDecoderLayer: memory must be .* got \[4, 3, 6\]\Z"):
        nn.TransformerDecoderLayer(E, H, 16)(x, T(RNG.standard_normal((4, 3, 6)), kiln.float32))
    with pytest.raises(ValueError, match="TransformerEncoderLayer: activation must be 'relu', 'gelu'"):
        nn.TransformerEncoderLayer(E, H, activation="tanh")
    with pytest.raises(TypeError, match="TransformerEncoder: expected a TransformerEncoderLayer"):
        nn.TransformerEncoder(nn.Dense(2, 2), 2)
    with pytest.raises(ValueError, match="TransformerDecoder: num_layers must be a positive int"):
        nn.TransformerDecoder(nn.TransformerDecoderLayer(E, H), 0)


def test_torch_parity_with_one_state_dict():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    t = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(E, H, 16, 0.0, "gelu", batch_first=True,
                                                                     norm_first=True), 2).double()
    t.train()  # dropout is 0; training mode keeps PyTorch off its fused inference path
    k = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, 16, 0.0, "gelu", batch_first=True, norm_first=True,
                                                         dtype=F64), 2)
    state = {n: v.detach().numpy() for n, v in t.state_dict().items()}
    assert set(state) == {n for n, _ in k.parameters_and_names()}
    k.load_state_dict({n: kiln.Tensor(v) for n, v in state.items()})
    x = RNG.standard_normal((N, L, E))
    mask = torch.tensor(np.triu(np.ones((L, L), bool), 1))
    xt = torch.tensor(x, requires_grad=True)
    yt = t(xt, mask=mask)
    gy = RNG.standard_normal(tuple(yt.shape))
    yt.backward(torch.tensor(gy))
    xk = T(x)
    np.testing.assert_allclose(k(xk, T(mask.numpy())).asnumpy(), yt.detach().numpy(), rtol=1e-9, atol=1e-10)
    grads = kiln.grad(lambda v: (k(v, T(mask.numpy())) * T(gy)).sum(), 0, k.trainable_params())(xk)
    np.testing.assert_allclose(grads[0].asnumpy(), xt.grad.numpy(), rtol=1e-8, atol=1e-10)
    torch_grads = dict(t.named_parameters())
    for (n, _), g in zip(k.parameters_and_names(), grads[1]):
        np.testing.assert_allclose(g.asnumpy(), torch_grads[n].grad.numpy(), rtol=1e-8, atol=1e-10, err_msg=n)
    tm = torch.nn.MultiheadAttention(E, H, kdim=5, vdim=3).double()
    km = nn.MultiheadAttention(E, H, kdim=5, vdim=3, dtype=F64)
    km.load_state_dict({n: kiln.Tensor(v.detach().numpy()) for n, v in tm.state_dict().items()})
    q, kk, v = RNG.standard_normal((L, N, E)), RNG.standard_normal((S, N, 5)), RNG.standard_normal((S, N, 3))
    pad = np.zeros((N, S), bool)
    pad[0, 0] = True
    ot, wt = tm(torch.tensor(q), torch.tensor(kk), torch.tensor(v), key_padding_mask=torch.tensor(pad))
    ok, wk = km(T(q), T(kk), T(v), key_padding_mask=T(pad))
    np.testing.assert_allclose(ok.asnumpy(), ot.detach().numpy(), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(wk.asnumpy(), wt.detach().numpy(), rtol=1e-9, atol=1e-10)


def test_compiled_variants_agree_with_eager_forward_and_backward():
    enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, 16, 0.0, "gelu"), 2)
    dec = nn.TransformerDecoderLayer(E, H, 16, 0.0, norm_first=True, batch_first=True)
    mha = nn.MultiheadAttention(E, H, kdim=6, vdim=6, batch_first=True)
    pad = T(np.array([[False] * (S - 1) + [True]] * N))

    def f(x, mem):
        xb = x.swapaxes(0, 1)
        out, w = mha(xb, mem, mem, key_padding_mask=pad)
        return enc(x, is_causal=True), dec(xb, out, tgt_is_causal=True), w

    args = lambda s: (T(RNG.standard_normal((L, N, E)) * s, kiln.float32),  # noqa: E731
                      T(RNG.standard_normal((N, S, 6)) * s, kiln.float32))
    run_all_modes(f, args(1.0), args(2.0))
    run_all_modes(f, args(1.0), args(2.0), variants=TRACE_VARIANTS)  # kiln.trace, MegEngine's
    weights = enc.trainable_params() + dec.trainable_params()

    def loss(x, mem):
        return (enc(x, is_causal=True) ** 2).sum() + dec(x.swapaxes(0, 1), mha(x.swapaxes(0, 1), mem, mem)[0]).sum()

    run_all_modes(loss, args(1.0), args(0.5), around=lambda f: kiln.value_and_grad(f, (0, 1), weights))


def test_onnx_export_of_an_encoder(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, 16, 0.0, "gelu"), 2)
            self.mha = nn.MultiheadAttention(E, H)

        def construct(self, x):
            return self.enc(x, is_causal=True) + self.mha(x, x, x)[1].sum()

    net = randomize(Net(), 0.3)
    x = RNG.standard_normal((L, N, E)).astype(np.float32)
    path = str(tmp_path / "encoder.onnx")
    onnx_runtime.export_checked(net, [x], path)
    got = onnx_runtime.run(path, [x])[0]
    np.testing.assert_allclose(got, net(kiln.Tensor(x)).asnumpy(), rtol=1e-5, atol=1e-5)


class _Seq2Seq(nn.Cell):
    def __init__(self):
        super().__init__()
        self.inp = nn.Dense(6, E)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, 16, 0.0, "gelu", batch_first=True), 2)
        self.dec = nn.TransformerDecoderLayer(E, H, 16, 0.0, batch_first=True, norm_first=True)
        self.out = nn.Dense(E, 3)

    def construct(self, x, y):
        return self.out(self.dec(self.inp(y), self.enc(self.inp(x)), tgt_is_causal=True))


def _train_step(net):
    # SGD: Adam would turn the float noise of gradients that are zero in exact arithmetic (the key
    # bias of attention) into updates of about its learning rate, in eager and compiled runs alike
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    grad_fn = kiln.value_and_grad(lambda x, y, t: ((net(x, y) - t) ** 2).mean(), None, net.trainable_params())

    def step(x, y, t):
        loss, grads = grad_fn(x, y, t)
        opt(grads)
        return loss

    return step


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_a_compiled_training_step_equals_eager(mode):
    """Whole steps (forward, backward, optimizer) of a small encoder-decoder, compiled, against the
    same steps run eagerly from the same weights: losses and weights after each level."""
    base = _Seq2Seq()
    data = [tuple(T(RNG.standard_normal(s), kiln.float32) for s in ((2, 5, 6), (2, 4, 6), (2, 4, 3)))] * 3
    eager = copy.deepcopy(base)
    step = _train_step(eager)
    want = [float(step(*d).asnumpy()) for d in data]
    assert want[-1] < want[0]
    for level in ("O0", "O1"):
        net = copy.deepcopy(base)
        jstep = kiln.jit(_train_step(net), capture_mode=mode, jit_level=level)
        got = [float(jstep(*d).asnumpy()) for d in data]
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=level)
        for (name, p), q in zip(net.parameters_and_names(), eager.trainable_params()):
            np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), rtol=1e-4, atol=1e-5, err_msg=f"{level} {name}")
        assert jstep.cache_info().eager_calls == 0
