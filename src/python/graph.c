/* kiln._C.Tracer and kiln._C.Executable: trace capture and compiled graphs for kiln.jit and
 * kiln.trace. Reference notes: arguments are borrowed; returned objects are new references. */
#include "pykiln.h"

#include "core/internal.h"
#include "ir/compare.h"
#include "ir/trace_internal.h"
#include "runtime/backend.h"

/* A str of text the library malloc'd (taken: freed here); NULL text is out of memory. */
static PyObject *str_taking(char *text) {
    if (!text) return PyErr_NoMemory();
    PyObject *o = PyUnicode_FromString(text);
    free(text);
    return o;
}

/* ---- Executable ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    kiln_executable *exe; /* the plan and the backend that runs it */
    char *graph_text; /* the graph's text, once asked for */
    int nin, nout;
    bool release_gil; /* worth it when the graph does real work */
    PyObject *memory; /* dict: planned peaks with and without recomputation, bfs and dfs (memory_report) */
} PyExecutable;

static PyTypeObject PyExecutable_Type;

static const kiln_executable *plan_of(PyObject *self) { return ((PyExecutable *)self)->exe; }

static kiln_status run_graph(PyExecutable *p, int nin, kiln_tensor *const *in, kiln_tensor **out) {
    return kiln_executable_run(p->exe, nin, in, p->nout, out);
}

/* run_graph from Python: the GIL released for real work (kiln's SIGINT handler armed: Ctrl-C stops
 * the run), a stale interrupt request settled first (KILN_ERR_INTERRUPTED when that raised). */
static kiln_status run_graph_python(PyExecutable *p, int nin, kiln_tensor *const *in, kiln_tensor **out) {
    if (pykiln_interrupt_stale() < 0) return KILN_ERR_INTERRUPTED;
    if (!p->release_gil) return run_graph(p, nin, in, out);
    kiln_status s;
    pykiln_interrupt_arm();
    Py_BEGIN_ALLOW_THREADS
    s = run_graph(p, nin, in, out);
    Py_END_ALLOW_THREADS
    return s;
}

static void executable_dealloc(PyObject *self) {
    PyExecutable *p = (PyExecutable *)self;
    kiln_executable_free(p->exe);
    free(p->graph_text);
    Py_XDECREF(p->memory);
    Py_TYPE(self)->tp_free(self);
}

/* __call__(*tensors) -> tuple of tensors */
static PyObject *executable_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    PyExecutable *p = (PyExecutable *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames && PyTuple_GET_SIZE(kwnames)) {
        PyErr_SetString(PyExc_TypeError, "a compiled graph takes positional tensors only");
        return NULL;
    }
    if (nargs != p->nin) {
        PyErr_Format(PyExc_TypeError, "the compiled graph takes %d tensors, got %zd", p->nin, nargs);
        return NULL;
    }
    kiln_tensor *small_in[8], **in = nargs <= 8 ? small_in : PyMem_Malloc(sizeof *in * (size_t)nargs);
    kiln_tensor *small_out[8], **out = p->nout <= 8 ? small_out : PyMem_Calloc((size_t)p->nout, sizeof *out);
    PyObject *result = NULL;
    if (!in || !out) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < nargs; k++) {
        if (!pykiln_is_tensor(args[k])) {
            PyErr_Format(PyExc_TypeError, "argument %zd of a compiled graph must be a Tensor", k);
            goto done;
        }
        in[k] = pykiln_unwrap(args[k]);
    }
    kiln_status s = run_graph_python(p, (int)nargs, in, out);
    if (s != KILN_OK) {
        pykiln_raise(s);
        goto done;
    }
    result = PyTuple_New(p->nout);
    for (int k = 0; k < p->nout; k++) {
        PyObject *o = result ? pykiln_wrap(out[k]) : NULL;
        if (!o) {
            if (!result) kiln_tensor_release(out[k]);
            for (int j = k + 1; j < p->nout; j++) kiln_tensor_release(out[j]);
            Py_CLEAR(result);
            break;
        }
        PyTuple_SET_ITEM(result, k, o);
    }
done:
    if (in && in != small_in) PyMem_Free(in);
    if (out && out != small_out) PyMem_Free(out);
    return result;
}

/* The C fast path (dispatcher.c): runs an Executable on positional tensors the caller's guards
 * matched, without building an argument tuple; a one-output graph's result comes back as the
 * tensor itself when `single`. Other callables are called normally. New reference. */
PyObject *pykiln_executable_call(PyObject *exe, PyObject *const *args, Py_ssize_t nargs, bool single) {
    if (Py_TYPE(exe) != &PyExecutable_Type || !single || ((PyExecutable *)exe)->nout != 1 || nargs > 8 ||
        nargs != ((PyExecutable *)exe)->nin) {
        PyObject *outs = PyObject_Vectorcall(exe, args, (size_t)nargs, NULL);
        if (!outs || !single) return outs;
        PyObject *r = PyTuple_GET_ITEM(outs, 0);
        Py_INCREF(r);
        Py_DECREF(outs);
        return r;
    }
    PyExecutable *p = (PyExecutable *)exe;
    kiln_tensor *in[8], *out = NULL;
    for (Py_ssize_t k = 0; k < nargs; k++) in[k] = pykiln_unwrap(args[k]);
    kiln_status s = run_graph_python(p, (int)nargs, in, &out);
    if (s != KILN_OK) return pykiln_raise(s);
    return pykiln_wrap(out);
}

static PyObject *executable_graph_str(PyObject *self, PyObject *unused) {
    (void)unused;
    PyExecutable *p = (PyExecutable *)self;
    if (!p->graph_text && !(p->graph_text = kiln_graph_to_string(kiln_executable_plan(p->exe)->g)))
        return PyErr_NoMemory();
    return PyUnicode_FromString(p->graph_text);
}

static PyObject *executable_order(PyObject *self, PyObject *unused) {
    (void)unused;
    return str_taking(kiln_executable_order_string(plan_of(self)));
}

static PyObject *executable_plan_str(PyObject *self, PyObject *unused) {
    (void)unused;
    return str_taking(kiln_executable_plan_string(plan_of(self)));
}

static PyObject *executable_get_arena_bytes(PyObject *self, void *c) {
    (void)c;
    return PyLong_FromSize_t(kiln_executable_arena_bytes(plan_of(self)));
}

static PyObject *executable_get_output_bytes(PyObject *self, void *c) {
    (void)c;
    return PyLong_FromSize_t(kiln_executable_output_bytes(plan_of(self)));
}

static PyObject *executable_get_num_outputs(PyObject *self, void *c) {
    (void)c;
    return PyLong_FromLong(((PyExecutable *)self)->nout);
}

static PyObject *executable_get_backend(PyObject *self, void *c) {
    (void)c;
    return PyUnicode_FromString(kiln_executable_backend(plan_of(self)));
}

static PyObject *executable_get_native(PyObject *self, void *c) {
    (void)c;
    return PyBool_FromLong(kiln_executable_is_native(plan_of(self)));
}

