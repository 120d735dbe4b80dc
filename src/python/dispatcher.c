/* kiln._C.JitDispatcher: the C fast path of a jitted function. It keeps the guards of the
 * graphs compiled for all-tensor positional calls (dtype, shape, requires_grad of each tensor,
 * grad mode, and the GuardSet on the Python state the capture read) and runs a matching graph
 * without entering Python. A dynamic entry (kiln.jit.dynamic) has symbols for some sizes: a call
 * binds them (one value per symbol, each at least 2) and runs the instance made for that binding;
 * a binding without one yet goes to Python, which makes it. Anything else goes to the
 * subclass's _slow_call (kiln.jit.JitFunction), which traces, compiles and registers entries.
 * Reference notes: arguments are borrowed; entries own a reference to their executable and guards. */
#include "pykiln.h"

#include "ir/trace_internal.h"

#define MAX_ENTRIES 8

enum { OUT_SINGLE, OUT_TUPLE, OUT_LIST };

typedef struct {
    PyObject *exe;    /* owned */
    PyObject *guards; /* owned GuardSet, or NULL */
    PyObject *refuse; /* owned refusal (pykiln_refuse_outputs) its outputs get in grad mode, or NULL */
    PyObject *tag;    /* owned: what Python registered it for (_last_fast_tag), or NULL */
    int nargs;
    bool grad_mode;
    int out_kind;
    kiln_meta *metas; /* nargs; in a dynamic entry a size -1 - k is symbol k */
    bool *requires_grad;
    int nsym;           /* dynamic entries: the number of symbols (0: exact shapes, exe runs) */
    int ninst, capinst; /* instances: ninst bindings of nsym sizes and their executables */
    int64_t *binds;
    PyObject **inst;    /* owned */
} guard_entry;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    guard_entry entries[MAX_ENTRIES];
    int nentries;
    int last_hit; /* the entry that served the latest call, -1: that call went to Python */
    Py_ssize_t fast_hits;
    bool enabled;
} PyJitDispatcher;

static void clear_entries(PyJitDispatcher *d) {
    for (int k = 0; k < d->nentries; k++) {
        Py_CLEAR(d->entries[k].exe);
        Py_CLEAR(d->entries[k].guards);
        Py_CLEAR(d->entries[k].refuse);
        Py_CLEAR(d->entries[k].tag);
        PyMem_Free(d->entries[k].metas);
        PyMem_Free(d->entries[k].requires_grad);
        for (int j = 0; j < d->entries[k].ninst; j++) Py_CLEAR(d->entries[k].inst[j]);
        PyMem_Free(d->entries[k].inst);
        PyMem_Free(d->entries[k].binds);
    }
    d->nentries = 0;
    d->last_hit = -1;
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
        Py_VISIT(d->entries[k].refuse);
        Py_VISIT(d->entries[k].tag);
        for (int j = 0; j < d->entries[k].ninst; j++) Py_VISIT(d->entries[k].inst[j]);
    }
    return 0; /* a Python subclass visits its own type and __dict__ */
}

static int dispatcher_clear(PyObject *self) {
    clear_entries((PyJitDispatcher *)self);
    return 0;
}

#define MAX_SYMS 64
#define MAX_INSTANCES 256 /* per dynamic entry (kiln.jit.dynamic.MAX_INSTANCES): the least recently found goes */

/* Whether the call matches e; for a dynamic entry, bind[] receives the symbols' sizes (a symbol
 * met twice must have one size; each is at least 2: sizes 0 and 1 are specialized). */
