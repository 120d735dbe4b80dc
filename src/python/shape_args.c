/* kiln.ops' shape functions and the argument helpers every op shares (kiln._C.shape): a shape
 * given as ints, a tuple or a list; an axis checked and made non-negative; a set of axes as the
 * bitmask the reductions take; and the view ops whose arguments need working out before the
 * kernel sees them (reshape's -1, flatten's merged axes, squeeze's axes of length 1, ...).
 * Errors name the op and the shape, as the ops' own checks do.
 * Reference notes: arguments are borrowed; results are new references. */
#include "pykiln.h"

#include "core/internal.h"

#define MAX_SHAPE KILN_MAX_ATTR_INTS

PyObject *pykiln_as_tensor(PyObject *x) {
    if (pykiln_is_tensor(x)) return Py_NewRef(x);
    return PyObject_CallOneArg((PyObject *)pykiln_tensor_class, x);
}

static PyObject *shape_repr(const int64_t *shape, int n) {
    PyObject *t = PyTuple_New(n);
    for (int k = 0; t && k < n; k++) {
        PyObject *v = PyLong_FromLongLong(shape[k]);
        if (!v) Py_CLEAR(t);
        else PyTuple_SET_ITEM(t, k, v);
    }
    return t;
}

static PyObject *value_error_shape(const char *format, const char *op, const int64_t *shape, int n) {
    PyObject *t = shape_repr(shape, n);
    if (t) PyErr_Format(PyExc_ValueError, format, op, t);
    Py_XDECREF(t);
    return NULL;
}

/* A shape given as ints, or as one tuple or list, into shape[0..*n); -1 with an exception set. */
static int parse_shape(const char *op, PyObject *args, int64_t *shape, int *n) {
    PyObject *items = args;
    if (PyTuple_GET_SIZE(args) == 1 && (PyTuple_Check(PyTuple_GET_ITEM(args, 0)) ||
                                        PyList_Check(PyTuple_GET_ITEM(args, 0))))
        items = PyTuple_GET_ITEM(args, 0);
    PyObject *seq = PySequence_Fast(items, "shape");
    if (!seq) return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    int rc = 0;
    if (len > MAX_SHAPE) {
        PyErr_Format(PyExc_ValueError, "too many int attributes (%zd > %d)", len, MAX_SHAPE);
        rc = -1;
    }
    for (Py_ssize_t k = 0; rc == 0 && k < len; k++) {
        PyObject *s = PySequence_Fast_GET_ITEM(seq, k);
        if (!PyIndex_Check(s)) {
            PyErr_Format(PyExc_TypeError, "%s: shape entries must be ints, got %R", op, s);
            rc = -1;
            break;
        }
        PyObject *i = PyNumber_Index(s);
        shape[k] = i ? PyLong_AsLongLong(i) : -1;
        Py_XDECREF(i);
        if (!i || (shape[k] == -1 && PyErr_Occurred())) rc = -1;
    }
    *n = (int)len;
    Py_DECREF(seq);
    return rc;
}

int pykiln_normalize_axis(const char *op, PyObject *axis, int ndim) {
    if (!PyLong_Check(axis) || PyBool_Check(axis)) {
        PyErr_Format(PyExc_TypeError, "%s: axis must be an int, got %s", op, _PyType_Name(Py_TYPE(axis)));
        return -1;
    }
    int overflow;
    long long a = PyLong_AsLongLongAndOverflow(axis, &overflow);
    int n = ndim > 1 ? ndim : 1;
    if (overflow || a < -n || a >= n) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_IndexError, "%s: axis %S is out of range for a tensor with %d dimensions", op, axis,
                         ndim);
        return -1;
    }
    return (int)(a < 0 ? a + n : a);
}

/* Applies a view op with int attributes to x (new reference). */
static PyObject *apply_view(kiln_op op, PyObject *x, const int64_t *ints, int n) {
    kiln_attrs attrs;
    kiln_attrs_clear(&attrs);
    for (int k = 0; k < n; k++) kiln_attrs_push_int(&attrs, ints[k]);
    kiln_tensor *in = pykiln_unwrap(x), *out[KILN_MAX_OUTPUTS] = {0};
    kiln_status s = kiln_apply(op, 1, &in, &attrs, out);
    if (s != KILN_OK) return pykiln_raise(s);
    return pykiln_wrap(out[0]);
}

static const kiln_meta *meta_of(PyObject *x) { return &pykiln_unwrap(x)->meta; }

static PyObject *reshape_to(PyObject *x, const int64_t *shape, int n) {
    return apply_view(KILN_OP_RESHAPE, x, shape, n);
}

