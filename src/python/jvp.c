/* kiln._C's forward mode (used by python/kiln/derivatives.py): jvp and linearize over a function
 * recorded by a nested Tracer (src/ir/jvp.c does the work), and the ops without a JVP rule. */
#include "pykiln.h"

#include "core/internal.h"
#include "ir/jvp.h"

/* The tensors of a sequence (borrowed) into a malloc'd array; NULL with an exception set. */
static kiln_tensor **tensors_of(PyObject *seq, const char *what, Py_ssize_t *n) {
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast) return NULL;
    *n = PySequence_Fast_GET_SIZE(fast);
    kiln_tensor **ts = PyMem_Calloc((size_t)(*n ? *n : 1), sizeof *ts);
    for (Py_ssize_t k = 0; ts && k < *n; k++) {
        PyObject *o = PySequence_Fast_GET_ITEM(fast, k);
        if (!pykiln_is_tensor(o)) {
            PyErr_Format(PyExc_TypeError, "%s: item %zd is not a Tensor", what, k);
            PyMem_Free(ts);
            ts = NULL;
            break;
        }
        ts[k] = pykiln_unwrap(o);
    }
    if (!ts && !PyErr_Occurred()) PyErr_NoMemory();
    Py_DECREF(fast);
    return ts;
}

/* A tuple of n tensors (references stolen; all released on failure). */
static PyObject *tuple_of(kiln_tensor **ts, int n) {
    PyObject *t = PyTuple_New(n);
    for (int k = 0; k < n; k++) {
        PyObject *o = t ? pykiln_wrap(ts[k]) : NULL;
        if (!o) {
            if (!t) kiln_tensor_release(ts[k]);
            for (int j = k + 1; j < n; j++) kiln_tensor_release(ts[j]);
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, k, o);
    }
    return t;
}

/* jvp(tracer, primals, tangents) -> (outputs, tangents of the outputs): the body the tracer finished
 * run again on primals with its ops' JVP rules (recorded by the active trace, if any) */
static PyObject *py_jvp(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *tracer, *primals, *tangents;
    if (!PyArg_ParseTuple(args, "OOO:jvp", &tracer, &primals, &tangents)) return NULL;
    Py_ssize_t nx = 0, nt = 0;
    kiln_tensor **x = tensors_of(primals, "jvp: primals", &nx);
    kiln_tensor **t = x ? tensors_of(tangents, "jvp: tangents", &nt) : NULL;
    kiln_graph *g = t ? pykiln_tracer_take_body(tracer) : NULL;
    PyObject *result = NULL;
    if (g && nt != nx) PyErr_Format(PyExc_ValueError, "jvp: %zd primals but %zd tangents", nx, nt);
    else if (g) {
        int ny = g->noutputs;
        kiln_tensor **y = PyMem_Calloc((size_t)(2 * ny + 1), sizeof *y);
        kiln_status s = y ? kiln_jvp_run(g, (int)nx, x, t, ny, y, y + ny) : KILN_ERR_MEMORY;
        if (!y) PyErr_NoMemory();
        else if (s != KILN_OK) pykiln_raise(s);
        else {
            PyObject *ys = tuple_of(y, ny), *tys = tuple_of(y + ny, ny);
            if (ys && tys) result = PyTuple_Pack(2, ys, tys);
            Py_XDECREF(ys), Py_XDECREF(tys);
        }
        PyMem_Free(y);
    }
    kiln_graph_free(g);
    PyMem_Free(x), PyMem_Free(t);
    return result;
}

/* ---- linearize --------------------------------------------------------------------------------- */

static const char LINEAR_CAPSULE[] = "kiln.linear_graph";

static void linear_capsule_free(PyObject *capsule) {
    kiln_graph_free(PyCapsule_GetPointer(capsule, LINEAR_CAPSULE));
}

/* linearize(tracer, primals) -> (outputs, residuals, linear): the forward part of the body's JVP graph
 * run on primals, and its tangent part (a capsule for run_linear) */
