/* Conversions between Python values and kiln tensors, and kiln_status -> exceptions. */
#include "pykiln.h"

#include <math.h>

#include "core/internal.h"

/* The exceptions of check ops, indexed by check id (register_check); process-wide like the
 * graphs that name them. */
static PyObject *check_exceptions;

PyObject *pykiln_register_check(PyObject *module, PyObject *exc) {
    (void)module;
    if (!PyExceptionInstance_Check(exc)) {
        PyErr_Format(PyExc_TypeError, "register_check: expected an exception instance, got %R", exc);
        return NULL;
    }
    if (!check_exceptions && !(check_exceptions = PyList_New(0))) return NULL;
    if (PyList_Append(check_exceptions, exc) < 0) return NULL;
    return PyLong_FromSsize_t(PyList_GET_SIZE(check_exceptions) - 1);
}

/* A fresh exception like the one registered for the failed check (its type called with its
 * args; the registered instance itself when that fails). */
static PyObject *raise_check(void) {
    int64_t id = kiln_last_check();
    if (!check_exceptions || id < 0 || id >= PyList_GET_SIZE(check_exceptions)) {
        PyErr_Format(PyExc_RuntimeError, "%s (no exception is registered for it)", kiln_last_error());
        return NULL;
    }
    PyObject *exc = PyList_GET_ITEM(check_exceptions, id);
    PyObject *fresh = PyObject_Call((PyObject *)Py_TYPE(exc), ((PyBaseExceptionObject *)exc)->args, NULL);
    if (!fresh || !PyExceptionInstance_Check(fresh)) {
        Py_XDECREF(fresh);
        PyErr_Clear();
        fresh = Py_NewRef(exc);
    }
    PyErr_SetObject((PyObject *)Py_TYPE(fresh), fresh);
    Py_DECREF(fresh);
    return NULL;
}

PyObject *pykiln_raise(kiln_status s) {
    PyObject *type;
    switch (s) {
    case KILN_ERR_CHECK: return raise_check();
    case KILN_ERR_INTERRUPTED: return pykiln_raise_interrupted();
    case KILN_ERR_VALUE:
    case KILN_ERR_LIMIT: type = PyExc_ValueError; break;
    case KILN_ERR_TYPE: type = PyExc_TypeError; break;
    case KILN_ERR_INDEX: type = PyExc_IndexError; break;
    case KILN_ERR_MEMORY: type = PyExc_MemoryError; break;
    case KILN_ERR_NOT_IMPLEMENTED: type = PyExc_NotImplementedError; break;
    default: type = PyExc_RuntimeError; break;
    }
    PyErr_SetString(type, kiln_last_error());
    return NULL;
}

static int dtype_of_name(PyObject *str, kiln_dtype *out) {
    const char *name = PyUnicode_AsUTF8(str);
    if (!name) PyErr_Clear();
    for (int d = 0; name && d < KILN_DTYPE_COUNT; d++)
        if (strcmp(name, kiln_dtype_name((kiln_dtype)d)) == 0) {
            *out = (kiln_dtype)d;
            return 0;
        }
    return -1;
}

/* numpy.dtype(obj).name (new reference), for a NumPy dtype or scalar type (np.float32) and the Python
 * types NumPy reads (bool, int, float); NULL with no error set when NumPy has no dtype for obj. */
static PyObject *numpy_dtype_name(PyObject *obj) {
    PyObject *mod = PyImport_ImportModule("numpy");
    PyObject *dt = mod ? PyObject_CallMethod(mod, "dtype", "O", obj) : NULL;
    PyObject *name = dt ? PyObject_GetAttrString(dt, "name") : NULL;
    Py_XDECREF(mod);
    Py_XDECREF(dt);
    if (!name && PyErr_ExceptionMatches(PyExc_Exception)) PyErr_Clear();
    return name;
}

