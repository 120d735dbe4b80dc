/* DLPack both ways: Tensor.__dlpack__ / __dlpack_device__ (kiln as producer) and
 * kiln.from_dlpack (kiln as consumer), zero-copy, following the Python specification of DLPack
 * and the array API standard.
 *
 * Export: the capsule holds a new kiln tensor viewing the same storage (so the memory lives until
 * the consumer calls the deleter, whatever happens to the Python tensor). A consumer asking for
 * max_version >= (1, 0) gets a "dltensor_versioned" capsule, with the read-only flag set for a
 * read-only tensor (one sharing a read-only buffer, or a broadcast view whose stride of 0 makes
 * elements share memory); an older consumer gets a legacy "dltensor" capsule, which has no way to
 * say read-only, so a read-only tensor is refused there with BufferError unless copy=True, as
 * NumPy does.
 *
 * Import: the consumer renames the capsule to "used_dltensor[_versioned]" when it takes the
 * tensor over, and calls the producer's deleter exactly once: when the last kiln tensor viewing
 * the memory dies, or at once when the tensor cannot be used (a major version kiln does not read,
 * a device other than the CPU, a dtype kiln lacks). */
#include "pykiln.h"

#include "core/internal.h"
#include "dlpack.h"

/* ---- dtypes ------------------------------------------------------------------------------ */

static DLDataType dl_dtype_of(kiln_dtype d) {
    DLDataType t = {kDLFloat, (uint8_t)(8 * kiln_dtype_size(d)), 1};
    switch (d) {
    case KILN_DTYPE_BOOL: t.code = kDLBool; break;
    case KILN_DTYPE_INT8: case KILN_DTYPE_INT32: case KILN_DTYPE_INT64: t.code = kDLInt; break;
    case KILN_DTYPE_BFLOAT16: t.code = kDLBfloat; break;
    default: break; /* float16, float32, float64 */
    }
    return t;
}

/* The kiln dtype of a DLPack dtype; -1 with TypeError set when kiln has none. */
static int kiln_dtype_of_dl(DLDataType t, kiln_dtype *out) {
    for (int d = 0; d < KILN_DTYPE_COUNT; d++) {
        DLDataType k = dl_dtype_of((kiln_dtype)d);
        if (t.code == k.code && t.bits == k.bits && t.lanes == 1) {
            *out = (kiln_dtype)d;
            return 0;
        }
    }
    static const char *const codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
    char name[48];
    if (t.code < sizeof codes / sizeof codes[0])
        snprintf(name, sizeof name, "%s%u%s", codes[t.code], t.bits, t.lanes != 1 ? " vector" : "");
    else
        snprintf(name, sizeof name, "of code %u", t.code);
    PyErr_Format(PyExc_TypeError, "from_dlpack: kiln has no dtype for the DLPack dtype %s (code %u, %u bits, %u lanes); "
                 "kiln has bool, int8, int32, int64, float16, bfloat16, float32 and float64", name, t.code, t.bits,
                 t.lanes);
    return -1;
}

/* ---- export -------------------------------------------------------------------------------- */

/* The manager_ctx of an exported tensor is the kiln tensor (a view of the storage) it keeps alive;
 * shape and strides point into it. The deleter may run on any thread: releasing a kiln tensor
 * takes no lock of Python's (a storage wrapping a Python buffer takes the GIL itself). */
static void delete_versioned(DLManagedTensorVersioned *self) {
    kiln_tensor_release(self->manager_ctx);
    PyMem_RawFree(self);
}

static void delete_legacy(DLManagedTensor *self) {
    kiln_tensor_release(self->manager_ctx);
    PyMem_RawFree(self);
}

/* Calls a deleter with no exception set (it may run Python code: a producer's deleter drops its
 * array, a capsule may die while an exception propagates), keeping the one that was set. */
static void call_deleter(void (*release)(void *), void *managed) {
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
    release(managed);
    PyErr_SetRaisedException(exc);
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    release(managed);
    PyErr_Restore(type, value, tb);
#endif
}