static PyObject *py_linearize(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *tracer, *primals;
    if (!PyArg_ParseTuple(args, "OO:linearize", &tracer, &primals)) return NULL;
    Py_ssize_t nx = 0;
    kiln_tensor **x = tensors_of(primals, "linearize: primals", &nx);
    kiln_graph *g = x ? pykiln_tracer_take_body(tracer) : NULL;
    kiln_graph *fwd = NULL, *lin = NULL;
    int32_t nres = 0;
    PyObject *result = NULL;
    kiln_status s = g ? kiln_jvp_linearize(g, (int)nx, x, &fwd, &lin, &nres) : KILN_OK;
    if (g && s != KILN_OK) pykiln_raise(s);
    else if (g) {
        int n = fwd->noutputs, ny = n - nres;
        kiln_tensor **out = PyMem_Calloc((size_t)(n + 1), sizeof *out);
        s = out ? kiln_jvp_run(fwd, (int)nx, x, NULL, n, out, NULL) : KILN_ERR_MEMORY;
        if (!out) PyErr_NoMemory();
        else if (s != KILN_OK) pykiln_raise(s);
        else {
            PyObject *ys = tuple_of(out, ny), *res = tuple_of(out + ny, nres);
            PyObject *cap = ys && res ? PyCapsule_New(lin, LINEAR_CAPSULE, linear_capsule_free) : NULL;
            if (cap) lin = NULL, result = PyTuple_Pack(3, ys, res, cap);
            Py_XDECREF(ys), Py_XDECREF(res), Py_XDECREF(cap);
        }
        PyMem_Free(out);
    }
    kiln_graph_free(g), kiln_graph_free(fwd), kiln_graph_free(lin);
    PyMem_Free(x);
    return result;
}

/* run_linear(linear, residuals, tangents) -> the outputs' tangents */
static PyObject *py_run_linear(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cap, *residuals, *tangents;
    if (!PyArg_ParseTuple(args, "OOO:run_linear", &cap, &residuals, &tangents)) return NULL;
    kiln_graph *lin = PyCapsule_GetPointer(cap, LINEAR_CAPSULE);
    if (!lin) return NULL;
    PyObject *all = PySequence_Concat(residuals, tangents);
    if (!all) return NULL;
    Py_ssize_t n = 0;
    kiln_tensor **in = tensors_of(all, "linearize: the linear function's inputs", &n);
    Py_DECREF(all);
    if (!in) return NULL;
    PyObject *result = NULL;
    kiln_tensor **out = PyMem_Calloc((size_t)(lin->noutputs + 1), sizeof *out);
    kiln_status s = out ? kiln_jvp_run(lin, (int)n, in, NULL, lin->noutputs, out, NULL) : KILN_ERR_MEMORY;
    if (!out) PyErr_NoMemory();
    else if (s != KILN_OK) pykiln_raise(s);
    else result = tuple_of(out, lin->noutputs);
    PyMem_Free(out), PyMem_Free(in);
    return result;
}

/* linear_ops(linear) -> the op names of the linear part's nodes, in order (for tests) */
static PyObject *py_linear_ops(PyObject *self, PyObject *cap) {
    (void)self;
    kiln_graph *lin = PyCapsule_GetPointer(cap, LINEAR_CAPSULE);
    if (!lin) return NULL;
    PyObject *list = PyList_New(lin->nnodes);
    for (int32_t i = 0; list && i < lin->nnodes; i++) {
        PyObject *name = PyUnicode_FromString(kiln_op_table[lin->nodes[i].op].name);
        if (!name) Py_CLEAR(list);
        else PyList_SET_ITEM(list, i, name);
    }
    return list;
}

/* jvp_rules_missing() -> names of the differentiable ops (a reverse rule) without a JVP rule */
static PyObject *py_jvp_missing(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *list = PyList_New(0);
    for (int op = 0; list && op < KILN_OP_COUNT; op++) {
        if (!kiln_op_differentiable((kiln_op)op) || kiln_jvp_supports((kiln_op)op)) continue;
        PyObject *name = PyUnicode_FromString(kiln_op_table[op].name);
        if (!name || PyList_Append(list, name) < 0) Py_CLEAR(list);
        Py_XDECREF(name);
    }
    return list;
}

/* jvp_rule_ops() -> names of the ops forward mode goes through (a JVP rule, or the transform's own) */
static PyObject *py_jvp_ops(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *list = PyList_New(0);
    for (int op = 0; list && op < KILN_OP_COUNT; op++) {
        if (!kiln_jvp_supports((kiln_op)op)) continue;
        PyObject *name = PyUnicode_FromString(kiln_op_table[op].name);
        if (!name || PyList_Append(list, name) < 0) Py_CLEAR(list);
        Py_XDECREF(name);
    }
    return list;
}

PyMethodDef pykiln_jvp_functions[] = {
    {"jvp", py_jvp, METH_VARARGS,
     "jvp(tracer, primals, tangents) -> (outputs, output tangents) of the body the tracer finished"},
    {"linearize", py_linearize, METH_VARARGS,
     "linearize(tracer, primals) -> (outputs, residuals, linear part) of the body the tracer finished"},
    {"run_linear", py_run_linear, METH_VARARGS, "run_linear(linear, residuals, tangents) -> output tangents"},
    {"linear_ops", py_linear_ops, METH_O, "linear_ops(linear) -> op names of a linearization's tangent part"},
    {"jvp_rules_missing", py_jvp_missing, METH_NOARGS, "differentiable ops forward mode does not go through"},
    {"jvp_rule_ops", py_jvp_ops, METH_NOARGS, "ops forward mode goes through"},
    {NULL, NULL, 0, NULL},
};