/* reshape's shape with its -1 resolved against x's size; -1 with an exception set. */
static int resolve_shape(const char *op, PyObject *x, int64_t *shape, int n) {
    int unknown = -1, count = 0;
    for (int k = 0; k < n; k++) {
        if (shape[k] == -1) unknown = k, count++;
        if (count > 1) return value_error_shape("%s: only one dimension can be -1, got %R", op, shape, n), -1;
    }
    for (int k = 0; k < n; k++)
        if (shape[k] < -1) return value_error_shape("%s: invalid shape %R", op, shape, n), -1;
    if (unknown < 0) return 0;
    int64_t known = 1, size = pykiln_unwrap(x)->numel;
    for (int k = 0; k < n; k++)
        if (k != unknown) known *= shape[k];
    if (known == 0 || size % known) {
        const kiln_meta *m = meta_of(x);
        PyObject *from = shape_repr(m->shape, m->ndim), *to = shape_repr(shape, n);
        if (from && to)
            PyErr_Format(PyExc_ValueError, "%s: cannot reshape a tensor of shape %R into shape %R", op, from, to);
        Py_XDECREF(from);
        Py_XDECREF(to);
        return -1;
    }
    shape[unknown] = size / known;
    return 0;
}

/* ---- the functions ------------------------------------------------------------------------ */

static PyObject *first_tensor(PyObject *args, const char *name) {
    if (PyTuple_GET_SIZE(args) < 1) return PyErr_Format(PyExc_TypeError, "%s() missing argument 'input'", name);
    return pykiln_as_tensor(PyTuple_GET_ITEM(args, 0));
}

/* Whether a reshape's sizes (args after the tensor: ints, or one tuple or list of them) hold a -1. */
static bool infers_a_size(PyObject *args) {
    PyObject *items = args;
    Py_ssize_t first = 1;
    if (PyTuple_GET_SIZE(args) == 2 && (PyTuple_Check(PyTuple_GET_ITEM(args, 1)) || PyList_Check(PyTuple_GET_ITEM(args, 1))))
        items = PyTuple_GET_ITEM(args, 1), first = 0;
    for (Py_ssize_t k = first; k < PySequence_Fast_GET_SIZE(items); k++) {
        PyObject *s = PySequence_Fast_GET_ITEM(items, k);
        if (PyLong_CheckExact(s) && PyLong_AsLong(s) == -1) return true;
    }
    return false;
}

static PyObject *py_reshape(PyObject *module, PyObject *args) {
    (void)module;
    /* a -1 is the rest of the input's elements: a dynamic capture records it as that, not as this call's size */
    PyObject *sym = pykiln_sym_call("reshape", args, pykiln_sym_hooked() && infers_a_size(args));
    if (sym || PyErr_Occurred()) return sym;
    PyObject *x = first_tensor(args, "reshape"), *rest = x ? PyTuple_GetSlice(args, 1, PY_SSIZE_T_MAX) : NULL;
    int64_t shape[MAX_SHAPE];
    int n;
    PyObject *out = rest && parse_shape("reshape", rest, shape, &n) == 0 && resolve_shape("reshape", x, shape, n) == 0
                        ? reshape_to(x, shape, n)
                        : NULL;
    Py_XDECREF(rest);
    Py_XDECREF(x);
    return out;
}

static PyObject *py_flatten(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *kwlist[] = {"input", "start_dim", "end_dim", NULL};
    PyObject *input, *start = NULL, *end = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OO:flatten", kwlist, &input, &start, &end)) return NULL;
    PyObject *x = pykiln_as_tensor(input), *zero = PyLong_FromLong(0), *minus1 = PyLong_FromLong(-1), *out = NULL;
    if (!x || !zero || !minus1) goto done;
    start = start ? start : zero, end = end ? end : minus1;
    const kiln_meta *m = meta_of(x);
    int64_t shape[KILN_MAX_DIMS] = {1};
    if (m->ndim == 0) {
        out = reshape_to(x, shape, 1);
        goto done;
    }
    int s = pykiln_normalize_axis("flatten", start, m->ndim);
    int e = s < 0 ? -1 : pykiln_normalize_axis("flatten", end, m->ndim);
    if (s < 0 || e < 0) goto done;
    if (s > e) {
        PyErr_Format(PyExc_ValueError, "flatten: start_dim %S comes after end_dim %S", start, end);
        goto done;
    }
    int n = 0, src[KILN_MAX_DIMS];
    for (int d = 0; d < s; d++) src[n] = d, shape[n++] = m->shape[d];
    shape[n] = 1;
    for (int d = s; d <= e; d++) shape[n] *= m->shape[d];
    src[n++] = s == e ? s : -2;
    for (int d = e + 1; d < m->ndim; d++) src[n] = d, shape[n++] = m->shape[d];
    out = pykiln_sym_derived(x, reshape_to(x, shape, n), src, n);
done:
    Py_XDECREF(x);
    Py_XDECREF(zero);
    Py_XDECREF(minus1);
    return out;
}

