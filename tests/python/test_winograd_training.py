"""Winograd F(4x4, 3x3) in training graphs (issue 33): the O1 pass conv_algorithm chooses it for
the 3x3, stride-1, dilation-1, ungrouped float32 convolutions of graphs that compute gradients —
forward, backward-input and backward-weight — where it measures faster (kiln._C's cost rule, in
src/ops/conv_winograd.c); O0 keeps the direct convolution, and kiln.jit.explain lists each
convolution's algorithm. Checked against float64 NumPy within the documented tolerance
(docs/guide/jit.md: the largest error of a tensor within 1e-5 * S, S the largest sum of the
magnitudes of the terms one of its elements adds up), against kiln eager (direct) in every capture mode x
O0/O1 x kbk/sink, by central differences, and on the AVX2 path (kiln's own kernels, counted)
via KILN_MAX_CPU_ISA=avx2 in a fresh interpreter."""
import re

import numpy as np
import pytest

import kiln
from kiln import ops
from kiln._optable import OP
from kiln.ops._util import apply

from conftest import run_isolated

TOL = 1e-5  # per element, relative to S (docs/guide/jit.md)
MODES = ["ast", "bytecode", "trace"]


# ---- float64 references --------------------------------------------------------------------------------


def _windows(x, kh, kw, oh, ow, stride, dilation):
    """x (N, C, Hp, Wp) padded -> the (kh, kw) window slices of the output grid."""
    return x[:, :, kh * dilation:kh * dilation + (oh - 1) * stride + 1:stride,
             kw * dilation:kw * dilation + (ow - 1) * stride + 1:stride]


def conv_exact(x, w, pads=(1, 1, 1, 1), stride=1, dilation=1, groups=1):
    """(y, S_y): conv2d in float64 and the sum of the magnitudes of each output's terms."""
    t, b, l, r = pads
    xp = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))
    n, c, hp, wp = xp.shape
    o, cg, k1, k2 = w.shape
    oh, ow = (hp - (k1 - 1) * dilation - 1) // stride + 1, (wp - (k2 - 1) * dilation - 1) // stride + 1
    y, s = np.zeros((n, o, oh, ow)), np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        xs, ws = xp[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og]
        for kh in range(k1):
            for kw in range(k2):
                win = _windows(xs, kh, kw, oh, ow, stride, dilation)
                y[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", win, ws[:, :, kh, kw])
                s[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", np.abs(win), np.abs(ws[:, :, kh, kw]))
    return y, s


def conv_grads_exact(x, w, gy, pads=(1, 1, 1, 1)):
    """(gx, S_gx, gw, S_gw) of a 3x3 stride-1 convolution in float64."""
    t, b, l, r = pads
    n, c, h, wd = x.shape
    oh, ow = gy.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))
    gxp, sxp = np.zeros_like(xp), np.zeros_like(xp)
    gw, sw = np.zeros_like(w), np.zeros_like(w)
    for kh in range(3):
        for kw in range(3):
            gxp[:, :, kh:kh + oh, kw:kw + ow] += np.einsum("nohw,oc->nchw", gy, w[:, :, kh, kw])
            sxp[:, :, kh:kh + oh, kw:kw + ow] += np.einsum("nohw,oc->nchw", np.abs(gy), np.abs(w[:, :, kh, kw]))
            gw[:, :, kh, kw] = np.einsum("nohw,nchw->oc", gy, xp[:, :, kh:kh + oh, kw:kw + ow])
            sw[:, :, kh, kw] = np.einsum("nohw,nchw->oc", np.abs(gy), np.abs(xp[:, :, kh:kh + oh, kw:kw + ow]))
    crop = (slice(None), slice(None), slice(t, t + h), slice(l, l + wd))
    return gxp[crop], sxp[crop], gw, sw


def check_within(got, exact, scale, what, tol=TOL):
    """max |got - exact| <= tol * max S: the documented tolerance (Winograd's transforms mix the
    values of a whole tile, so an element's error follows the size of its neighbours' terms)."""
    err = np.abs(np.asarray(got, np.float64) - exact)
    bound = tol * float(np.max(scale))
    worst = np.unravel_index(np.argmax(err), err.shape)
    assert err.max() <= bound, f"{what}: error {err[worst]:.3g} at {worst} over {tol} * max S = {bound:.3g}"


