/* kiln._C.record_grad: a node of the eager autograd tape whose gradient is a Python callable
 * (kiln.jit's bytecode capture: a compiled piece of a function, whose backward is the compiled
 * backward graph of that piece). */
#include "pykiln.h"

#include "autograd/node.h"

/* The node's rule: backward(grads, needs) -> a sequence of nin gradients (Tensor or None). keep: an
 * exception it raises reaches the caller of the backward pass as it is (pykiln_backward_error), else
 * as a RuntimeError naming it. */
static kiln_status run_backward(void *ctx, int nout, kiln_tensor *const *grads, int nin, const bool *needs,
                                bool create_graph, kiln_tensor **gin, bool keep) {
    PyGILState_STATE st = PyGILState_Ensure();
    kiln_status s = KILN_OK;
    PyObject *g = PyTuple_New(nout), *nd = PyTuple_New(nin), *r = NULL, *seq = NULL;
    for (int k = 0; g && k < nout; k++) {
        if (grads[k]) kiln_tensor_retain(grads[k]);
        PyObject *item = grads[k] ? pykiln_wrap(grads[k]) : Py_NewRef(Py_None);
        if (!item) Py_CLEAR(g);
        else PyTuple_SET_ITEM(g, k, item);
    }
    for (int k = 0; nd && k < nin; k++) PyTuple_SET_ITEM(nd, k, PyBool_FromLong(needs[k]));
    if (g && nd) r = PyObject_CallFunctionObjArgs((PyObject *)ctx, g, nd, create_graph ? Py_True : Py_False, NULL);
    if (r) seq = PySequence_Fast(r, "record_grad: backward must return a sequence");
    if (seq && PySequence_Fast_GET_SIZE(seq) != nin)
        PyErr_Format(PyExc_ValueError, "record_grad: backward returned %zd gradients for %d inputs",
                     PySequence_Fast_GET_SIZE(seq), nin);
    for (int k = 0; seq && !PyErr_Occurred() && k < nin; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, k);
        if (item == Py_None) continue;
        if (!pykiln_is_tensor(item)) {
            PyErr_Format(PyExc_TypeError, "record_grad: gradient %d is a %s, not a Tensor", k, Py_TYPE(item)->tp_name);
            break;
        }
        gin[k] = pykiln_unwrap(item);
        kiln_tensor_retain(gin[k]);
    }
    if (PyErr_Occurred() && keep) {
        kiln_release_all(gin, nin);
        s = pykiln_backward_error();
    } else if (PyErr_Occurred()) { /* the Python error, as kiln's (the engine adds where it happened) */
        kiln_release_all(gin, nin);
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        PyObject *text = exc ? PyObject_Str(exc) : NULL;
        const char *msg = text ? PyUnicode_AsUTF8(text) : NULL;
        s = kiln_error(KILN_ERR_RUNTIME, "%s: %s", exc ? Py_TYPE(exc)->tp_name : "error", msg ? msg : "?");
        PyErr_Clear();
        Py_XDECREF(text);
        Py_XDECREF(type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
    }
    Py_XDECREF(seq);
    Py_XDECREF(r);
    Py_XDECREF(nd);
    Py_XDECREF(g);
    PyGILState_Release(st);
    return s;
}

static kiln_status call_backward(void *ctx, int nout, kiln_tensor *const *grads, int nin, const bool *needs,
                                 bool create_graph, kiln_tensor **gin) {
    return run_backward(ctx, nout, grads, nin, needs, create_graph, gin, false);
}

static kiln_status call_backward_keeping(void *ctx, int nout, kiln_tensor *const *grads, int nin, const bool *needs,
                                         bool create_graph, kiln_tensor **gin) {
    return run_backward(ctx, nout, grads, nin, needs, create_graph, gin, true);
}

static void release_backward(void *ctx) {
    PyGILState_STATE st = PyGILState_Ensure();
    Py_DECREF((PyObject *)ctx);
    PyGILState_Release(st);
}

/* record_grad(inputs, outputs, backward, name, keep_exceptions=False): outputs (fresh tensors) become
 * the outputs of one autograd node over inputs whose gradient is backward(grads, needs, create_graph)
 * (see kiln_autograd_record_custom); grads holds None for outputs no gradient reached. With
 * keep_exceptions what backward raises reaches the caller of the pass as it is (kiln.grad_hooks: a
 * user's hook), else as a RuntimeError naming it. */
