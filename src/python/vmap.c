/* kiln._C's side of kiln.vmap: batch_graph (the graph transform of src/passes/vmap.c),
 * apply_graph (a graph's nodes applied one by one through kiln_apply: eagerly they run kernel by
 * kernel and autograd records them; under a trace they join the enclosing recording) and
 * batch_rules (each op's KILN_BATCH rule, for the tests). */
#include "kiln/passes.h"
#include "pykiln.h"

static int int_list(PyObject *seq, int32_t n, int32_t *out, const char *what) {
    PyObject *fast = PySequence_Fast(seq, what);
    if (!fast) return -1;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(PyExc_ValueError, "batch_graph: %s needs %d entries, got %zd", what, n, PySequence_Fast_GET_SIZE(fast));
        Py_DECREF(fast);
        return -1;
    }
    for (int32_t k = 0; k < n; k++) {
        PyObject *o = PySequence_Fast_GET_ITEM(fast, k);
        long v = o == Py_None ? -1 : PyLong_AsLong(o);
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        out[k] = (int32_t)v;
    }
    Py_DECREF(fast);
    return 0;
}

/* batch_graph(graph, batch, in_axes, out_axes) -> (Graph, [names of the ops run per example]);
 * an axis is an int >= 0 or None */
static PyObject *py_batch_graph(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *graph, *in_axes, *out_axes;
    long long batch;
    if (!PyArg_ParseTuple(args, "OLOO:batch_graph", &graph, &batch, &in_axes, &out_axes)) return NULL;
    const kiln_graph *g = pykiln_graph_of(graph);
    if (!g) return NULL;
    int32_t *ia = PyMem_Malloc(sizeof *ia * (size_t)(g->ninputs + 1));
    int32_t *oa = PyMem_Malloc(sizeof *oa * (size_t)(g->noutputs + 1));
    bool *fallback = PyMem_Calloc(KILN_OP_COUNT, sizeof *fallback);
    PyObject *result = NULL;
    kiln_graph *ng = NULL;
    if (!ia || !oa || !fallback) PyErr_NoMemory();
    else if (int_list(in_axes, g->ninputs, ia, "in_axes") == 0 && int_list(out_axes, g->noutputs, oa, "out_axes") == 0) {
        kiln_status s = kiln_graph_batch(g, batch, ia, oa, fallback, &ng);
        if (s != KILN_OK) pykiln_raise(s);
        else {
            PyObject *names = PyList_New(0);
            for (int op = 0; names && op < KILN_OP_COUNT; op++) {
                if (!fallback[op]) continue;
                PyObject *name = PyUnicode_FromString(kiln_op_table[op].name);
                if (!name || PyList_Append(names, name) < 0) Py_CLEAR(names);
                Py_XDECREF(name);
            }
            PyObject *wrapped = names ? pykiln_wrap_graph(ng) : NULL;
            if (!names) kiln_graph_free(ng);
            if (wrapped) result = Py_BuildValue("(NN)", wrapped, names);
            else Py_XDECREF(names);
        }
    }
    PyMem_Free(ia), PyMem_Free(oa), PyMem_Free(fallback);
    return result;
}

