"""Hostile input never crashes (issue 18, items 1-3): read-only buffers give read-only tensors whose
in-place writes raise, set_num_threads is range-checked, huge shapes raise instead of overflowing.
The reproducers that used to crash the process run in a subprocess, so a crash fails the test
instead of killing pytest."""
import numpy as np
import pytest

import kiln
from conftest import run_isolated
from kiln import nn, ops

READ_ONLY = "assignment destination is read-only"


def read_only_f32(n=4):
    return kiln.from_numpy(np.frombuffer(bytes(4 * n), np.float32))


# ---- 1. read-only buffers -----------------------------------------------------------------

def test_mmap_read_only_write_raises_in_subprocess(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(4096))
    rc, out = run_isolated(f"""
        import mmap, numpy as np, kiln
        with open({str(path)!r}, "rb") as f:
            m = mmap.mmap(f.fileno(), 4096, access=mmap.ACCESS_READ)
        t = kiln.from_numpy(np.frombuffer(m, np.float32))
        try:
            t[0] = 1.0
        except ValueError as e:
            print("raised:", e)
        else:
            print("no error")
        print("value", float(t[0].item()), t._read_only)
        """)
    assert rc == 0, out
    assert "raised:" in out and READ_ONLY in out, out
    assert "value 0.0 True" in out, out


def test_bytes_stay_immutable():
    b = bytes(16)
    t = kiln.from_numpy(np.frombuffer(b, np.float32))
    assert t._read_only
    with pytest.raises(ValueError, match=READ_ONLY):
        t[0] = 1.0
    assert b == bytes(16)
    # reading still works, and copies are writable
    assert ops.sum(t).item() == 0.0
    c = kiln.Tensor(np.frombuffer(b, np.float32))
    assert not c._read_only
    c[0] = 1.0
    assert c.asnumpy()[0] == 1.0 and b == bytes(16)


def test_broadcast_to_view_write_raises():
    a = np.arange(3, dtype=np.float32)
    t = kiln.from_numpy(np.broadcast_to(a, (4, 3)))
    with pytest.raises(ValueError, match=READ_ONLY):
        t[0] = 9.0
    np.testing.assert_array_equal(a, [0, 1, 2])


def test_kiln_broadcast_view_write_raises():
    x = kiln.Tensor(np.arange(3, dtype=np.float32))
    e = ops.broadcast_to(x, (4, 3))
    with pytest.raises(ValueError, match="broadcast view of shape"):
        e[0] = 9.0
    with pytest.raises(ValueError, match=READ_ONLY):
        e[kiln.Tensor(np.array([0, 2]))] = 1.0
    np.testing.assert_array_equal(x.asnumpy(), [0, 1, 2])


def test_writable_array_stays_shared():
    a = np.zeros(4, np.float32)
    t = kiln.from_numpy(a)
    assert not t._read_only
    t[1] = 5.0
    assert a[1] == 5.0


@pytest.mark.parametrize("write", [
    lambda t: t.__setitem__(0, 1.0),
    lambda t: t.__setitem__(slice(None), 1.0),
    lambda t: t.__setitem__(Ellipsis, kiln.Tensor(np.ones(4, np.float32))),
    lambda t: t.__setitem__(kiln.Tensor(np.array([1, 3])), 2.0),
    lambda t: t.__setitem__(kiln.Tensor(np.array([True, False, True, False])), 2.0),
    lambda t: t.assign_value(1.0),
    lambda t: t.fill_(2.0),
    lambda t: t.zero_(),
], ids=["int", "slice", "ellipsis", "int-index", "mask", "assign_value", "fill_", "zero_"])
def test_in_place_paths_raise(write):
    b = bytes(16)
    t = kiln.from_numpy(np.frombuffer(b, np.float32))
    version = t._version
    with pytest.raises(ValueError, match=READ_ONLY):
        write(t)
    assert b == bytes(16) and t._version == version


def test_views_of_read_only_tensor_are_read_only():
    t = read_only_f32(6).reshape((2, 3))
    row = t[1]
    assert row._read_only
    with pytest.raises(ValueError, match=READ_ONLY):
        row[0] = 1.0
    assert t.detach()._read_only


def test_numpy_export_is_read_only():
    t = read_only_f32()
    a = np.asarray(t)
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0] = 1.0
    b = ops.broadcast_to(kiln.Tensor(np.ones(3, np.float32)), (2, 3)).asnumpy()
    assert not b.flags.writeable
    assert np.asarray(kiln.Tensor(np.ones(3, np.float32))).flags.writeable


@pytest.mark.parametrize("make", [
    lambda ps: nn.SGD(ps, learning_rate=0.1),
    lambda ps: nn.SGD(ps, learning_rate=0.1, momentum=0.9),
    lambda ps: nn.Adam(ps, learning_rate=0.1),
], ids=["sgd", "sgd-momentum", "adam"])
def test_optimizer_update_of_read_only_parameter_raises(make):
    b = bytes(16)
    p = kiln.from_numpy(np.frombuffer(b, np.float32))
    p.requires_grad = True
    opt = make([p])
    g = kiln.Tensor(np.ones(4, np.float32))
    with pytest.raises(ValueError, match=READ_ONLY):
        opt((g,))
    assert b == bytes(16)