static PyObject *executable_get_fallback_calls(PyObject *self, void *c) {
    (void)c;
    return PyLong_FromLongLong(kiln_executable_fallback_calls(plan_of(self)));
}

static PyObject *executable_memory_report(PyObject *self, PyObject *unused) {
    (void)unused;
    return pykiln_executable_memory(plan_of(self));
}

static PyObject *executable_recompute_report(PyObject *self, PyObject *unused) {
    (void)unused;
    PyObject *m = ((PyExecutable *)self)->memory;
    return m ? PyDict_Copy(m) : PyDict_New();
}

static PyObject *executable_graph_dot(PyObject *self, PyObject *unused) {
    (void)unused;
    return pykiln_executable_dot(plan_of(self));
}

static PyMethodDef executable_methods[] = {
    {"memory_report", executable_memory_report, METH_NOARGS,
     "the memory plan at its busiest step: arena, output and live bytes, the buffers live there"},
    {"recompute_report", executable_recompute_report, METH_NOARGS,
     "planned arena bytes with and without recomputation (sublinear memory, Cell.recompute), the recomputed ops "
     "and their FLOPs, and the peaks of the bfs and dfs orders"},
    {"graph_dot", executable_graph_dot, METH_NOARGS, "the compiled graph as Graphviz DOT"},
    {"graph_str", executable_graph_str, METH_NOARGS, "the graph in text form"},
    {"order", executable_order, METH_NOARGS, "the execution order, as op names"},
    {"plan_str", executable_plan_str, METH_NOARGS, "the plan in text form (order, memory, groups, bodies)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef executable_getset[] = {
    {"arena_bytes", executable_get_arena_bytes, NULL, "planned bytes of all intermediates", NULL},
    {"output_bytes", executable_get_output_bytes, NULL, "bytes of the outputs of one call", NULL},
    {"num_outputs", executable_get_num_outputs, NULL, "number of outputs", NULL},
    {"backend", executable_get_backend, NULL, "the name of the registered backend that runs it ('kbk', 'sink', ...)", NULL},
    {"native", executable_get_native, NULL, "sink: whether the graph runs as generated native code", NULL},
    {"fallback_calls", executable_get_fallback_calls, NULL,
     "sink: calls run kernel by kernel (inputs in layouts the generated code was not made for)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PyExecutable_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.Executable",
    .tp_basicsize = sizeof(PyExecutable),
    .tp_dealloc = executable_dealloc,
    .tp_vectorcall_offset = 0, /* set in init */
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A compiled graph: its plan, run by one registered backend (kbk, sink, reference).",
    .tp_methods = executable_methods,
    .tp_getset = executable_getset,
};

typedef struct {
    PyExecutable base;
    vectorcallfunc vectorcall;
} PyExecutableWithCall;

/* ---- Graph: a recording, as kiln.trace keeps it to verify later calls against ------------ */

typedef struct {
    PyObject_HEAD
    kiln_graph *g; /* owned */
} PyGraph;

static PyTypeObject PyGraph_Type;

static void graph_dealloc(PyObject *self) {
    kiln_graph_free(((PyGraph *)self)->g);
    Py_TYPE(self)->tp_free(self);
}

const kiln_graph *pykiln_graph_of(PyObject *o) {
    if (!PyObject_TypeCheck(o, &PyGraph_Type)) {
        PyErr_Format(PyExc_TypeError, "expected a kiln._C.Graph, got %s", Py_TYPE(o)->tp_name);
        return NULL;
    }
    return ((PyGraph *)o)->g;
}

/* Takes ownership of g. New reference. */
static PyObject *wrap_graph(kiln_graph *g);
PyObject *pykiln_wrap_graph(kiln_graph *g) { return wrap_graph(g); }

static PyObject *wrap_graph(kiln_graph *g) {
    PyGraph *p = PyObject_New(PyGraph, &PyGraph_Type);
    if (!p) {
        kiln_graph_free(g);
        return NULL;
    }
    p->g = g;
    return (PyObject *)p;
}

static PyObject *graph_str(PyObject *self) {
    return str_taking(kiln_graph_to_string(((PyGraph *)self)->g));
}

typedef enum { DIFF_OPS, DIFF_OUTPUTS, DIFF_CAPTURED } diff_what;

/* diff_ops(other, labels) / diff_outputs(other, labels) / diff_captured(other, labels) -> the first
 * difference between this recording and `other` (a later call's), as a message, or None. labels:
 * the names of the graph inputs (the function's tensor arguments) for messages. */
static PyObject *graph_diff(PyObject *self, PyObject *args, diff_what what) {
    PyObject *other, *labels;
    static const char *const formats[] = {"O!O!:diff_ops", "O!O!:diff_outputs", "O!O!:diff_captured"};
    if (!PyArg_ParseTuple(args, formats[what], &PyGraph_Type, &other, &PyList_Type, &labels)) return NULL;
    const kiln_graph *a = ((PyGraph *)self)->g, *b = ((PyGraph *)other)->g;
    kiln_graph_diff d;
    bool differs = what == DIFF_OUTPUTS ? kiln_graph_diff_outputs(a, b, &d)
                   : what == DIFF_OPS   ? kiln_graph_diff_ops(a, b, &d)
                                        : kiln_graph_diff_captured(a, b, &d);
    if (!differs) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(labels);
    const char **names = PyMem_Malloc(sizeof *names * (size_t)(n ? n : 1));
    if (!names) return PyErr_NoMemory();
    for (Py_ssize_t k = 0; k < n; k++) {
        names[k] = PyUnicode_AsUTF8(PyList_GET_ITEM(labels, k)); /* borrowed from the list's strings */
        if (!names[k]) {
            PyMem_Free(names);
            return NULL;
        }
    }
    char *msg = kiln_graph_diff_message(&d, (int)n, names);
    PyMem_Free(names);
    if (!msg) return PyErr_NoMemory();
    PyObject *o = PyUnicode_FromString(msg);
    free(msg);
    return o;
}

static PyObject *graph_diff_ops(PyObject *self, PyObject *args) { return graph_diff(self, args, DIFF_OPS); }

static PyObject *graph_diff_outputs(PyObject *self, PyObject *args) { return graph_diff(self, args, DIFF_OUTPUTS); }

static PyObject *graph_diff_captured(PyObject *self, PyObject *args) { return graph_diff(self, args, DIFF_CAPTURED); }

/* reader_of(value) -> "op at file:line" of the first op reading value number `value`, or None */
static PyObject *graph_reader_of(PyObject *self, PyObject *arg) {
    const kiln_graph *g = ((PyGraph *)self)->g;
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return NULL;
    int32_t n = v >= 0 && v < g->nvalues ? kiln_graph_first_reader(g, (int32_t)v) : -1;
    if (n < 0) Py_RETURN_NONE;
    const kiln_node *node = &g->nodes[n];
    const char *name = kiln_op_table[node->op].name;
    if (node->loc < 0 || node->loc >= g->nlocs) return PyUnicode_FromString(name);
    const char *loc = g->locs[node->loc], *base = strrchr(loc, '/');
    return PyUnicode_FromFormat("%s at %s", name, base && strchr(base, ':') ? base + 1 : loc);
}

/* rebind(input_shapes, sets) -> Graph: this graph for inputs of other shapes (kiln_graph_rebind);
 * sets: [(node, attr index, kind, value)], kind 0 value, 1 a dimension of the node's input 0,
 * 2 the rest of a reshape, 3 follow (a gradient rule's node, KILN_ATTR_SET_FOLLOW). ValueError when
 * the graph does not hold for those shapes. */
static PyObject *graph_rebind(PyObject *self, PyObject *args) {
    const kiln_graph *g = ((PyGraph *)self)->g;
    PyObject *shapes, *sets;
    if (!PyArg_ParseTuple(args, "O!O!:rebind", &PyList_Type, &shapes, &PyList_Type, &sets)) return NULL;
    if (PyList_GET_SIZE(shapes) != g->ninputs)
        return PyErr_Format(PyExc_ValueError, "rebind: %d input shapes expected", g->ninputs);
    Py_ssize_t nset = PyList_GET_SIZE(sets);
    kiln_meta *metas = PyMem_Malloc(sizeof *metas * (size_t)(g->ninputs ? g->ninputs : 1));
    kiln_attr_set *set = PyMem_Malloc(sizeof *set * (size_t)(nset ? nset : 1));
    PyObject *result = NULL;
    if (!metas || !set) {
        PyErr_NoMemory();
        goto done;
    }
    for (int32_t k = 0; k < g->ninputs; k++) {
        PyObject *t = PyList_GET_ITEM(shapes, k);
        metas[k] = g->values[g->inputs[k]].meta;
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != metas[k].ndim) {
            PyErr_Format(PyExc_ValueError, "rebind: input %d needs a tuple of %d sizes", k, metas[k].ndim);
            goto done;
        }
        for (int d = 0; d < metas[k].ndim; d++) {
            metas[k].shape[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, d));
            if (metas[k].shape[d] == -1 && PyErr_Occurred()) goto done;
        }
    }
    for (Py_ssize_t k = 0; k < nset; k++) {
        int kind;
        long long value;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(sets, k), "iiiL:rebind set", &set[k].node, &set[k].index, &kind,
                              &value))
            goto done;
        set[k].kind = (kiln_attr_set_kind)kind;
        set[k].value = value;
    }
    kiln_graph *out = NULL;
    kiln_status s = kiln_graph_rebind(g, metas, (int)nset, set, &out);
    result = s == KILN_OK ? wrap_graph(out) : pykiln_raise(s);
