"""nn.Conv2dTranspose / nn.ConvTranspose2d / ops.conv_transpose2d and nn.Conv3d / ops.conv3d (issue 30)
against direct NumPy loops, gradients against finite differences, PyTorch with copied weights when
torch is importable, and every compiled variant (ast / bytecode / trace x O0 / O1 x kbk / sink)
equal to eager, forward and backward."""
import numpy as np
import pytest

import kiln
from kiln import nn, ops
from conformance import TRACE_VARIANTS, run_all_modes
from conftest import check_grad
import onnx_runtime

RNG = np.random.default_rng(30)


def np_conv_transpose(x, w, b, stride, top_left, dilation, groups, out_hw):
    """Output row o gets x row i through kernel row k where o = i * stride - top + k * dilation."""
    n, cin, h, wd = x.shape
    _, cog, kh, kw = w.shape
    cig = cin // groups
    y = np.zeros((n, cog * groups) + tuple(out_hw))
    for g in range(groups):
        xs, ws = x[:, g * cig:(g + 1) * cig], w[g * cig:(g + 1) * cig]
        for i in range(h):
            for j in range(wd):
                for a in range(kh):
                    for c in range(kw):
                        o = i * stride[0] - top_left[0] + a * dilation[0]
                        p = j * stride[1] - top_left[1] + c * dilation[1]
                        if 0 <= o < out_hw[0] and 0 <= p < out_hw[1]:
                            y[:, g * cog:(g + 1) * cog, o, p] += xs[:, :, i, j] @ ws[:, :, a, c]
    if b is not None:
        y += b[None, :, None, None]
    return y


def np_conv3d(x, w, b, stride, pads, dilation, groups):
    n, c, d, h, wd = x.shape
    o, cg, kd, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), pads[0:2], pads[2:4], pads[4:6]))
    od = (xp.shape[2] - (kd - 1) * dilation[0] - 1) // stride[0] + 1
    oh = (xp.shape[3] - (kh - 1) * dilation[1] - 1) // stride[1] + 1
    ow = (xp.shape[4] - (kw - 1) * dilation[2] - 1) // stride[2] + 1
    y = np.zeros((n, o, od, oh, ow))
    og = o // groups
    for g in range(groups):
        for z in range(od):
            for i in range(oh):
                for j in range(ow):
                    win = xp[:, g * cg:(g + 1) * cg,
                             z * stride[0]:z * stride[0] + (kd - 1) * dilation[0] + 1:dilation[0],
                             i * stride[1]:i * stride[1] + (kh - 1) * dilation[1] + 1:dilation[1],
                             j * stride[2]:j * stride[2] + (kw - 1) * dilation[2] + 1:dilation[2]]
                    y[:, g * og:(g + 1) * og, z, i, j] = np.einsum("ncdhw,ocdhw->no", win, w[g * og:(g + 1) * og])
    return y if b is None else y + b[None, :, None, None, None]


# (in, out, kernel, stride, padding, output_padding, groups, dilation)
CASES = [
    (3, 4, 3, 1, 0, 0, 1, 1),
    (4, 6, 3, 2, 1, 1, 2, 1),
    (2, 3, (2, 3), (2, 1), (0, 1), (1, 0), 1, 1),
    (2, 2, 3, 1, 2, 0, 1, 2),  # padding reaching past the reached rows
    (2, 2, 2, 1, 0, 1, 1, 2),  # output_padding below dilation, not stride: a row no input reaches
    (3, 2, 4, 3, 1, 2, 1, 1),
]


