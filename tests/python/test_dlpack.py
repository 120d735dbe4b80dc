"""DLPack both ways: Tensor.__dlpack__ / __dlpack_device__ and kiln.from_dlpack, against NumPy
(np.from_dlpack, ndarray.__dlpack__), a DLPack producer written here with ctypes (to watch the
deleter and craft what NumPy never exports), and PyTorch and JAX when they are installed."""
import ctypes
import gc
import sys
import weakref

import numpy as np
import pytest

import kiln

NP_DTYPES = (np.bool_, np.int8, np.int32, np.int64, np.float16, np.float32, np.float64)


def values(dtype, shape=(3, 4)):
    n = int(np.prod(shape))
    return ((np.arange(n) * 7) % 5 - 2).astype(dtype).reshape(shape)


def in_use():
    gc.collect()
    return kiln._C.memory_stats()[0]


# ---- NumPy: round trips, aliasing, dtypes ------------------------------------------------------

@pytest.mark.parametrize("dtype", NP_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_to_kiln_shares_memory(dtype):
    a = values(dtype)
    t = kiln.from_dlpack(a)
    assert t.dtype.name == np.dtype(dtype).name and t.shape == a.shape
    assert t._data_ptr == a.ctypes.data
    np.testing.assert_array_equal(np.asarray(t), a)
    a[1, 2] = 1  # a write through NumPy is seen by kiln ...
    assert t[1, 2].item() == 1
    t[0, 0] = 0  # ... and the other way round
    assert a[0, 0] == 0
    assert not t._read_only


@pytest.mark.parametrize("dtype", NP_DTYPES, ids=lambda d: np.dtype(d).name)
def test_kiln_to_numpy_shares_memory(dtype):
    t = kiln.Tensor(values(dtype))
    a = np.from_dlpack(t)
    assert a.dtype == dtype and a.shape == t.shape and a.flags.writeable
    assert a.ctypes.data == t._data_ptr
    np.testing.assert_array_equal(a, np.asarray(t))
    a[2, 3] = 1
    assert t[2, 3].item() == 1
    t[0, 1] = 0
    assert a[0, 1] == 0


def test_bfloat16_travels_as_dlpack_bfloat():
    # NumPy has no bfloat16: kiln reads back its own capsule, and the bits are the same memory
    t = kiln.Tensor(np.array([1.5, -2.0, 3.25]), kiln.bfloat16)
    back = kiln.from_dlpack(t.__dlpack__(max_version=(1, 0)))
    assert back.dtype is kiln.bfloat16 and back._data_ptr == t._data_ptr
    np.testing.assert_array_equal(back.float().asnumpy(), [1.5, -2.0, 3.25])


@pytest.mark.parametrize("make", [
    lambda a: a[::-1],                   # negative stride
    lambda a: a[:, ::2],                 # gaps
    lambda a: a.T,                       # transposed
    lambda a: a[1:, 2:],                 # an offset into the buffer
    lambda a: a[::-2, ::-3],
    lambda a: a[2, 1, ...],              # 0-d
    lambda a: a[:0],                     # empty
    lambda a: a.reshape(2, 3, 2, 5)[:, :, :, 1:4],
], ids=["reversed", "step", "transposed", "offset", "negative-steps", "0d", "empty", "4d"])
def test_views_both_ways(make):
    base = np.arange(60, dtype=np.float64).reshape(6, 10)
    a = make(base)
    t = kiln.from_dlpack(a)
    np.testing.assert_array_equal(np.asarray(t), a)
    if a.size:
        assert t._data_ptr == a.ctypes.data
    # a kiln view exported: NumPy sees its layout, no copy
    k = make(kiln.from_numpy(base))
    b = np.from_dlpack(k)
    np.testing.assert_array_equal(b, a)
    assert b.strides == a.strides
    if a.size:
        assert b.ctypes.data == a.ctypes.data


def test_kiln_ops_on_imported_views_match_numpy():
    base = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    a = base[::-1, 1::2]
    t = kiln.from_dlpack(a)
    np.testing.assert_allclose((kiln.ops.exp(t) * 2 + t.sum(axis=0)).asnumpy(), np.exp(a) * 2 + a.sum(axis=0),
                               rtol=1e-6)


def test_capsule_names_follow_max_version():
    t = kiln.Tensor(np.arange(3.0))
    assert 'capsule object "dltensor"' in repr(t.__dlpack__())
    assert 'capsule object "dltensor"' in repr(t.__dlpack__(max_version=(0, 8)))
    cap = t.__dlpack__(max_version=(1, 0))
    assert 'capsule object "dltensor_versioned"' in repr(cap)
    u = kiln.from_dlpack(cap)  # the consumer renames what it took over
    assert 'capsule object "used_dltensor_versioned"' in repr(cap)
    with pytest.raises(ValueError, match="consumed already"):
        kiln.from_dlpack(cap)
    legacy = np.arange(3.0).__dlpack__()
    kiln.from_dlpack(legacy)
    assert 'capsule object "used_dltensor"' in repr(legacy)
    np.testing.assert_array_equal(u.asnumpy(), [0, 1, 2])
    assert t.__dlpack_device__() == (1, 0)


def test_from_dlpack_of_a_kiln_tensor_shares_its_storage():
    t = kiln.from_numpy(np.broadcast_to(np.arange(4.0), (2, 4)))
    v = kiln.from_dlpack(t)
    assert v._shares_storage(t) and v._read_only and v._strides == t._strides
    w = kiln.Tensor(np.arange(4.0))
    kiln.from_dlpack(w)[1] = 9  # same storage: the write is seen, and counted, in w
    assert w[1].item() == 9 and w._version == 1


def test_tensor_constructor_copies_through_dlpack():
    class OnlyDLPack:  # no buffer protocol, no __array__: the way a torch or jax tensor looks
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kwargs):
            return self.a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    a = values(np.float64)
    t = kiln.Tensor(OnlyDLPack(a))
    np.testing.assert_array_equal(t.asnumpy(), a)
    a[0, 0] = 42  # Tensor() copies
    assert t[0, 0].item() != 42
    assert kiln.Tensor(OnlyDLPack(a), kiln.float32).dtype is kiln.float32