done:
    PyMem_Free(metas);
    PyMem_Free(set);
    return result;
}

/* amp(level, dtype) -> this graph with amp's casts (kiln_graph_amp, src/passes/amp.c) */
static PyObject *graph_amp(PyObject *self, PyObject *args) {
    int level;
    PyObject *dtype;
    kiln_dtype low;
    if (!PyArg_ParseTuple(args, "iO:amp", &level, &dtype) || pykiln_parse_dtype(dtype, &low) < 0) return NULL;
    kiln_graph *out = NULL;
    kiln_status s = kiln_graph_amp(((PyGraph *)self)->g, (kiln_amp_level)level, low, &out);
    return s == KILN_OK ? wrap_graph(out) : pykiln_raise(s);
}

/* The value id arg names in self's graph, or -1 with an exception naming `who` set. */
static long value_arg(PyObject *self, PyObject *arg, const char *who) {
    const kiln_graph *g = ((PyGraph *)self)->g;
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < 0 || v >= g->nvalues) return PyErr_Format(PyExc_IndexError, "%s: no value %ld", who, v), -1;
    return v;
}

/* value_shape(value) -> the shape of value %value */
static PyObject *graph_value_shape(PyObject *self, PyObject *arg) {
    long v = value_arg(self, arg, "value_shape");
    if (v < 0) return NULL;
    const kiln_meta *m = &((PyGraph *)self)->g->values[v].meta;
    PyObject *tup = PyTuple_New(m->ndim);
    for (int d = 0; tup && d < m->ndim; d++) PyTuple_SET_ITEM(tup, d, PyLong_FromLongLong(m->shape[d]));
    return tup;
}

static PyObject *graph_get_has_effects(PyObject *self, void *c) {
    (void)c;
    return PyBool_FromLong(kiln_graph_has_effects(((PyGraph *)self)->g));
}

PyObject *pykiln_meta_tuple(const kiln_meta *m) {
    PyObject *shape = PyTuple_New(m->ndim);
    for (int d = 0; shape && d < m->ndim; d++) PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(m->shape[d]));
    return shape ? Py_BuildValue("(ON)", pykiln_dtypes[m->dtype], shape) : NULL;
}

static PyObject *ids_of(const int32_t *ids, int32_t n) {
    PyObject *list = PyList_New(n);
    for (int32_t k = 0; list && k < n; k++) PyList_SET_ITEM(list, k, PyLong_FromLong(ids[k]));
    return list;
}

/* inputs() -> [(dtype, shape)] of the graph's inputs */
static PyObject *graph_inputs(PyObject *self, PyObject *unused) {
    (void)unused;
    const kiln_graph *g = ((PyGraph *)self)->g;
    PyObject *list = PyList_New(g->ninputs);
    for (int32_t k = 0; list && k < g->ninputs; k++) {
        PyObject *item = pykiln_meta_tuple(&g->values[g->inputs[k]].meta);
        if (!item) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, k, item);
    }
    return list;
}

/* One node as (op name, [input ids], [output ids], (ints), (floats), [(dtype, shape)] of the outputs). */
static PyObject *node_tuple(const kiln_graph *g, const kiln_node *n) {
    PyObject *ints = PyTuple_New(n->attrs.ni), *floats = PyTuple_New(n->attrs.nf), *metas = PyList_New(n->nout);
    if (!ints || !floats || !metas) goto fail;
    for (int k = 0; k < n->attrs.ni; k++) PyTuple_SET_ITEM(ints, k, PyLong_FromLongLong(n->attrs.i[k]));
    for (int k = 0; k < n->attrs.nf; k++) PyTuple_SET_ITEM(floats, k, PyFloat_FromDouble(n->attrs.f[k]));
    for (int k = 0; k < n->nout; k++) {
        PyObject *m = pykiln_meta_tuple(&g->values[n->out[k]].meta);
        if (!m) goto fail;
        PyList_SET_ITEM(metas, k, m);
    }
    return Py_BuildValue("(sNNNNN)", kiln_op_table[n->op].name, ids_of(n->in, n->nin), ids_of(n->out, n->nout), ints,
                         floats, metas);
fail:
    Py_XDECREF(ints), Py_XDECREF(floats), Py_XDECREF(metas);
    return NULL;
}

/* structure(path=()) -> (inputs [(id, dtype, shape)], captures [(id, tensor)], nodes [node_tuple],
 * outputs [id], number of subgraphs): the graph as data, for exporters; path: subgraph indices
 * leading from this graph to a nested one (control-flow bodies). */
