"""Tensor and process settings as MindSpore and PyTorch users spell them: in-place methods (add_,
mul_, ... keep the tensor's dtype and shape or refuse), type()/is_floating_point()/element_size()/
ndimension()/mT, NumPy dtypes as dtype=, NumPy reductions of a tensor (np.sum(t)),
set_context(device_target=), set_seed."""
import numpy as np
import pytest

import kiln
from kiln import nn
from conformance import rand, run_all_modes


def test_in_place_methods_match_numpy():
    a = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    z = kiln.Tensor(a.copy())
    same = z.add_(kiln.Tensor(np.ones(3, np.float32)), alpha=2).mul_(0.5).sub_(1).div_(4).clamp_(-0.2, 0.3)
    assert same is z
    want = np.clip((((a + 2.0) * 0.5) - 1) / 4, -0.2, 0.3)
    np.testing.assert_allclose(z.asnumpy(), want, rtol=1e-6)
    z.neg_().abs_().pow_(2).sqrt_()
    np.testing.assert_allclose(z.asnumpy(), np.abs(want), rtol=1e-6)
    z.copy_(kiln.Tensor(np.array([7.0, 8.0, 9.0], np.float32)))
    np.testing.assert_allclose(z.asnumpy(), np.tile([7.0, 8.0, 9.0], (2, 1)))
    i = kiln.Tensor(np.array([1, 2], np.int64))
    i.copy_(kiln.Tensor(np.array([2.7, -3.2], np.float32)))  # copy_ converts, as PyTorch's
    assert i.asnumpy().tolist() == [2, -3] and i.dtype == kiln.int64


def test_in_place_methods_refuse_what_would_change_dtype_or_shape():
    i = kiln.Tensor(np.array([1, 2], np.int64))
    with pytest.raises(TypeError, match="add_.*float32.*int64"):
        i.add_(0.5)
    z = kiln.Tensor(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"mul_.*\[4, 2, 3\].*\[2, 3\]"):
        z.mul_(kiln.Tensor(np.ones((4, 2, 3), np.float32)))
    assert z.asnumpy().tolist() == np.ones((2, 3)).tolist()


def test_in_place_methods_compiled_agree_with_eager():
    def f(x, y):
        z = x * 1
        z.add_(y, alpha=0.5)
        z.clamp_(max=0.8)
        w = z.mul_(2)
        return w, z

    run_all_modes(f, (rand(3), rand(3, seed=1)), (rand(3, seed=2), rand(3, seed=3)))


def test_descriptive_methods():
    x = kiln.Tensor(np.zeros((4, 2, 3), np.float16))
    assert x.type() == "Float16" and x.type(np.float32).dtype == kiln.float32
    assert x.is_floating_point() and not kiln.Tensor(np.array([1])).is_floating_point()
    assert x.element_size() == 2 and x.ndimension() == 3 and x.nelement() == 24
    assert tuple(x.mT.shape) == (4, 3, 2)
    with pytest.raises(ValueError, match="mT"):
        kiln.Tensor(np.zeros(3, np.float32)).mT


@pytest.mark.parametrize("dtype, want", [(np.float32, "float32"), (np.dtype("int64"), "int64"), (np.int8, "int8"),
                                         (bool, "bool"), (np.float16, "float16"), ("float64", "float64")])
def test_numpy_dtypes_as_dtype(dtype, want):
    assert kiln.Tensor(np.ones(2), dtype=dtype).dtype.name == want
    assert kiln.ops.zeros(2, dtype=dtype).dtype.name == want
    assert kiln.Tensor([1.5]).astype(dtype).dtype.name == want


def test_a_dtype_kiln_lacks_is_refused_clearly():
    with pytest.raises(TypeError, match="NumPy dtype kiln has.*complex64"):
        kiln.Tensor(np.ones(2), dtype=np.complex64)
    with pytest.raises(TypeError, match="zeros"):
        kiln.ops.zeros(2, dtype=object())


def test_numpy_reductions_of_a_tensor():
    a = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    t = kiln.Tensor(a)
    for np_fn in (np.sum, np.mean, np.max, np.min, np.prod, np.std, np.var, np.argmax, np.argmin):
        np.testing.assert_allclose(np.asarray(np_fn(t)), np_fn(a), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(np_fn(t, axis=1)), np_fn(a, axis=1), rtol=1e-5)
    assert np.sum(t, dtype=np.float64).dtype == kiln.float64
    with pytest.raises(TypeError, match="out="):
        np.sum(t, out=np.zeros(()))