# ---- the ops with Winograd allowed, eagerly ----------------------------------------------------------


def winograd_forward(x, w, pads):
    """conv2d_fused(x, w) with Winograd allowed (i[13]) and no epilogue, NCHW."""
    return apply(OP.conv2d_fused, (x, w), (1, 1) + tuple(pads) + (1, 1, 1) + (0, 0, 0, 0, 1))


def winograd_backward_input(gy, w, x_shape, pads):
    return apply(OP.conv2d_backward_input, (gy, w), (1, 1) + tuple(pads) + (1, 1, 1) + tuple(x_shape) + (1,))


def winograd_backward_weight(x, gy, w_shape, pads):
    return apply(OP.conv2d_backward_weight, (x, gy), (1, 1) + tuple(pads) + (1, 1, 1) + tuple(w_shape) + (1,))


SIZES = [(h, w) for h in (1, 2, 3, 5, 7, 9) for w in (1, 3, 9)] + [(16, 16), (13, 11)]


@pytest.mark.parametrize("channels", [(1, 1), (3, 17), (17, 3), (17, 17), (32, 32)])
@pytest.mark.parametrize("pads", [(1, 1, 1, 1), (0, 0, 0, 0), (2, 1, 0, 2)])
def test_ops_with_winograd_allowed_match_float64(channels, pads):
    c, o = channels
    rng = np.random.default_rng(c * 100 + o + sum(pads))
    for h, wd in SIZES:
        if h + pads[0] + pads[1] < 3 or wd + pads[2] + pads[3] < 3:
            continue
        x = rng.standard_normal((1, c, h, wd))
        w = rng.standard_normal((o, c, 3, 3))
        y, sy = conv_exact(x, w, pads)
        gy = rng.standard_normal(y.shape)
        gx, sgx, gw, sgw = conv_grads_exact(x, w, gy, pads)
        xt, wt, gyt = (kiln.Tensor(a.astype(np.float32)) for a in (x, w, gy))
        what = f"{c}->{o} channels, {h}x{wd}, pads {pads}"
        check_within(winograd_forward(xt, wt, pads).asnumpy(), y, sy, f"forward {what}")
        check_within(winograd_backward_input(gyt, wt, x.shape, pads).asnumpy(), gx, sgx, f"backward-input {what}")
        check_within(winograd_backward_weight(xt, gyt, w.shape, pads).asnumpy(), gw, sgw, f"backward-weight {what}")


def test_winograd_attribute_must_be_0_or_1():
    x, w = kiln.Tensor(np.ones((1, 2, 4, 4), np.float32)), kiln.Tensor(np.ones((2, 2, 3, 3), np.float32))
    with pytest.raises(ValueError, match="conv2d_backward_weight: the Winograd attribute must be 0 or 1, got 2"):
        apply(OP.conv2d_backward_weight, (x, x), (1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 3, 2))
    with pytest.raises(ValueError, match="conv2d_backward_input: the Winograd attribute must be 0 or 1, got -1"):
        apply(OP.conv2d_backward_input, (x, w), (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 4, -1))


# ---- graphs: the pass's choice, every capture mode -----------------------------------------------------


def two_convs(conv1, conv2, r):
    """sum(conv2(relu(conv1(x, w1)), w2) * r) with the given conv keyword arguments."""
    def f(x, w1, w2):
        h = ops.relu(ops.conv2d(x, w1, **conv1))
        return (ops.conv2d(h, w2, **conv2) * r).sum()
    return f