static bool entry_matches(const guard_entry *e, PyObject *const *args, Py_ssize_t nargs, bool grad_mode,
                          int64_t *bind) {
    if (e->nargs != nargs || e->grad_mode != grad_mode) return false;
    for (int k = 0; k < e->nsym; k++) bind[k] = -1;
    for (Py_ssize_t k = 0; k < nargs; k++) {
        const kiln_tensor *t = pykiln_unwrap(args[k]);
        const kiln_meta *m = &e->metas[k];
        if (t->meta.dtype != m->dtype || t->meta.ndim != m->ndim || t->requires_grad != e->requires_grad[k] ||
            !kiln_tensor_is_contiguous(t) || /* (strided views: the slow path, whose key tells them apart) */
            kiln_autograd_has_hooks(t))      /* (backward hooks: the slow path's key, kiln.grad_hooks) */
            return false;
        for (int d = 0; d < m->ndim; d++) {
            int64_t want = m->shape[d], got = t->meta.shape[d];
            if (want >= 0) {
                if (got != want) return false;
            } else if (got < 2 || (bind[-1 - want] >= 0 && bind[-1 - want] != got)) {
                return false;
            } else {
                bind[-1 - want] = got;
            }
        }
    }
    return !e->guards || pykiln_guards_hold(e->guards);
}

/* The executable of a matching entry for the binding (moved one place forward when found, so the
 * bindings called most are found first), or NULL: none made yet. */
static PyObject *instance_of(guard_entry *e, const int64_t *bind) {
    if (e->nsym == 0) return e->exe;
    for (int j = 0; j < e->ninst; j++) {
        int64_t *b = &e->binds[(size_t)j * (size_t)e->nsym];
        if (memcmp(b, bind, sizeof(int64_t) * (size_t)e->nsym) != 0) continue;
        if (j == 0) return e->inst[0];
        int64_t tmp[MAX_SYMS];
        int64_t *prev = b - e->nsym;
        memcpy(tmp, prev, sizeof(int64_t) * (size_t)e->nsym);
        memcpy(prev, b, sizeof(int64_t) * (size_t)e->nsym);
        memcpy(b, tmp, sizeof(int64_t) * (size_t)e->nsym);
        PyObject *x = e->inst[j - 1];
        e->inst[j - 1] = e->inst[j];
        e->inst[j] = x;
        return e->inst[j - 1];
    }
    return NULL;
}

static PyObject *slow_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    ((PyJitDispatcher *)self)->last_hit = -1;
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

/* kiln.disable_jit / KILN_DISABLE_JIT: every call goes to Python, which runs the function eagerly */
static bool all_disabled = false;

/* Whether this thread runs code inside grad / value_and_grad / GradManager (kiln.autograd's
 * grad_nesting sets it): an entry whose outputs get a refusing node does not serve such a call, which
 * Python runs eagerly for its gradients. */
static _Thread_local bool differentiating = false;

static PyObject *dispatcher_set_differentiating(PyObject *cls, PyObject *flag) {
    (void)cls;
    int on = PyObject_IsTrue(flag);
    if (on < 0) return NULL;
    bool prev = differentiating;
    differentiating = on;
    return PyBool_FromLong(prev);
}

static PyObject *dispatcher_set_all_disabled(PyObject *cls, PyObject *flag) {
    (void)cls;
    int on = PyObject_IsTrue(flag);
    if (on < 0) return NULL;
    bool prev = all_disabled;
    all_disabled = on;
    return PyBool_FromLong(prev);
}

static PyObject *dispatcher_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyJitDispatcher *d = (PyJitDispatcher *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    kiln_amp_level amp;
    kiln_amp_get(&amp, NULL);
    /* fast entries are of calls without amp (dispatcher_add_entry): under amp, Python keys the call */
    if (!d->enabled || all_disabled || (kwnames && PyTuple_GET_SIZE(kwnames)) || d->nentries == 0 || kiln_tracer_active() ||
        amp != KILN_AMP_O0)
        return slow_call(self, args, nargsf, kwnames);
    for (Py_ssize_t k = 0; k < nargs; k++) {
        if (!pykiln_is_tensor(args[k])) return slow_call(self, args, nargsf, kwnames);
        for (Py_ssize_t j = 0; j < k; j++) /* one tensor in two places: keyed apart, in Python */
            if (args[j] == args[k]) return slow_call(self, args, nargsf, kwnames);
    }
    bool grad_mode = kiln_grad_enabled();
    int64_t bind[MAX_SYMS];
    for (int k = 0; k < d->nentries; k++) {
        guard_entry *e = &d->entries[k];
        if ((e->refuse && differentiating) || !entry_matches(e, args, nargs, grad_mode, bind)) continue;
        PyObject *exe = instance_of(e, bind);
        if (!exe) continue; /* not a binding of this entry yet (its guards may not admit it): Python decides */
        PyObject *outs = pykiln_executable_call(exe, args, nargs, e->out_kind == OUT_SINGLE);
        if (!outs) return NULL;
        if (e->refuse && pykiln_refuse_outputs(e->refuse, outs) < 0) {
            Py_DECREF(outs);
            return NULL;
        }
        d->fast_hits++;
        d->last_hit = k;
        if (e->out_kind != OUT_LIST) return outs;
        PyObject *r = PySequence_List(outs);
        Py_DECREF(outs);
        return r;
    }
    return slow_call(self, args, nargsf, kwnames);
}

