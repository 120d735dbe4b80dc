/* The hooks a dynamic-shape capture (kiln.jit.dynamic) sets while it records: reading a traced
 * tensor's shape may give symbolic sizes, and the shape functions given symbolic sizes hand the
 * call to Python, which records how the node's attributes follow the symbols. Unset (the usual
 * case) each costs one pointer test. The hooks are the thread's own (the tracer is too), so two
 * threads can capture dynamically at once. Reference notes: the hooks are owned here. */
#include "pykiln.h"

#include "core/hooks.h"

static _Thread_local PyObject *shape_hook, *call_hook, *sym_type;
static _Thread_local bool in_call; /* the call hook runs the function itself: not again */

/* set_sym_hooks(shape_hook, call_hook, sym_type) or set_sym_hooks(None, None, None):
 * shape_hook(tensor, what) for what 0 (.shape: its result, unless None, is the shape), 1 (.size)
 * and 2 (len()); call_hook(op name, args) serves reshape and broadcast_to when an argument is a
 * sym_type, narrow, getitem (x[key]: (x, key)) and setitem (x[key] = value: (x, key, value))
 * always, and hears of the reshapes flatten, squeeze and unsqueeze make ("derived", (x, out,
 * sources)) and of a backward pass ("backward", () as it starts, "backward_done" when it has
 * recorded its nodes). */
static PyObject *py_set_sym_hooks(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *sh, *ch, *ty;
    if (!PyArg_ParseTuple(args, "OOO:set_sym_hooks", &sh, &ch, &ty)) return NULL;
    bool none = sh == Py_None && ch == Py_None && ty == Py_None;
    if (!none && (!PyCallable_Check(sh) || !PyCallable_Check(ch) || !PyType_Check(ty))) {
        PyErr_SetString(PyExc_TypeError, "set_sym_hooks: two callables and a type, or three Nones");
        return NULL;
    }
    Py_CLEAR(shape_hook);
    Py_CLEAR(call_hook);
    Py_CLEAR(sym_type);
    if (!none) shape_hook = Py_NewRef(sh), call_hook = Py_NewRef(ch), sym_type = Py_NewRef(ty);
    kiln_thread.trace_symbolic = !none;
    Py_RETURN_NONE;
}

PyObject *pykiln_sym_shape(PyObject *tensor, int what) {
    if (!shape_hook) return Py_NewRef(Py_None);
    return PyObject_CallFunction(shape_hook, "Oi", tensor, what);
}

static bool has_sym(PyObject *o, int depth) {
    if (PyObject_TypeCheck(o, (PyTypeObject *)sym_type)) return true;
    if (depth > 1 || !(PyTuple_Check(o) || PyList_Check(o))) return false;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(o); k++)
        if (has_sym(PySequence_Fast_GET_ITEM(o, k), depth + 1)) return true;
    return false;
}

PyObject *pykiln_sym_call(const char *op, PyObject *args, bool always) {
    if (!call_hook || in_call || !(always || has_sym(args, 0))) return NULL;
    in_call = true;
    PyObject *r = PyObject_CallFunction(call_hook, "sO", op, args);
    in_call = false;
    return r;
}

bool pykiln_sym_hooked(void) { return call_hook && !in_call; }

PyObject *pykiln_sym_derived(PyObject *x, PyObject *out, const int *src, int n) {
    if (!call_hook || !out || out == x) return out;
    PyObject *t = PyTuple_New(n);
    for (int k = 0; t && k < n; k++) PyTuple_SET_ITEM(t, k, PyLong_FromLong(src[k]));
    PyObject *r = t ? PyObject_CallFunction(call_hook, "s(OOO)", "derived", x, out, t) : NULL;
    Py_XDECREF(t);
    if (!r) {
        Py_DECREF(out);
        return NULL;
    }
    Py_DECREF(r);
    return out;
}

int pykiln_sym_note_backward(bool done) {
    if (!call_hook) return 0;
    PyObject *r = PyObject_CallFunction(call_hook, "s()", done ? "backward_done" : "backward");
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* in_body(tensor) -> whether a control-flow body is being traced and it recorded the tensor */
static PyObject *py_in_body(PyObject *self, PyObject *t) {
    (void)self;
    kiln_tracer *tr = kiln_tracer_active();
    return PyBool_FromLong(tr && kiln_tracer_in_body() && pykiln_is_tensor(t) &&
                           kiln_tracer_knows(tr, pykiln_unwrap(t)));
}

/* same_meta(a, b) -> whether two tensors have one dtype and shape, read without the shape hook:
 * for structural checks that a rebinding checks again (a cond's branches, a loop body's values) */
static PyObject *py_same_meta(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *a, *b;
    if (!PyArg_ParseTuple(args, "OO:same_meta", &a, &b)) return NULL;
    if (!pykiln_is_tensor(a) || !pykiln_is_tensor(b)) return PyErr_Format(PyExc_TypeError, "same_meta: two tensors");
    const kiln_meta *x = &pykiln_unwrap(a)->meta, *y = &pykiln_unwrap(b)->meta;
    bool same = x->dtype == y->dtype && x->ndim == y->ndim;
    for (int d = 0; same && d < x->ndim; d++) same = x->shape[d] == y->shape[d];
    return PyBool_FromLong(same);
}

/* raw_shape(tensor) -> its sizes as ints, read without the shape hook: for the structural
 * bookkeeping of the ast runtime (a branch's result metas), which a rebinding checks again */
static PyObject *py_raw_shape(PyObject *self, PyObject *t) {
    (void)self;
    if (!pykiln_is_tensor(t)) return PyErr_Format(PyExc_TypeError, "raw_shape: a tensor");
    const kiln_meta *m = &pykiln_unwrap(t)->meta;
    PyObject *tup = PyTuple_New(m->ndim);
    for (int d = 0; tup && d < m->ndim; d++) {
        PyObject *v = PyLong_FromLongLong(m->shape[d]);
        if (!v) {
            Py_CLEAR(tup);
            break;
        }
        PyTuple_SET_ITEM(tup, d, v);
    }
    return tup;
}

/* sym_call(op, args) -> what a dynamic capture's call hook makes of a call whose args hold symbolic
 * sizes, or None when no capture is recording or args hold none (the caller then goes on with ints) */
static PyObject *py_sym_call(PyObject *self, PyObject *args) {
    (void)self;
    const char *op;
    PyObject *call_args;
    if (!PyArg_ParseTuple(args, "sO!:sym_call", &op, &PyTuple_Type, &call_args)) return NULL;
    PyObject *r = pykiln_sym_call(op, call_args, false);
    return r || PyErr_Occurred() ? r : Py_NewRef(Py_None);
}

static PyMethodDef sym_functions[] = {
    {"sym_call", py_sym_call, METH_VARARGS,
     "sym_call(op, args) -> the dynamic capture's result for a call with symbolic sizes in args, or None"},
    {"raw_shape", py_raw_shape, METH_O, "raw_shape(tensor) -> its sizes as ints (no shape hook)"},
    {"same_meta", py_same_meta, METH_VARARGS, "same_meta(a, b) -> same dtype and shape (no shape hook)"},
    {"in_body", py_in_body, METH_O, "in_body(tensor) -> whether a control-flow body being traced made it"},
    {"set_sym_hooks", py_set_sym_hooks, METH_VARARGS,
     "set_sym_hooks(shape_hook, call_hook, sym_type): symbolic shapes while a dynamic capture records"},
    {NULL, NULL, 0, NULL},
};

int pykiln_sym_hooks_init(PyObject *module) { return PyModule_AddFunctions(module, sym_functions); }