static PyObject *py_record_grad(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ins, *outs, *fn;
    const char *name;
    int keep = 0;
    if (!PyArg_ParseTuple(args, "O!O!Os|p:record_grad", &PyTuple_Type, &ins, &PyTuple_Type, &outs, &fn, &name, &keep))
        return NULL;
    Py_ssize_t nin = PyTuple_GET_SIZE(ins), nout = PyTuple_GET_SIZE(outs);
    kiln_tensor **t = PyMem_Calloc((size_t)(nin + nout + 1), sizeof *t);
    if (!t) return PyErr_NoMemory();
    for (Py_ssize_t k = 0; k < nin + nout; k++) {
        PyObject *o = k < nin ? PyTuple_GET_ITEM(ins, k) : PyTuple_GET_ITEM(outs, k - nin);
        if (!pykiln_is_tensor(o)) {
            PyMem_Free(t);
            return PyErr_Format(PyExc_TypeError, "record_grad: %s %zd is not a Tensor", k < nin ? "input" : "output",
                                k < nin ? k : k - nin);
        }
        t[k] = pykiln_unwrap(o);
        if (k >= nin && t[k]->grad_fn) {
            PyMem_Free(t);
            return PyErr_Format(PyExc_ValueError, "record_grad: output %zd already has autograd history", k - nin);
        }
    }
    /* the name lives as long as the node: interned, kept by the interpreter */
    PyObject *interned = PyUnicode_InternFromString(name);
    if (!interned) {
        PyMem_Free(t);
        return NULL;
    }
    kiln_custom_grad rule = {keep ? call_backward_keeping : call_backward, release_backward, Py_NewRef(fn),
                             PyUnicode_AsUTF8(interned)};
    kiln_status s = kiln_autograd_record_custom((int)nin, t, (int)nout, t + nin, &rule);
    PyMem_Free(t);
    if (s != KILN_OK) return pykiln_raise(s);
    Py_RETURN_NONE;
}

/* A refusal (kiln.jit.capture_core.NoHistory): the tuple (reads, positions, backward, name) — the
 * tensors a compiled graph reads that require grad, the positions of its outputs that would require
 * grad eagerly, the Python gradient of the node (it raises, naming the function) and the node's name.
 * 1 when refusal has that form, else 0 with a TypeError set. */
int pykiln_refusal_check(PyObject *refusal) {
    if (!PyTuple_Check(refusal) || PyTuple_GET_SIZE(refusal) != 4 || !PyTuple_Check(PyTuple_GET_ITEM(refusal, 0)) ||
        !PyTuple_Check(PyTuple_GET_ITEM(refusal, 1)) || !PyCallable_Check(PyTuple_GET_ITEM(refusal, 2)) ||
        !PyUnicode_Check(PyTuple_GET_ITEM(refusal, 3))) {
        PyErr_SetString(PyExc_TypeError, "refusal must be (reads, positions, backward, name)");
        return 0;
    }
    PyObject *reads = PyTuple_GET_ITEM(refusal, 0), *pos = PyTuple_GET_ITEM(refusal, 1);
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(reads); k++)
        if (!pykiln_is_tensor(PyTuple_GET_ITEM(reads, k))) {
            PyErr_SetString(PyExc_TypeError, "refusal: reads must be Tensors");
            return 0;
        }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(pos); k++)
        if (!PyLong_Check(PyTuple_GET_ITEM(pos, k))) {
            PyErr_SetString(PyExc_TypeError, "refusal: positions must be ints");
            return 0;
        }
    return 1;
}

/* Gives the outputs of a compiled run (outs: a tuple or list, or the one tensor of a single-output
 * graph) at the refusal's positions that are tensors without gradient history, and are none of its
 * reads, one autograd node over the reads whose gradient is the refusal's backward (which raises):
 * a later .backward() through them fails, naming the function, instead of missing the reads' share
 * (kiln.jit.capture_core.refuse_backward). Nothing when no read requires grad, or outside grad
 * mode. 0, or -1 with an error set. The refusal has been checked (pykiln_refusal_check). */