static PyObject *graph_structure(PyObject *self, PyObject *args) {
    const kiln_graph *g = ((PyGraph *)self)->g;
    PyObject *path = NULL;
    if (!PyArg_ParseTuple(args, "|O!:structure", &PyTuple_Type, &path)) return NULL;
    for (Py_ssize_t k = 0; path && k < PyTuple_GET_SIZE(path); k++) {
        long idx = PyLong_AsLong(PyTuple_GET_ITEM(path, k));
        if (idx == -1 && PyErr_Occurred()) return NULL;
        if (idx < 0 || idx >= g->nsubgraphs) {
            PyErr_Format(PyExc_IndexError, "structure: subgraph %ld of a graph with %d", idx, (int)g->nsubgraphs);
            return NULL;
        }
        g = g->subgraphs[idx];
    }
    PyObject *ins = PyList_New(g->ninputs), *caps = PyList_New(g->ncaptures), *nodes = PyList_New(g->nnodes);
    bool ok = ins && caps && nodes;
    for (int32_t k = 0; ok && k < g->ninputs; k++) {
        PyObject *m = pykiln_meta_tuple(&g->values[g->inputs[k]].meta);
        PyObject *item = m ? Py_BuildValue("(iN)", g->inputs[k], m) : NULL;
        ok = item != NULL;
        if (ok) PyList_SET_ITEM(ins, k, item);
    }
    for (int32_t k = 0; ok && k < g->ncaptures; k++) {
        kiln_tensor *t = g->values[g->captures[k]].bound;
        kiln_tensor_retain(t);
        PyObject *pt = pykiln_wrap(t);
        PyObject *item = pt ? Py_BuildValue("(iN)", g->captures[k], pt) : NULL;
        ok = item != NULL;
        if (ok) PyList_SET_ITEM(caps, k, item);
    }
    for (int32_t i = 0; ok && i < g->nnodes; i++) {
        PyObject *item = node_tuple(g, &g->nodes[i]);
        ok = item != NULL;
        if (ok) PyList_SET_ITEM(nodes, i, item);
    }
    if (!ok) {
        Py_XDECREF(ins), Py_XDECREF(caps), Py_XDECREF(nodes);
        return NULL;
    }
    return Py_BuildValue("(NNNNi)", ins, caps, nodes, ids_of(g->outputs, g->noutputs), g->nsubgraphs);
}

/* split(nforward_inputs, nforward_outputs) -> (forward Graph, backward Graph, number of residuals):
 * kiln_graph_split */
static PyObject *graph_split(PyObject *self, PyObject *args) {
    int nfin, nfout;
    if (!PyArg_ParseTuple(args, "ii:split", &nfin, &nfout)) return NULL;
    kiln_graph *f = NULL, *b = NULL;
    int32_t nres = 0;
    kiln_status s = kiln_graph_split(((PyGraph *)self)->g, nfin, nfout, &f, &b, &nres);
    if (s != KILN_OK) return pykiln_raise(s);
    PyObject *pf = wrap_graph(f), *pb = pf ? wrap_graph(b) : (kiln_graph_free(b), NULL);
    if (!pb) {
        Py_XDECREF(pf);
        return NULL;
    }
    return Py_BuildValue("(NNi)", pf, pb, (int)nres);
}

static PyObject *graph_get_num_outputs(PyObject *self, void *c) {
    (void)c;
    return PyLong_FromLong(((PyGraph *)self)->g->noutputs);
}

static PyMethodDef graph_methods[] = {
    {"inputs", graph_inputs, METH_NOARGS, "inputs() -> [(dtype, shape)] of the graph's inputs"},
    {"structure", graph_structure, METH_VARARGS,
     "structure(path=()) -> (inputs, captures, nodes, outputs, subgraph count): the graph (or the nested subgraph at "
     "path) as data, for exporters"},
    {"amp", graph_amp, METH_VARARGS, "amp(level, dtype) -> this graph with mixed precision's casts (level 0-3: O0-O3)"},
    {"rebind", graph_rebind, METH_VARARGS, "rebind(input_shapes, sets) -> this graph for other input shapes"},
    {"value_shape", graph_value_shape, METH_O, "value_shape(value) -> the shape of that value"},
    {"symbolize", pykiln_graph_symbolize, METH_VARARGS,
     "symbolize(hints, input_sizes, sets) -> this recording with symbolic sizes (graph_sym.c)"},
    {"instantiate", pykiln_graph_instantiate, METH_O, "instantiate(values) -> the concrete graph of one binding"},
    {"symbolic_sizes", pykiln_graph_symbolic_sizes, METH_VARARGS,
     "symbolic_sizes(path=()) -> ({value: sizes}, {node: int attributes as sizes}) where a size is symbolic"},
    {"value_shape_at", pykiln_graph_value_shape_at, METH_VARARGS,
     "value_shape_at(value, values) -> that value's shape at one binding of the symbols"},
    {"diff_ops", graph_diff_ops, METH_VARARGS, "diff_ops(other, labels) -> the first difference of the ops, or None"},
    {"diff_outputs", graph_diff_outputs, METH_VARARGS,
     "diff_outputs(other, labels) -> the first difference of the returned values, or None"},
    {"diff_captured", graph_diff_captured, METH_VARARGS,
     "diff_captured(other, labels) -> the first captured tensor that is another one (or, made by the function, "
     "holds other values), or None"},
    {"reader_of", graph_reader_of, METH_O, "reader_of(value) -> 'op at file:line' of its first reader, or None"},
    {"split", graph_split, METH_VARARGS,
     "split(nforward_inputs, nforward_outputs) -> (forward, backward, nresiduals): a forward-and-backward graph "
     "cut at the values the backward reads"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef graph_getset[] = {
    {"num_outputs", graph_get_num_outputs, NULL, "number of graph outputs", NULL},
    {"has_effects", graph_get_has_effects, NULL,
     "whether running it again would repeat effects (in-place writes, random draws, printing)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PyGraph_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.Graph",
    .tp_basicsize = sizeof(PyGraph),
    .tp_dealloc = graph_dealloc,
    .tp_str = graph_str,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A recorded graph (Tracer.recorded()), compared with later recordings by kiln.trace.",
    .tp_methods = graph_methods,
    .tp_getset = graph_getset,
};

/* ---- Tracer ------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    kiln_tracer *tr;
    bool active;
    kiln_graph *body; /* finish_body's graph, until pykiln_tracer_take_body */
} PyTracer;

static PyTypeObject PyTracer_Type;

static void tracer_dealloc(PyObject *self) {
    PyTracer *p = (PyTracer *)self;
    kiln_tracer_free(p->tr);
    kiln_graph_free(p->body);
    Py_TYPE(self)->tp_free(self);
}

/* Tracer(capture_constants=False, nested=False): starts recording on this thread; nested: inside
 * the active trace (a control-flow body), which resumes when this one ends */
static PyObject *tracer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"capture_constants", "nested", NULL};
    int constants = 0, nested = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|pp:Tracer", kwlist, &constants, &nested)) return NULL;
    if (kiln_tracer_active() && !nested) {
        PyErr_SetString(PyExc_RuntimeError, "a trace is already being recorded on this thread");
        return NULL;
    }
    PyTracer *p = (PyTracer *)type->tp_alloc(type, 0);
    if (!p) return NULL;
    kiln_status s = kiln_tracer_begin(&p->tr);
    if (s != KILN_OK) {
        Py_DECREF(p);
        return pykiln_raise(s);
    }
    kiln_tracer_set_capture_constants(p->tr, constants);
    p->active = true;
    return (PyObject *)p;
}