static void release_versioned(void *ctx) {
    DLManagedTensorVersioned *m = ctx;
    if (m->deleter) m->deleter(m);
}

static void release_legacy(void *ctx) {
    DLManagedTensor *m = ctx;
    if (m->deleter) m->deleter(m);
}

/* A capsule no consumer took over still owns its tensor. */
static void destroy_versioned_capsule(PyObject *capsule) {
    if (!PyCapsule_IsValid(capsule, KILN_DLPACK_NAME_VERSIONED)) return; /* renamed: consumed */
    call_deleter(release_versioned, PyCapsule_GetPointer(capsule, KILN_DLPACK_NAME_VERSIONED));
}

static void destroy_legacy_capsule(PyObject *capsule) {
    if (!PyCapsule_IsValid(capsule, KILN_DLPACK_NAME)) return;
    call_deleter(release_legacy, PyCapsule_GetPointer(capsule, KILN_DLPACK_NAME));
}

static void fill_dl_tensor(DLTensor *dl, kiln_tensor *t) {
    dl->data = t->data;
    dl->device = (DLDevice){kDLCPU, 0};
    dl->ndim = t->meta.ndim;
    dl->dtype = dl_dtype_of(t->meta.dtype);
    dl->shape = t->meta.shape;
    dl->strides = t->strides;
    dl->byte_offset = 0;
}

/* (major, minor) or None -> whether the consumer reads the versioned form; -1 with an error set. */
static int wants_versioned(PyObject *max_version) {
    if (max_version == Py_None) return 0;
    long major = -1;
    if (PyTuple_Check(max_version) && PyTuple_GET_SIZE(max_version) == 2) {
        major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0));
        if (major == -1 && PyErr_Occurred()) return -1;
        if (!PyLong_Check(PyTuple_GET_ITEM(max_version, 1))) major = -1;
    }
    if (major < 0) {
        PyErr_Format(PyExc_TypeError, "__dlpack__: max_version must be None or a tuple (major, minor) of ints, got %R",
                     max_version);
        return -1;
    }
    return major >= 1;
}

/* Whether a (device_type, device_id) object names kiln's device, the CPU; -1 with an error set. */
static int is_cpu_device(PyObject *device, const char *who) {
    long type = -1, id = -1;
    if (PyTuple_Check(device) && PyTuple_GET_SIZE(device) == 2) {
        type = PyLong_AsLong(PyTuple_GET_ITEM(device, 0));
        if (type == -1 && PyErr_Occurred()) return -1;
        id = PyLong_AsLong(PyTuple_GET_ITEM(device, 1));
        if (id == -1 && PyErr_Occurred()) return -1;
    } else {
        PyErr_Format(PyExc_TypeError, "%s: a DLPack device is a tuple (device_type, device_id), got %R", who, device);
        return -1;
    }
    return type == kDLCPU && id == 0;
}

/* The device argument of __dlpack__ (dl_device) and from_dlpack (device): None, (1, 0), or for
 * from_dlpack "cpu"; anything else raises `error`. 0 when it is the CPU, -1 with an error set. */
static int require_cpu(PyObject *device, bool allow_name, PyObject *error, const char *who) {
    if (device == Py_None) return 0;
    if (allow_name && PyUnicode_Check(device) && PyUnicode_CompareWithASCIIString(device, "cpu") == 0) return 0;
    int cpu = allow_name && !PyTuple_Check(device) ? 0 : is_cpu_device(device, who);
    if (cpu < 0) return -1;
    if (!cpu)
        PyErr_Format(error, "%s: kiln tensors live on the CPU only, DLPack device (1, 0)%s; got %R", who,
                     allow_name ? " or \"cpu\"" : "", device);
    return cpu ? 0 : -1;
}

/* A contiguous copy of t in kiln's own memory; NULL with an error set. */
static kiln_tensor *contiguous_copy(const kiln_tensor *t) {
    kiln_tensor *c = NULL;
    kiln_status s = kiln_tensor_empty(t->meta.dtype, t->meta.ndim, t->meta.shape, &c);
    if (s == KILN_OK) s = kiln_copy_into(c, t);
    if (s == KILN_OK) return c;
    kiln_tensor_release(c);
    return (kiln_tensor *)pykiln_raise(s);
}