def test_producer_without_max_version_gets_the_legacy_call():
    seen = []

    class OldProducer:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, stream=None):  # before the array API's 2023.12 revision
            seen.append(stream)
            return self.a.__dlpack__()

    a = values(np.int32)
    t = kiln.from_dlpack(OldProducer(a))
    np.testing.assert_array_equal(t.asnumpy(), a)
    assert seen == [None]


# ---- read-only -------------------------------------------------------------------------------

def test_read_only_numpy_gives_read_only_tensor():
    a = values(np.float32)
    a.flags.writeable = False
    t = kiln.from_dlpack(a)
    assert t._read_only
    with pytest.raises(ValueError, match="read-only"):
        t[0, 0] = 1
    with pytest.raises(ValueError, match="read-only"):
        t[1:][0] = 1  # views of it too
    np.testing.assert_array_equal(t.asnumpy(), a)
    w = kiln.from_dlpack(a, copy=True)  # a writable copy of kiln's own
    assert not w._read_only and w._data_ptr != a.ctypes.data
    w[0, 0] = 1
    assert a[0, 0] == -2 and w[0, 0].item() == 1


@pytest.mark.parametrize("make", [
    lambda: kiln.from_numpy(np.broadcast_to(np.arange(4.0), (3, 4))),   # read-only storage
    lambda: kiln.ops.broadcast_to(kiln.Tensor(np.arange(4.0)), (3, 4)),  # stride 0: never written
], ids=["read-only-storage", "broadcast-view"])
def test_read_only_tensor_exports(make):
    t = make()
    a = np.from_dlpack(t)  # NumPy asks for max_version (1, 0): the read-only flag says it
    assert not a.flags.writeable
    np.testing.assert_array_equal(a, np.broadcast_to(np.arange(4.0), (3, 4)))
    # the legacy form cannot say read-only: refused, as NumPy refuses its read-only arrays
    with pytest.raises(BufferError, match="read-only"):
        t.__dlpack__()
    with pytest.raises(BufferError, match="readonly"):
        np.broadcast_to(np.arange(4.0), (3, 4)).__dlpack__()
    # unless the consumer asks for a copy: contiguous, writable, the tensor's own memory untouched
    c = kiln.from_dlpack(t.__dlpack__(copy=True))
    assert not c._read_only and c.is_contiguous() and c._data_ptr != t._data_ptr
    c[0, 0] = 7
    assert t[0, 0].item() == 0
    versioned = np.from_dlpack(kiln.from_dlpack(t.__dlpack__(max_version=(1, 0), copy=True)))
    assert versioned.flags.writeable