@pytest.mark.parametrize("case", CASES)
def test_conv_transpose2d_functional_against_direct_loops(case):
    cin, cout, k, s, p, op, g, d = case
    k, s, p, op, d = [(v, v) if isinstance(v, int) else v for v in (k, s, p, op, d)]
    x = RNG.standard_normal((2, cin, 5, 4))
    w = RNG.standard_normal((cin, cout // g, k[0], k[1]))
    b = RNG.standard_normal(cout)
    out = [(x.shape[2 + a] - 1) * s[a] - 2 * p[a] + d[a] * (k[a] - 1) + op[a] + 1 for a in range(2)]
    want = np_conv_transpose(x, w, b, s, p, d, g, out)
    for dt, tol in ((kiln.float64, 1e-12), (kiln.float32, 1e-5)):
        got = ops.conv_transpose2d(kiln.Tensor(x, dt), kiln.Tensor(w, dt), kiln.Tensor(b, dt), s, p, op, g, d)
        assert got.shape == want.shape
        np.testing.assert_allclose(got.asnumpy(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[4]])
def test_conv_transpose2d_gradients_by_finite_differences(case):
    cin, cout, k, s, p, op, g, d = case
    x = RNG.standard_normal((1, cin, 3, 3))
    w = RNG.standard_normal((cin, cout // g, k, k))
    b = RNG.standard_normal(cout)
    check_grad(lambda x, w, b: ops.conv_transpose2d(x, w, b, s, p, op, g, d), x, w, b, rtol=1e-6, atol=1e-8)


def test_second_order_gradient_through_the_transposed_convolution():
    """The gradient of conv2d_backward_input is a conv2d and a conv2d_backward_weight: check it
    through the input gradient of a conv2d (a gradient of a gradient)."""
    w = RNG.standard_normal((2, 3, 3, 3))
    gy = RNG.standard_normal((1, 2, 3, 3))

    def input_grad(x, w, gy):
        return kiln.grad(lambda x: (ops.conv2d(x, w, None, 2, "pad", 1) * gy).sum())(x)

    check_grad(lambda gy, w: ops.conv_transpose2d(gy, w, None, 2, 1, 1), gy, w, rtol=1e-6, atol=1e-8)
    x = RNG.standard_normal((1, 3, 6, 6))
    xt, wt, gyt = (kiln.Tensor(a, kiln.float64) for a in (x, w, gy))
    direct = ops.conv_transpose2d(gyt, wt, None, 2, 1, 1)
    np.testing.assert_allclose(input_grad(xt, wt, gyt).asnumpy(), direct.asnumpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode, padding, out_hw", [
    ("same", 0, lambda h, s, ek: h * s),
    ("valid", 0, lambda h, s, ek: h * s + max(ek - s, 0)),
    ("pad", (1, 2, 0, 1), None),
])
@pytest.mark.parametrize("kernel, stride", [(3, 2), (1, 2), (4, 2), (3, 1)])
def test_conv2d_transpose_cell_pad_modes(mode, padding, out_hw, kernel, stride):
    cell = nn.Conv2dTranspose(4, 6, kernel, stride, pad_mode=mode, padding=padding, has_bias=True)
    x = RNG.standard_normal((2, 4, 5, 6)).astype(np.float32)
    w, b = cell.weight.asnumpy().astype(np.float64), cell.bias.asnumpy().astype(np.float64)
    if mode == "pad":
        pads = padding
        out = [(x.shape[2] - 1) * stride - pads[0] - pads[1] + kernel, (x.shape[3] - 1) * stride - pads[2] - pads[3]
               + kernel]
    else:
        total = max(0, kernel - stride) if mode == "same" else 0
        pads = (total // 2, total - total // 2) * 2
        out = [out_hw(x.shape[2], stride, kernel), out_hw(x.shape[3], stride, kernel)]
    if min(out) < 1:
        with pytest.raises(ValueError, match="Conv2dTranspose"):
            cell(kiln.Tensor(x))
        return
    want = np_conv_transpose(x.astype(np.float64), w, b, (stride,) * 2, (pads[0], pads[2]), (1, 1), 1, out)
    np.testing.assert_allclose(cell(kiln.Tensor(x)).asnumpy(), want, rtol=1e-5, atol=1e-5)


def test_conv2d_transpose_inverts_conv2d_shapes_and_names_its_parameters():
    conv = nn.Conv2d(3, 8, 3, 2, pad_mode="same")
    deconv = nn.Conv2dTranspose(8, 3, 3, 2, pad_mode="same")
    x = kiln.Tensor(RNG.standard_normal((1, 3, 16, 16)).astype(np.float32))
    assert deconv(conv(x)).shape == (1, 3, 16, 16)
    assert [n for n, _ in nn.ConvTranspose2d(3, 4, 2).parameters_and_names()] == ["weight", "bias"]
    assert nn.Conv2dTranspose(3, 4, 2).bias is None  # MindSpore's has_bias=False
    assert tuple(nn.ConvTranspose2d(4, 6, 3, groups=2).weight.shape) == (4, 3, 3, 3)


def test_conv_transpose2d_output_size_argument():
    cell = nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1)
    x = kiln.Tensor(RNG.standard_normal((1, 2, 4, 4)).astype(np.float32))
    y7, y8 = cell(x), cell(x, output_size=(8, 8))
    assert y7.shape == (1, 3, 7, 7) and y8.shape == (1, 3, 8, 8)
    np.testing.assert_allclose(y8.asnumpy()[:, :, :7, :7], y7.asnumpy(), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"ConvTranspose2d: output_size \(9, 9\) is not reachable"):
        cell(x, output_size=(9, 9))


def test_bad_arguments_and_shapes_raise_naming_the_layer():
    with pytest.raises(ValueError, match="Conv2dTranspose: group 3 must divide in_channels 4"):
        nn.Conv2dTranspose(4, 6, 3, group=3)
    with pytest.raises(ValueError, match="ConvTranspose2d: output_padding .* must be below stride"):
        nn.ConvTranspose2d(4, 6, 3, stride=2, output_padding=2)
    with pytest.raises(ValueError, match="Conv2dTranspose: padding .* needs pad_mode='pad'"):
        nn.Conv2dTranspose(4, 6, 3, padding=1)
    cell = nn.Conv2dTranspose(4, 6, 3)
    with pytest.raises(ValueError, match=r"Conv2dTranspose: expected input \(N, 4, H, W\), got \[2, 3, 5, 5\]"):
        cell(kiln.Tensor(np.zeros((2, 3, 5, 5), np.float32)))
    with pytest.raises(ValueError, match=r"conv_transpose2d: input of shape \[1, 3, 4, 4\] has 3 channels, "
                                         r"but weight of shape \[2, 2, 3, 3\] expects 2"):
        ops.conv_transpose2d(kiln.Tensor(np.zeros((1, 3, 4, 4), np.float32)), kiln.Tensor(np.zeros((2, 2, 3, 3),
                                                                                                      np.float32)))
    with pytest.raises(ValueError, match="conv_transpose2d: output size .* is not positive"):
        ops.conv_transpose2d(kiln.Tensor(np.zeros((1, 2, 1, 1), np.float32)),
                             kiln.Tensor(np.zeros((2, 2, 1, 1), np.float32)), padding=1)
    with pytest.raises(TypeError, match="conv_transpose2d: expected floating-point input and weight, got int32"):
        ops.conv_transpose2d(kiln.Tensor(np.zeros((1, 2, 3, 3), np.int32)),
                             kiln.Tensor(np.zeros((2, 2, 1, 1), np.int32)))


@pytest.mark.parametrize("stride, pad_mode, padding, dilation, groups", [
    (1, "valid", 0, 1, 1),
    ((2, 1, 2), "pad", (1, 0, 1), 1, 2),
    (1, "same", 0, (2, 1, 1), 1),
    (2, "pad", (0, 1, 1, 0, 2, 1), 1, 1),
])
def test_conv3d_against_direct_loops(stride, pad_mode, padding, dilation, groups):
    x = RNG.standard_normal((2, 4, 5, 6, 5))
    w = RNG.standard_normal((6, 4 // groups, 3, 2, 3))
    b = RNG.standard_normal(6)
    t = lambda v: (v,) * 3 if isinstance(v, int) else v  # noqa: E731
    s, dl = t(stride), t(dilation)
    if pad_mode == "valid":
        pads = (0,) * 6
    elif pad_mode == "same":
        pads = []
        for a in range(3):
            ek = (w.shape[2 + a] - 1) * dl[a] + 1
            total = max(0, (-(-x.shape[2 + a] // s[a]) - 1) * s[a] + ek - x.shape[2 + a])
            pads += [total // 2, total - total // 2]
    else:
        pads = padding if len(padding) == 6 else sum(((v, v) for v in padding), ())
    want = np_conv3d(x, w, b, s, pads, dl, groups)
    got = ops.conv3d(kiln.Tensor(x), kiln.Tensor(w), kiln.Tensor(b), stride, pad_mode, padding, dilation, groups)
    np.testing.assert_allclose(got.asnumpy(), want, rtol=1e-12, atol=1e-12)
    cell = nn.Conv3d(4, 6, (3, 2, 3), stride, pad_mode, padding, dilation, groups, has_bias=True)
    cw, cb = cell.weight.asnumpy().astype(np.float64), cell.bias.asnumpy().astype(np.float64)
    np.testing.assert_allclose(cell(kiln.Tensor(x.astype(np.float32))).asnumpy(),
                               np_conv3d(x, cw, cb, s, pads, dl, groups), rtol=1e-4, atol=1e-5)


def test_conv3d_gradients_and_errors():
    x = RNG.standard_normal((1, 2, 4, 3, 3))
    w = RNG.standard_normal((2, 2, 2, 2, 2))
    check_grad(lambda x, w: ops.conv3d(x, w, None, (2, 1, 1), "pad", 1), x, w, rtol=1e-6, atol=1e-8)
    with pytest.raises(ValueError, match=r"Conv3d: expected input \(N, 2, D, H, W\), got \[1, 2, 4, 4\]"):
        nn.Conv3d(2, 3, 3)(kiln.Tensor(np.zeros((1, 2, 4, 4), np.float32)))
    with pytest.raises(ValueError, match="conv3d: kernel depth 5 .* does not fit the padded input depth 4"):
        ops.conv3d(kiln.Tensor(x), kiln.Tensor(RNG.standard_normal((2, 2, 5, 1, 1))))


def test_torch_parity_with_copied_weights():
    torch = pytest.importorskip("torch")
    t = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, dilation=1).double()
    k = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, dtype=kiln.float64)
    k.weight.set_data(kiln.Tensor(t.weight.detach().numpy()))
    k.bias.set_data(kiln.Tensor(t.bias.detach().numpy()))
    x = RNG.standard_normal((2, 4, 5, 5))
    xt = torch.tensor(x, requires_grad=True)
    yt = t(xt)
    gy = RNG.standard_normal(tuple(yt.shape))
    yt.backward(torch.tensor(gy))
    xk = kiln.Tensor(x, kiln.float64)
    np.testing.assert_allclose(k(xk).asnumpy(), yt.detach().numpy(), rtol=1e-10, atol=1e-10)
    gx, gw = kiln.grad(lambda v: (k(v) * kiln.Tensor(gy)).sum(), 0, [k.weight])(xk)
    np.testing.assert_allclose(gx.asnumpy(), xt.grad.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(gw[0].asnumpy(), t.weight.grad.numpy(), rtol=1e-10, atol=1e-10)
    t3 = torch.nn.Conv3d(2, 4, 3, stride=(1, 2, 1), padding=1).double()
    k3 = nn.Conv3d(2, 4, 3, (1, 2, 1), "pad", 1, has_bias=True, dtype=kiln.float64)
    k3.weight.set_data(kiln.Tensor(t3.weight.detach().numpy()))
    k3.bias.set_data(kiln.Tensor(t3.bias.detach().numpy()))
    x3 = RNG.standard_normal((1, 2, 4, 5, 5))
    np.testing.assert_allclose(k3(kiln.Tensor(x3)).asnumpy(), t3(torch.tensor(x3)).detach().numpy(), rtol=1e-10,
                               atol=1e-10)


def test_compiled_variants_agree_with_eager_forward_and_backward():
    deconv = nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)
    same = nn.Conv2dTranspose(3, 2, 2, 2, has_bias=True)
    conv3 = nn.Conv3d(2, 2, 3, (2, 1, 1), has_bias=True)

    def f(x, v):
        return same(ops.relu(deconv(x))), conv3(v), deconv(x, output_size=(5, 8))

    args = lambda s: (kiln.Tensor(RNG.standard_normal((2, 4, 3, 4)).astype(np.float32) * s),  # noqa: E731
                      kiln.Tensor(RNG.standard_normal((1, 2, 5, 4, 4)).astype(np.float32) * s))
    run_all_modes(f, args(1.0), args(2.0))
    run_all_modes(f, args(1.0), args(2.0), variants=TRACE_VARIANTS)  # kiln.trace, MegEngine's
    params = deconv.trainable_params() + same.trainable_params()

    def loss(x):
        return (same(ops.relu(deconv(x))) ** 2).sum()

    run_all_modes(loss, (args(1.0)[0],), (args(0.5)[0],),
                  around=lambda f: kiln.value_and_grad(f, 0, params))


def test_onnx_export_of_the_transposed_convolution(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")

    net = nn.SequentialCell(nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
                            nn.Conv2dTranspose(6, 2, 3, 2, pad_mode="same", has_bias=True))
    x = RNG.standard_normal((1, 4, 5, 3)).astype(np.float32)
    path = str(tmp_path / "deconv.onnx")
    onnx_runtime.export_checked(net, [x], path)
    got = onnx_runtime.run(path, [x])[0]
    np.testing.assert_allclose(got, net(kiln.Tensor(x)).asnumpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, tol", [(kiln.float16, 3e-2), (kiln.bfloat16, 1e-1)])
def test_half_precision_and_strided_operands(dtype, tol):
    x = RNG.standard_normal((2, 4, 5, 3))
    w = RNG.standard_normal((4, 3, 3, 3))
    want = np_conv_transpose(x, w, None, (2, 2), (1, 1), (1, 1), 1, (9, 5))
    got = ops.conv_transpose2d(kiln.Tensor(x, dtype), kiln.Tensor(w, dtype), None, 2, 1)
    assert got.dtype == dtype
    np.testing.assert_allclose(got.astype(kiln.float64).asnumpy(), want, rtol=tol, atol=tol * 4)
    # operands that are views with swapped axes: the same result as their contiguous copies
    xs = kiln.Tensor(np.ascontiguousarray(x.swapaxes(2, 3))).swapaxes(2, 3)
    ws = kiln.Tensor(np.ascontiguousarray(w.swapaxes(0, 1))).swapaxes(0, 1)
    assert not xs.is_contiguous() and not ws.is_contiguous()
    np.testing.assert_allclose(ops.conv_transpose2d(xs, ws, None, 2, 1).asnumpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["ast", "bytecode", "trace"])
def test_a_compiled_training_step_of_an_autoencoder_equals_eager(mode):
    """Whole steps (forward, backward, optimizer) of a small convolutional autoencoder, compiled,
    against the same steps run eagerly from the same weights."""
    import copy

    base = nn.SequentialCell(nn.Conv2d(3, 8, 3, 2, has_bias=True), nn.ReLU(),
                             nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
                             nn.Conv2dTranspose(4, 3, 3, pad_mode="same", has_bias=True))

    def make_step(net):
        opt = nn.SGD(net.trainable_params(), learning_rate=0.05, momentum=0.9)
        grad_fn = kiln.value_and_grad(lambda x: ((net(x) - x) ** 2).mean(), None, net.trainable_params())

        def step(x):
            loss, grads = grad_fn(x)
            opt(grads)
            return loss

        return step

    x = kiln.Tensor(RNG.standard_normal((2, 3, 8, 8)).astype(np.float32))
    eager = copy.deepcopy(base)
    step = make_step(eager)
    want = [float(step(x).asnumpy()) for _ in range(3)]
    assert want[-1] < want[0]
    for level in ("O0", "O1"):
        net = copy.deepcopy(base)
        jstep = kiln.jit(make_step(net), capture_mode=mode, jit_level=level)
        got = [float(jstep(x).asnumpy()) for _ in range(3)]
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=level)
        for (name, p), q in zip(net.parameters_and_names(), eager.trainable_params()):
            np.testing.assert_allclose(p.asnumpy(), q.asnumpy(), rtol=1e-4, atol=1e-5, err_msg=f"{level} {name}")
        assert jstep.cache_info().eager_calls == 0