/* Tensor.__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None) */
PyObject *pykiln_tensor_dlpack(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O$OOO:__dlpack__", kwlist, &stream, &max_version, &dl_device,
                                     &copy_obj))
        return NULL;
    if (stream != Py_None) {
        PyErr_Format(PyExc_BufferError, "__dlpack__: kiln tensors live on the CPU, which has no streams: stream must "
                     "be None, got %R", stream);
        return NULL;
    }
    int versioned = wants_versioned(max_version);
    if (versioned < 0) return NULL;
    if (require_cpu(dl_device, false, PyExc_BufferError, "__dlpack__") < 0) return NULL;
    int copy = copy_obj == Py_None ? 0 : PyObject_IsTrue(copy_obj);
    if (copy < 0) return NULL;

    kiln_tensor *t = pykiln_unwrap(self), *held = NULL;
    kiln_tracer_note_value_read(t); /* the value leaves kiln, as through the buffer protocol */
    bool read_only = kiln_tensor_is_read_only(t) || kiln_tensor_overlaps(t);
    if (copy) { /* a contiguous copy only the consumer owns */
        if (!(held = contiguous_copy(t))) return NULL;
        read_only = false;
    } else {
        if (read_only && !versioned) {
            PyErr_SetString(PyExc_BufferError,
                            "__dlpack__: cannot export a read-only tensor (it shares a read-only buffer, or is a "
                            "broadcast view) as a legacy DLPack capsule, which cannot say read-only: ask for "
                            "max_version=(1, 0) or later, or for copy=True");
            return NULL;
        }
        kiln_status s = kiln_tensor_view(t, t->meta.ndim, t->meta.shape, t->strides, t->offset, &held);
        if (s != KILN_OK) return pykiln_raise(s);
        if (!read_only) kiln_tensor_mark_escaped(t); /* the consumer may write it without a version bump */
    }

    PyObject *capsule;
    if (versioned) {
        DLManagedTensorVersioned *m = PyMem_RawCalloc(1, sizeof *m);
        if (!m) {
            kiln_tensor_release(held);
            return PyErr_NoMemory();
        }
        m->version = (DLPackVersion){KILN_DLPACK_MAJOR, KILN_DLPACK_MINOR};
        m->manager_ctx = held;
        m->deleter = delete_versioned;
        m->flags = (read_only ? KILN_DLPACK_FLAG_READ_ONLY : 0) | (copy ? KILN_DLPACK_FLAG_IS_COPIED : 0);
        fill_dl_tensor(&m->dl_tensor, held);
        capsule = PyCapsule_New(m, KILN_DLPACK_NAME_VERSIONED, destroy_versioned_capsule);
        if (!capsule) delete_versioned(m);
    } else {
        DLManagedTensor *m = PyMem_RawCalloc(1, sizeof *m);
        if (!m) {
            kiln_tensor_release(held);
            return PyErr_NoMemory();
        }
        m->manager_ctx = held;
        m->deleter = delete_legacy;
        fill_dl_tensor(&m->dl_tensor, held);
        capsule = PyCapsule_New(m, KILN_DLPACK_NAME, destroy_legacy_capsule);
        if (!capsule) delete_legacy(m);
    }
    return capsule;
}

/* Tensor.__dlpack_device__() -> (kDLCPU, 0) */
PyObject *pykiln_tensor_dlpack_device(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue("(ii)", (int)kDLCPU, 0);
}

/* ---- import -------------------------------------------------------------------------------- */

/* Checks a DLTensor kiln took over and wraps its memory; NULL with an error set otherwise (the
 * caller then calls the deleter). */