static PyTracer *live(PyObject *self) {
    PyTracer *p = (PyTracer *)self;
    if (!p->active) {
        PyErr_SetString(PyExc_RuntimeError, "this trace has ended");
        return NULL;
    }
    return p;
}

static PyObject *tracer_add_input(PyObject *self, PyObject *t) {
    PyTracer *p = live(self);
    if (!p) return NULL;
    if (!pykiln_is_tensor(t)) {
        PyErr_SetString(PyExc_TypeError, "add_input expects a Tensor");
        return NULL;
    }
    kiln_status s = kiln_tracer_add_input(p->tr, pykiln_unwrap(t));
    if (s != KILN_OK) return pykiln_raise(s);
    Py_RETURN_NONE;
}

static PyObject *tracer_set_loc(PyObject *self, PyObject *loc) {
    PyTracer *p = live(self);
    if (!p) return NULL;
    const char *text = loc == Py_None ? NULL : PyUnicode_AsUTF8(loc);
    if (loc != Py_None && !text) return NULL;
    kiln_status s = kiln_tracer_set_loc(p->tr, text);
    if (s != KILN_OK) return pykiln_raise(s);
    Py_RETURN_NONE;
}

/* keep_undo(): from now on, each tensor the traced ops write in place is copied before its first write */
static PyObject *tracer_keep_undo(PyObject *self, PyObject *unused) {
    (void)unused;
    PyTracer *p = live(self);
    if (!p) return NULL;
    kiln_tracer_keep_undo(p->tr, true);
    Py_RETURN_NONE;
}

/* undo_writes(): those tensors' values put back as they were before the trace wrote them */
static PyObject *tracer_undo_writes(PyObject *self, PyObject *unused) {
    (void)unused;
    PyTracer *p = (PyTracer *)self;
    kiln_tracer_keep_undo(p->tr, false);
    kiln_status s = kiln_tracer_undo_writes(p->tr);
    if (s != KILN_OK) return pykiln_raise(s);
    Py_RETURN_NONE;
}

static PyObject *tracer_knows(PyObject *self, PyObject *t) {
    PyTracer *p = (PyTracer *)self;
    if (!pykiln_is_tensor(t)) Py_RETURN_FALSE;
    return PyBool_FromLong(kiln_tracer_knows(p->tr, pykiln_unwrap(t)));
}

/* captured() -> [tensor]: the tensors the graph reads from outside by reference (not constants),
 * of the finished body, else of the graph recorded so far */
static PyObject *tracer_captured(PyObject *self, PyObject *unused) {
    (void)unused;
    PyTracer *p = (PyTracer *)self;
    const kiln_graph *g = p->body ? p->body : kiln_tracer_graph(p->tr);
    PyObject *list = PyList_New(0);
    for (int32_t c = 0; list && g && c < g->ncaptures; c++) {
        const kiln_value *v = &g->values[g->captures[c]];
        if (v->constant) continue;
        kiln_tensor_retain(v->bound);
        PyObject *t = pykiln_wrap(v->bound);
        if (!t || PyList_Append(list, t) < 0) Py_CLEAR(list);
        Py_XDECREF(t);
    }
    return list;
}

/* bind(tensor, like): from now on this (active) trace reads tensor as the value of like, a
 * tensor it recorded of the same meta (a captured tensor read through a packed copy) */
static PyObject *tracer_bind(PyObject *self, PyObject *args) {
    PyObject *t, *like;
    if (!PyArg_ParseTuple(args, "OO:bind", &t, &like)) return NULL;
    PyTracer *p = live(self);
    if (!p) return NULL;
    if (!pykiln_is_tensor(t) || !pykiln_is_tensor(like)) return PyErr_Format(PyExc_TypeError, "bind expects two Tensors");
    kiln_tensor *a = pykiln_unwrap(t), *b = pykiln_unwrap(like);
    if (kiln_tracer_active() != p->tr || !kiln_tracer_knows(p->tr, b) || !kiln_meta_equal(&a->meta, &b->meta))
        return PyErr_Format(PyExc_ValueError, "bind: like must be a tensor this active trace recorded, of tensor's meta");
    kiln_tracer_alias(b, a);
    Py_RETURN_NONE;
}

/* value_of(tensor) -> its value in the graph (capturing it when unknown) */
static PyObject *tracer_value_of(PyObject *self, PyObject *t) {
    PyTracer *p = live(self);
    if (!p) return NULL;
    if (!pykiln_is_tensor(t)) return PyErr_Format(PyExc_TypeError, "value_of expects a Tensor");
    int32_t v;
    kiln_status s = kiln_tracer_value_of(p->tr, pykiln_unwrap(t), &v);
    if (s != KILN_OK) return pykiln_raise(s);
    return PyLong_FromLong(v);
}

/* node_of(tensor) -> the index of the node that produced it in the graph, or -1 (an input, a
 * capture, or a tensor this trace does not know) */
static PyObject *tracer_node_of(PyObject *self, PyObject *t) {
    PyTracer *p = (PyTracer *)self;
    if (!pykiln_is_tensor(t) || !kiln_tracer_knows(p->tr, pykiln_unwrap(t))) return PyLong_FromLong(-1);
    int32_t v;
    kiln_status s = kiln_tracer_value_of(p->tr, pykiln_unwrap(t), &v);
    if (s != KILN_OK) return pykiln_raise(s);
    const kiln_graph *g = kiln_tracer_graph(p->tr);
    return PyLong_FromLong(g->values[v].kind == KILN_VALUE_NODE ? g->values[v].node : -1);
}

static PyObject *tracer_count(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyLong_FromLong(kiln_tracer_count(((PyTracer *)self)->tr));
}

/* constant_sources() -> [(tensor, "%value", version)]: what a capture_constants trace copied in (new
 * tensor objects sharing the originals' storage, whose version tells of in-place writes since) */