/* Permutes x's axes by perm (op names the caller in errors). */
static PyObject *permute_by(const char *op, PyObject *x, PyObject *axes) {
    int64_t perm[MAX_SHAPE];
    int n, ndim = meta_of(x)->ndim;
    if (parse_shape(op, axes, perm, &n) < 0) return NULL;
    for (int k = 0; k < n; k++) {
        PyObject *a = PyLong_FromLongLong(perm[k]);
        int v = a ? pykiln_normalize_axis(op, a, ndim) : -1;
        Py_XDECREF(a);
        if (v < 0) return NULL;
        perm[k] = v;
    }
    return apply_view(KILN_OP_PERMUTE, x, perm, n);
}

static PyObject *swap(PyObject *x, PyObject *axis0, PyObject *axis1) {
    int ndim = meta_of(x)->ndim, a = pykiln_normalize_axis("swapaxes", axis0, ndim);
    int b = a < 0 ? -1 : pykiln_normalize_axis("swapaxes", axis1, ndim);
    if (a < 0 || b < 0) return NULL;
    int64_t perm[KILN_MAX_DIMS];
    for (int k = 0; k < ndim; k++) perm[k] = k;
    perm[a] = b, perm[b] = a;
    return apply_view(KILN_OP_PERMUTE, x, perm, ndim);
}

static PyObject *py_permute(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *x = first_tensor(args, "permute"), *axes = x ? PyTuple_GetSlice(args, 1, PY_SSIZE_T_MAX) : NULL;
    PyObject *out = axes ? permute_by("permute", x, axes) : NULL;
    Py_XDECREF(axes);
    Py_XDECREF(x);
    return out;
}

static PyObject *py_transpose(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *x = first_tensor(args, "transpose"), *axes = x ? PyTuple_GetSlice(args, 1, PY_SSIZE_T_MAX) : NULL;
    PyObject *out = NULL;
    if (axes && PyTuple_GET_SIZE(axes) == 0) {
        int64_t perm[KILN_MAX_DIMS];
        int ndim = meta_of(x)->ndim;
        for (int k = 0; k < ndim; k++) perm[k] = ndim - 1 - k;
        out = apply_view(KILN_OP_PERMUTE, x, perm, ndim);
    } else if (axes && PyTuple_GET_SIZE(axes) == 2 && PyLong_Check(PyTuple_GET_ITEM(axes, 0)) &&
               PyLong_Check(PyTuple_GET_ITEM(axes, 1))) {
        out = swap(x, PyTuple_GET_ITEM(axes, 0), PyTuple_GET_ITEM(axes, 1));
    } else if (axes) {
        out = permute_by("permute", x, axes);
    }
    Py_XDECREF(axes);
    Py_XDECREF(x);
    return out;
}

static PyObject *py_swapaxes(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *input, *a, *b;
    if (!PyArg_ParseTuple(args, "OOO:swapaxes", &input, &a, &b)) return NULL;
    PyObject *x = pykiln_as_tensor(input), *out = x ? swap(x, a, b) : NULL;
    Py_XDECREF(x);
    return out;
}

static PyObject *py_squeeze(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *kwlist[] = {"input", "axis", NULL};
    PyObject *input, *axis = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:squeeze", kwlist, &input, &axis)) return NULL;
    PyObject *x = pykiln_as_tensor(input);
    if (!x) return NULL;
    const kiln_meta *m = meta_of(x);
    int squeezed[KILN_MAX_DIMS] = {0}, n = 0;
    int64_t shape[KILN_MAX_DIMS];
    PyObject *out = NULL, *axes = axis == Py_None ? NULL
                                  : PyTuple_Check(axis) || PyList_Check(axis) ? PySequence_Tuple(axis)
                                                                              : PyTuple_Pack(1, axis);
    if (axis != Py_None && !axes) goto done;
    for (Py_ssize_t k = 0; axes && k < PyTuple_GET_SIZE(axes); k++) {
        int a = pykiln_normalize_axis("squeeze", PyTuple_GET_ITEM(axes, k), m->ndim);
        if (a < 0) goto done;
        if (a < m->ndim) squeezed[a] = 1;
    }
    for (int d = 0; axes && d < m->ndim; d++) {
        if (squeezed[d] && m->shape[d] != 1) {
            PyObject *s = shape_repr(m->shape, m->ndim);
            if (s)
                PyErr_Format(PyExc_ValueError, "squeeze: axis %d of a tensor of shape %R has length %lld, not 1", d, s,
                             (long long)m->shape[d]);
            Py_XDECREF(s);
            goto done;
        }
    }
    int src[KILN_MAX_DIMS];
    for (int d = 0; d < m->ndim; d++)
        if (axes ? !squeezed[d] : m->shape[d] != 1) src[n] = d, shape[n++] = m->shape[d];
    out = reshape_to(x, shape, n);
    /* squeeze() of every axis of length 1 keeps a size the symbols could make 1: not followed */
    if (axes) out = pykiln_sym_derived(x, out, src, n);
done:
    Py_XDECREF(axes);
    Py_DECREF(x);
    return out;
}