static kiln_tensor *wrap_dl_tensor(const DLTensor *dl, void (*release)(void *), void *ctx) {
    if (dl->device.device_type != kDLCPU) {
        PyErr_Format(PyExc_BufferError, "from_dlpack: the tensor is on DLPack device (%d, %d), not the CPU (1, 0); "
                     "kiln computes on the CPU: copy it there first (e.g. torch: x.cpu())",
                     (int)dl->device.device_type, (int)dl->device.device_id);
        return NULL;
    }
    kiln_dtype dtype;
    if (kiln_dtype_of_dl(dl->dtype, &dtype) != 0) return NULL;
    if (dl->ndim < 0 || dl->ndim > KILN_MAX_DIMS || (dl->ndim > 0 && !dl->shape)) {
        PyErr_Format(PyExc_ValueError, "from_dlpack: a tensor of %d dimensions%s; kiln tensors have at most %d",
                     (int)dl->ndim, dl->ndim > 0 && !dl->shape ? " without a shape" : "", KILN_MAX_DIMS);
        return NULL;
    }
    int64_t numel;
    kiln_status s = kiln_shape_numel_checked(dl->ndim, dl->shape, &numel);
    if (s != KILN_OK) {
        pykiln_raise(s);
        return NULL;
    }
    char *data = (char *)dl->data + dl->byte_offset;
    size_t item = kiln_dtype_size(dtype);
    if (numel > 0 && (uintptr_t)data % item != 0) {
        PyErr_Format(PyExc_BufferError, "from_dlpack: the %s data at %p is not aligned to its %zu-byte elements; "
                     "kiln reads elements in place and cannot share it (copy it in the producer first)",
                     kiln_dtype_name(dtype), (void *)data, item);
        return NULL;
    }
    /* kiln's views take any strides in elements: negative (reversed) and 0 (broadcast, read-only
     * for writes as every broadcast view is); NULL strides are compact row-major */
    kiln_tensor *t = NULL;
    s = kiln_tensor_wrap(dtype, dl->ndim, dl->shape, dl->strides, data, release, ctx, &t);
    if (s != KILN_OK) {
        pykiln_raise(s);
        return NULL;
    }
    return t;
}

/* Takes over the tensor of a "dltensor" or "dltensor_versioned" capsule. */
static kiln_tensor *consume_capsule(PyObject *capsule) {
    if (PyCapsule_IsValid(capsule, KILN_DLPACK_NAME_VERSIONED)) {
        DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, KILN_DLPACK_NAME_VERSIONED);
        if (PyCapsule_SetName(capsule, KILN_DLPACK_NAME_VERSIONED_USED) != 0) return NULL;
        if (m->version.major != KILN_DLPACK_MAJOR) { /* nothing past the deleter may be read */
            unsigned major = m->version.major, minor = m->version.minor;
            call_deleter(release_versioned, m);
            PyErr_Format(PyExc_BufferError, "from_dlpack: the producer exported DLPack %u.%u; kiln reads major "
                         "version %d only", major, minor, KILN_DLPACK_MAJOR);
            return NULL;
        }
        kiln_tensor *t = wrap_dl_tensor(&m->dl_tensor, release_versioned, m);
        if (!t) {
            call_deleter(release_versioned, m);
            return NULL;
        }
        if (m->flags & KILN_DLPACK_FLAG_READ_ONLY) kiln_tensor_set_read_only(t); /* writes raise, as for buffers */
        return t;
    }
    if (PyCapsule_IsValid(capsule, KILN_DLPACK_NAME)) {
        DLManagedTensor *m = PyCapsule_GetPointer(capsule, KILN_DLPACK_NAME);
        if (PyCapsule_SetName(capsule, KILN_DLPACK_NAME_USED) != 0) return NULL;
        kiln_tensor *t = wrap_dl_tensor(&m->dl_tensor, release_legacy, m);
        if (!t) call_deleter(release_legacy, m);
        return t;
    }
    const char *name = PyCapsule_GetName(capsule);
    if (!name && PyErr_Occurred()) return NULL;
    if (name && (strcmp(name, KILN_DLPACK_NAME_USED) == 0 || strcmp(name, KILN_DLPACK_NAME_VERSIONED_USED) == 0))
        PyErr_Format(PyExc_ValueError, "from_dlpack: this DLPack capsule was consumed already (it is named '%s'); "
                     "a capsule gives its tensor once: call __dlpack__() again", name);
    else
        PyErr_Format(PyExc_ValueError, "from_dlpack: a capsule named '%s' is not a DLPack tensor "
                     "(expected '" KILN_DLPACK_NAME_VERSIONED "' or '" KILN_DLPACK_NAME "')", name ? name : "(null)");
    return NULL;
}