/* Reads a dynamic entry's sizes: dims[k] is a tuple of tensor k's sizes, -1 - j for symbol j. */
static int read_dims(guard_entry *e, PyObject *dims, Py_ssize_t n) {
    if (!PyTuple_Check(dims) || PyTuple_GET_SIZE(dims) != n) {
        PyErr_SetString(PyExc_TypeError, "_add_fast_entry: dims must be a tuple of one tuple per tensor");
        return -1;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *t = PyTuple_GET_ITEM(dims, k);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != e->metas[k].ndim) {
            PyErr_SetString(PyExc_ValueError, "_add_fast_entry: dims must give each tensor's sizes");
            return -1;
        }
        for (int d = 0; d < e->metas[k].ndim; d++) {
            long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(t, d));
            if (v == -1 && PyErr_Occurred()) return -1;
            if (v < -MAX_SYMS) {
                PyErr_Format(PyExc_ValueError, "_add_fast_entry: at most %d symbols", MAX_SYMS);
                return -1;
            }
            e->metas[k].shape[d] = v;
            if (v < 0 && -v > e->nsym) e->nsym = (int)-v;
        }
    }
    return 0;
}

/* _add_fast_entry(executable, tensors, grad_mode, out_kind, guards=None, dims=None, refuse=None, tag=None) ->
 * whether added; with dims (see read_dims) a dynamic entry, its executable unused (None), and its
 * number (for _add_fast_instance, which gives its instances) instead of True. refuse: a refusal
 * (pykiln_refuse_outputs) whose node the outputs of a grad-mode entry get, as kiln.jit's Python
 * paths give them (kiln.jit.capture_core.refuse_backward). */
static PyObject *dispatcher_add_entry(PyObject *self, PyObject *args) {
    PyJitDispatcher *d = (PyJitDispatcher *)self;
    PyObject *exe, *tensors, *guards = Py_None, *dims = Py_None, *refuse = Py_None, *tag = Py_None;
    int grad_mode, out_kind;
    if (!PyArg_ParseTuple(args, "OO!pi|OOOO:_add_fast_entry", &exe, &PyTuple_Type, &tensors, &grad_mode, &out_kind,
                          &guards, &dims, &refuse, &tag))
        return NULL;
    if (refuse != Py_None && !pykiln_refusal_check(refuse)) return NULL;
    kiln_amp_level amp;
    kiln_amp_get(&amp, NULL);
    if (amp != KILN_AMP_O0) Py_RETURN_FALSE; /* the fast path does not key calls by amp */
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
    e->nsym = e->ninst = e->capinst = 0;
    e->binds = NULL;
    e->inst = NULL;
    if (dims != Py_None && (read_dims(e, dims, n) < 0 || e->nsym == 0)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "_add_fast_entry: dims without a symbol");
        PyMem_Free(e->metas), PyMem_Free(e->requires_grad);
        return NULL;
    }
    Py_INCREF(exe);
    e->exe = exe;
    e->guards = guards == Py_None ? NULL : Py_NewRef(guards);
    e->refuse = refuse == Py_None || !grad_mode ? NULL : Py_NewRef(refuse);
    e->tag = tag == Py_None ? NULL : Py_NewRef(tag);
    e->nargs = (int)n;
    e->grad_mode = grad_mode;
    e->out_kind = out_kind;
    d->nentries++;
    if (e->nsym) return PyLong_FromLong(d->nentries - 1);
    Py_RETURN_TRUE;
}