static PyObject *py_unsqueeze(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *kwlist[] = {"input", "axis", "dim", NULL};
    PyObject *input, *axis = NULL, *dim = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$O:unsqueeze", kwlist, &input, &axis, &dim)) return NULL;
    if (dim != Py_None) axis = dim;
    if (!axis) return PyErr_Format(PyExc_TypeError, "unsqueeze() missing required argument 'axis'");
    PyObject *x = pykiln_as_tensor(input);
    if (!x) return NULL;
    const kiln_meta *m = meta_of(x);
    int a = pykiln_normalize_axis("unsqueeze", axis, m->ndim + 1), n = 0;
    int64_t shape[KILN_MAX_DIMS + 1];
    int src[KILN_MAX_DIMS + 1];
    PyObject *out = NULL;
    if (a >= 0) {
        for (int d = 0; d <= m->ndim; d++) {
            if (d == a) src[n] = -1, shape[n++] = 1;
            if (d < m->ndim) src[n] = d, shape[n++] = m->shape[d];
        }
        out = pykiln_sym_derived(x, reshape_to(x, shape, n), src, n);
    }
    Py_DECREF(x);
    return out;
}

static PyObject *py_broadcast_to(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *sym = pykiln_sym_call("broadcast_to", args, false);
    if (sym || PyErr_Occurred()) return sym;
    PyObject *x = first_tensor(args, "broadcast_to"), *rest = x ? PyTuple_GetSlice(args, 1, PY_SSIZE_T_MAX) : NULL;
    int64_t shape[MAX_SHAPE];
    int n;
    PyObject *out = NULL;
    if (rest && parse_shape("broadcast_to", rest, shape, &n) == 0) {
        const kiln_meta *m = meta_of(x);
        int lead = n - m->ndim, ok = 1;
        for (int k = 0; k < n && ok; k++) { /* -1 keeps the input's length */
            if (shape[k] != -1) continue;
            if (k < lead) {
                value_error_shape("%s: -1 is not allowed for a new leading axis in %R", "broadcast_to", shape, n);
                ok = 0;
            } else {
                shape[k] = m->shape[k - lead];
            }
        }
        if (ok) out = apply_view(KILN_OP_EXPAND, x, shape, n);
    }
    Py_XDECREF(rest);
    Py_XDECREF(x);
    return out;
}

/* ---- joining and splitting ---------------------------------------------------------------- */

/* The tensors of a sequence as a new list of tensors (values converted). */
static PyObject *tensor_list(PyObject *seq, const char *op) {
    PyObject *items = PySequence_List(seq), *out = items ? PyList_New(PyList_GET_SIZE(items)) : NULL;
    for (Py_ssize_t k = 0; out && k < PyList_GET_SIZE(items); k++) {
        PyObject *t = pykiln_as_tensor(PyList_GET_ITEM(items, k));
        if (!t) Py_CLEAR(out);
        else PyList_SET_ITEM(out, k, t);
    }
    Py_XDECREF(items);
    if (out && PyList_GET_SIZE(out) == 0) {
        PyErr_Format(PyExc_ValueError, "%s: needs at least one tensor", op);
        Py_CLEAR(out);
    }
    return out;
}

static PyObject *concat_list(PyObject *tensors, int axis) {
    kiln_attrs attrs;
    kiln_attrs_clear(&attrs);
    kiln_attrs_push_int(&attrs, axis);
    return pykiln_apply(KILN_OP_CONCAT, tensors, &attrs);
}

static PyObject *py_concat(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *kwlist[] = {"tensors", "axis", "dim", NULL};
    PyObject *seq, *axis = NULL, *dim = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$O:concat", kwlist, &seq, &axis, &dim)) return NULL;
    PyObject *zero = PyLong_FromLong(0), *tensors = zero ? tensor_list(seq, "concat") : NULL, *out = NULL;
    if (tensors) {
        int a = pykiln_normalize_axis("concat", dim != Py_None ? dim : axis ? axis : zero,
                                      meta_of(PyList_GET_ITEM(tensors, 0))->ndim);
        out = a < 0 ? NULL : concat_list(tensors, a);
    }
    Py_XDECREF(zero);
    Py_XDECREF(tensors);
    return out;
}

