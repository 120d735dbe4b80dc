/* What kiln._C.Executable says about itself for people: its memory plan at the busiest step
 * (memory_report) and its graph as Graphviz DOT (graph_dot). */
#include "pykiln.h"

#include "runtime/backend.h"

static PyObject *meta_tuple(const kiln_meta *m) {
    PyObject *shape = PyTuple_New(m->ndim);
    for (int d = 0; shape && d < m->ndim; d++) PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(m->shape[d]));
    return shape;
}

PyObject *pykiln_executable_memory(const kiln_executable *e) {
    const kiln_plan *p = kiln_executable_plan(e);
    const kiln_graph *g = p->g;
    kiln_plan_peak peak;
    kiln_status s = kiln_plan_peak_find(p, &peak);
    if (s != KILN_OK) return pykiln_raise(s);
    PyObject *buffers = PyList_New(0);
    for (int32_t k = 0; buffers && k < peak.nvalues; k++) {
        int32_t v = peak.values[k], node = peak.producer[v];
        const kiln_node *nd = node >= 0 ? &g->nodes[node] : NULL;
        PyObject *shape = meta_tuple(&g->values[v].meta);
        PyObject *b = shape ? Py_BuildValue("{s:n,s:i,s:L,s:s,s:O,s:s,s:z}", "bytes",
                                            (Py_ssize_t)kiln_plan_value_bytes(p, v), "value", (int)v, "offset",
                                            (long long)p->offset[v], "dtype", kiln_dtype_name(g->values[v].meta.dtype),
                                            "shape", shape, "op", nd ? kiln_op_table[nd->op].name : "?", "loc",
                                            nd && nd->loc >= 0 ? g->locs[nd->loc] : NULL)
                            : NULL;
        Py_XDECREF(shape);
        if (!b || PyList_Append(buffers, b) < 0) Py_CLEAR(buffers);
        Py_XDECREF(b);
    }
    PyObject *out = buffers ? Py_BuildValue("{s:n,s:n,s:i,s:i,s:n,s:O}", "arena_bytes", (Py_ssize_t)p->arena_bytes,
                                            "output_bytes", (Py_ssize_t)p->output_bytes, "peak_step", (int)peak.step,
                                            "steps", (int)p->norder, "live_bytes", (Py_ssize_t)peak.live_bytes,
                                            "buffers", buffers)
                            : NULL;
    Py_XDECREF(buffers);
    kiln_plan_peak_free(&peak);
    return out;
}

PyObject *pykiln_executable_dot(const kiln_executable *e) {
    char *text = kiln_graph_to_dot(kiln_executable_plan(e)->g);
    if (!text) return pykiln_raise(KILN_ERR_MEMORY);
    PyObject *o = PyUnicode_FromString(text);
    free(text);
    return o;
}