int pykiln_parse_dtype(PyObject *obj, kiln_dtype *out) {
    if (PyObject_TypeCheck(obj, &PyKilnDType_Type)) {
        *out = ((PyKilnDType *)obj)->id;
        return 0;
    }
    if (PyUnicode_Check(obj) && dtype_of_name(obj, out) == 0) return 0;
    if (!PyUnicode_Check(obj)) {
        PyObject *name = numpy_dtype_name(obj);
        if (!name && PyErr_Occurred()) return -1;
        int found = name ? dtype_of_name(name, out) : -1;
        Py_XDECREF(name);
        if (found == 0) return 0;
    }
    PyErr_Format(PyExc_TypeError, "expected a kiln dtype (kiln.float32, ...), its name or a NumPy dtype kiln has, got %R",
                 obj);
    return -1;
}

/* ---- buffers ---------------------------------------------------------------------------- */

static int dtype_of_format(const char *fmt, Py_ssize_t itemsize, kiln_dtype *out) {
    if (!fmt) fmt = "B";
    while (*fmt == '@' || *fmt == '=' || *fmt == '<' || *fmt == '!') fmt++;
    if (fmt[0] == '\0' || fmt[1] != '\0') return -1;
    switch (fmt[0]) {
    case '?': *out = KILN_DTYPE_BOOL; return 0;
    case 'b': *out = KILN_DTYPE_INT8; return 0;
    case 'e': *out = KILN_DTYPE_FLOAT16; return 0;
    case 'f': *out = KILN_DTYPE_FLOAT32; return 0;
    case 'd': *out = KILN_DTYPE_FLOAT64; return 0;
    case 'i': case 'l': case 'q':
        if (itemsize == 4) *out = KILN_DTYPE_INT32;
        else if (itemsize == 8) *out = KILN_DTYPE_INT64;
        else return -1;
        return 0;
    default: return -1;
    }
}

static void release_buffer(void *ctx) {
    Py_buffer *view = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    PyBuffer_Release(view);
    PyGILState_Release(g);
    PyMem_RawFree(view);
}

/* A tensor sharing the memory of an object with the buffer protocol; NULL without an error
 * set when the object has no usable buffer. A read-only buffer (an immutable bytes, an mmap
 * opened for reading, a NumPy array that is not writeable, such as a broadcast_to view) gives
 * a read-only tensor: in-place writes raise ValueError. */
static kiln_tensor *wrap_buffer(PyObject *obj) {
    if (!PyObject_CheckBuffer(obj)) return NULL;
    Py_buffer *view = PyMem_RawMalloc(sizeof *view);
    if (!view) {
        PyErr_NoMemory();
        return NULL;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO) != 0) {
        PyMem_RawFree(view);
        PyErr_Clear();
        return NULL;
    }
    kiln_dtype dtype;
    if (view->ndim > KILN_MAX_DIMS || dtype_of_format(view->format, view->itemsize, &dtype) != 0) {
        PyErr_Format(PyExc_TypeError, "cannot make a tensor from a buffer of format '%s' with %d dimensions "
                     "(supported: bool, int8, int32, int64, float16, float32, float64; at most %d dimensions)",
                     view->format ? view->format : "B", view->ndim, KILN_MAX_DIMS);
        PyBuffer_Release(view);
        PyMem_RawFree(view);
        return NULL;
    }
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    for (int d = 0; d < view->ndim; d++) {
        shape[d] = view->shape[d];
        if (view->strides[d] % view->itemsize != 0) {
            PyErr_SetString(PyExc_ValueError, "cannot make a tensor from a buffer with unaligned strides");
            PyBuffer_Release(view);
            PyMem_RawFree(view);
            return NULL;
        }
        strides[d] = view->strides[d] / view->itemsize;
    }
    kiln_tensor *t = NULL;
    kiln_status s = kiln_tensor_wrap(dtype, view->ndim, shape, strides, view->buf, release_buffer, view, &t);
    if (s != KILN_OK) {
        PyBuffer_Release(view);
        PyMem_RawFree(view);
        pykiln_raise(s);
        return NULL;
    }
    if (view->readonly) kiln_tensor_set_read_only(t); /* writes would land in memory we may not change */
    return t;
}

/* ---- scalars and sequences ------------------------------------------------------------- */