def test_set_context_device_target():
    kiln.set_context(device_target="CPU")
    assert kiln.get_context("device_target") == "CPU"
    kiln.set_context(device_target="cpu", device_id=0)
    for other in ("GPU", "Ascend"):  # a MindSpore script's first line: it runs, on the CPU, with a warning
        with pytest.warns(RuntimeWarning, match=f"device_target '{other}' is not available; kiln runs on the CPU"):
            kiln.set_context(device_target=other)
        assert kiln.get_context("device_target") == "CPU"
    with pytest.raises(ValueError, match="device_target"):
        kiln.set_context(device_target=3)
    with pytest.raises(ValueError, match="device_id"):
        kiln.set_context(device_id=1)


def test_set_context_jit_level_and_save_graphs(tmp_path):
    try:
        kiln.set_context(jit_level="O1", save_graphs=True, save_graphs_path=str(tmp_path / "ir"))
        f = kiln.jit(lambda a, b: a * b + 1)
        assert f.options.jit_level == "O1" and kiln.jit(lambda a: a, jit_level="O0").options.jit_level == "O0"
        x = rand(3)
        np.testing.assert_allclose(f(x, x).asnumpy(), (x * x + 1).asnumpy())
        files = list((tmp_path / "ir").iterdir())
        assert len(files) == 1 and files[0].suffix == ".ir" and "mul" in files[0].read_text()
        with pytest.raises(ValueError, match="jit_level"):
            kiln.set_context(jit_level="O3")
        with pytest.raises(ValueError, match="save_graphs"):
            kiln.set_context(save_graphs=7)
    finally:
        kiln.set_context(jit_level="", save_graphs=False, save_graphs_path=".")


def test_set_seed_makes_initializers_random_ops_and_numpy_repeat():
    draws = []
    for _ in range(2):
        kiln.set_seed(123)
        draws.append((nn.Dense(4, 3).weight.asnumpy().copy(), kiln.ops.randn(5).asnumpy().copy(), np.random.rand(2)))
    for a, b in zip(*draws):
        np.testing.assert_array_equal(a, b)
    assert kiln.get_seed() == 123
    for bad in (-1, 2 ** 32, 1.5, True):
        with pytest.raises(ValueError, match="set_seed"):
            kiln.set_seed(bad)


def test_repr_rows_line_up_under_the_first():
    text = repr(kiln.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)))
    assert text == "Tensor(shape=[2, 3], dtype=float32, value=\n[[0., 1., 2.],\n [3., 4., 5.]])"


def test_addcmul_addcdiv_and_amin_amax():
    a = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]], np.float32)
    t1, t2 = kiln.Tensor(a * 2), kiln.Tensor(a + 5)
    z = kiln.Tensor(a.copy())
    z.addcmul_(t1, t2, value=0.5).addcdiv_(t1, t2, value=-2)
    np.testing.assert_allclose(z.asnumpy(), a + 0.5 * (a * 2) * (a + 5) - 2 * (a * 2) / (a + 5), rtol=1e-6)
    t = kiln.Tensor(a)
    np.testing.assert_allclose(t.amax(1).asnumpy(), a.max(1))
    np.testing.assert_allclose(t.amin((0, 1)).asnumpy(), a.min())


def test_tensor_from_a_python_number_keeps_it_in_the_dtype_asked():
    import numpy as np
    assert kiln.Tensor(0.1, kiln.float64).item() == 0.1  # not 0.1 rounded to float32 on the way
    assert kiln.Tensor([0.1, 0.7], kiln.float64).asnumpy().tolist() == [0.1, 0.7]
    assert kiln.Tensor(2 ** 53 + 1, kiln.int64).item() == 2 ** 53 + 1
    assert kiln.Tensor(2.7, kiln.int32).item() == 2 and kiln.Tensor(True, kiln.float32).item() == 1.0
    for value, dtype, error in [(2 ** 40, kiln.int32, OverflowError), (300, kiln.int8, OverflowError),
                                (2 ** 70, kiln.int64, OverflowError), ([1, 300], kiln.int8, OverflowError),
                                (float("nan"), kiln.int64, ValueError), (1e30, kiln.int32, ValueError)]:
        with pytest.raises(error):
            kiln.Tensor(value, dtype)
    np.testing.assert_array_equal(kiln.Tensor([[1, 2], [3, 4]], kiln.int8).asnumpy(), [[1, 2], [3, 4]])
