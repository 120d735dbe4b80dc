"""kiln.amp's user-facing pieces: autocast as context manager and decorator (nesting, restoring,
per thread), kiln.autocast (PyTorch's spelling), auto_mixed_precision and Cell.to_float, and the
errors bad arguments get."""
import threading

import numpy as np
import pytest

import kiln
from kiln import _C, amp, nn, ops

BF = kiln.bfloat16


def mats(seed=0):
    rng = np.random.default_rng(seed)
    return (kiln.tensor(rng.standard_normal((3, 4)).astype(np.float32)),
            kiln.tensor(rng.standard_normal((4, 2)).astype(np.float32)))


def test_autocast_nests_and_restores():
    a, b = mats()
    assert _C.amp_state() is None
    with amp.autocast(low_prec_dtype=BF):
        assert ops.matmul(a, b).dtype is BF
        with amp.autocast(enabled=False):
            assert _C.amp_state() is None and ops.matmul(a, b).dtype is kiln.float32
        with amp.autocast(low_prec_dtype=kiln.float16):
            assert ops.matmul(a, b).dtype is kiln.float16
        assert _C.amp_state() == (1, BF)
    assert _C.amp_state() is None


def test_autocast_restores_after_an_exception():
    with pytest.raises(ZeroDivisionError):
        with amp.autocast(low_prec_dtype=BF):
            1 / 0
    assert _C.amp_state() is None


def test_autocast_as_decorator_and_reused_object():
    a, b = mats()
    ac = amp.autocast(low_prec_dtype=BF, level="O3")

    @ac
    def f(x, y):
        return ops.relu(x) @ y

    assert f(a, b).dtype is BF and _C.amp_state() is None
    with ac:
        with ac:  # the same object entered twice
            assert _C.amp_state() == (3, BF)
        assert _C.amp_state() == (3, BF)
    assert _C.amp_state() is None


def test_pytorch_spelling():
    a, b = mats()
    with kiln.autocast("cpu"):  # bfloat16 by default, as PyTorch's on the CPU
        assert ops.matmul(a, b).dtype is BF
    with kiln.autocast("cpu", dtype=kiln.float16):
        assert ops.matmul(a, b).dtype is kiln.float16
    with pytest.raises(ValueError, match="cpu"):
        kiln.autocast("cuda")


def test_each_thread_has_its_own_setting():
    a, b = mats()
    seen = {}

    def other():
        seen["state"] = _C.amp_state()
        seen["dtype"] = ops.matmul(a, b).dtype

    with amp.autocast(low_prec_dtype=BF):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == {"state": None, "dtype": kiln.float32}


def test_backward_inside_autocast_runs_the_forwards_dtypes():
    a, b = mats()
    b = nn.Parameter(b, "b")
    with amp.autocast(low_prec_dtype=BF):
        loss, (g,) = kiln.value_and_grad(lambda x, w: ops.matmul(x, w).astype(kiln.float32).sum(), None, [b])(a, b)
    assert g.dtype is kiln.float32
    want = np.ones((3, 2)).T @ a.astype(BF).astype(kiln.float32).numpy()
    np.testing.assert_allclose(g.numpy(), want.T, rtol=1e-2, atol=1e-2)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 8)
        self.bn = nn.BatchNorm1d(8)
        self.out = nn.Dense(8, 2)
        self.loss = nn.MSELoss()

    def construct(self, x):
        return self.out(ops.relu(self.bn(self.fc(x))))


def test_auto_mixed_precision_levels():
    net = Net()
    x = mats()[0]
    assert amp.auto_mixed_precision(net, "O0") is net
    o1 = amp.auto_mixed_precision(net, "O1", BF)
    assert o1(x).dtype is kiln.float32  # O1 and O2 give float32 outputs
    assert net.bn.__dict__.get("_amp") is None
    o2 = amp.auto_mixed_precision(net, "O2", BF)
    assert net.bn._amp == (3, kiln.float32) and net.loss._amp == (3, kiln.float32)  # norms and losses float32
    assert o2(x).dtype is kiln.float32
    o3 = amp.auto_mixed_precision(Net(), "O3", BF)
    assert o3(x).dtype is BF
    assert [p.dtype for p in o2.trainable_params()] == [kiln.float32] * len(o2.trainable_params())
    with pytest.raises(ValueError, match="amp_level"):
        amp.auto_mixed_precision(net, "O4")
    with pytest.raises(TypeError, match="dtype"):
        amp.auto_mixed_precision(net, "O1", kiln.int32)
    with pytest.raises(TypeError, match="Cell"):
        amp.auto_mixed_precision(lambda x: x, "O1")


def test_to_float_sets_a_cells_dtype_and_float32_keeps_a_part_exact():
    a, b = mats()

    class Inner(nn.Cell):
        def construct(self, x, y):
            return ops.matmul(x, y) * 2.0

    class Outer(nn.Cell):
        def __init__(self):
            super().__init__()
            self.inner = Inner().to_float(kiln.float32)

        def construct(self, x, y):
            return self.inner(x, y), ops.matmul(x, y)

    outer = Outer().to_float(BF)
    kept, low = outer(a, b)
    assert kept.dtype is kiln.float32 and low.dtype is BF
    np.testing.assert_array_equal(kept.numpy(), (ops.matmul(a, b) * 2.0).numpy())
    with pytest.raises(TypeError, match="dst_type"):
        Inner().to_float(kiln.int64)


def test_autocast_bad_arguments():
    with pytest.raises(TypeError, match="dtype"):
        amp.autocast(low_prec_dtype=kiln.int32)
    with pytest.raises(TypeError, match="high_prec_dtype"):
        amp.autocast(high_prec_dtype=kiln.float64)
    with pytest.raises(ValueError, match="amp_level"):
        amp.autocast(level="O9")
    with pytest.raises(TypeError, match="decorates"):
        amp.autocast()(3)
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        _C.amp_set(1, kiln.int32)
    with pytest.raises(ValueError, match="O0, O1, O2 or O3"):
        _C.amp_set(7, BF)
    assert _C.amp_state() is None
