/* kiln._C.Elementwise: the elementwise functions of kiln.ops (neg, exp, ..., add, mul, maximum,
 * comparisons) as callables. A unary one converts its argument to a tensor; a binary one
 * broadcasts and promotes NumPy 2's way through kiln_apply, where a Python scalar next to a
 * tensor is weak (takes the tensor's dtype), on either side: ops.sub(2, x) computes in the dtype
 * `2 - x` and `x - 2` do.
 * Reference notes: arguments are borrowed; results are new references. */
#include "pykiln.h"

#include "core/internal.h"

#include <structmember.h>

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int op, arity;
    PyObject *name; /* __name__ */
    PyObject *doc;  /* __doc__ */
} PyElementwise;

static PyObject *apply_pair(int op, PyObject *a, PyObject *b) {
    PyObject *inputs = PyTuple_Pack(2, a, b);
    kiln_attrs attrs;
    kiln_attrs_clear(&attrs);
    PyObject *out = inputs ? pykiln_apply((kiln_op)op, inputs, &attrs) : NULL;
    Py_XDECREF(inputs);
    return out;
}

/* A value given before a tensor, as a tensor, converted as the operators convert it (`2 * x` is
 * `x.__rmul__(2)`): a Python scalar is weak, so ops.mul(2, x) and 2 * x give one dtype. */
static PyObject *scalar_first(PyObject *input, PyObject *other) {
    if (!PyFloat_Check(input) && !PyLong_Check(input) && !PyObject_CheckBuffer(input) && !PyList_Check(input) &&
        !PyTuple_Check(input))
        return pykiln_as_tensor(input);
    kiln_tensor *conv = pykiln_to_tensor(input, pykiln_unwrap(other));
    return conv ? pykiln_wrap(conv) : NULL;
}

static bool is_comparison(int op) {
    return op == KILN_OP_EQ || op == KILN_OP_NE || op == KILN_OP_LT || op == KILN_OP_LE || op == KILN_OP_GT ||
           op == KILN_OP_GE;
}

/* The comparison with its operands swapped: v < x is x > v. */
static kiln_op flipped(int op) {
    return op == KILN_OP_LT ? KILN_OP_GT : op == KILN_OP_LE ? KILN_OP_GE : op == KILN_OP_GT ? KILN_OP_LT
           : op == KILN_OP_GE ? KILN_OP_LE : (kiln_op)op;
}

static PyObject *elementwise_run(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyElementwise *e = (PyElementwise *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    PyObject *given[2] = {NULL, NULL};
    if (kwnames && PyTuple_GET_SIZE(kwnames)) { /* input=, other= */
        static const char *const names[] = {"input", "other"};
        for (Py_ssize_t k = 0; k < nargs && k < 2; k++) given[k] = args[k];
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++) {
            int slot = -1;
            for (int n = 0; n < e->arity; n++)
                if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, k), names[n]) == 0) slot = n;
            if (slot < 0 || given[slot])
                return PyErr_Format(PyExc_TypeError, "%U() got an unexpected or repeated keyword argument %R",
                                    e->name, PyTuple_GET_ITEM(kwnames, k));
            given[slot] = args[nargs + k];
        }
        nargs += PyTuple_GET_SIZE(kwnames);
        args = given;
    }
    if (nargs != e->arity || !args[0] || (e->arity == 2 && !args[1]))
        return PyErr_Format(PyExc_TypeError, "%U() takes %d argument%s (%zd given)", e->name, e->arity,
                            e->arity == 1 ? "" : "s", nargs);
    if (e->arity == 1) {
        PyObject *x = pykiln_as_tensor(args[0]), *in = x ? PyTuple_Pack(1, x) : NULL;
        kiln_attrs attrs;
        kiln_attrs_clear(&attrs);
        PyObject *out = in ? pykiln_apply((kiln_op)e->op, in, &attrs) : NULL;
        Py_XDECREF(x);
        Py_XDECREF(in);
        return out;
    }
    PyObject *input = args[0], *other = args[1];
    int tensor_first = pykiln_is_tensor(input);
    if (is_comparison(e->op) && tensor_first != pykiln_is_tensor(other)) { /* int8 == 300: by value */
        PyObject *r = tensor_first ? pykiln_compare_out_of_range(input, other, (kiln_op)e->op)
                                   : pykiln_compare_out_of_range(other, input, flipped(e->op));
        if (r || PyErr_Occurred()) return r;
    }
    PyObject *first = tensor_first                ? Py_NewRef(input)
                      : !pykiln_is_tensor(other) ? pykiln_as_tensor(input)
                                                 : scalar_first(input, other);
    PyObject *out = first ? apply_pair(e->op, first, other) : NULL;
    Py_XDECREF(first);
    return out;
}

/* elementwise_run, whose errors name the op */
static PyObject *elementwise_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyObject *out = elementwise_run(self, args, nargsf, kwnames);
    if (!out) pykiln_name_error(PyUnicode_AsUTF8(((PyElementwise *)self)->name));
    return out;
}

static PyObject *elementwise_tp_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    return PyVectorcall_Call(self, args, kwargs);
}

static int elementwise_init(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"op", "name", "arity", "doc", NULL};
    PyElementwise *e = (PyElementwise *)self;
    PyObject *name, *doc;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iUiU:Elementwise", kwlist, &e->op, &name, &e->arity, &doc))
        return -1;
    if (e->op < 0 || e->op >= KILN_OP_COUNT || e->arity < 1 || e->arity > 2) {
        PyErr_Format(PyExc_ValueError, "Elementwise: unknown op %d or arity %d", e->op, e->arity);
        return -1;
    }
    Py_XSETREF(e->name, Py_NewRef(name));
    Py_XSETREF(e->doc, Py_NewRef(doc));
    return 0;
}

static PyObject *elementwise_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *self = PyType_GenericNew(type, args, kwargs);
    if (self) *(vectorcallfunc *)((char *)self + type->tp_vectorcall_offset) = elementwise_call;
    return self;
}

static void elementwise_dealloc(PyObject *self) {
    PyElementwise *e = (PyElementwise *)self;
    Py_CLEAR(e->name);
    Py_CLEAR(e->doc);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *elementwise_repr(PyObject *self) {
    return PyUnicode_FromFormat("<kiln elementwise %U>", ((PyElementwise *)self)->name);
}

static PyMemberDef elementwise_members[] = {
    {"__name__", T_OBJECT, offsetof(PyElementwise, name), READONLY, NULL},
    {"__qualname__", T_OBJECT, offsetof(PyElementwise, name), READONLY, NULL},
    {"__doc__", T_OBJECT, offsetof(PyElementwise, doc), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PyElementwise_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.Elementwise",
    .tp_basicsize = sizeof(PyElementwise),
    .tp_dealloc = elementwise_dealloc,
    .tp_repr = elementwise_repr,
    .tp_call = elementwise_tp_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_members = elementwise_members,
    .tp_init = elementwise_init,
    .tp_new = elementwise_new,
};

int pykiln_elementwise_init(PyObject *module) {
    PyElementwise_Type.tp_vectorcall_offset = offsetof(PyElementwise, vectorcall);
    if (PyType_Ready(&PyElementwise_Type) < 0) return -1;
    Py_INCREF(&PyElementwise_Type);
    return PyModule_AddObject(module, "Elementwise", (PyObject *)&PyElementwise_Type);
}