/* _add_fast_instance(entry, binding, executable, limit=MAX_INSTANCES): the executable for one
 * binding (a tuple of the symbols' sizes) of dynamic entry number `entry` (in the order added);
 * the entry keeps at most `limit` instances */
static PyObject *dispatcher_add_instance(PyObject *self, PyObject *args) {
    PyJitDispatcher *d = (PyJitDispatcher *)self;
    int k, limit = MAX_INSTANCES;
    PyObject *binding, *exe;
    if (!PyArg_ParseTuple(args, "iO!O|i:_add_fast_instance", &k, &PyTuple_Type, &binding, &exe, &limit)) return NULL;
    if (limit < 1 || limit > MAX_INSTANCES) limit = MAX_INSTANCES;
    if (k < 0 || k >= d->nentries || d->entries[k].nsym == 0)
        return PyErr_Format(PyExc_IndexError, "_add_fast_instance: no dynamic entry %d", k);
    guard_entry *e = &d->entries[k];
    if (PyTuple_GET_SIZE(binding) != e->nsym)
        return PyErr_Format(PyExc_ValueError, "_add_fast_instance: %d sizes expected", e->nsym);
    while (e->ninst >= limit) Py_CLEAR(e->inst[--e->ninst]); /* the last: the least recently found */
    if (e->ninst == e->capinst) {
        int cap = e->capinst ? 2 * e->capinst : 8;
        int64_t *binds = PyMem_Realloc(e->binds, sizeof(int64_t) * (size_t)cap * (size_t)e->nsym);
        if (!binds) return PyErr_NoMemory();
        e->binds = binds;
        PyObject **inst = PyMem_Realloc(e->inst, sizeof(PyObject *) * (size_t)cap);
        if (!inst) return PyErr_NoMemory();
        e->inst = inst;
        e->capinst = cap;
    }
    int64_t b[MAX_SYMS];
    for (int j = 0; j < e->nsym; j++) {
        b[j] = PyLong_AsLongLong(PyTuple_GET_ITEM(binding, j));
        if (b[j] == -1 && PyErr_Occurred()) return NULL;
    }
    /* the newest first: the last is the least recently made or found */
    memmove(&e->binds[e->nsym], e->binds, sizeof(int64_t) * (size_t)e->ninst * (size_t)e->nsym);
    memmove(&e->inst[1], e->inst, sizeof(PyObject *) * (size_t)e->ninst);
    memcpy(e->binds, b, sizeof(int64_t) * (size_t)e->nsym);
    e->inst[0] = Py_NewRef(exe);
    e->ninst++;
    Py_RETURN_NONE;
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

static PyObject *get_last_fast_tag(PyObject *self, void *c) {
    (void)c;
    PyJitDispatcher *d = (PyJitDispatcher *)self;
    PyObject *tag = d->last_hit >= 0 && d->last_hit < d->nentries ? d->entries[d->last_hit].tag : NULL;
    return Py_NewRef(tag ? tag : Py_None);
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
    d->last_hit = -1;
    return (PyObject *)d;
}

static PyMethodDef dispatcher_methods[] = {
    {"_add_fast_entry", dispatcher_add_entry, METH_VARARGS, "register a graph for all-tensor positional calls"},
    {"_add_fast_instance", dispatcher_add_instance, METH_VARARGS, "register a dynamic entry's graph for a binding"},
    {"_clear_fast_entries", dispatcher_clear_entries, METH_NOARGS, "drop the registered graphs"},
    {"_set_all_disabled", dispatcher_set_all_disabled, METH_O | METH_STATIC,
     "send every call of every dispatcher to Python (kiln.disable_jit); returns the previous setting"},
    {"_set_differentiating", dispatcher_set_differentiating, METH_O | METH_STATIC,
     "whether this thread runs inside grad / value_and_grad / GradManager (kiln.autograd.grad_nesting); returns the "
     "previous setting"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef dispatcher_getset[] = {
    {"_fast_hits", get_fast_hits, NULL, "calls served without entering Python", NULL},
    {"_last_fast_tag", get_last_fast_tag, NULL,
     "the tag of the entry that served the latest call without entering Python, or None (that call went to Python)",
     NULL},
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
