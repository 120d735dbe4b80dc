/* Tensor.__getitem__ / __setitem__: the Python index object parsed into the plain items that
 * kiln_index_get / kiln_index_set (src/ops/index_lower.c) lower to ops. Reference notes:
 * arguments are borrowed; results are new references. */
#include "pykiln.h"

#include "core/internal.h"
#include "ops/index_lower.h"

#define MAX_ITEMS 64

/* numpy.ndarray, looked up at the first index that needs it (NULL until then). Process-wide like
 * the tensor class. */
static PyObject *ndarray_type;

int pykiln_is_ndarray(PyObject *k) {
    if (PyList_Check(k) || !PyObject_CheckBuffer(k)) return 0; /* (no array: and no NumPy import for it) */
    if (!ndarray_type) {
        PyObject *np = PyImport_ImportModule("numpy");
        if (!np) return -1;
        ndarray_type = PyObject_GetAttrString(np, "ndarray");
        Py_DECREF(np);
        if (!ndarray_type) return -1;
    }
    return PyObject_IsInstance(k, ndarray_type);
}

/* A list or ndarray index as a tensor of its own (a copy, as Tensor(numpy.asarray(k)) makes).
 * New C reference, or NULL with an exception set. */
static kiln_tensor *array_index(PyObject *k) {
    PyObject *np = PyImport_ImportModule("numpy");
    if (!np) return NULL;
    PyObject *arr = PyObject_CallMethod(np, "asarray", "O", k);
    Py_DECREF(np);
    if (!arr) return NULL;
    kiln_tensor *src = pykiln_to_tensor(arr, NULL), *t = NULL;
    Py_DECREF(arr);
    if (!src) return NULL;
    kiln_status s = kiln_tensor_empty(src->meta.dtype, src->meta.ndim, src->meta.shape, &t);
    if (s == KILN_OK) s = kiln_copy_into(t, src);
    kiln_tensor_release(src);
    if (s != KILN_OK) {
        kiln_tensor_release(t);
        pykiln_raise(s);
        return NULL;
    }
    return t;
}

typedef struct {
    int n, nowned;
    kiln_index_item items[MAX_ITEMS];
    kiln_tensor *owned[MAX_ITEMS]; /* tensors made from lists and arrays */
} parsed_key;

static void parsed_free(parsed_key *p) { kiln_release_all(p->owned, p->nowned); }

static int parse_item(PyObject *k, parsed_key *p) {
    kiln_index_item *item = &p->items[p->n++];
    memset(item, 0, sizeof *item);
    if (k == Py_None) {
        item->kind = KILN_INDEX_NEWAXIS;
        return 0;
    }
    if (k == Py_Ellipsis) {
        item->kind = KILN_INDEX_ELLIPSIS;
        return 0;
    }
    if (PySlice_Check(k)) {
        Py_ssize_t start, stop, step;
        if (PySlice_Unpack(k, &start, &stop, &step) < 0) return -1;
        *item = (kiln_index_item){KILN_INDEX_SLICE, start, stop, step, NULL};
        return 0;
    }
    if (pykiln_is_tensor(k)) {
        item->kind = KILN_INDEX_TENSOR;
        item->tensor = pykiln_unwrap(k);
        return 0;
    }
    int array = PyList_Check(k) ? 1 : pykiln_is_ndarray(k);
    if (array < 0) return -1;
    if (array) {
        kiln_tensor *t = array_index(k);
        if (!t) return -1;
        p->owned[p->nowned++] = t;
        item->kind = KILN_INDEX_TENSOR;
        item->tensor = t;
        return 0;
    }
    if (PyIndex_Check(k)) {
        PyObject *i = PyNumber_Index(k);
        if (!i) return -1;
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(i, &overflow);
        Py_DECREF(i);
        if (v == -1 && PyErr_Occurred()) return -1;
        item->kind = KILN_INDEX_INT;
        item->start = overflow > 0 ? INT64_MAX : overflow < 0 ? INT64_MIN : (int64_t)v; /* out of bounds either way */
        return 0;
    }
    PyErr_Format(PyExc_IndexError, "index: unsupported index %R (use ints, slices, None, ..., or integer tensors)", k);
    return -1;
}