static kiln_tensor *scalar_tensor(double v, int64_t iv, bool is_int, kiln_dtype dtype) {
    kiln_tensor *t = NULL;
    kiln_status s = kiln_tensor_empty(dtype, 0, NULL, &t);
    if (s != KILN_OK) {
        pykiln_raise(s);
        return NULL;
    }
    switch (dtype) {
    case KILN_DTYPE_BOOL: *(uint8_t *)t->data = is_int ? iv != 0 : v != 0; break;
    case KILN_DTYPE_INT8: *(int8_t *)t->data = (int8_t)(is_int ? iv : (int64_t)v); break;
    case KILN_DTYPE_INT32: *(int32_t *)t->data = (int32_t)(is_int ? iv : (int64_t)v); break;
    case KILN_DTYPE_INT64: *(int64_t *)t->data = is_int ? iv : (int64_t)v; break;
    case KILN_DTYPE_FLOAT32: *(float *)t->data = (float)(is_int ? (double)iv : v); break;
    case KILN_DTYPE_FLOAT64: *(double *)t->data = is_int ? (double)iv : v; break;
    default: { /* 16-bit floats: go through float32 */
        kiln_tensor *f = scalar_tensor(v, iv, is_int, KILN_DTYPE_FLOAT32), *h = NULL;
        if (f) f->literal = false;
        if (!f) {
            kiln_tensor_release(t);
            return NULL;
        }
        kiln_tensor_release(t);
        kiln_status cs = kiln_emit_cast(f, dtype, &h);
        kiln_tensor_release(f);
        if (cs != KILN_OK) {
            pykiln_raise(cs);
            return NULL;
        }
        h->literal = true;
        h->amp_exact = is_int || v == floor(v); /* (amp never narrows integers: src/ops/amp.c) */
        return h;
    }
    }
    t->literal = true;
    t->amp_exact = is_int || v == floor(v);
    return t;
}

/* The dtype a Python scalar takes next to a tensor of dtype `like` (NumPy 2 weak scalars). */
static kiln_dtype weak_scalar_dtype(PyObject *v, const kiln_tensor *like) {
    bool have = like != NULL;
    kiln_dtype ld = have ? like->meta.dtype : KILN_DTYPE_FLOAT32;
    if (PyBool_Check(v)) return have ? ld : KILN_DTYPE_BOOL;
    if (PyLong_Check(v)) return have && ld != KILN_DTYPE_BOOL ? ld : KILN_DTYPE_INT64;
    return have && kiln_dtype_is_float(ld) ? ld : KILN_DTYPE_FLOAT32;
}

kiln_tensor *pykiln_to_tensor(PyObject *value, const kiln_tensor *like) {
    if (pykiln_is_tensor(value)) {
        kiln_tensor *t = pykiln_unwrap(value);
        kiln_tensor_retain(t);
        return t;
    }
    if (PyBool_Check(value) || PyLong_Check(value)) {
        int overflow = 0;
        long long iv = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow) {
            PyErr_SetString(PyExc_OverflowError, "Python int too large for an int64 tensor");
            return NULL;
        }
        kiln_dtype dtype = weak_scalar_dtype(value, like);
        if (!PyBool_Check(value) && ((dtype == KILN_DTYPE_INT8 && (iv < INT8_MIN || iv > INT8_MAX)) ||
                                     (dtype == KILN_DTYPE_INT32 && (iv < INT32_MIN || iv > INT32_MAX)))) {
            /* NumPy 2's rule: a weak Python int must fit the tensor's integer dtype (no silent wrap) */
            PyErr_Format(PyExc_OverflowError, "Python integer %lld out of bounds for %s", iv,
                         kiln_dtype_name(dtype));
            return NULL;
        }
        return scalar_tensor((double)iv, iv, true, dtype);
    }
    /* NumPy scalars subclass float but keep their dtype: they go through the buffer path */
    if (PyFloat_CheckExact(value)) return scalar_tensor(PyFloat_AS_DOUBLE(value), 0, false, weak_scalar_dtype(value, like));
    kiln_tensor *t = wrap_buffer(value);
    if (t || PyErr_Occurred()) return t;
    /* a PyTorch or JAX tensor, ...: shared through DLPack (Tensor() then copies it) */
    if (PyObject_HasAttrString(value, "__dlpack__")) return pykiln_tensor_from_dlpack(value);
    if (PyList_Check(value) || PyTuple_Check(value)) {
        /* nested sequences go through NumPy, then default float64 -> float32 as in MindSpore */
        PyObject *np = PyImport_ImportModule("numpy");
        if (!np) return NULL;
        PyObject *arr = PyObject_CallMethod(np, "asarray", "O", value);
        Py_DECREF(np);
        if (!arr) return NULL;
        t = wrap_buffer(arr);
        Py_DECREF(arr);
        if (!t) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "cannot make a tensor from %R: elements must be numbers", value);
            return NULL;
        }
        if (t->meta.dtype == KILN_DTYPE_FLOAT64) {
            kiln_tensor *f = NULL;
            kiln_status s = kiln_emit_cast(t, KILN_DTYPE_FLOAT32, &f);
            kiln_tensor_release(t);
            if (s != KILN_OK) return (kiln_tensor *)pykiln_raise(s);
            t = f;
        }
        return t;
    }
    PyErr_Format(PyExc_TypeError, "cannot make a tensor from an object of type %.100s", Py_TYPE(value)->tp_name);
    return NULL;
}

