/* kiln._C.JitDispatcher: the C fast path of a jitted function. It keeps the guards of the
 * graphs compiled for all-tensor positional calls (dtype, shape, requires_grad of each tensor,
 * grad mode, and the GuardSet on the Python state the capture read) and runs a matching graph
 * without entering Python; anything else goes to the
 * subclass's _slow_call (kiln.jit.JitFunction), which traces, compiles and registers entries.
 * Reference notes: arguments are borrowed; entries own a reference to their executable and guards. */
#include "pykiln.h"

#include "ir/trace_internal.h"

#define MAX_ENTRIES 8

enum { OUT_SINGLE, OUT_TUPLE, OUT_LIST };

typedef struct {
    PyObject *exe;    /* owned */
    PyObject *guards; /* owned GuardSet, or NULL */
    int nargs;
    bool grad_mode;
    int out_kind;
    kiln_meta *metas; /* nargs */
    bool *requires_grad;
} guard_entry;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    guard_entry entries[MAX_ENTRIES];
    int nentries;
    Py_ssize_t fast_hits;
    bool enabled;
} PyJitDispatcher;

static void clear_entries(PyJitDispatcher *d) {
    for (int k = 0; k < d->nentries; k++) {
        Py_CLEAR(d->entries[k].exe);
        Py_CLEAR(d->entries[k].guards);
        PyMem_Free(d->entries[k].metas);
        PyMem_Free(d->entries[k].requires_grad);
    }
    d->nentries = 0;
}

static void dispatcher_dealloc(PyObject *self) {
    PyJitDispatcher *d = (PyJitDispatcher *)self;
    PyObject_GC_UnTrack(self);
    clear_entries(d);
    Py_TYPE(self)->tp_free(self);
}

static int dispatcher_traverse(PyObject *self, visitproc visit, void *arg) {
    PyJitDispatcher *d = (PyJitDispatcher *)self;
    for (int k = 0; k < d->nentries; k++) {
        Py_VISIT(d->entries[k].exe);
        Py_VISIT(d->entries[k].guards);
    }
    return 0; /* a Python subclass visits its own type and __dict__ */
}

static int dispatcher_clear(PyObject *self) {
    clear_entries((PyJitDispatcher *)self);
    return 0;
}

static bool entry_matches(const guard_entry *e, PyObject *const *args, Py_ssize_t nargs, bool grad_mode) {
    if (e->nargs != nargs || e->grad_mode != grad_mode) return false;
    for (Py_ssize_t k = 0; k < nargs; k++) {
        const kiln_tensor *t = pykiln_unwrap(args[k]);
        const kiln_meta *m = &e->metas[k];
        if (t->meta.dtype != m->dtype || t->meta.ndim != m->ndim || t->requires_grad != e->requires_grad[k])
            return false;
        for (int d = 0; d < m->ndim; d++)
            if (t->meta.shape[d] != m->shape[d]) return false;
    }
    return !e->guards || pykiln_guards_hold(e->guards);
}

static PyObject *slow_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyObject *name = PyUnicode_InternFromString("_slow_call");
    if (!name) return NULL;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[9], **stack = total + 1 <= 9 ? small : PyMem_Malloc(sizeof(PyObject *) * (size_t)(total + 1));
    if (!stack) {
        Py_DECREF(name);
        return PyErr_NoMemory();
    }
    stack[0] = self;
    for (Py_ssize_t k = 0; k < total; k++) stack[k + 1] = args[k];
    PyObject *r = PyObject_VectorcallMethod(name, stack, (size_t)(nargs + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames);
    if (stack != small) PyMem_Free(stack);
    Py_DECREF(name);
    return r;
}

static PyObject *dispatcher_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyJitDispatcher *d = (PyJitDispatcher *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (!d->enabled || (kwnames && PyTuple_GET_SIZE(kwnames)) || d->nentries == 0 || kiln_tracer_active())
        return slow_call(self, args, nargsf, kwnames);
    for (Py_ssize_t k = 0; k < nargs; k++)
        if (!pykiln_is_tensor(args[k])) return slow_call(self, args, nargsf, kwnames);
    bool grad_mode = kiln_grad_enabled();
    for (int k = 0; k < d->nentries; k++) {
        guard_entry *e = &d->entries[k];
        if (!entry_matches(e, args, nargs, grad_mode)) continue;
        PyObject *outs = pykiln_executable_call(e->exe, args, nargs, e->out_kind == OUT_SINGLE);
        if (!outs) return NULL;
        d->fast_hits++;
        if (e->out_kind != OUT_LIST) return outs;
        PyObject *r = PySequence_List(outs);
        Py_DECREF(outs);
        return r;
    }
    return slow_call(self, args, nargsf, kwnames);
}

