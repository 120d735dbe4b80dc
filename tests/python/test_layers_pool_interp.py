"""ops.interpolate / nn.Upsample (nearest, linear, bilinear, trilinear; both align_corners rules) and
ops.adaptive_max_pool2d / nn.AdaptiveMaxPool2d (issue 30) against PyTorch's index rules written out
in NumPy (and PyTorch itself when importable), gradients against finite differences, and every
compiled variant equal to eager, forward and backward."""
import numpy as np
import pytest

import kiln
from kiln import nn, ops
from conformance import TRACE_VARIANTS, run_all_modes
from conftest import check_grad
import onnx_runtime

RNG = np.random.default_rng(31)


def np_linear_axis(x, axis, n_out, scale, align):
    n_in = x.shape[axis]
    out = []
    for i in range(n_out):
        if align:
            s = i * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        else:
            s = max((i + 0.5) * scale - 0.5, 0.0)
        i0 = int(np.floor(s))
        i1 = min(i0 + 1, n_in - 1)
        lam = s - i0
        out.append(np.take(x, i0, axis) * (1 - lam) + np.take(x, i1, axis) * lam)
    return np.stack(out, axis)


def np_resize(x, sizes, scales, mode, align=False):
    y = x.astype(np.float64)
    for d in reversed(range(len(sizes))):
        if mode == "nearest":
            idx = np.minimum(np.floor(np.arange(sizes[d]) * scales[d]).astype(int), x.shape[2 + d] - 1)
            y = np.take(y, idx, 2 + d)
        else:
            y = np_linear_axis(y, 2 + d, sizes[d], scales[d], align)
    return y


def np_adaptive_max(x, out):
    h, w = x.shape[2:]
    y = np.zeros(x.shape[:2] + tuple(out))
    for i in range(out[0]):
        for j in range(out[1]):
            a, b = (i * h) // out[0], -((-(i + 1) * h) // out[0])
            c, d = (j * w) // out[1], -((-(j + 1) * w) // out[1])
            y[:, :, i, j] = x[:, :, a:b, c:d].max((2, 3))
    return y


def test_bilinear_on_a_known_grid():
    x = kiln.Tensor(np.array([[[[1.0, 2.0], [3.0, 4.0]]]], np.float32))
    half = ops.interpolate(x, scale_factor=2, mode="bilinear").asnumpy()[0, 0]
    np.testing.assert_allclose(half, [[1.0, 1.25, 1.75, 2.0], [1.5, 1.75, 2.25, 2.5], [2.5, 2.75, 3.25, 3.5],
                                      [3.0, 3.25, 3.75, 4.0]], rtol=1e-6)
    corners = ops.interpolate(x, size=(3, 3), mode="bilinear", align_corners=True).asnumpy()[0, 0]
    np.testing.assert_allclose(corners, [[1.0, 1.5, 2.0], [2.0, 2.5, 3.0], [3.0, 3.5, 4.0]], rtol=1e-6)
    nearest = ops.interpolate(kiln.Tensor(np.arange(3.0).reshape(1, 1, 3)), size=5).asnumpy()[0, 0]
    np.testing.assert_array_equal(nearest, [0, 0, 1, 1, 2])


