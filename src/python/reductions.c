/* kiln._C.Reduction: the reduction functions of kiln.ops (sum, mean, prod, max, min, var, std,
 * argmax, argmin) as callables that work out their arguments — NumPy's axis/keepdims, PyTorch's
 * dim/keepdim, the moments' ddof/correction/unbiased — into the op's attributes:
 *     reduce:  (mask of the reduced axes, keepdims)
 *     moment:  (mask, keepdims, ddof)
 *     arg:     (mask of the one axis, or of all of them for a flattened tensor; keepdims)
 * Reference notes: arguments are borrowed; results are new references. */
#include "pykiln.h"

#include "core/internal.h"

#include <structmember.h>

enum { KIND_REDUCE, KIND_MOMENT, KIND_ARG };

typedef struct {
    PyObject_HEAD
    int op, kind;
    PyObject *name; /* __name__ */
    PyObject *doc;  /* __doc__ */
} PyReduction;

/* The mask of the axes `axis` names (None: every axis), as axes_mask() gives it. */
static int reduce_mask(PyReduction *r, PyObject *axis, int ndim, long long *mask) {
    const char *name = PyUnicode_AsUTF8(r->name);
    if (!name) return -1;
    if (r->kind == KIND_ARG) {
        int a = axis == Py_None ? 0 : pykiln_normalize_axis(name, axis, ndim);
        if (a < 0) return -1; /* raised; no shift by it */
        *mask = ndim == 0 ? 0 : axis == Py_None ? (1LL << ndim) - 1 : 1LL << a;
        return 0;
    }
    PyObject *m = pykiln_axes_mask(name, axis, ndim);
    *mask = m ? PyLong_AsLongLong(m) : -1;
    Py_XDECREF(m);
    return m ? 0 : -1;
}

static PyObject *reduction_run(PyObject *self, PyObject *args, PyObject *kwargs) {
    PyReduction *r = (PyReduction *)self;
    static char *plain[] = {"input", "axis", "keepdims", "dim", "keepdim", NULL};
    static char *moment[] = {"input", "axis", "keepdims", "ddof", "correction", "unbiased", "dim", "keepdim", NULL};
    PyObject *input, *axis = Py_None, *keepdims = Py_False, *dim = Py_None, *keepdim = Py_None;
    PyObject *ddof = NULL, *correction = Py_None, *unbiased = Py_None;
    int ok = r->kind == KIND_MOMENT
                 ? PyArg_ParseTupleAndKeywords(args, kwargs, "O|OO$OOOOO", moment, &input, &axis, &keepdims, &ddof,
                                               &correction, &unbiased, &dim, &keepdim)
                 : PyArg_ParseTupleAndKeywords(args, kwargs, "O|OO$OO", plain, &input, &axis, &keepdims, &dim,
                                               &keepdim);
    if (!ok) return NULL;
    if (dim != Py_None) axis = dim;
    if (keepdim != Py_None) keepdims = keepdim;
    if (correction != Py_None) ddof = correction;
    long long mask, ddof_value = 0;
    if (unbiased != Py_None) { /* unbiased=True is ddof 1 */
        int u = PyObject_IsTrue(unbiased);
        if (u < 0) return NULL;
        ddof = NULL, ddof_value = u;
    }
    if (ddof && !PyLong_Check(ddof) && !PyFloat_Check(ddof))
        return PyErr_Format(PyExc_TypeError, "%U: ddof must be a number, got %s", r->name, Py_TYPE(ddof)->tp_name);
    PyObject *d = ddof ? PyNumber_Long(ddof) : NULL;
    if (d) ddof_value = PyLong_AsLongLong(d);
    Py_XDECREF(d);
    if (ddof && (!d || (ddof_value == -1 && PyErr_Occurred()))) return NULL;
    PyObject *x = pykiln_as_tensor(input);
    if (!x) return NULL;
    int keep = PyObject_IsTrue(keepdims);
    if (keep < 0 || reduce_mask(r, axis, pykiln_unwrap(x)->meta.ndim, &mask) < 0) {
        Py_DECREF(x);
        return NULL;
    }
    kiln_attrs attrs;
    kiln_attrs_clear(&attrs);
    kiln_attrs_push_int(&attrs, mask);
    kiln_attrs_push_int(&attrs, keep);
    if (r->kind == KIND_MOMENT) kiln_attrs_push_int(&attrs, ddof_value);
    kiln_tensor *in = pykiln_unwrap(x), *out[KILN_MAX_OUTPUTS] = {0};
    kiln_status s = kiln_apply((kiln_op)r->op, 1, &in, &attrs, out);
    Py_DECREF(x);
    if (s != KILN_OK) return pykiln_raise(s);
    return pykiln_wrap(out[0]);
}

/* reduction_run, whose errors name the op */
static PyObject *reduction_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    PyObject *out = reduction_run(self, args, kwargs);
    if (!out) pykiln_name_error(PyUnicode_AsUTF8(((PyReduction *)self)->name));
    return out;
}

static int reduction_init(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"op", "name", "kind", "doc", NULL};
    PyReduction *r = (PyReduction *)self;
    const char *kind;
    PyObject *name, *doc;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iUsU:Reduction", kwlist, &r->op, &name, &kind, &doc)) return -1;
    if (r->op < 0 || r->op >= KILN_OP_COUNT) {
        PyErr_Format(PyExc_ValueError, "Reduction: unknown op %d", r->op);
        return -1;
    }
    r->kind = strcmp(kind, "moment") == 0 ? KIND_MOMENT : strcmp(kind, "arg") == 0 ? KIND_ARG : KIND_REDUCE;
    if (r->kind == KIND_REDUCE && strcmp(kind, "reduce") != 0) {
        PyErr_Format(PyExc_ValueError, "Reduction: kind must be 'reduce', 'moment' or 'arg', got %s", kind);
        return -1;
    }
    Py_XSETREF(r->name, Py_NewRef(name));
    Py_XSETREF(r->doc, Py_NewRef(doc));
    return 0;
}

static void reduction_dealloc(PyObject *self) {
    PyReduction *r = (PyReduction *)self;
    Py_CLEAR(r->name);
    Py_CLEAR(r->doc);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *reduction_repr(PyObject *self) {
    return PyUnicode_FromFormat("<kiln reduction %U>", ((PyReduction *)self)->name);
}

static PyMemberDef reduction_members[] = {
    {"__name__", T_OBJECT, offsetof(PyReduction, name), READONLY, NULL},
    {"__qualname__", T_OBJECT, offsetof(PyReduction, name), READONLY, NULL},
    {"__doc__", T_OBJECT, offsetof(PyReduction, doc), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PyReduction_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.Reduction",
    .tp_basicsize = sizeof(PyReduction),
    .tp_dealloc = reduction_dealloc,
    .tp_repr = reduction_repr,
    .tp_call = reduction_call,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_members = reduction_members,
    .tp_init = reduction_init,
    .tp_new = PyType_GenericNew,
};

int pykiln_reductions_init(PyObject *module) {
    if (PyType_Ready(&PyReduction_Type) < 0) return -1;
    Py_INCREF(&PyReduction_Type);
    return PyModule_AddObject(module, "Reduction", (PyObject *)&PyReduction_Type);
}
