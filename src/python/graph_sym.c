/* Graphs with symbolic sizes for kiln.jit's dynamic entries (kiln/jit/dynamic.py): a recording made
 * symbolic from the capture's expressions (Graph.symbolize), optimized once (optimize_graph), and
 * per binding its concrete graph (Graph.instantiate), which compile_graph plans at level 0. The
 * capture's expressions are tuples: ("c", v), ("s", k), (op, a, b) with op + - * //. */
#include "pykiln.h"

#include "core/internal.h"
#include "ir/symbolic.h"
#include "kiln/passes.h"

/* A SymExpr's size d (in table src) copied into the graph's table t, symbol k of src being symbol k
 * of t; -1 with an exception. */
static int copy_sdim(const kiln_symtab *src, kiln_sdim d, kiln_symtab *t, kiln_sdim *out) {
    int32_t n = kiln_sym_count(src), have = kiln_sym_count(t);
    kiln_sdim *map = PyMem_Malloc(sizeof *map * (size_t)(n ? n : 1));
    if (!map) return PyErr_NoMemory(), -1;
    for (int32_t k = 0; k < n; k++) map[k] = k < have ? kiln_sym_get(t, k) : (kiln_sdim){-1, 0};
    kiln_status s = kiln_sym_subst(t, src, d, map, out);
    PyMem_Free(map);
    if (s != KILN_OK) return pykiln_raise(s), -1;
    return 0;
}

/* The size of a capture expression, or -1 with ValueError (an op the table has no form for:
 * %, floor division by a symbol or a constant <= 0). */
static int to_sdim(PyObject *e, kiln_symtab *t, int depth, kiln_sdim *out) {
    const kiln_symtab *src;
    kiln_sdim d;
    if (pykiln_symexpr_get(e, &src, &d)) return copy_sdim(src, d, t, out);
    if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) < 2 || !PyUnicode_Check(PyTuple_GET_ITEM(e, 0)) || depth > 64) {
        PyErr_SetString(PyExc_ValueError, "symbolize: not a size expression");
        return -1;
    }
    const char *tag = PyUnicode_AsUTF8(PyTuple_GET_ITEM(e, 0));
    if (!tag) return -1;
    if (strcmp(tag, "c") == 0 || strcmp(tag, "s") == 0) {
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(e, 1));
        if (v == -1 && PyErr_Occurred()) return -1;
        if (tag[0] == 'c') {
            *out = kiln_sdim_const(v);
            return 0;
        }
        if (v < 0 || v >= kiln_sym_count(t)) {
            PyErr_Format(PyExc_ValueError, "symbolize: no symbol s%lld", v);
            return -1;
        }
        *out = kiln_sym_get(t, (int32_t)v);
        return 0;
    }
    kiln_sdim a, b;
    if (PyTuple_GET_SIZE(e) != 3 || to_sdim(PyTuple_GET_ITEM(e, 1), t, depth + 1, &a) < 0 ||
        to_sdim(PyTuple_GET_ITEM(e, 2), t, depth + 1, &b) < 0)
        return PyErr_Occurred() ? -1 : (PyErr_SetString(PyExc_ValueError, "symbolize: not a size expression"), -1);
    kiln_status s;
    if (strcmp(tag, "+") == 0) {
        s = kiln_sym_add(t, a, b, out);
    } else if (strcmp(tag, "-") == 0) {
        s = kiln_sym_mul(t, b, kiln_sdim_const(-1), &b);
        if (s == KILN_OK) s = kiln_sym_add(t, a, b, out);
    } else if (strcmp(tag, "*") == 0) {
        s = kiln_sym_mul(t, a, b, out);
    } else if (strcmp(tag, "//") == 0 && b.e == 0 && b.v > 0) {
        s = kiln_sym_floordiv(t, a, b.v, out);
    } else {
        PyErr_Format(PyExc_ValueError, "symbolize: no symbolic form for '%s' here", tag);
        return -1;
    }
    if (s != KILN_OK) {
        pykiln_raise(s);
        return -1;
    }
    return 0;
}