@pytest.mark.parametrize("mode, shape, size, scale, align", [
    ("nearest", (2, 3, 5, 7), (8, 4), None, None),
    ("nearest", (2, 3, 4, 4), None, 2, None),
    ("nearest", (1, 2, 5, 3), None, (1.5, 2.5), None),
    ("nearest", (1, 2, 4, 3, 5), (3, 6, 2), None, None),
    ("bilinear", (2, 3, 5, 7), (9, 4), None, False),
    ("bilinear", (2, 3, 5, 7), (9, 4), None, True),
    ("bilinear", (1, 2, 4, 6), None, (2.5, 0.5), False),
    ("bilinear", (1, 2, 4, 6), None, 3, True),
    ("bilinear", (1, 1, 1, 5), (3, 1), None, True),
    ("linear", (2, 3, 7), 11, None, False),
    ("trilinear", (1, 2, 3, 4, 5), (5, 2, 7), None, False),
])
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.float64])
def test_interpolate_against_pytorch_rules(mode, shape, size, scale, align, dtype):
    x = RNG.standard_normal(shape)
    spatial = len(shape) - 2
    if size is not None:
        sizes = (size,) * spatial if isinstance(size, int) else size
        scales = [shape[2 + d] / sizes[d] for d in range(spatial)]
    else:
        f = (scale,) * spatial if isinstance(scale, (int, float)) else scale
        sizes = [int(np.floor(shape[2 + d] * f[d])) for d in range(spatial)]
        scales = [1.0 / v for v in f]
    want = np_resize(x, sizes, scales, mode, bool(align))
    got = ops.interpolate(kiln.Tensor(x, dtype), size, scale, mode, align)
    tol = 1e-12 if dtype == kiln.float64 else 2e-6
    np.testing.assert_allclose(got.asnumpy(), want, rtol=tol, atol=tol)
    up = nn.Upsample(size, scale, mode, align)(kiln.Tensor(x, dtype))
    np.testing.assert_array_equal(up.asnumpy(), got.asnumpy())


@pytest.mark.parametrize("out", [(1, 1), (2, 3), (3, 3), (4, 5), (5, 7), (7, 10), (None, 2)])
def test_adaptive_max_pool_windows(out):
    x = RNG.standard_normal((2, 3, 5, 7))
    want = np_adaptive_max(x, tuple(x.shape[2 + d] if out[d] is None else out[d] for d in range(2)))
    np.testing.assert_array_equal(ops.adaptive_max_pool2d(kiln.Tensor(x), out).asnumpy(), want)
    np.testing.assert_array_equal(nn.AdaptiveMaxPool2d(out)(kiln.Tensor(x.astype(np.float32))).asnumpy(),
                                  want.astype(np.float32))


def test_gradients_by_finite_differences():
    x = RNG.standard_normal((1, 2, 5, 4))
    check_grad(lambda v: ops.interpolate(v, size=(7, 3), mode="bilinear"), x, rtol=1e-6, atol=1e-8)
    check_grad(lambda v: ops.interpolate(v, size=(3, 6), mode="bilinear", align_corners=True), x, rtol=1e-6,
               atol=1e-8)
    check_grad(lambda v: ops.interpolate(v, scale_factor=1.5), x, rtol=1e-6, atol=1e-8)
    check_grad(lambda v: ops.adaptive_max_pool2d(v, (3, 3)), x, rtol=1e-6, atol=1e-8)
    check_grad(lambda v: ops.adaptive_max_pool2d(v, (5, 2)), x, rtol=1e-6, atol=1e-8)


def test_bad_inputs_raise_naming_the_function():
    x = kiln.Tensor(np.zeros((1, 2, 4, 4), np.float32))
    with pytest.raises(ValueError, match="interpolate: give exactly one of size and scale_factor"):
        ops.interpolate(x)
    with pytest.raises(ValueError, match="interpolate: mode must be"):
        ops.interpolate(x, size=3, mode="bicubic")
    with pytest.raises(ValueError, match=r"interpolate: mode 'bilinear' expects a 4-D input, got shape \[1, 2, 4\]"):
        ops.interpolate(kiln.Tensor(np.zeros((1, 2, 4), np.float32)), size=3, mode="bilinear")
    with pytest.raises(ValueError, match="interpolate: size must be a positive int or 2 of them"):
        ops.interpolate(x, size=(3, 0))
    with pytest.raises(ValueError, match="interpolate: align_corners is for the linear modes"):
        ops.interpolate(x, size=3, align_corners=True)
    with pytest.raises(ValueError, match=r"Upsample: expected \(N, C, spatial...\) .* got \[2, 4\]"):
        nn.Upsample(scale_factor=2)(kiln.Tensor(np.zeros((2, 4), np.float32)))
    with pytest.raises(ValueError, match="Upsample: mode must be"):
        nn.Upsample(scale_factor=2, mode="area")
    with pytest.raises(ValueError, match=r"AdaptiveMaxPool2d: expected \(N, C, H, W\), got \[2, 4\]"):
        nn.AdaptiveMaxPool2d(2)(kiln.Tensor(np.zeros((2, 4), np.float32)))
    with pytest.raises(ValueError, match="AdaptiveMaxPool2d: output_size must be"):
        nn.AdaptiveMaxPool2d((0, 2))
    with pytest.raises(ValueError, match=r"interpolate: an output of spatial size \(1048576, 1048576\) .* holds "
                                         r"more than 2\*\*31 elements"):
        ops.interpolate(x, size=(2 ** 20, 2 ** 20))
    with pytest.raises(ValueError, match="adaptive_max_pool2d: an output of spatial size .* more than 2"):
        ops.adaptive_max_pool2d(x, (2 ** 40, 2))
    with pytest.raises(ValueError, match="adaptive_max_pool2d: return_indices=True is not supported"):
        ops.adaptive_max_pool2d(x, 2, return_indices=True)