def _problem(c=64, hw=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    w1 = (rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    w2 = (rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    r = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    return x, w1, w2, r


def _exact_two_convs(x, w1, w2, r):
    """Value and gradients in float64, with per-element scales S carried through both convolutions."""
    x, w1, w2, r = (a.astype(np.float64) for a in (x, w1, w2, r))
    a1, s1 = conv_exact(x, w1)
    h = np.maximum(a1, 0)
    y, _ = conv_exact(h, w2)
    gh, sgh, gw2, sgw2 = conv_grads_exact(h, w2, r)
    ga1 = gh * (a1 > 0)
    gx, sgx, gw1, sgw1 = conv_grads_exact(x, w1, ga1)
    # the first convolution's error reaches the second's weight gradient through h (|dh| <= TOL * s1)
    _, _, _, carried = conv_grads_exact(s1, np.abs(w2), np.abs(r))
    _, carried_x, _, carried_w = conv_grads_exact(np.abs(x), np.abs(w1), sgh)
    return (y * r).sum(), {"x": (gx, sgx + carried_x), "w1": (gw1, sgw1 + carried_w), "w2": (gw2, sgw2 + carried)}


WINOGRAD = "winograd F(4x4, 3x3)"


def expected_algorithm(op):
    """The pass's choice at the shapes below (64 channels, 32x32): Winograd everywhere on AVX-512
    (oneDNN's); elsewhere kiln's own, whose backward-weight never pays (src/ops/conv_winograd.c)."""
    if op == "conv2d_backward_weight" and kiln._C.conv_block_size() != 16:
        return "direct"
    return WINOGRAD


def _algorithms(jf):
    """[(op, input shape, algorithm)] of each convolution kiln.jit.explain lists, and its text."""
    text = str(jf.explain())
    found = re.findall(r"^  convolution \d+: (\S+) (\[[^\]]*\]).*: (direct|winograd F\(4x4, 3x3\))$", text, re.M)
    return found, text


def _run(fn, args):
    value, grads = fn(*args)
    return value.asnumpy(), [g.asnumpy() for g in grads]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("level", ["O0", "O1"])
@pytest.mark.parametrize("backend", ["kbk", "sink"])
def test_every_capture_mode_level_and_backend(mode, level, backend):
    x, w1, w2, r = _problem()
    f = two_convs({"padding": 1}, {"padding": 1}, kiln.Tensor(r))
    args = [kiln.Tensor(a) for a in (x, w1, w2)]
    v_eager, g_eager = _run(kiln.value_and_grad(f, grad_position=(0, 1, 2)), args)
    jf = kiln.jit(f, capture_mode=mode, jit_level=level, backend=backend)
    fn = kiln.value_and_grad(jf, grad_position=(0, 1, 2))
    _run(fn, args)
    v, grads = _run(fn, args)
    algos, text = _algorithms(jf)
    assert {"conv2d_backward_input", "conv2d_backward_weight"} <= {op for op, _, _ in algos}, text
    if level == "O0":  # direct convolutions: eager's kernels, eager's results
        assert all(a == "direct" for _, _, a in algos), text
        np.testing.assert_array_equal(v, v_eager)
        for got, want in zip(grads, g_eager):
            np.testing.assert_array_equal(got, want)
        return
    backward = [(op, a) for op, _, a in algos if op.startswith("conv2d_backward")]
    assert backward and all(a == expected_algorithm(op) for op, a in backward), text
    # bytecode capture also compiles the piece's forward on its own (a graph without gradients:
    # direct); the forward of the graph with the backward is Winograd in every mode
    forward = [a for op, _, a in algos if not op.startswith("conv2d_backward")]
    assert WINOGRAD in forward, text
    if mode != "bytecode":
        assert all(a == WINOGRAD for a in forward), text
    exact_v, exact_g = _exact_two_convs(x, w1, w2, r)
    np.testing.assert_allclose(v, exact_v, rtol=1e-4)
    for name, got, eager in zip(("x", "w1", "w2"), grads, g_eager):
        want, scale = exact_g[name]
        check_within(got, want, scale, f"{mode} {level} {backend}: gradient of {name}")
        check_within(eager, want, scale, f"eager: gradient of {name}")


@pytest.mark.parametrize("conv, why", [
    ({"padding": 1, "stride": 2}, "stride 2"),
    ({"padding": 2, "dilation": 2}, "dilation 2"),
    ({"padding": 1, "groups": 2}, "groups 2"),
    ({"padding": 0, "pad_mode": "valid"}, "a 1x1 kernel"),
])
def test_convolutions_that_do_not_qualify_stay_direct(conv, why):
    rng = np.random.default_rng(7)
    c, hw = 64, 64  # the second convolution's input 32x32 after stride 2: Winograd pays there
    k = 1 if why == "a 1x1 kernel" else 3
    x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
    w1 = rng.standard_normal((c, c // conv.get("groups", 1), k, k)).astype(np.float32)
    w2 = rng.standard_normal((c, c, 3, 3)).astype(np.float32)

    def f(x, w1, w2):
        h = ops.relu(ops.conv2d(x, w1, **conv))
        return ops.conv2d(h, w2, padding=1).sum()

    args = [kiln.Tensor(a) for a in (x, w1, w2)]
    v_eager, g_eager = _run(kiln.value_and_grad(f, grad_position=(0, 1, 2)), args)
    jf = kiln.jit(f, jit_level="O1")
    fn = kiln.value_and_grad(jf, grad_position=(0, 1, 2))
    v, grads = _run(fn, args)
    algos, text = _algorithms(jf)
    # the first convolution's forward and both gradients direct; the second's as the pass chooses
    second = sorted(WINOGRAD if op == "conv2d" else expected_algorithm(op)
                    for op in ("conv2d", "conv2d_backward_input", "conv2d_backward_weight"))
    assert sorted(a for _, _, a in algos) == sorted(["direct"] * 3 + second), f"{why}:\n{text}"
    np.testing.assert_allclose(v, v_eager, rtol=1e-4, atol=1e-3)
    # the first convolution's weight gradient is direct, from an input gradient the (Winograd)
    # second convolution's backward-input computed: eager's up to that rounding
    np.testing.assert_allclose(grads[1], g_eager[1], rtol=1e-3, atol=1e-3 * np.abs(g_eager[1]).max())


def test_forward_only_graphs_keep_direct_convolutions():
    x, w1, w2, r = _problem()
    f = two_convs({"padding": 1}, {"padding": 1}, kiln.Tensor(r))
    args = [kiln.Tensor(a) for a in (x, w1, w2)]
    jf = kiln.jit(f, jit_level="O1")
    got = jf(*args).asnumpy()
    algos, text = _algorithms(jf)
    assert algos and all(a == "direct" for _, _, a in algos), text
    np.testing.assert_allclose(got, f(*args).asnumpy(), rtol=1e-6)


def test_gradients_match_central_differences():
    """Each loss is linear in the operand varied, so a central difference with a step of 1 is
    exact up to float32 rounding of the loss."""
    x, w1, w2, r = _problem(seed=3)
    rng = np.random.default_rng(11)
    f = two_convs({"padding": 1}, {"padding": 1}, kiln.Tensor(r))

    def linear_in_w2(w2_):  # relu(conv1) fixed: linear in w2
        return f(kiln.Tensor(x), kiln.Tensor(w1), kiln.Tensor(w2_)).asnumpy().astype(np.float64)

    jf = kiln.jit(f, jit_level="O1")
    fn = kiln.value_and_grad(jf, grad_position=(0, 1, 2))
    args = [kiln.Tensor(a) for a in (x, w1, w2)]
    _run(fn, args)
    _, (gx, gw1, gw2) = _run(fn, args)
    assert all(a == expected_algorithm(op) for op, _, a in _algorithms(jf)[0])
    for _ in range(3):
        v = rng.standard_normal(w2.shape).astype(np.float32)
        fd = (linear_in_w2(w2 + v) - linear_in_w2(w2 - v)) / 2
        np.testing.assert_allclose((gw2.astype(np.float64) * v).sum(), fd, rtol=1e-4, atol=1e-3)

    def conv_loss(x_, w_):  # linear in x and in w separately
        return (ops.conv2d(x_, w_, padding=1) * kiln.Tensor(r)).sum()

    jg = kiln.value_and_grad(kiln.jit(conv_loss, jit_level="O1"), grad_position=(0, 1))
    xa, wa = kiln.Tensor(x), kiln.Tensor(w1)
    jg(xa, wa)
    _, (g_x, g_w) = _run(jg, (xa, wa))
    for _ in range(3):
        dx = rng.standard_normal(x.shape).astype(np.float32)
        dw = rng.standard_normal(w1.shape).astype(np.float32)
        fx = (conv_loss(kiln.Tensor(x + dx), wa).asnumpy() - conv_loss(kiln.Tensor(x - dx), wa).asnumpy()) / 2
        fw = (conv_loss(xa, kiln.Tensor(w1 + dw)).asnumpy() - conv_loss(xa, kiln.Tensor(w1 - dw)).asnumpy()) / 2
        np.testing.assert_allclose((g_x.astype(np.float64) * dx).sum(), fx, rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose((g_w.astype(np.float64) * dw).sum(), fw, rtol=1e-4, atol=1e-3)


def test_basic_block_training_step_at_o1():
    """The BasicBlock in training mode: every 3x3 convolution Winograd at O1 (two forwards, two
    weight gradients, the input gradient of conv2: x needs none), BatchNorm+ReLU backward fused,
    gradients within tolerance of eager's."""
    from kiln import models, profiler
    kiln.manual_seed(0)
    block = models.BasicBlock(64)
    x = kiln.Tensor(np.random.default_rng(2).standard_normal((1, 64, 32, 32)).astype(np.float32))
    weights = block.trainable_params()
    v_eager, g_eager = _run(kiln.value_and_grad(block, None, weights), (x,))
    jf = kiln.jit(block, jit_level="O1")
    fn = kiln.value_and_grad(jf, None, weights)
    _run(fn, (x,))
    with profiler.profile(record_shapes=False, profile_memory=False) as prof:
        v, grads = _run(fn, (x,))
    names = [e["name"] for e in prof.events() if e["kind"] == "kernel"]
    assert names.count("batch_norm_relu_backward") == 2, names  # both BatchNorm+ReLU backwards fused
    assert "relu_backward" not in names and "batch_norm_backward" not in names, names
    algos, text = _algorithms(jf)
    assert len(algos) == 5 and all(a == expected_algorithm(op) for op, _, a in algos), text
    np.testing.assert_allclose(v, v_eager, rtol=1e-4, atol=1e-3)
    for got, want in zip(grads, g_eager):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=2e-4 * np.abs(want).max())


AVX2_CHECK = """
import numpy as np, kiln, sys
sys.path.insert(0, {tests!r})
import test_winograd_training as t
assert kiln._C.conv_block_size() == 8
x, w1, w2, r = t._problem()
f = t.two_convs({{"padding": 1}}, {{"padding": 1}}, kiln.Tensor(r))
fn = kiln.value_and_grad(kiln.jit(f, jit_level="O1"), grad_position=(0, 1, 2))
args = [kiln.Tensor(a) for a in (x, w1, w2)]
fn(*args)
before = kiln._C.conv_winograd_count()
v, grads = t._run(fn, args)
ran = kiln._C.conv_winograd_count() - before
assert ran == 4, ran  # two forwards, two backward-inputs (a forward of the turned filter); backward-weight direct
before = kiln._C.conv_winograd_count()
xt, gy = kiln.Tensor(x), kiln.Tensor(r)
gw = t.winograd_backward_weight(xt, gy, w1.shape, (1, 1, 1, 1)).asnumpy()  # kiln's own, asked for
assert kiln._C.conv_winograd_count() - before == 1
_, _, want, scale = t.conv_grads_exact(x.astype(np.float64), w1.astype(np.float64), r.astype(np.float64))
t.check_within(gw, want, scale, "avx2 backward-weight kernel")
exact_v, exact_g = t._exact_two_convs(x, w1, w2, r)
for name, got in zip(("x", "w1", "w2"), grads):
    t.check_within(got, *exact_g[name], "avx2 " + name)
print("ok")
"""


def test_avx2_path_runs_kilns_own_kernels():
    import os
    code = AVX2_CHECK.format(tests=os.path.dirname(os.path.abspath(__file__)))
    rc, out = run_isolated(code, timeout=300, KILN_MAX_CPU_ISA="avx2")
    assert rc == 0 and out.strip().endswith("ok"), out