/* apply_graph(graph, inputs) -> list of the outputs: every node through kiln_apply, in order */
static PyObject *py_apply_graph(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *graph, *inputs;
    if (!PyArg_ParseTuple(args, "OO:apply_graph", &graph, &inputs)) return NULL;
    const kiln_graph *g = pykiln_graph_of(graph);
    if (!g) return NULL;
    PyObject *fast = PySequence_Fast(inputs, "apply_graph: inputs must be a sequence");
    if (!fast) return NULL;
    if (PySequence_Fast_GET_SIZE(fast) != g->ninputs) {
        PyErr_Format(PyExc_ValueError, "apply_graph: the graph takes %d inputs, got %zd", g->ninputs,
                     PySequence_Fast_GET_SIZE(fast));
        Py_DECREF(fast);
        return NULL;
    }
    kiln_tensor **slot = PyMem_Calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof *slot);
    if (!slot) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    kiln_status s = KILN_OK;
    for (int32_t k = 0; k < g->ninputs; k++) {
        PyObject *o = PySequence_Fast_GET_ITEM(fast, k);
        if (!pykiln_is_tensor(o)) {
            PyErr_Format(PyExc_TypeError, "apply_graph: input %d is not a Tensor", k);
            s = KILN_ERR_TYPE;
            break;
        }
        kiln_tensor *t = pykiln_unwrap(o);
        const kiln_meta *m = &g->values[g->inputs[k]].meta;
        bool same = t->meta.dtype == m->dtype && t->meta.ndim == m->ndim;
        for (int d = 0; same && d < m->ndim; d++) same = t->meta.shape[d] == m->shape[d];
        if (!same) {
            PyErr_Format(PyExc_ValueError, "apply_graph: input %d does not have the graph's dtype and shape", k);
            s = KILN_ERR_VALUE;
            break;
        }
        kiln_tensor_retain(t);
        slot[g->inputs[k]] = t;
    }
    Py_DECREF(fast);
    for (int32_t c = 0; c < g->ncaptures && s == KILN_OK; c++) {
        kiln_tensor *t = g->values[g->captures[c]].bound;
        kiln_tensor_retain(t);
        slot[g->captures[c]] = t;
    }
    kiln_tensor *small[16];
    for (int32_t i = 0; i < g->nnodes && s == KILN_OK; i++) {
        const kiln_node *n = &g->nodes[i];
        kiln_tensor **ins = n->nin <= 16 ? small : PyMem_Malloc(sizeof *ins * (size_t)n->nin);
        if (!ins) {
            PyErr_NoMemory();
            s = KILN_ERR_MEMORY;
            break;
        }
        for (int k = 0; k < n->nin; k++) ins[k] = slot[n->in[k]];
        kiln_tensor *outs[KILN_MAX_OUTPUTS] = {0};
        s = kiln_apply(n->op, n->nin, ins, &n->attrs, outs);
        if (ins != small) PyMem_Free(ins);
        if (s != KILN_OK) {
            if (n->loc >= 0) kiln_error_context(s, "%s (%s)", kiln_op_table[n->op].name, g->locs[n->loc]);
            pykiln_raise(s);
            break;
        }
        for (int k = 0; k < n->nout; k++) slot[n->out[k]] = outs[k];
    }
    PyObject *result = NULL;
    if (s == KILN_OK) {
        result = PyList_New(g->noutputs);
        for (int32_t k = 0; result && k < g->noutputs; k++) {
            kiln_tensor *t = slot[g->outputs[k]];
            kiln_tensor_retain(t);
            PyObject *o = pykiln_wrap(t);
            if (!o) Py_CLEAR(result);
            else PyList_SET_ITEM(result, k, o);
        }
    }
    for (int32_t v = 0; v < g->nvalues; v++) kiln_tensor_release(slot[v]);
    PyMem_Free(slot);
    return result;
}

/* batch_rules() -> {op name: its KILN_BATCH rule, "" when none} */
static PyObject *py_batch_rules(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *d = PyDict_New();
    for (int op = 0; d && op < KILN_OP_COUNT; op++) {
        PyObject *rule = PyUnicode_FromString(kiln_batch_rule_name((kiln_op)op));
        if (!rule || PyDict_SetItemString(d, kiln_op_table[op].name, rule) < 0) Py_CLEAR(d);
        Py_XDECREF(rule);
    }
    return d;
}

static PyMethodDef vmap_functions[] = {
    {"batch_graph", py_batch_graph, METH_VARARGS,
     "batch_graph(graph, batch, in_axes, out_axes) -> (batched Graph, [ops run once per example])"},
    {"apply_graph", py_apply_graph, METH_VARARGS, "apply_graph(graph, inputs) -> [outputs]: its nodes through the dispatcher"},
    {"batch_rules", py_batch_rules, METH_NOARGS, "batch_rules() -> {op: its KILN_BATCH rule ('' when none)}"},
    {NULL, NULL, 0, NULL},
};

int pykiln_vmap_init(PyObject *module) { return PyModule_AddFunctions(module, vmap_functions); }