/* symbolize(hints, input_sizes, sets) -> Graph: hints per symbol (each >= 2), input_sizes per graph
 * input a tuple of expressions, sets [(node, attr index, kind, value)]: kind 0 an expression, 1 a
 * dimension of the node's input 0, 2 the rest of a reshape (kiln_graph_symbolize). ValueError
 * when the recording does not hold for every binding as recorded. */
PyObject *pykiln_graph_symbolize(PyObject *self, PyObject *args) {
    const kiln_graph *g = pykiln_graph_of(self);
    PyObject *hints, *sizes, *sets;
    if (!g || !PyArg_ParseTuple(args, "O!O!O!:symbolize", &PyList_Type, &hints, &PyList_Type, &sizes, &PyList_Type,
                                &sets))
        return NULL;
    if (PyList_GET_SIZE(sizes) != g->ninputs)
        return PyErr_Format(PyExc_ValueError, "symbolize: %d input sizes expected", g->ninputs);
    Py_ssize_t nset = PyList_GET_SIZE(sets);
    kiln_sshape *in = PyMem_Calloc((size_t)(g->ninputs ? g->ninputs : 1), sizeof *in);
    kiln_attr_sym_set *st = PyMem_Calloc((size_t)(nset ? nset : 1), sizeof *st);
    kiln_symtab *t = NULL;
    PyObject *result = NULL;
    kiln_status s = in && st ? kiln_symtab_new(&t) : KILN_ERR_MEMORY;
    if (s != KILN_OK) {
        if (s == KILN_ERR_MEMORY && (!in || !st)) PyErr_NoMemory();
        else pykiln_raise(s);
        goto done;
    }
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(hints); k++) {
        long long h = PyLong_AsLongLong(PyList_GET_ITEM(hints, k));
        kiln_sdim unused;
        if (h == -1 && PyErr_Occurred()) goto done;
        if ((s = kiln_sym_new(t, 2, h, &unused)) != KILN_OK) {
            pykiln_raise(s);
            goto done;
        }
    }
    for (int32_t k = 0; k < g->ninputs; k++) {
        PyObject *row = PyList_GET_ITEM(sizes, k);
        if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) > KILN_MAX_DIMS) {
            PyErr_Format(PyExc_ValueError, "symbolize: input %d needs a tuple of sizes", k);
            goto done;
        }
        in[k].ndim = (int32_t)PyTuple_GET_SIZE(row);
        for (int d = 0; d < in[k].ndim; d++)
            if (to_sdim(PyTuple_GET_ITEM(row, d), t, 0, &in[k].d[d]) < 0) goto done;
    }
    for (Py_ssize_t k = 0; k < nset; k++) {
        PyObject *item = PyList_GET_ITEM(sets, k), *value;
        int node, index, kind;
        if (!PyArg_ParseTuple(item, "iiiO:symbolize set", &node, &index, &kind, &value)) goto done;
        st[k].node = node, st[k].index = index, st[k].kind = (kiln_attr_set_kind)kind;
        if (kind == KILN_ATTR_SET_VALUE) {
            if (to_sdim(value, t, 0, &st[k].value) < 0) goto done;
        } else {
            long long v = PyLong_AsLongLong(value);
            if (v == -1 && PyErr_Occurred()) goto done;
            st[k].value = kiln_sdim_const(v);
        }
    }
    kiln_graph *out = NULL;
    s = kiln_graph_symbolize(g, t, in, (int)nset, st, &out);
    t = NULL; /* taken */
    result = s == KILN_OK ? pykiln_wrap_graph(out) : pykiln_raise(s);
done:
    kiln_symtab_free(t);
    PyMem_Free(in);
    PyMem_Free(st);
    return result;
}