/* A Python number in `dtype` itself (not through float32 first: Tensor(0.1, float64) is 0.1), or
 * the OverflowError / ValueError NumPy gives for a value the dtype cannot hold. */
static kiln_tensor *number_as(PyObject *value, kiln_dtype dtype) {
    bool is_int = PyBool_Check(value) || PyLong_Check(value);
    long long iv = 0;
    double v = 0;
    if (is_int) {
        int overflow = 0;
        iv = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow && !kiln_dtype_is_float(dtype)) {
            PyErr_Format(PyExc_OverflowError, "Python integer %R out of bounds for %s", value, kiln_dtype_name(dtype));
            return NULL;
        }
        v = overflow ? PyLong_AsDouble(value) : (double)iv;
        if (overflow && PyErr_Occurred()) return NULL;
        if (overflow) is_int = false;
    } else {
        v = PyFloat_AS_DOUBLE(value);
    }
    long long ilo = 0, ihi = 0; /* the integer dtype's range */
    double lo = 0, hi = 0;      /* floats it takes: [lo, hi) */
    switch (dtype) {
    case KILN_DTYPE_INT8: ilo = INT8_MIN, ihi = INT8_MAX, lo = -128.0, hi = 128.0; break;
    case KILN_DTYPE_INT32: ilo = INT32_MIN, ihi = INT32_MAX, lo = -2147483648.0, hi = 2147483648.0; break;
    case KILN_DTYPE_INT64: ilo = INT64_MIN, ihi = INT64_MAX, lo = -9223372036854775808.0, hi = 9223372036854775808.0; break;
    default: break;
    }
    if (hi != 0) {
        if (is_int && (iv < ilo || iv > ihi)) {
            PyErr_Format(PyExc_OverflowError, "Python integer %R out of bounds for %s", value, kiln_dtype_name(dtype));
            return NULL;
        }
        if (!is_int && !(v > lo - 1.0 && v < hi)) { /* NaN, inf or out of range: no integer holds it */
            PyErr_Format(PyExc_ValueError, "cannot convert float %R to %s", value, kiln_dtype_name(dtype));
            return NULL;
        }
    }
    return scalar_tensor(v, iv, is_int, dtype);
}

kiln_tensor *pykiln_to_tensor_as(PyObject *value, kiln_dtype dtype) {
    if (PyBool_Check(value) || PyLong_CheckExact(value) || PyFloat_CheckExact(value)) {
        kiln_tensor *t = number_as(value, dtype);
        if (t) t->literal = false;
        return t;
    }
    if ((PyList_Check(value) || PyTuple_Check(value)) && dtype != KILN_DTYPE_BFLOAT16) {
        /* nested numbers straight into the dtype through NumPy (no float32 on the way) */
        PyObject *np = PyImport_ImportModule("numpy");
        if (!np) return NULL;
        PyObject *arr = PyObject_CallMethod(np, "asarray", "Os", value, kiln_dtype_name(dtype));
        Py_DECREF(np);
        if (!arr) return NULL;
        kiln_tensor *t = wrap_buffer(arr);
        Py_DECREF(arr);
        if (!t && !PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "cannot make a %s tensor from %R", kiln_dtype_name(dtype), value);
        return t;
    }
    return pykiln_to_tensor(value, NULL);
}