# ---- lifetime and leaks ------------------------------------------------------------------------

def test_numpy_producer_outlives_its_name():
    a = values(np.float64, (64, 64))
    expected = a.copy()
    alive = weakref.ref(a)
    t = kiln.from_dlpack(a)
    v = t[3:, ::2]
    del a
    gc.collect()
    assert alive() is not None  # the kiln tensor holds the producer's memory
    del t
    gc.collect()
    assert alive() is not None  # so does a view of it
    np.testing.assert_array_equal(v.asnumpy(), expected[3:, ::2])
    del v
    gc.collect()
    assert alive() is None  # the last view gone: the deleter ran


def test_kiln_producer_outlives_its_tensor():
    nbytes = 256 * 1024 * 8
    before = in_use()
    t = kiln.Tensor(np.arange(256 * 1024, dtype=np.float64))
    a = np.from_dlpack(t[::2])
    del t
    assert in_use() - before >= nbytes  # the storage lives on in the capsule's tensor
    np.testing.assert_array_equal(a, np.arange(0, 256 * 1024, 2))
    del a
    assert in_use() - before < nbytes


def test_round_trips_leak_nothing():
    a = values(np.float32, (32, 32))
    refs = sys.getrefcount(a)
    before = in_use()
    t = kiln.Tensor(values(np.float32, (32, 32)))
    for _ in range(2000):
        k = kiln.from_dlpack(a)                           # versioned, consumed
        b = np.from_dlpack(k[1:])                         # kiln exports a view
        c = kiln.from_dlpack(np.from_dlpack(t))           # kiln -> NumPy -> kiln
        t.__dlpack__(max_version=(1, 0))                  # never consumed: the capsule's destructor frees it
        t.__dlpack__()
        kiln.from_dlpack(t.__dlpack__(), copy=True)
        del k, b, c
    gc.collect()
    assert sys.getrefcount(a) == refs
    del t
    assert in_use() == before


# ---- a producer written here: deleter calls, byte offsets, what NumPy never exports ---------------

class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Versioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _DELETER), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
_VERSIONED_NAME = ctypes.create_string_buffer(b"dltensor_versioned")  # lives as long as the capsules
_OTHER_NAME = ctypes.create_string_buffer(b"some_other_capsule")


class Producer:
    """One DLManagedTensorVersioned over a NumPy buffer, counting its deleter's calls."""

    def __init__(self, buf, shape, strides=None, byte_offset=0, code=2, bits=None, device=(1, 0), major=1,
                 flags=0):
        self.buf, self.deleted = buf, 0
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * max(len(strides), 1))(*strides)
        self.deleter = _DELETER(self._delete)
        self.m = _Versioned(major, 0, None, self.deleter, flags, _DLTensor(
            buf.ctypes.data, _Device(*device), len(shape), _DType(code, bits or 8 * buf.itemsize, 1),
            self.shape, self.strides, byte_offset))

    def _delete(self, ptr):
        assert ptr == ctypes.addressof(self.m)
        self.deleted += 1

    def __dlpack__(self, **kwargs):
        return _capsule_new(ctypes.addressof(self.m), ctypes.addressof(_VERSIONED_NAME), None)


def test_deleter_runs_once_after_the_last_view():
    buf = np.arange(24, dtype=np.float32)
    p = Producer(buf, (4, 5), byte_offset=4 * 4)  # starts at element 4, NULL strides: row-major
    t = kiln.from_dlpack(p)
    np.testing.assert_array_equal(t.asnumpy(), buf[4:].reshape(4, 5))
    views = [t[1:], t.T, t[::-1, 2]]
    del t
    gc.collect()
    assert p.deleted == 0
    np.testing.assert_array_equal(views[2].asnumpy(), buf[4:].reshape(4, 5)[::-1, 2])
    views.clear()
    gc.collect()
    assert p.deleted == 1