/* The binding `values` (a list of ints, one per symbol of g), into b; -1 with an exception. */
static int bindings(const kiln_graph *g, PyObject *values, int64_t *b) {
    int32_t n = g->syms ? kiln_sym_count(g->syms) : 0;
    if (!PyList_Check(values) || PyList_GET_SIZE(values) != n) {
        PyErr_Format(PyExc_ValueError, "expected a list of %d sizes, one per symbol", n);
        return -1;
    }
    for (int32_t k = 0; k < n; k++) {
        b[k] = PyLong_AsLongLong(PyList_GET_ITEM(values, k));
        if (b[k] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

/* instantiate(values) -> Graph: the concrete graph at symbol k = values[k] (ValueError when the
 * graph does not hold there). */
PyObject *pykiln_graph_instantiate(PyObject *self, PyObject *values) {
    const kiln_graph *g = pykiln_graph_of(self);
    if (!g) return NULL;
    int64_t *b = PyMem_Malloc(sizeof *b * (size_t)(g->syms && kiln_sym_count(g->syms) ? kiln_sym_count(g->syms) : 1));
    if (!b) return PyErr_NoMemory();
    kiln_graph *out = NULL;
    PyObject *result = NULL;
    if (bindings(g, values, b) == 0) {
        kiln_status s = kiln_graph_instantiate(g, b, &out);
        result = s == KILN_OK ? pykiln_wrap_graph(out) : pykiln_raise(s);
    }
    PyMem_Free(b);
    return result;
}

/* value_shape_at(value, values) -> the shape of %value at that binding */
PyObject *pykiln_graph_value_shape_at(PyObject *self, PyObject *args) {
    const kiln_graph *g = pykiln_graph_of(self);
    long v;
    PyObject *values;
    if (!g || !PyArg_ParseTuple(args, "lO:value_shape_at", &v, &values)) return NULL;
    if (v < 0 || v >= g->nvalues) return PyErr_Format(PyExc_IndexError, "value_shape_at: no value %ld", v);
    int64_t *b = PyMem_Malloc(sizeof *b * (size_t)(g->syms && kiln_sym_count(g->syms) ? kiln_sym_count(g->syms) : 1));
    if (!b) return PyErr_NoMemory();
    int64_t shape[KILN_MAX_DIMS];
    PyObject *result = NULL;
    if (bindings(g, values, b) == 0) {
        kiln_status s = kiln_graph_value_shape_at(g, (int32_t)v, b, shape);
        if (s != KILN_OK) {
            pykiln_raise(s);
        } else {
            int nd = g->values[v].meta.ndim;
            result = PyTuple_New(nd);
            for (int d = 0; result && d < nd; d++) PyTuple_SET_ITEM(result, d, PyLong_FromLongLong(shape[d]));
        }
    }
    PyMem_Free(b);
    return result;
}

/* One size as Python: an int when constant, else its expression's text ("s0*64", "(s0+1)//2"). */
static PyObject *size_object(const kiln_symtab *t, kiln_sdim d) {
    if (kiln_sdim_is_const(d)) return PyLong_FromLongLong(d.v);
    kiln_strbuf b = {0};
    kiln_sym_print(&b, t, d);
    PyObject *text = b.failed || !b.buf ? PyErr_NoMemory() : PyUnicode_FromStringAndSize(b.buf, (Py_ssize_t)b.len);
    free(b.buf);
    return text;
}

/* A tuple of n sizes, or None when every one is constant (new reference; NULL on error). */
static PyObject *sizes_tuple(const kiln_symtab *t, const kiln_sdim *d, int n) {
    bool symbolic = false;
    for (int k = 0; k < n; k++) symbolic |= !kiln_sdim_is_const(d[k]);
    if (!symbolic) return Py_NewRef(Py_None);
    PyObject *out = PyTuple_New(n);
    for (int k = 0; out && k < n; k++) {
        PyObject *o = size_object(t, d[k]);
        if (!o) Py_CLEAR(out);
        else PyTuple_SET_ITEM(out, k, o);
    }
    return out;
}

/* symbolic_sizes(path=()) -> ({value: sizes}, {node index: int attributes as sizes}) of the graph
 * (or the subgraph at path), for values and nodes with a symbolic size; sizes are ints and
 * expression texts over s0, s1, ... (kiln_sym_print: + - * and // by a constant). */
PyObject *pykiln_graph_symbolic_sizes(PyObject *self, PyObject *args) {
    const kiln_graph *g = pykiln_graph_of(self);
    PyObject *path = NULL;
    if (!g || !PyArg_ParseTuple(args, "|O!:symbolic_sizes", &PyTuple_Type, &path)) return NULL;
    for (Py_ssize_t k = 0; path && k < PyTuple_GET_SIZE(path); k++) {
        long idx = PyLong_AsLong(PyTuple_GET_ITEM(path, k));
        if (idx == -1 && PyErr_Occurred()) return NULL;
        if (idx < 0 || idx >= g->nsubgraphs)
            return PyErr_Format(PyExc_IndexError, "symbolic_sizes: subgraph %ld of a graph with %d", idx,
                                (int)g->nsubgraphs);
        g = g->subgraphs[idx];
    }
    PyObject *values = PyDict_New(), *attrs = PyDict_New();
    bool ok = values && attrs;
    for (int32_t v = 0; ok && g->syms && v < g->nvalues; v++) {
        kiln_sshape sh;
        kiln_graph_value_sshape(g, v, &sh);
        PyObject *sizes = sizes_tuple(g->syms, sh.d, sh.ndim), *key = sizes ? PyLong_FromLong(v) : NULL;
        ok = key && (sizes == Py_None || PyDict_SetItem(values, key, sizes) == 0);
        Py_XDECREF(sizes);
        Py_XDECREF(key);
    }
    for (int32_t i = 0; ok && g->syms && i < g->nnodes; i++) {
        const kiln_node *n = &g->nodes[i];
        if (!n->attr_sym || n->attrs.ni == 0) continue;
        kiln_sdim ai[KILN_MAX_ATTR_INTS];
        kiln_graph_attr_dims(n, ai);
        PyObject *sizes = sizes_tuple(g->syms, ai, n->attrs.ni), *key = sizes ? PyLong_FromLong(i) : NULL;
        ok = key && (sizes == Py_None || PyDict_SetItem(attrs, key, sizes) == 0);
        Py_XDECREF(sizes);
        Py_XDECREF(key);
    }
    if (!ok) {
        Py_XDECREF(values), Py_XDECREF(attrs);
        return NULL;
    }
    return Py_BuildValue("(NN)", values, attrs);
}

/* optimize_graph(graph, level=0, inference=False, disable_format_transform=False) -> Graph: a copy
 * run through the level's passes (symbolic sizes kept) */
PyObject *pykiln_optimize_graph(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"graph", "level", "inference", "disable_format_transform", NULL};
    PyObject *graph;
    int level = 0, inference = 0, no_format = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|ipp:optimize_graph", kwlist, &graph, &level, &inference,
                                     &no_format))
        return NULL;
    const kiln_graph *g = pykiln_graph_of(graph);
    if (!g) return NULL;
    if (level < KILN_LEVEL_O0 || level > KILN_LEVEL_O2)
        return PyErr_Format(PyExc_ValueError, "optimize_graph: level must be 0, 1 or 2");
    kiln_pass_options opt = {(kiln_jit_level)level, inference, no_format, KILN_CONV_FUSE_ALL, false};
    kiln_graph *c = NULL;
    kiln_status s = kiln_graph_clone(g, &c);
    if (s == KILN_OK) s = kiln_optimize(&c, &opt);
    if (s != KILN_OK) {
        kiln_graph_free(c);
        return pykiln_raise(s);
    }
    return pykiln_wrap_graph(c);
}