static PyObject *py_stack(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *kwlist[] = {"tensors", "axis", "dim", NULL};
    PyObject *seq, *axis = NULL, *dim = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$O:stack", kwlist, &seq, &axis, &dim)) return NULL;
    PyObject *zero = PyLong_FromLong(0), *tensors = zero ? tensor_list(seq, "stack") : NULL, *out = NULL;
    Py_ssize_t n = tensors ? PyList_GET_SIZE(tensors) : 0;
    const kiln_meta *first = n ? meta_of(PyList_GET_ITEM(tensors, 0)) : NULL;
    for (Py_ssize_t k = 1; first && k < n; k++) {
        if (kiln_shape_equal(meta_of(PyList_GET_ITEM(tensors, k)), first->ndim, first->shape)) continue;
        PyObject *shapes = PyList_New(n);
        for (Py_ssize_t j = 0; shapes && j < n; j++) {
            const kiln_meta *m = meta_of(PyList_GET_ITEM(tensors, j));
            PyObject *shape = shape_repr(m->shape, m->ndim);
            if (!shape) Py_CLEAR(shapes);
            else PyList_SET_ITEM(shapes, j, shape);
        }
        if (shapes) PyErr_Format(PyExc_ValueError, "stack: all tensors must have one shape, got %R", shapes);
        Py_XDECREF(shapes);
        first = NULL;
    }
    int a = first ? pykiln_normalize_axis("stack", dim != Py_None ? dim : axis ? axis : zero, first->ndim + 1) : -1;
    PyObject *expanded = a >= 0 ? PyList_New(n) : NULL;
    for (Py_ssize_t k = 0; expanded && k < n; k++) { /* each gets a new axis a of length 1 */
        PyObject *x = PyList_GET_ITEM(tensors, k);
        const kiln_meta *m = meta_of(x);
        int64_t shape[KILN_MAX_DIMS + 1];
        int src[KILN_MAX_DIMS + 1], nd = 0;
        for (int d = 0; d <= m->ndim; d++) {
            if (d == a) src[nd] = -1, shape[nd++] = 1;
            if (d < m->ndim) src[nd] = d, shape[nd++] = m->shape[d];
        }
        /* (as unsqueeze: a dynamic capture follows the sizes) */
        PyObject *t = pykiln_sym_derived(x, reshape_to(x, shape, nd), src, nd);
        if (!t) Py_CLEAR(expanded);
        else PyList_SET_ITEM(expanded, k, t);
    }
    if (expanded) out = concat_list(expanded, a);
    Py_XDECREF(expanded);
    Py_XDECREF(zero);
    Py_XDECREF(tensors);
    return out;
}

/* The `length` elements from `start` along axis a of x (a view). */
static PyObject *narrow_view(PyObject *x, int a, int64_t start, int64_t length) {
    const kiln_meta *m = meta_of(x);
    int64_t attrs[3 * KILN_MAX_DIMS] = {0}; /* starts, steps, lengths */
    for (int d = 0; d < KILN_MAX_DIMS; d++) attrs[KILN_MAX_DIMS + d] = 1;
    for (int d = 0; d < m->ndim; d++) attrs[2 * KILN_MAX_DIMS + d] = m->shape[d];
    attrs[a] = start, attrs[2 * KILN_MAX_DIMS + a] = length;
    return apply_view(KILN_OP_SLICE, x, attrs, 3 * KILN_MAX_DIMS);
}

static PyObject *py_narrow(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *sym = pykiln_sym_call("narrow", args, true);
    if (sym || PyErr_Occurred()) return sym;
    PyObject *input, *axis;
    long long start, length;
    if (!PyArg_ParseTuple(args, "OOLL:narrow", &input, &axis, &start, &length)) return NULL;
    PyObject *x = pykiln_as_tensor(input), *out = NULL;
    int a = x ? pykiln_normalize_axis("narrow", axis, meta_of(x)->ndim) : -1;
    if (a >= 0) out = narrow_view(x, a, start, length);
    Py_XDECREF(x);
    return out;
}

/* The views of x of the given sizes along axis a, one after another (a tuple). */
static PyObject *split_sizes(PyObject *x, int a, PyObject *sizes) {
    PyObject *out = PyTuple_New(PyList_GET_SIZE(sizes));
    int64_t start = 0;
    for (Py_ssize_t k = 0; out && k < PyList_GET_SIZE(sizes); k++) {
        long long len = PyLong_AsLongLong(PyList_GET_ITEM(sizes, k));
        PyObject *piece = len == -1 && PyErr_Occurred() ? NULL : narrow_view(x, a, start, len);
        if (!piece) Py_CLEAR(out);
        else PyTuple_SET_ITEM(out, k, piece);
        start += len;
    }
    return out;
}