static PyObject *tracer_constant_sources(PyObject *self, PyObject *unused) {
    (void)unused;
    kiln_tracer *tr = ((PyTracer *)self)->tr;
    int32_t n = kiln_tracer_num_constant_sources(tr);
    PyObject *list = PyList_New(n);
    for (int32_t k = 0; list && k < n; k++) {
        int32_t value;
        int64_t version;
        kiln_tensor *src = kiln_tracer_constant_source(tr, k, &value, &version), *alias = NULL;
        kiln_status s = kiln_tensor_detach(src, &alias);
        PyObject *t = s == KILN_OK ? pykiln_wrap(alias) : pykiln_raise(s);
        PyObject *item = t ? Py_BuildValue("(NsL)", t, "", (long long)version) : NULL;
        if (item) {
            PyObject *name = PyUnicode_FromFormat("%%%d", (int)value);
            if (!name) Py_CLEAR(item);
            else PyTuple_SetItem(item, 1, name);
        }
        if (!item) Py_CLEAR(list);
        else PyList_SET_ITEM(list, k, item);
    }
    return list;
}

/* outside_value_reads() -> [(tensor, version)]: the tensors the trace did not know whose values
 * Python read while it was active (new tensor objects sharing their storage) and their versions then */
static PyObject *tracer_outside_value_reads(PyObject *self, PyObject *unused) {
    (void)unused;
    kiln_tracer *tr = ((PyTracer *)self)->tr;
    int32_t n = kiln_tracer_num_outside_reads(tr);
    PyObject *list = PyList_New(n);
    for (int32_t k = 0; list && k < n; k++) {
        int64_t version;
        kiln_tensor *src = kiln_tracer_outside_read(tr, k, &version), *alias = NULL;
        kiln_status s = kiln_tensor_detach(src, &alias);
        PyObject *t = s == KILN_OK ? pykiln_wrap(alias) : pykiln_raise(s);
        PyObject *item = t ? Py_BuildValue("(NL)", t, (long long)version) : NULL;
        if (!item) Py_CLEAR(list);
        else PyList_SET_ITEM(list, k, item);
    }
    return list;
}

/* value_reads() -> (count, "file:line" of the first or None): values of recorded tensors read by Python */
static PyObject *tracer_value_reads(PyObject *self, PyObject *unused) {
    (void)unused;
    const char *loc = NULL;
    int32_t n = kiln_tracer_value_reads(((PyTracer *)self)->tr, &loc);
    if (loc) return Py_BuildValue("(is)", (int)n, loc);
    return Py_BuildValue("(iO)", (int)n, Py_None);
}

/* end(): stop recording (the graph so far is kept) */
static PyObject *tracer_end(PyObject *self, PyObject *unused) {
    (void)unused;
    PyTracer *p = (PyTracer *)self;
    kiln_tracer_end(p->tr);
    p->active = false;
    Py_RETURN_NONE;
}

/* Ends p's trace and makes the values of the tensors in `outputs` (a sequence; *n of them) its
 * graph's outputs. Returns the graph (borrowed from the tracer), or NULL with an exception set;
 * `what` names the caller in messages. */
static kiln_graph *end_with_outputs(PyTracer *p, PyObject *outputs, const char *what, Py_ssize_t *n) {
    kiln_tracer_end(p->tr);
    p->active = false;
    kiln_status s = kiln_tracer_status(p->tr);
    if (s != KILN_OK) return pykiln_raise(s), NULL;
    if (!PyList_Check(outputs) && !PyTuple_Check(outputs)) {
        PyErr_Format(PyExc_TypeError, "%s: outputs must be a list or tuple of tensors", what);
        return NULL;
    }
    *n = PySequence_Fast_GET_SIZE(outputs);
    int32_t *ids = PyMem_Malloc(sizeof(int32_t) * (size_t)(*n ? *n : 1));
    if (!ids) return PyErr_NoMemory(), NULL;
    for (Py_ssize_t k = 0; k < *n && s == KILN_OK; k++) {
        PyObject *o = PySequence_Fast_GET_ITEM(outputs, k);
        if (!pykiln_is_tensor(o)) {
            PyErr_Format(PyExc_TypeError, "%s: output %zd is not a Tensor", what, k);
            PyMem_Free(ids);
            return NULL;
        }
        s = kiln_tracer_value_of(p->tr, pykiln_unwrap(o), &ids[k]);
    }
    kiln_graph *g = kiln_tracer_graph(p->tr);
    if (s == KILN_OK) s = kiln_graph_set_outputs(g, (int)*n, ids);
    PyMem_Free(ids);
    if (s != KILN_OK) return pykiln_raise(s), NULL;
    return g;
}

/* Recomputation after the level's passes: the nodes of Cells marked with Cell.recompute() when
 * there are any, else the checkpoint search when `sublinear` is a tuple (thresh_nr_try,
 * genetic_nr_iter, genetic_pool_size, lb_memory bytes, num_worker). Fills a dict for
 * memory_report(), returned (NULL with an exception set on failure). */
static PyObject *recompute_graph(kiln_graph **g, kiln_exec_order order, PyObject *sublinear) {
    kiln_sublinear_report rep = {0};
    const char *mode = "none";
    kiln_graph *marked = NULL;
    kiln_recompute_stats st = {0};
    kiln_status s = kiln_plan_arena_bytes(*g, order, &rep.peak_before);
    rep.peak_after = rep.peak_greedy = rep.peak_hoisted = rep.peak_before;
    if (s == KILN_OK) s = kiln_recompute_marked(*g, &marked, &st);
    if (s == KILN_OK && marked) {
        kiln_graph_free(*g);
        *g = marked;
        mode = "cell";
        rep.recomputed_ops = st.recomputed_ops, rep.extra_flops = st.extra_flops;
        s = kiln_plan_arena_bytes(*g, order, &rep.peak_after);
    } else if (s == KILN_OK && sublinear != Py_None) {
        long long t[5];
        if (!PyArg_ParseTuple(sublinear, "LLLLL", &t[0], &t[1], &t[2], &t[3], &t[4])) return NULL;
        for (int k = 0; k < 5; k++)
            if (t[k] < 0 || t[k] > (k == 3 ? INT64_MAX : INT32_MAX) || (k == 4 && t[k] < 1)) {
                static const char *names[] = {"thresh_nr_try", "genetic_nr_iter", "genetic_pool_size", "lb_memory",
                                              "num_worker"};
                return PyErr_Format(PyExc_ValueError, "SublinearMemoryConfig: %s out of range: %lld", names[k], t[k]);
            }
        kiln_sublinear_config cfg = {(int32_t)t[0], (int32_t)t[1], (int32_t)t[2], (int64_t)t[3], (int32_t)t[4], 2333};
        Py_BEGIN_ALLOW_THREADS
        s = kiln_sublinear_optimize(g, order, &cfg, &rep);
        Py_END_ALLOW_THREADS
        mode = "search";
    }
    size_t bfs = 0, dfs = 0;
    if (s == KILN_OK) s = kiln_plan_arena_bytes(*g, KILN_ORDER_BFS, &bfs);
    if (s == KILN_OK) s = kiln_plan_arena_bytes(*g, KILN_ORDER_DFS, &dfs);
    if (s != KILN_OK) return pykiln_raise(s);
    size_t constants = 0; /* copies the graph holds (captured by value) */
    for (int32_t c = 0; c < (*g)->ncaptures; c++) {
        const kiln_value *v = &(*g)->values[(*g)->captures[c]];
        if (v->constant) constants += (size_t)kiln_meta_numel(&v->meta) * kiln_dtype_size(v->meta.dtype);
    }
    return Py_BuildValue("{s:s,s:n,s:n,s:n,s:n,s:n,s:i,s:L,s:i,s:i,s:n,s:n}", "recompute", mode, "constant_bytes",
                         (Py_ssize_t)constants, "peak_before", (Py_ssize_t)rep.peak_before, "peak_hoisted",
                         (Py_ssize_t)rep.peak_hoisted, "peak_after", (Py_ssize_t)rep.peak_after, "peak_greedy",
                         (Py_ssize_t)rep.peak_greedy, "recomputed_ops", rep.recomputed_ops, "extra_flops",
                         (long long)rep.extra_flops, "checkpoints", rep.checkpoints, "candidates", rep.candidates,
                         "peak_bfs", (Py_ssize_t)bfs, "peak_dfs", (Py_ssize_t)dfs);
}