/* Calls obj.__dlpack__ the way the array API asks of a consumer: with the newest max_version kiln
 * reads, and without arguments when the producer does not take them (an older producer). */
static PyObject *ask_capsule(PyObject *obj) {
    PyObject *method = PyObject_GetAttrString(obj, "__dlpack__");
    if (!method) return NULL;
    PyObject *args = PyTuple_New(0), *kwargs = Py_BuildValue("{s(ii)}", "max_version", KILN_DLPACK_MAJOR,
                                                             KILN_DLPACK_MINOR);
    PyObject *capsule = args && kwargs ? PyObject_Call(method, args, kwargs) : NULL;
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    if (!capsule && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        capsule = PyObject_CallNoArgs(method);
    }
    Py_DECREF(method);
    return capsule;
}

kiln_tensor *pykiln_tensor_from_dlpack(PyObject *obj) {
    if (PyCapsule_CheckExact(obj)) return consume_capsule(obj);
    if (pykiln_is_tensor(obj)) { /* kiln's own: a view of the same storage, as a round trip would give */
        kiln_tensor *t = pykiln_unwrap(obj), *v = NULL;
        kiln_status s = kiln_tensor_view(t, t->meta.ndim, t->meta.shape, t->strides, t->offset, &v);
        return s == KILN_OK ? v : (kiln_tensor *)pykiln_raise(s);
    }
    int has = PyObject_HasAttrString(obj, "__dlpack__");
    if (!has) {
        PyErr_Format(PyExc_TypeError, "from_dlpack expects an object with __dlpack__ (a NumPy array, a PyTorch or JAX "
                     "tensor, ...) or a DLPack capsule, got %.100s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    if (PyObject_HasAttrString(obj, "__dlpack_device__")) { /* refuse other devices before any export */
        PyObject *device = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
        if (!device) return NULL;
        int cpu = is_cpu_device(device, "from_dlpack");
        if (cpu == 0)
            PyErr_Format(PyExc_BufferError, "from_dlpack: the %.100s is on DLPack device %R, not the CPU (1, 0); kiln "
                         "computes on the CPU: copy it there first (e.g. torch: x.cpu())", Py_TYPE(obj)->tp_name,
                         device);
        Py_DECREF(device);
        if (cpu != 1) return NULL;
    }
    PyObject *capsule = ask_capsule(obj);
    if (!capsule) return NULL;
    kiln_tensor *t = NULL;
    if (!PyCapsule_CheckExact(capsule))
        PyErr_Format(PyExc_TypeError, "from_dlpack: %.100s.__dlpack__() returned a %.100s, not a capsule",
                     Py_TYPE(obj)->tp_name, Py_TYPE(capsule)->tp_name);
    else
        t = consume_capsule(capsule);
    Py_DECREF(capsule);
    return t;
}

/* kiln.from_dlpack(x, /, *, device=None, copy=None) */
PyObject *pykiln_from_dlpack(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *kwlist[] = {"", "device", "copy", NULL};
    PyObject *obj, *device = Py_None, *copy_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|$OO:from_dlpack", kwlist, &obj, &device, &copy_obj)) return NULL;
    if (require_cpu(device, true, PyExc_ValueError, "from_dlpack") < 0) return NULL;
    int copy = copy_obj == Py_None ? 0 : PyObject_IsTrue(copy_obj);
    if (copy < 0) return NULL;
    kiln_tensor *t = pykiln_tensor_from_dlpack(obj);
    if (!t || !copy) return t ? pykiln_wrap(t) : NULL;
    kiln_tensor *c = contiguous_copy(t); /* copy=True: writable memory of kiln's own; the producer is let go */
    kiln_tensor_release(t);
    return c ? pykiln_wrap(c) : NULL;
}