/* _add_fast_entry(executable, tensors, grad_mode, out_kind, guards=None) */
static PyObject *dispatcher_add_entry(PyObject *self, PyObject *args) {
    PyJitDispatcher *d = (PyJitDispatcher *)self;
    PyObject *exe, *tensors, *guards = Py_None;
    int grad_mode, out_kind;
    if (!PyArg_ParseTuple(args, "OO!pi|O:_add_fast_entry", &exe, &PyTuple_Type, &tensors, &grad_mode, &out_kind,
                          &guards))
        return NULL;
    if (guards != Py_None && !pykiln_is_guardset(guards)) {
        PyErr_SetString(PyExc_TypeError, "_add_fast_entry: guards must be a GuardSet or None");
        return NULL;
    }
    if (d->nentries == MAX_ENTRIES) Py_RETURN_FALSE;
    if (out_kind < OUT_SINGLE || out_kind > OUT_LIST) {
        PyErr_SetString(PyExc_ValueError, "_add_fast_entry: bad output kind");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(tensors);
    guard_entry *e = &d->entries[d->nentries];
    e->metas = PyMem_Malloc(sizeof(kiln_meta) * (size_t)(n ? n : 1));
    e->requires_grad = PyMem_Malloc(sizeof(bool) * (size_t)(n ? n : 1));
    if (!e->metas || !e->requires_grad) {
        PyMem_Free(e->metas), PyMem_Free(e->requires_grad);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *t = PyTuple_GET_ITEM(tensors, k);
        if (!pykiln_is_tensor(t)) {
            PyMem_Free(e->metas), PyMem_Free(e->requires_grad);
            PyErr_SetString(PyExc_TypeError, "_add_fast_entry: tensors only");
            return NULL;
        }
        e->metas[k] = pykiln_unwrap(t)->meta;
        e->requires_grad[k] = pykiln_unwrap(t)->requires_grad;
    }
    Py_INCREF(exe);
    e->exe = exe;
    e->guards = guards == Py_None ? NULL : Py_NewRef(guards);
    e->nargs = (int)n;
    e->grad_mode = grad_mode;
    e->out_kind = out_kind;
    d->nentries++;
    Py_RETURN_TRUE;
}

static PyObject *dispatcher_clear_entries(PyObject *self, PyObject *unused) {
    (void)unused;
    clear_entries((PyJitDispatcher *)self);
    Py_RETURN_NONE;
}

static PyObject *get_fast_hits(PyObject *self, void *c) {
    (void)c;
    return PyLong_FromSsize_t(((PyJitDispatcher *)self)->fast_hits);
}

static PyObject *get_fast_enabled(PyObject *self, void *c) {
    (void)c;
    return PyBool_FromLong(((PyJitDispatcher *)self)->enabled);
}

static int set_fast_enabled(PyObject *self, PyObject *v, void *c) {
    (void)c;
    int flag = v ? PyObject_IsTrue(v) : 0;
    if (flag < 0) return -1;
    ((PyJitDispatcher *)self)->enabled = flag;
    return 0;
}

static PyObject *dispatcher_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    (void)args, (void)kwargs;
    PyJitDispatcher *d = (PyJitDispatcher *)type->tp_alloc(type, 0);
    if (!d) return NULL;
    d->vectorcall = dispatcher_vectorcall;
    d->enabled = true;
    return (PyObject *)d;
}

static PyMethodDef dispatcher_methods[] = {
    {"_add_fast_entry", dispatcher_add_entry, METH_VARARGS, "register a graph for all-tensor positional calls"},
    {"_clear_fast_entries", dispatcher_clear_entries, METH_NOARGS, "drop the registered graphs"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef dispatcher_getset[] = {
    {"_fast_hits", get_fast_hits, NULL, "calls served without entering Python", NULL},
    {"_fast_enabled", get_fast_enabled, set_fast_enabled, "whether the C fast path is used", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PyJitDispatcher_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.JitDispatcher",
    .tp_basicsize = sizeof(PyJitDispatcher),
    .tp_dealloc = dispatcher_dealloc,
    .tp_vectorcall_offset = offsetof(PyJitDispatcher, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "C fast path of kiln.jit functions.",
    .tp_traverse = dispatcher_traverse,
    .tp_clear = dispatcher_clear,
    .tp_methods = dispatcher_methods,
    .tp_getset = dispatcher_getset,
    .tp_new = dispatcher_new,
};

int pykiln_dispatcher_init_type(PyObject *module) {
    if (PyType_Ready(&PyJitDispatcher_Type) < 0) return -1;
    Py_INCREF(&PyJitDispatcher_Type);
    return PyModule_AddObject(module, "JitDispatcher", (PyObject *)&PyJitDispatcher_Type);
}