PyObject *pykiln_executable_new(const kiln_graph *g, const kiln_compile_options *opt) {
    kiln_executable *exe = NULL;
    kiln_status s = kiln_compile(g, opt, &exe);
    if (s != KILN_OK) return pykiln_raise(s);
    return pykiln_executable_wrap(exe, g);
}

PyObject *pykiln_executable_wrap(kiln_executable *exe, const kiln_graph *g) {
    PyExecutableWithCall *e = PyObject_New(PyExecutableWithCall, &PyExecutable_Type);
    if (!e) {
        kiln_executable_free(exe);
        return NULL;
    }
    e->vectorcall = executable_vectorcall;
    e->base.exe = exe;
    e->base.memory = NULL;
    e->base.graph_text = NULL; /* made when asked for (graph_str): the plan keeps the graph */
    e->base.nin = g->ninputs;
    e->base.nout = g->noutputs;
    int64_t work = 0;
    for (int32_t v = 0; v < g->nvalues; v++) work += kiln_meta_numel(&g->values[v].meta);
    bool loops = false; /* control flow: the work depends on the data */
    for (int32_t i = 0; i < g->nnodes; i++) loops |= (kiln_op_table[g->nodes[i].op].flags & KILN_OPF_CONTROL) != 0;
    e->base.release_gil = work >= 65536 || loops;
    return (PyObject *)e;
}

/* An Executable of g (borrowed, left unchanged): a copy optimized for opt's level, recomputed
 * (recompute_graph) and compiled for opt's backend. */
static PyObject *optimize_and_compile(const kiln_graph *g, const pykiln_compile_options *opt) {
    kiln_graph *optimized = NULL;
    kiln_status s = kiln_graph_clone(g, &optimized);
    if (s == KILN_OK) s = kiln_optimize(&optimized, &opt->passes);
    if (s != KILN_OK) {
        kiln_graph_free(optimized);
        return pykiln_raise(s);
    }
    PyObject *memory = recompute_graph(&optimized, opt->compile.order, opt->sublinear);
    if (!memory) {
        kiln_graph_free(optimized);
        return NULL;
    }
    PyObject *e = pykiln_executable_new(optimized, &opt->compile);
    kiln_graph_free(optimized);
    if (!e) {
        Py_DECREF(memory);
        return NULL;
    }
    ((PyExecutable *)e)->memory = memory;
    return e;
}

/* finish(outputs, options=None) -> Executable; ends the trace and compiles its graph with options
 * (a CompileOptions; None: the defaults), as compile_graph does */
static PyObject *tracer_finish(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"outputs", "options", NULL};
    PyObject *outputs, *options = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:finish", kwlist, &outputs, &options)) return NULL;
    const pykiln_compile_options *opt = pykiln_compile_options_of(options, "finish");
    if (!opt) return NULL;
    PyTracer *p = (PyTracer *)self;
    Py_ssize_t n = 0;
    kiln_graph *g = end_with_outputs(p, outputs, "finish", &n);
    if (!g) return NULL;
    return optimize_and_compile(g, opt);
}

/* finish_body(outputs): ends the trace and keeps its graph, returning `outputs`, for
 * kiln._C.apply_control */
static PyObject *tracer_finish_body(PyObject *self, PyObject *outputs) {
    PyTracer *p = (PyTracer *)self;
    Py_ssize_t n = 0;
    kiln_graph *g = end_with_outputs(p, outputs, "finish_body", &n);
    if (!g) return NULL;
    kiln_status s = KILN_OK;
    kiln_graph_free(p->body);
    p->body = NULL;
    if (s == KILN_OK) s = kiln_graph_clone(g, &p->body);
    if (s != KILN_OK) return pykiln_raise(s);
    Py_RETURN_NONE;
}

kiln_graph *pykiln_tracer_take_body(PyObject *o) {
    if (!PyObject_TypeCheck(o, &PyTracer_Type) || !((PyTracer *)o)->body) {
        PyErr_SetString(PyExc_TypeError, "expected a Tracer that finished a body (finish_body)");
        return NULL;
    }
    kiln_graph *g = ((PyTracer *)o)->body;
    ((PyTracer *)o)->body = NULL;
    return g;
}

/* finish_graph(outputs) -> Graph: ends the trace and returns a copy of its graph with these outputs,
 * unoptimized (for Graph.split, then compile_graph) */
static PyObject *tracer_finish_graph(PyObject *self, PyObject *outputs) {
    Py_ssize_t n = 0;
    kiln_graph *g = end_with_outputs((PyTracer *)self, outputs, "finish_graph", &n), *c = NULL;
    if (!g) return NULL;
    kiln_status s = kiln_graph_clone(g, &c);
    if (s != KILN_OK) return pykiln_raise(s);
    return wrap_graph(c);
}

static PyObject *tracer_graph_str(PyObject *self, PyObject *unused) {
    (void)unused;
    return str_taking(kiln_graph_to_string(kiln_tracer_graph(((PyTracer *)self)->tr)));
}

/* recorded() -> Graph: a copy of the graph recorded so far (as recorded, before any pass) */
static PyObject *tracer_recorded(PyObject *self, PyObject *unused) {
    (void)unused;
    kiln_graph *g = NULL;
    kiln_status s = kiln_graph_clone(kiln_tracer_graph(((PyTracer *)self)->tr), &g);
    if (s != KILN_OK) return pykiln_raise(s);
    return wrap_graph(g);
}