/* split's piece sizes along an axis of length n: all `size` but a shorter last one. */
static PyObject *even_sizes(long long size, int64_t n, const char *op) {
    if (size <= 0) return PyErr_Format(PyExc_ValueError, "%s: the split size must be positive, got %lld", op, size);
    PyObject *sizes = PyList_New(0);
    for (int64_t left = n; sizes && left > 0; left -= size) {
        PyObject *v = PyLong_FromLongLong(left < size ? left : size);
        if (!v || PyList_Append(sizes, v) < 0) Py_CLEAR(sizes);
        Py_XDECREF(v);
    }
    return sizes;
}

/* The axis split or chunk cuts (and its length in *n); -1 with an exception naming op set. */
static int cut_axis(const char *op, PyObject *x, PyObject *axis, int64_t *n) {
    int a = pykiln_normalize_axis(op, axis, meta_of(x)->ndim);
    if (a >= 0 && meta_of(x)->ndim == 0) {
        PyErr_Format(PyExc_ValueError, "%s: a 0-d tensor has no axis", op);
        return -1;
    }
    *n = a >= 0 ? meta_of(x)->shape[a] : 0;
    return a;
}

static PyObject *py_split(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *kwlist[] = {"tensor", "split_size_or_sections", "axis", "dim", NULL};
    PyObject *input, *sections, *axis = NULL, *dim = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|O$O:split", kwlist, &input, &sections, &axis, &dim))
        return NULL;
    PyObject *zero = PyLong_FromLong(0), *x = zero ? pykiln_as_tensor(input) : NULL, *sizes = NULL, *out = NULL;
    int64_t n;
    int a = x ? cut_axis("split", x, dim != Py_None ? dim : axis ? axis : zero, &n) : -1;
    if (a >= 0 && PyIndex_Check(sections)) { /* an int, or an object standing for one (a symbolic size) */
        long long size = PyLong_AsLongLong(sections);
        sizes = size == -1 && PyErr_Occurred() ? NULL : even_sizes(size, n, "split");
    } else if (a >= 0) {
        sizes = PySequence_List(sections);
        long long sum = 0;
        for (Py_ssize_t k = 0; sizes && k < PyList_GET_SIZE(sizes); k++) {
            long long v = PyLong_AsLongLong(PyList_GET_ITEM(sizes, k));
            if (v == -1 && PyErr_Occurred()) Py_CLEAR(sizes);
            sum += v;
        }
        if (sizes && sum != n) {
            PyErr_Format(PyExc_ValueError, "split: sections %R do not add up to %lld, the length of axis %d", sizes,
                         (long long)n, a);
            Py_CLEAR(sizes);
        }
    }
    if (sizes) out = split_sizes(x, a, sizes);
    Py_XDECREF(sizes);
    Py_XDECREF(x);
    Py_XDECREF(zero);
    return out;
}

static PyObject *py_chunk(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *kwlist[] = {"input", "chunks", "axis", NULL};
    PyObject *input, *axis = NULL;
    long long chunks;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OL|O:chunk", kwlist, &input, &chunks, &axis)) return NULL;
    if (chunks <= 0) return PyErr_Format(PyExc_ValueError, "chunk: chunks must be positive, got %lld", chunks);
    PyObject *zero = PyLong_FromLong(0), *x = zero ? pykiln_as_tensor(input) : NULL, *out = NULL;
    int64_t n;
    int a = x ? cut_axis("chunk", x, axis ? axis : zero, &n) : -1;
    /* ceil(n / chunks) without n + chunks - 1, which overflows for chunks near 2**63 */
    PyObject *sizes = a >= 0 ? even_sizes(n > 0 ? (n - 1) / chunks + 1 : 0, n, "split") : NULL;
    if (sizes) out = split_sizes(x, a, sizes);
    Py_XDECREF(sizes);
    Py_XDECREF(x);
    Py_XDECREF(zero);
    return out;
}

/* ---- the shared argument helpers ---------------------------------------------------------- */

static PyObject *py_normalize_axis(PyObject *module, PyObject *args) {
    (void)module;
    const char *op;
    PyObject *axis;
    int ndim;
    if (!PyArg_ParseTuple(args, "sOi:normalize_axis", &op, &axis, &ndim)) return NULL;
    int a = pykiln_normalize_axis(op, axis, ndim);
    return a < 0 ? NULL : PyLong_FromLong(a);
}