def test_batch_norm_read_only_running_stats_raises():
    x = kiln.Tensor(np.random.default_rng(0).standard_normal((4, 2, 3, 3)).astype(np.float32))
    gamma, beta = kiln.Tensor(np.ones(2, np.float32)), kiln.Tensor(np.zeros(2, np.float32))
    mean, var = read_only_f32(2), kiln.from_numpy(np.frombuffer(np.ones(2, np.float32).tobytes(), np.float32))
    from kiln._C import apply
    from kiln._optable import OP
    with pytest.raises(ValueError, match="batch_norm: assignment destination is read-only"):
        apply(OP.batch_norm, (x, gamma, beta, mean, var), (1,), (1e-5, 0.1))
    # inference only reads them
    y = apply(OP.batch_norm, (x, gamma, beta, mean, var), (0,), (1e-5, 0.1))
    assert y[0].shape == (4, 2, 3, 3)


@pytest.mark.parametrize("backend", ["kbk", "sink"])
@pytest.mark.parametrize("capture_mode", ["trace", "ast"])
def test_jit_graph_writing_a_read_only_input_raises(backend, capture_mode):
    @kiln.jit(backend=backend, capture_mode=capture_mode)
    def f(x):
        x[0] = 5.0
        return x + 1

    w = kiln.Tensor(np.zeros(4, np.float32))
    f(w)
    f(w)  # compiled
    assert w.asnumpy()[0] == 5.0
    b = bytes(16)
    with pytest.raises(ValueError, match=READ_ONLY):
        f(kiln.from_numpy(np.frombuffer(b, np.float32)))
    assert b == bytes(16)
    a = np.arange(4, dtype=np.float32)
    with pytest.raises(ValueError, match=READ_ONLY):
        f(kiln.from_numpy(np.broadcast_to(a, (3, 4))[0]))
    np.testing.assert_array_equal(a, np.arange(4))


def test_jit_graph_reading_a_read_only_input_runs():
    @kiln.jit
    def f(x):
        return x * 2

    t = read_only_f32()
    assert f(t).asnumpy().tolist() == [0, 0, 0, 0]
    assert f(t).asnumpy().tolist() == [0, 0, 0, 0]


# ---- 2. set_num_threads -----------------------------------------------------------------------

def test_set_num_threads_huge_raises_in_subprocess():
    rc, out = run_isolated("""
        import kiln
        before = kiln.get_num_threads()
        for n in (10**5, 2**40, 2**32 + 3, 2**64, 0, -1, 1025):
            try:
                kiln.set_num_threads(n)
            except ValueError as e:
                print("ValueError", e)
            else:
                print("accepted", n)
        assert kiln.get_num_threads() == before
        print(float(kiln.ops.ones((512, 512)).sum().item()))
        """)
    assert rc == 0, out
    assert "accepted" not in out, out
    assert out.count("ValueError set_num_threads: the count must be between 1 and 1024") == 7, out
    assert "got 4294967299" in out and "got 18446744073709551616" in out, out
    assert "262144.0" in out, out


@pytest.mark.parametrize("bad", [2.0, "2", None, True, [2]])
def test_set_num_threads_non_int_raises_type_error(bad):
    before = kiln.get_num_threads()
    with pytest.raises(TypeError, match="set_num_threads: the count must be an int"):
        kiln.set_num_threads(bad)
    assert kiln.get_num_threads() == before


def test_set_num_threads_accepts_ints():
    before = kiln.get_num_threads()
    try:
        kiln.set_num_threads(np.int64(1))
        assert kiln.get_num_threads() == 1
        kiln.set_num_threads(1024)
        assert kiln.get_num_threads() == 1024
    finally:
        kiln.set_num_threads(before)


# ---- 3. huge shapes ------------------------------------------------------------------------------

TOO_LARGE = "is too large: a tensor holds at most 2\\^59 elements"


@pytest.mark.parametrize("make", [
    lambda: ops.zeros((2**40, 2**40)),
    lambda: ops.ones((2**40, 2**40)),
    lambda: ops.full((2**31, 2**31, 2**31), 1.0),
    lambda: ops.zeros((0, 2**40, 2**40)),
    lambda: ops.eye(2**40, 2**40),
    lambda: ops.arange(0, 2**62),
    lambda: kiln.Tensor(np.zeros(4, np.float32)).reshape((2**62, 2**62, 0, 4)),
    lambda: ops.broadcast_to(kiln.Tensor(np.zeros(1, np.float32)), (2**40, 2**40)),
], ids=["zeros", "ones", "full", "zero-dim", "eye", "arange", "reshape", "broadcast_to"])
def test_huge_shapes_raise(make):
    with pytest.raises(ValueError, match=TOO_LARGE):
        make()


def test_broadcast_of_huge_views_raises():
    a = ops.broadcast_to(kiln.Tensor(np.zeros((1, 1), np.float32)), (2**31, 1))
    b = ops.broadcast_to(kiln.Tensor(np.zeros((1, 1), np.float32)), (1, 2**31))
    with pytest.raises(ValueError, match="broadcasting"):
        a + b


def test_huge_shapes_in_subprocess():
    rc, out = run_isolated("""
        import kiln, numpy as np
        from kiln import ops
        for make in (lambda: ops.zeros((2**40, 2**40)), lambda: ops.rand((2**32 + 1, 2**32 - 1)),
                     lambda: ops.zeros((2**62, 4))):
            try:
                make()
            except ValueError as e:
                print("ValueError", e)
        """)
    assert rc == 0, out
    assert out.count("ValueError") == 3, out


def test_negative_dims_raise():
    with pytest.raises(ValueError, match="negative dimension"):
        ops.zeros((2, -3))