def test_torch_parity():
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((2, 3, 5, 7))
    for kw in (dict(size=(9, 4), mode="bilinear", align_corners=False), dict(scale_factor=2.5, mode="bilinear",
                                                                              align_corners=True),
               dict(scale_factor=1.7, mode="nearest"), dict(size=(3, 11), mode="nearest")):
        want = torch.nn.functional.interpolate(torch.tensor(x), **kw).numpy()
        np.testing.assert_allclose(ops.interpolate(kiln.Tensor(x), **kw).asnumpy(), want, rtol=1e-12, atol=1e-12)
    for align in (False, True):
        xt = torch.tensor(x, requires_grad=True)
        yt = torch.nn.functional.interpolate(xt, size=(8, 3), mode="bilinear", align_corners=align)
        gy = RNG.standard_normal(tuple(yt.shape))
        yt.backward(torch.tensor(gy))
        g = kiln.grad(lambda v: (ops.interpolate(v, (8, 3), None, "bilinear", align) * kiln.Tensor(gy)).sum())(
            kiln.Tensor(x))
        np.testing.assert_allclose(g.asnumpy(), xt.grad.numpy(), rtol=1e-12, atol=1e-12)
    xt = torch.tensor(x, requires_grad=True)
    yt = torch.nn.functional.adaptive_max_pool2d(xt, (3, 4))
    gy = RNG.standard_normal(tuple(yt.shape))
    yt.backward(torch.tensor(gy))
    g = kiln.grad(lambda v: (ops.adaptive_max_pool2d(v, (3, 4)) * kiln.Tensor(gy)).sum())(kiln.Tensor(x))
    np.testing.assert_allclose(ops.adaptive_max_pool2d(kiln.Tensor(x), (3, 4)).asnumpy(), yt.detach().numpy())
    np.testing.assert_allclose(g.asnumpy(), xt.grad.numpy(), rtol=1e-12)


def test_compiled_variants_agree_with_eager_forward_and_backward():
    up = nn.Upsample(scale_factor=(1.5, 2), mode="bilinear", align_corners=False)
    corners = nn.Upsample(size=(6, 5), mode="bilinear", align_corners=True)
    pool = nn.AdaptiveMaxPool2d((3, 4))

    def f(x):
        return pool(up(x)), corners(x), ops.interpolate(x, size=(7, 3))

    args = lambda s: (kiln.Tensor(RNG.standard_normal((2, 3, 4, 5)).astype(np.float32) * s),)  # noqa: E731
    run_all_modes(f, args(1.0), args(3.0))
    run_all_modes(f, args(1.0), args(3.0), variants=TRACE_VARIANTS)  # kiln.trace, MegEngine's

    def loss(x):
        return (pool(up(x)) ** 2).sum() + corners(x).sum()

    run_all_modes(loss, args(1.0), args(0.5), around=lambda f: kiln.value_and_grad(f))


def test_onnx_export_of_resizing_and_pooling(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")

    net = nn.SequentialCell(nn.Upsample(scale_factor=1.5, mode="bilinear"), nn.AdaptiveMaxPool2d((3, 4)),
                            nn.Upsample(size=(5, 7)))
    x = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
    path = str(tmp_path / "resize.onnx")
    onnx_runtime.export_checked(net, [x], path)
    got = onnx_runtime.run(path, [x])[0]
    np.testing.assert_allclose(got, net(kiln.Tensor(x)).asnumpy(), rtol=1e-6, atol=1e-6)