static int parse_key(PyObject *key, parsed_key *p) {
    p->n = p->nowned = 0;
    if (!PyTuple_Check(key)) return parse_item(key, p);
    Py_ssize_t n = PyTuple_GET_SIZE(key);
    if (n > MAX_ITEMS) {
        PyErr_Format(PyExc_IndexError, "index: too many items in an index (%zd; at most %d)", n, MAX_ITEMS);
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++)
        if (parse_item(PyTuple_GET_ITEM(key, k), p) < 0) return -1;
    return 0;
}

/* mp_subscript: x[key] */
PyObject *pykiln_tensor_getitem(PyObject *self, PyObject *key) {
    if (pykiln_sym_hooked()) { /* a dynamic capture: the slice's bounds follow the symbols */
        PyObject *args = PyTuple_Pack(2, self, key);
        PyObject *sym = args ? pykiln_sym_call("getitem", args, true) : NULL;
        Py_XDECREF(args);
        if (sym || PyErr_Occurred()) return sym;
    }
    parsed_key p;
    kiln_tensor *out = NULL;
    PyObject *result = NULL;
    if (parse_key(key, &p) == 0) {
        kiln_status s = kiln_index_get(pykiln_unwrap(self), p.n, p.items, kiln_tracer_note_value_read, &out);
        result = s == KILN_OK ? pykiln_wrap(out) : pykiln_raise(s);
    }
    parsed_free(&p);
    return result;
}

/* mp_ass_subscript: x[key] = value (a value that is not a tensor becomes one of x's dtype) */
int pykiln_tensor_setitem(PyObject *self, PyObject *key, PyObject *value) {
    if (!value) {
        PyErr_SetString(PyExc_TypeError, "tensor elements can't be deleted");
        return -1;
    }
    if (pykiln_sym_hooked()) { /* a dynamic capture: the slice's bounds follow the symbols */
        PyObject *args = PyTuple_Pack(3, self, key, value);
        PyObject *sym = args ? pykiln_sym_call("setitem", args, true) : NULL;
        Py_XDECREF(args);
        Py_XDECREF(sym);
        return sym ? 0 : -1;
    }
    kiln_tensor *x = pykiln_unwrap(self), *v = NULL;
    if (pykiln_is_tensor(value)) {
        kiln_tensor_retain(v = pykiln_unwrap(value));
    } else {
        /* Python numbers and lists go straight into a float x's dtype (t[...] = 0.01 on a float64 t
         * keeps 0.01, not float32's 0.0099999998); anything else is made as it is, then copied, as
         * Tensor(value, x.dtype) does */
        bool direct = kiln_dtype_is_float(x->meta.dtype) &&
                      (PyFloat_CheckExact(value) || PyLong_CheckExact(value) || PyList_Check(value) || PyTuple_Check(value));
        kiln_tensor *src = direct ? pykiln_to_tensor_as(value, x->meta.dtype) : pykiln_to_tensor(value, NULL);
        if (!src) return -1;
        kiln_status s = kiln_tensor_empty(x->meta.dtype, src->meta.ndim, src->meta.shape, &v);
        if (s == KILN_OK) s = kiln_copy_into(v, src);
        kiln_tensor_release(src);
        if (s != KILN_OK) {
            kiln_tensor_release(v);
            pykiln_raise(s);
            return -1;
        }
    }
    parsed_key p;
    int rc = -1;
    if (parse_key(key, &p) == 0) {
        kiln_status s = kiln_index_set(x, p.n, p.items, v, kiln_tracer_note_value_read);
        if (s == KILN_OK) rc = 0;
        else pykiln_raise(s);
    }
    parsed_free(&p);
    kiln_tensor_release(v);
    return rc;
}