def test_explicit_strides_and_read_only_flag():
    buf = np.arange(30, dtype=np.float64)
    p = Producer(buf, (3, 4), strides=(-6, 2), byte_offset=8 * 12, flags=1)
    t = kiln.from_dlpack(p)
    np.testing.assert_array_equal(t.asnumpy(), buf[12::-6][:3, None] + 2 * np.arange(4))
    assert t._read_only
    with pytest.raises(ValueError, match="read-only"):
        t[0, 0] = 1
    del t
    gc.collect()
    assert p.deleted == 1


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(major=2), BufferError, "DLPack 2.0"),
    (dict(device=(2, 0)), BufferError, r"device \(2, 0\)"),
    (dict(code=5, bits=64), TypeError, "complex64"),
    (dict(code=1), TypeError, "uint32"),
    (dict(byte_offset=2), BufferError, "not aligned"),
], ids=["major-version", "cuda", "complex", "uint32", "unaligned"])
def test_refused_capsules_are_still_deleted(kwargs, error, match):
    p = Producer(np.zeros(8, np.float32), (2, 3), **kwargs)
    with pytest.raises(error, match=match):
        kiln.from_dlpack(p)
    assert p.deleted == 1  # taken over, so the consumer calls the deleter, once


# ---- errors ----------------------------------------------------------------------------------------

def test_errors():
    t = kiln.Tensor(np.arange(3.0))
    with pytest.raises(TypeError, match="from_dlpack expects an object with __dlpack__"):
        kiln.from_dlpack([1, 2, 3])
    with pytest.raises(TypeError, match="uint8"):
        kiln.from_dlpack(np.arange(3, dtype=np.uint8))
    with pytest.raises(TypeError, match="complex128"):
        kiln.from_dlpack(np.arange(3, dtype=np.complex128))
    with pytest.raises(BufferError, match="stream"):
        t.__dlpack__(stream=1)
    with pytest.raises(BufferError, match="device"):
        t.__dlpack__(dl_device=(2, 0))
    with pytest.raises(TypeError, match="max_version"):
        t.__dlpack__(max_version=1)
    with pytest.raises(ValueError, match="CPU only"):
        kiln.from_dlpack(np.arange(3.0), device="cuda")
    assert kiln.from_dlpack(np.arange(3.0), device="cpu").shape == (3,)
    assert kiln.from_dlpack(np.arange(3.0), device=(1, 0)).shape == (3,)
    with pytest.raises(ValueError, match="not a DLPack tensor"):
        kiln.from_dlpack(_capsule_new(ctypes.addressof(_VERSIONED_NAME), ctypes.addressof(_OTHER_NAME), None))

    class OnGPU:
        asked = False

        def __dlpack__(self, **kwargs):
            OnGPU.asked = True

        def __dlpack_device__(self):
            return (2, 0)

    with pytest.raises(BufferError, match=r"device \(2, 0\), not the CPU"):
        kiln.from_dlpack(OnGPU())
    assert not OnGPU.asked  # refused before any export


# ---- PyTorch and JAX, when installed -----------------------------------------------------------------

def test_torch_both_ways():
    torch = pytest.importorskip("torch")
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    t = kiln.from_dlpack(x)
    assert t._data_ptr == x.data_ptr()
    x[0, 0] = 5
    assert t[0, 0].item() == 5
    y = torch.from_dlpack(kiln.Tensor(np.arange(6.0).reshape(2, 3))[:, ::2])
    assert y.dtype == torch.float64 and y.stride() == (3, 2)
    np.testing.assert_array_equal(y.numpy(), np.arange(6.0).reshape(2, 3)[:, ::2])
    for dt in (torch.bool, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float64):
        s = (torch.arange(5) % 3).to(dt)
        k = kiln.Tensor(s)  # a copy, through DLPack
        assert k.dtype.name == str(dt).removeprefix("torch.")
        assert torch.equal(torch.from_dlpack(k), s)
    c = kiln.Tensor(x)
    x[1, 1] = -1
    assert c[1, 1].item() == 5.0 and kiln.from_dlpack(x)[1, 1].item() == -1


def test_jax_both_ways():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    t = kiln.from_dlpack(x)
    np.testing.assert_array_equal(t.asnumpy(), np.arange(12, dtype=np.float32).reshape(3, 4))
    np.testing.assert_array_equal(kiln.Tensor(x).asnumpy(), np.asarray(x))
    y = jnp.from_dlpack(kiln.Tensor(np.arange(6, dtype=np.int32).reshape(2, 3)))
    np.testing.assert_array_equal(np.asarray(y), np.arange(6).reshape(2, 3))