int pykiln_refuse_outputs(PyObject *refusal, PyObject *outs) {
    PyObject *reads = PyTuple_GET_ITEM(refusal, 0), *pos = PyTuple_GET_ITEM(refusal, 1);
    Py_ssize_t nin = PyTuple_GET_SIZE(reads), npos = PyTuple_GET_SIZE(pos);
    if (nin == 0 || npos == 0) return 0;
    Py_ssize_t nouts = PyTuple_Check(outs) ? PyTuple_GET_SIZE(outs) : PyList_Check(outs) ? PyList_GET_SIZE(outs) : 1;
    kiln_tensor *small[16], **t = nin + npos <= 16 ? small : PyMem_Calloc((size_t)(nin + npos), sizeof *t);
    if (!t) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < nin; k++) t[k] = pykiln_unwrap(PyTuple_GET_ITEM(reads, k));
    int nout = 0;
    for (Py_ssize_t j = 0; j < npos; j++) {
        Py_ssize_t p = PyLong_AsSsize_t(PyTuple_GET_ITEM(pos, j));
        if (p == -1 && PyErr_Occurred()) PyErr_Clear(); /* (out of range: no such output) */
        if (p < 0 || p >= nouts) continue;
        PyObject *o = PyTuple_Check(outs) ? PyTuple_GET_ITEM(outs, p) : PyList_Check(outs) ? PyList_GET_ITEM(outs, p) : outs;
        if (!pykiln_is_tensor(o) || pykiln_unwrap(o)->requires_grad) continue;
        bool read = false;
        for (Py_ssize_t k = 0; k < nin && !read; k++) read = o == PyTuple_GET_ITEM(reads, k);
        if (!read) t[nin + nout++] = pykiln_unwrap(o);
    }
    int rc = 0;
    if (nout) {
        /* the name lives as long as the node: interned, kept by the interpreter (as record_grad's) */
        PyObject *name = Py_NewRef(PyTuple_GET_ITEM(refusal, 3));
        PyUnicode_InternInPlace(&name);
        kiln_custom_grad rule = {call_backward, release_backward, Py_NewRef(PyTuple_GET_ITEM(refusal, 2)),
                                 PyUnicode_AsUTF8(name)};
        kiln_status s = kiln_autograd_record_custom((int)nin, t, nout, t + nin, &rule);
        if (s != KILN_OK) {
            pykiln_raise(s);
            rc = -1;
        }
    }
    if (t != small) PyMem_Free(t);
    return rc;
}

/* refuse_outputs(refusal, outs) -> outs: pykiln_refuse_outputs */
static PyObject *py_refuse_outputs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) return PyErr_Format(PyExc_TypeError, "refuse_outputs takes (refusal, outs)");
    if (!pykiln_refusal_check(args[0]) || pykiln_refuse_outputs(args[0], args[1]) < 0) return NULL;
    return Py_NewRef(args[1]);
}

/* Adds what the history edge e reaches to the walk: a leaf (once) to leaves, a node recorded
 * since `since` (once) to the stack; a node recorded before: its name in *outer. */
static int walk_edge(const kiln_grad_edge *e, uint64_t since, PyObject *seen, PyObject *leaves, PyObject *stack,
                     const char **outer) {
    const void *key = e->leaf ? (const void *)e->leaf : (const void *)e->node;
    if (!key) return 0;
    if (e->node && e->node->seq < since) {
        if (!*outer) *outer = kiln_grad_node_name(e->node);
        return 0;
    }
    PyObject *k = PyLong_FromVoidPtr((void *)key);
    int known = k ? PySet_Contains(seen, k) : -1;
    if (known == 0) known = PySet_Add(seen, k);
    else if (known == 1) known = 2;
    Py_XDECREF(k);
    if (known < 0) return -1;
    if (known == 2) return 0;
    if (e->node) {
        PyObject *n = PyLong_FromVoidPtr(e->node);
        int rc = n ? PyList_Append(stack, n) : -1;
        Py_XDECREF(n);
        return rc;
    }
    kiln_tensor_retain(e->leaf);
    PyObject *t = pykiln_wrap(e->leaf);
    int rc = t ? PyList_Append(leaves, t) : -1;
    Py_XDECREF(t);
    return rc;
}