PyObject *pykiln_axes_mask(const char *op, PyObject *axis, int ndim) {
    if (axis == Py_None) return PyLong_FromLongLong((1LL << ndim) - 1);
    if (!PyTuple_Check(axis) && !PyList_Check(axis)) {
        if (ndim == 0) return PyLong_FromLong(0);
        int a = pykiln_normalize_axis(op, axis, ndim);
        return a < 0 ? NULL : PyLong_FromLongLong(1LL << a);
    }
    long long mask = 0;
    PyObject *axes = PySequence_Tuple(axis);
    for (Py_ssize_t k = 0; axes && k < PyTuple_GET_SIZE(axes); k++) {
        int a = pykiln_normalize_axis(op, PyTuple_GET_ITEM(axes, k), ndim);
        if (a >= 0 && (mask & (1LL << a)))
            PyErr_Format(PyExc_ValueError, "%s: axis %S appears twice in %R", op, PyTuple_GET_ITEM(axes, k), axes);
        if (a < 0 || PyErr_Occurred()) Py_CLEAR(axes);
        else mask |= 1LL << a;
    }
    PyObject *out = axes ? PyLong_FromLongLong(mask) : NULL;
    Py_XDECREF(axes);
    return out;
}

static PyObject *py_axes_mask(PyObject *module, PyObject *args) {
    (void)module;
    const char *op;
    PyObject *axis;
    int ndim;
    if (!PyArg_ParseTuple(args, "sOi:axes_mask", &op, &axis, &ndim)) return NULL;
    return pykiln_axes_mask(op, axis, ndim);
}

static PyObject *py_shape_tuple(PyObject *module, PyObject *args) {
    (void)module;
    const char *op;
    PyObject *shape;
    if (!PyArg_ParseTuple(args, "sO:shape_tuple", &op, &shape)) return NULL;
    PyObject *items = PySequence_Tuple(shape);
    int64_t dims[MAX_SHAPE];
    int n;
    PyObject *out = items && parse_shape(op, items, dims, &n) == 0 ? shape_repr(dims, n) : NULL;
    Py_XDECREF(items);
    return out;
}

static PyObject *py_as_tensor(PyObject *module, PyObject *x) {
    (void)module;
    return pykiln_as_tensor(x);
}

/* ---- errors name the op ----------------------------------------------------------------------- */

/* (pykiln.h) The pending exception, when Python's own (a TypeError from Tensor(x), an OverflowError from an
 * int) and its message names no op ("word: ..."), becomes "op: message" (chained to it): the
 * same class, or TypeError for an AttributeError and ValueError for an OverflowError or a
 * ZeroDivisionError, as kiln.ops' Python functions do (kiln.ops._util.naming_errors). */
void pykiln_name_error(const char *op) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *renamed = type == PyExc_TypeError || type == PyExc_ValueError || type == PyExc_IndexError ||
                                type == PyExc_KeyError ? type
                        : type == PyExc_AttributeError                                      ? PyExc_TypeError
                        : type == PyExc_OverflowError || type == PyExc_ZeroDivisionError    ? PyExc_ValueError
                                                                                           : NULL;
    PyObject *msg = renamed && value ? PyObject_Str(value) : NULL;
    const char *m = msg ? PyUnicode_AsUTF8(msg) : NULL;
    size_t word = m ? strspn(m, "abcdefghijklmnopqrstuvwxyz0123456789_/") : 0;
    if (!m || (word > 0 && m[word] == ':' && m[word + 1] == ' ')) {
        Py_XDECREF(msg);
        PyErr_Restore(type, value, tb);
        return;
    }
    PyErr_Format(renamed, "%s: %U", op, msg);
    Py_DECREF(msg);
    PyObject *ntype, *nvalue, *ntb;
    PyErr_Fetch(&ntype, &nvalue, &ntb);
    PyErr_NormalizeException(&ntype, &nvalue, &ntb);
    if (nvalue) PyException_SetCause(nvalue, Py_NewRef(value));
    PyErr_Restore(ntype, nvalue, ntb);
    Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
}

/* fn under the name `op`: its errors name the op (pykiln_name_error) */
#define NAMED_VARARGS(fn, op)                                                                        \
    static PyObject *fn##_named(PyObject *module, PyObject *args) {                                 \
        PyObject *out = fn(module, args);                                                            \
        if (!out) pykiln_name_error(op);                                                                    \
        return out;                                                                                  \
    }
#define NAMED_KEYWORDS(fn, op)                                                                       \
    static PyObject *fn##_named(PyObject *module, PyObject *args, PyObject *kwargs) {               \
        PyObject *out = fn(module, args, kwargs);                                                    \
        if (!out) pykiln_name_error(op);                                                                    \
        return out;                                                                                  \
    }