static PyMethodDef tracer_methods[] = {
    {"add_input", tracer_add_input, METH_O, "declare a tensor as the next graph input"},
    {"set_loc", tracer_set_loc, METH_O, "source location recorded with the following ops"},
    {"knows", tracer_knows, METH_O, "whether the tensor is an input or was produced while tracing"},
    {"keep_undo", tracer_keep_undo, METH_NOARGS, "copy each tensor the traced ops write in place before its first write"},
    {"undo_writes", tracer_undo_writes, METH_NOARGS, "put the tensors the trace wrote back as they were (keep_undo)"},
    {"count", tracer_count, METH_NOARGS, "number of ops recorded"},
    {"value_of", tracer_value_of, METH_O, "value_of(tensor) -> its value id in the graph"},
    {"captured", tracer_captured, METH_NOARGS, "captured() -> [tensor] read from outside by reference"},
    {"bind", tracer_bind, METH_VARARGS, "bind(tensor, like): read tensor as like's value from now on"},
    {"node_of", tracer_node_of, METH_O, "node_of(tensor) -> index of the node producing it, or -1"},
    {"constant_sources", tracer_constant_sources, METH_NOARGS, "[(tensor, value name, version)] of constants"},
    {"value_reads", tracer_value_reads, METH_NOARGS, "(count, first location) of recorded values read by Python"},
    {"outside_value_reads", tracer_outside_value_reads, METH_NOARGS,
     "[(tensor, version)] of tensors the trace did not know whose values Python read"},
    {"end", tracer_end, METH_NOARGS, "stop recording"},
    {"finish", (PyCFunction)(void (*)(void))tracer_finish, METH_VARARGS | METH_KEYWORDS,
     "finish(outputs, options=None) -> Executable (options: a CompileOptions)"},
    {"finish_body", tracer_finish_body, METH_O, "finish_body(outputs): end and keep the graph for apply_control"},
    {"finish_graph", tracer_finish_graph, METH_O, "finish_graph(outputs) -> Graph: end, with these outputs"},
    {"graph_str", tracer_graph_str, METH_NOARGS, "the graph recorded so far"},
    {"recorded", tracer_recorded, METH_NOARGS, "a copy of the graph recorded so far (a Graph)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PyTracer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.Tracer",
    .tp_basicsize = sizeof(PyTracer),
    .tp_dealloc = tracer_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Records the ops run on this thread into a graph.",
    .tp_methods = tracer_methods,
    .tp_new = tracer_new,
};

/* ---- memory statistics ------------------------------------------------------------------ */

static PyObject *py_memory_stats(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return Py_BuildValue("(nn)", (Py_ssize_t)kiln_memory_in_use(), (Py_ssize_t)kiln_memory_peak());
}

static PyObject *py_reset_peak(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    kiln_memory_reset_peak();
    Py_RETURN_NONE;
}

/* suspend_tracing() -> token: recording on this thread stops (exclude_from_trace) until
 * resume_tracing(token); the token is the suspended tracer's address (0: none was active). */
static PyObject *py_suspend_tracing(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromVoidPtr(kiln_tracer_suspend());
}

static PyObject *py_resume_tracing(PyObject *self, PyObject *token) {
    (void)self;
    void *tr = PyLong_AsVoidPtr(token);
    if (!tr && PyErr_Occurred()) return NULL;
    if (kiln_tracer_active())
        return PyErr_Format(PyExc_RuntimeError, "resume_tracing: a tracer is active; suspend and resume must pair");
    kiln_tracer_resume((kiln_tracer *)tr);
    Py_RETURN_NONE;
}

/* traced_here(tensor) -> whether the active recording made the tensor or takes it as an input (a
 * value of the graph), rather than meeting it as a constant; False when none records. */
static PyObject *py_traced_here(PyObject *self, PyObject *t) {
    (void)self;
    if (!pykiln_is_tensor(t)) return PyErr_Format(PyExc_TypeError, "traced_here: expected a Tensor");
    kiln_tracer *tr = kiln_tracer_active();
    return PyBool_FromLong(tr && kiln_tracer_knows(tr, pykiln_unwrap(t)));
}

static PyObject *py_tracing(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(kiln_tracer_active() != NULL);
}

/* compile_graph(graph, options=None) -> Executable: a copy of graph optimized for options' level
 * and compiled for its backend (options: a CompileOptions; None: the defaults) */
static PyObject *py_compile_graph(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"graph", "options", NULL};
    PyObject *graph, *options = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!|O:compile_graph", kwlist, &PyGraph_Type, &graph, &options))
        return NULL;
    const pykiln_compile_options *opt = pykiln_compile_options_of(options, "compile_graph");
    return opt ? optimize_and_compile(((PyGraph *)graph)->g, opt) : NULL;
}

PyMethodDef pykiln_graph_functions[] = {
    {"compile_graph", (PyCFunction)(void (*)(void))py_compile_graph, METH_VARARGS | METH_KEYWORDS,
     "compile_graph(graph, options=None) -> Executable (options: a CompileOptions)"},
    {"optimize_graph", (PyCFunction)(void (*)(void))pykiln_optimize_graph, METH_VARARGS | METH_KEYWORDS,
     "optimize_graph(graph, level=0, inference=False, disable_format_transform=False) -> the optimized Graph"},
    {"memory_stats", py_memory_stats, METH_NOARGS, "(bytes in use, peak bytes) of kiln's allocator"},
    {"reset_peak_memory", py_reset_peak, METH_NOARGS, "restart peak tracking from the current use"},
    {"is_tracing", py_tracing, METH_NOARGS, "whether ops on this thread are being recorded"},
    {"traced_here", py_traced_here, METH_O, "traced_here(tensor) -> whether the active recording made or takes it"},
    {"suspend_tracing", py_suspend_tracing, METH_NOARGS,
     "suspend_tracing() -> token: stop recording on this thread until resume_tracing(token)"},
    {"resume_tracing", py_resume_tracing, METH_O, "resume_tracing(token): recording as before suspend_tracing"},
    {NULL, NULL, 0, NULL},
};

int pykiln_graph_init_types(PyObject *module) {
    PyExecutable_Type.tp_basicsize = sizeof(PyExecutableWithCall);
    PyExecutable_Type.tp_vectorcall_offset = offsetof(PyExecutableWithCall, vectorcall);
    if (PyType_Ready(&PyExecutable_Type) < 0 || PyType_Ready(&PyTracer_Type) < 0 || PyType_Ready(&PyGraph_Type) < 0)
        return -1;
    Py_INCREF(&PyExecutable_Type);
    if (PyModule_AddObject(module, "Executable", (PyObject *)&PyExecutable_Type) < 0) return -1;
    Py_INCREF(&PyGraph_Type);
    if (PyModule_AddObject(module, "Graph", (PyObject *)&PyGraph_Type) < 0) return -1;
    Py_INCREF(&PyTracer_Type);
    if (PyModule_AddObject(module, "Tracer", (PyObject *)&PyTracer_Type) < 0) return -1;
    if (PyModule_AddFunctions(module, pykiln_control_functions) < 0) return -1;
    if (PyModule_AddFunctions(module, pykiln_jvp_functions) < 0) return -1;
    if (PyModule_AddFunctions(module, pykiln_profile_functions) < 0) return -1;
    if (pykiln_profile_log_ready(module) < 0) return -1;
    if (PyModule_AddFunctions(module, pykiln_plan_sym_functions) < 0) return -1;
    if (PyModule_AddFunctions(module, pykiln_attention_functions) < 0) return -1;
    return PyModule_AddFunctions(module, pykiln_graph_functions);
}