/* grad_leaves(outputs, since, known) -> (leaves, outer): the leaf tensors that require grad which
 * the outputs' history reaches through nodes recorded at or after `since` (grad_clock()), each
 * once, in the order found, except those in known; outer: the name of the first op recorded before `since` that the history
 * reaches (a tensor made outside with its own history), or None. */
static PyObject *py_grad_leaves(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *outs, *known;
    unsigned long long since;
    if (!PyArg_ParseTuple(args, "O!KO!:grad_leaves", &PyTuple_Type, &outs, &since, &PyTuple_Type, &known))
        return NULL;
    PyObject *seen = PySet_New(NULL), *leaves = PyList_New(0), *stack = PyList_New(0), *result = NULL;
    const char *outer = NULL;
    int rc = seen && leaves && stack ? 0 : -1;
    for (Py_ssize_t k = 0; rc == 0 && k < PyTuple_GET_SIZE(known); k++) { /* leaves not to list */
        PyObject *o = PyTuple_GET_ITEM(known, k);
        PyObject *key = pykiln_is_tensor(o) ? PyLong_FromVoidPtr(pykiln_unwrap(o)) : NULL;
        rc = key ? PySet_Add(seen, key) : -1;
        Py_XDECREF(key);
        if (!pykiln_is_tensor(o)) PyErr_Format(PyExc_TypeError, "grad_leaves: known %zd is not a Tensor", k);
    }
    for (Py_ssize_t k = 0; rc == 0 && k < PyTuple_GET_SIZE(outs); k++) {
        PyObject *o = PyTuple_GET_ITEM(outs, k);
        if (!pykiln_is_tensor(o)) {
            PyErr_Format(PyExc_TypeError, "grad_leaves: output %zd is not a Tensor", k);
            rc = -1;
            break;
        }
        kiln_tensor *t = pykiln_unwrap(o);
        if (!t->requires_grad) continue;
        kiln_grad_edge e = {.node = t->grad_fn, .output_nr = 0, .leaf = t->grad_fn ? NULL : t};
        rc = walk_edge(&e, (uint64_t)since, seen, leaves, stack, &outer);
    }
    while (rc == 0 && PyList_GET_SIZE(stack) > 0) {
        Py_ssize_t top = PyList_GET_SIZE(stack) - 1;
        const kiln_grad_node *n = PyLong_AsVoidPtr(PyList_GET_ITEM(stack, top));
        rc = PyList_SetSlice(stack, top, top + 1, NULL);
        for (int32_t k = 0; rc == 0 && n && k < n->nin; k++) rc = walk_edge(&n->next[k], (uint64_t)since, seen, leaves,
                                                                           stack, &outer);
    }
    if (rc == 0) result = outer ? Py_BuildValue("(Os)", leaves, outer) : Py_BuildValue("(OO)", leaves, Py_None);
    Py_XDECREF(seen);
    Py_XDECREF(leaves);
    Py_XDECREF(stack);
    return result;
}

static PyObject *py_grad_clock(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromUnsignedLongLong(kiln_autograd_clock());
}

static PyMethodDef custom_grad_functions[] = {
    {"grad_leaves", py_grad_leaves, METH_VARARGS,
     "grad_leaves(outputs, since, known) -> (leaves, outer): the leaf tensors requiring grad (but those in known) "
     "that the outputs' history recorded since grad_clock() reaches, and the name of an op recorded before it that "
     "it reaches (or None)"},
    {"grad_clock", py_grad_clock, METH_NOARGS, "grad_clock() -> the order number the next autograd node gets"},
    {"refuse_outputs", (PyCFunction)(void (*)(void))py_refuse_outputs, METH_FASTCALL,
     "refuse_outputs(refusal, outs) -> outs: the outputs at the refusal's positions without history get one "
     "autograd node over its reads whose gradient raises (kiln.jit.capture_core.refuse_backward)"},
    {"record_grad", py_record_grad, METH_VARARGS,
     "record_grad(inputs, outputs, backward, name, keep_exceptions=False): outputs become one autograd node over "
     "inputs, whose gradient "
     "is backward(grads, needs, create_graph) -> per input a Tensor or None"},
    {NULL, NULL, 0, NULL},
};

int pykiln_custom_grad_init(PyObject *module) { return PyModule_AddFunctions(module, custom_grad_functions); }