NAMED_VARARGS(py_reshape, "reshape")
NAMED_KEYWORDS(py_flatten, "flatten")
NAMED_VARARGS(py_permute, "permute")
NAMED_VARARGS(py_transpose, "transpose")
NAMED_VARARGS(py_swapaxes, "swapaxes")
NAMED_KEYWORDS(py_squeeze, "squeeze")
NAMED_KEYWORDS(py_unsqueeze, "unsqueeze")
NAMED_VARARGS(py_broadcast_to, "broadcast_to")
NAMED_KEYWORDS(py_concat, "concat")
NAMED_KEYWORDS(py_stack, "stack")
NAMED_VARARGS(py_narrow, "narrow")
NAMED_KEYWORDS(py_split, "split")
NAMED_KEYWORDS(py_chunk, "chunk")

static PyMethodDef shape_functions[] = {
    {"reshape", py_reshape_named, METH_VARARGS,
     "reshape(input, *shape)\n--\n\nA tensor with the same elements and a new shape (a view when the layout "
     "allows); one dimension may be -1."},
    {"flatten", (PyCFunction)(void (*)(void))py_flatten_named, METH_VARARGS | METH_KEYWORDS,
     "flatten(input, start_dim=0, end_dim=-1)\n--\n\nMerges axes start_dim..end_dim into one."},
    {"permute", py_permute_named, METH_VARARGS, "permute(input, *axes)\n--\n\nReorders the axes (a view)."},
    {"transpose", py_transpose_named, METH_VARARGS,
     "transpose(input, *axes)\n--\n\ntranspose(x, perm) permutes the axes (MindSpore); transpose(x, dim0, dim1) "
     "swaps two axes (PyTorch); transpose(x) reverses them."},
    {"swapaxes", py_swapaxes_named, METH_VARARGS, "swapaxes(input, axis0, axis1)\n--\n\nExchanges two axes (a view)."},
    {"squeeze", (PyCFunction)(void (*)(void))py_squeeze_named, METH_VARARGS | METH_KEYWORDS,
     "squeeze(input, axis=None)\n--\n\nRemoves axes of length 1 (all of them, or those in `axis`)."},
    {"unsqueeze", (PyCFunction)(void (*)(void))py_unsqueeze_named, METH_VARARGS | METH_KEYWORDS,
     "unsqueeze(input, axis, *, dim=None)\n--\n\nInserts an axis of length 1 at `axis`."},
    {"broadcast_to", py_broadcast_to_named, METH_VARARGS,
     "broadcast_to(input, *shape)\n--\n\nA read-only broadcast view with the given shape (-1 keeps the input's "
     "length)."},
    {"concat", (PyCFunction)(void (*)(void))py_concat_named, METH_VARARGS | METH_KEYWORDS,
     "concat(tensors, axis=0, *, dim=None)\n--\n\nJoins tensors along an existing axis."},
    {"stack", (PyCFunction)(void (*)(void))py_stack_named, METH_VARARGS | METH_KEYWORDS,
     "stack(tensors, axis=0, *, dim=None)\n--\n\nJoins tensors of one shape along a new axis."},
    {"narrow", py_narrow_named, METH_VARARGS,
     "narrow(input, axis, start, length)\n--\n\nThe `length` elements from `start` along `axis` (a view)."},
    {"split", (PyCFunction)(void (*)(void))py_split_named, METH_VARARGS | METH_KEYWORDS,
     "split(tensor, split_size_or_sections, axis=0, *, dim=None)\n--\n\nViews of consecutive pieces along "
     "`axis`: of a given size, or of the listed sizes."},
    {"chunk", (PyCFunction)(void (*)(void))py_chunk_named, METH_VARARGS | METH_KEYWORDS,
     "chunk(input, chunks, axis=0)\n--\n\nSplits into `chunks` nearly equal pieces."},
    {"as_tensor", py_as_tensor, METH_O,
     "as_tensor(x)\n--\n\nx as a kiln tensor: itself, or Tensor(x). (Scalars mixed with tensors in one op are "
     "better passed to apply as they are: it gives them the tensor's dtype the NumPy-2 way.)"},
    {"normalize_axis", py_normalize_axis, METH_VARARGS,
     "normalize_axis(op, axis, ndim)\n--\n\nOne axis in [0, ndim) (a 0-d tensor accepts 0 and -1)."},
    {"axes_mask", py_axes_mask, METH_VARARGS,
     "axes_mask(op, axis, ndim)\n--\n\nBitmask of reduced axes; None means every axis."},
    {"shape_tuple", py_shape_tuple, METH_VARARGS,
     "shape_tuple(op, shape)\n--\n\nA shape given as ints, a tuple or a list (shape is the tuple of arguments), as "
     "a tuple of ints."},
    {NULL, NULL, 0, NULL},
};

int pykiln_shape_init(PyObject *module) {
    PyObject *shape = PyModule_New("kiln._C.shape");
    if (!shape || PyModule_AddFunctions(shape, shape_functions) < 0) {
        Py_XDECREF(shape);
        return -1;
    }
    return PyModule_AddObject(module, "shape", shape);
}
