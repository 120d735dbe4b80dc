/* kiln._C.model_write and kiln._C.Model: model files (include/kiln/model.h) for trace.dump,
 * kiln.export and kiln.load. Arguments are borrowed; returned objects are new references. */
#include "pykiln.h"

/* The UTF-8 text of str o (borrowed), or NULL with an exception: a name in a model file is text
 * without NUL characters (a C string would end at the first), which the reader checks too. */
static const char *name_text(PyObject *o, const char *what, Py_ssize_t k) {
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s: name %zd is not a str", what, k);
        return NULL;
    }
    Py_ssize_t n;
    const char *text = PyUnicode_AsUTF8AndSize(o, &n);
    if (!text) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: name %zd (%R) is not UTF-8 text (it holds a lone surrogate)", what, k, o);
        return NULL;
    }
    if (strlen(text) != (size_t)n) {
        PyErr_Format(PyExc_ValueError, "%s: name %zd (%R) holds a NUL character", what, k, o);
        return NULL;
    }
    return text;
}

/* A list/tuple of str (or None: NULL) as a PyMem array of borrowed UTF-8 pointers. */
static int names_of(PyObject *seq, Py_ssize_t want, const char *what, const char ***out) {
    *out = NULL;
    if (seq == Py_None) return 0;
    if (!PyList_Check(seq) && !PyTuple_Check(seq)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of str or None", what);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n != want) {
        PyErr_Format(PyExc_ValueError, "%s: %zd names for %zd values", what, n, want);
        return -1;
    }
    const char **names = PyMem_Malloc(sizeof *names * (size_t)(n ? n : 1));
    if (!names) return PyErr_NoMemory(), -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *o = PySequence_Fast_GET_ITEM(seq, k);
        names[k] = name_text(o, what, k);
        if (!names[k]) {
            PyMem_Free(names);
            return -1;
        }
    }
    *out = names;
    return 0;
}

/* Folds what the inference rewrites fold in float32 (batch norm into weights, constants such as
 * rotary frequencies from a large theta, which float16 cannot hold), then stores float16. */
static kiln_status to_float16(kiln_graph **g, const kiln_pass_options *opt) {
    static const char *const before[] = {"dce", "fold_batch_norm", "cse", "constant_fold", "simplify", "dce"};
    for (size_t k = 0; k < sizeof before / sizeof before[0]; k++) KILN_TRY(kiln_run_pass(before[k], g, opt));
    kiln_graph *narrow = NULL;
    KILN_TRY(kiln_graph_to_float16(*g, &narrow));
    kiln_graph_free(*g);
    *g = narrow;
    return KILN_OK;
}

/* trace.dump's float16 options (float16: 1 enable_io16xc32, 2 enable_ioc16). A graph that computes
 * in 16-bit floats already (amp) keeps its dtypes: enable_io16xc32 makes its float32 inputs and
 * outputs float16; enable_ioc16 (every value float16) would round the values amp keeps float32 and
 * turn bfloat16 into float16, so it is refused. */
static kiln_status float16_storage(kiln_graph **g, const kiln_pass_options *opt, int float16) {
    if (!kiln_graph_computes_16bit(*g)) return to_float16(g, opt);
    if (float16 == 2)
        return kiln_error(KILN_ERR_VALUE, "trace.dump: enable_ioc16 stores every value as float16, but this graph "
                          "computes in 16-bit floats already (mixed precision: amp's bfloat16 or float16 products, "
                          "with the accumulations, norms and positions it keeps float32); use enable_io16xc32 "
                          "(float16 inputs and outputs, the graph's dtypes kept), or amp level O3 for 16-bit "
                          "values throughout");
    kiln_graph *io = NULL;
    KILN_TRY(kiln_graph_io_to_float16(*g, &io));
    kiln_graph_free(*g);
    *g = io;
    return KILN_OK;
}

/* graph_computes_16bit(graph) -> bool: whether a node of the graph makes a float16 or bfloat16
 * value (amp), which trace.dump's float16 options treat apart (float16_storage). */
static PyObject *py_graph_computes_16bit(PyObject *self, PyObject *graph) {
    (void)self;
    const kiln_graph *g = pykiln_graph_of(graph);
    if (!g) return NULL;
    return PyBool_FromLong(kiln_graph_computes_16bit(g));
}

/* The names trace.dump keeps (keep_param_name: param_names, {capture value id: name}, else None;
 * keep_var_name 1: the inputs' and outputs' names, 2: and generated ones for every node output;
 * keep_opr_name, keep_opr_priority: generated node names, the recorded order), set on the copy
 * of the recording before the rewrites, which carry them. */
static kiln_status name_graph(kiln_graph *g, PyObject *param_names, int keep_var, int keep_opr, int keep_priority,
                              const char **ins, const char **outs) {
    if (param_names != Py_None) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(param_names, &pos, &key, &value)) {
            long v = PyLong_AsLong(key);
            if (v == -1 && PyErr_Occurred()) return KILN_ERR_VALUE;
            const char *name = name_text(value, "trace.dump param_names", v);
            if (!name) return KILN_ERR_VALUE;
            if (v < 0 || v >= g->nvalues || g->values[v].kind != KILN_VALUE_CAPTURED) {
                PyErr_Format(PyExc_ValueError, "model_write: parameter name '%s' for value %ld, not a capture", name, v);
                return KILN_ERR_VALUE;
            }
            KILN_TRY(kiln_graph_set_value_name(g, (int32_t)v, name));
        }
    }
    for (int32_t k = 0; keep_var && k < g->ninputs; k++) KILN_TRY(kiln_graph_set_value_name(g, g->inputs[k], ins[k]));
    for (int32_t k = 0; keep_var && k < g->noutputs; k++)
        if (!kiln_graph_value_name(g, g->outputs[k])) KILN_TRY(kiln_graph_set_value_name(g, g->outputs[k], outs[k]));
    return kiln_graph_generate_names(g, keep_var >= 2, keep_opr, keep_priority);
}

/* model_write(graph, level, inference, disable_format_transform, conv_fusion, float16, input_names, output_names, metadata,
 *             user_info, cases, graph_name, param_names, keep_var_name, keep_opr_name, keep_opr_priority)
 *   -> (bytes, node count, parameter bytes, graph text)
 * Optimizes a copy of graph at the level (inference: the inference rewrites) and writes it with
 * the test cases (a list of tensors: per case the inputs, then the expected outputs) and the
 * names kept (name_graph); float16: 0, or 1 enable_io16xc32, 2 enable_ioc16 (float16_storage). */
static PyObject *py_model_write(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *graph, *in_names, *out_names, *cases, *param_names, *name_obj;
    int level, inference, no_format, fusion, float16, keep_var, keep_opr, keep_priority;
    const char *metadata, *user_info, *graph_name = NULL;
    if (!PyArg_ParseTuple(args, "OippiiOOzzO!OOipp:model_write", &graph, &level, &inference, &no_format, &fusion,
                          &float16, &in_names, &out_names, &metadata, &user_info, &PyList_Type, &cases, &name_obj,
                          &param_names, &keep_var, &keep_opr, &keep_priority))
        return NULL;
    if (name_obj != Py_None && !(graph_name = name_text(name_obj, "trace.dump graph_name", 0))) return NULL;
    if (param_names != Py_None && !PyDict_Check(param_names)) {
        PyErr_SetString(PyExc_TypeError, "model_write: param_names must be a dict or None");
        return NULL;
    }
    if (keep_var < 0 || keep_var > 2) {
        PyErr_Format(PyExc_ValueError, "trace.dump: keep_var_name must be 0, 1 or 2, got %d", keep_var);
        return NULL;
    }
    const kiln_graph *src = pykiln_graph_of(graph);
    if (!src) return NULL;
    if (level < KILN_LEVEL_O0 || level > KILN_LEVEL_O2 || fusion < KILN_CONV_FUSE_ALL || fusion > KILN_CONV_FUSE_BIAS_ACT) {
        PyErr_SetString(PyExc_ValueError, "model_write: level must be 0, 1 or 2 and conv_fusion 0, 1 or 2");
        return NULL;
    }
    Py_ssize_t per = src->ninputs + src->noutputs, ntensors = PyList_GET_SIZE(cases);
    if (per ? ntensors % per : ntensors) {
        PyErr_Format(PyExc_ValueError, "model_write: %zd test case tensors is not a multiple of %zd", ntensors, per);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < ntensors; k++)
        if (!pykiln_is_tensor(PyList_GET_ITEM(cases, k))) {
            PyErr_Format(PyExc_TypeError, "model_write: test case tensor %zd is not a Tensor", k);
            return NULL;
        }
    const char **ins = NULL, **outs = NULL;
    if (names_of(in_names, src->ninputs, "trace.dump arg_names", &ins) < 0) return NULL;
    if (names_of(out_names, src->noutputs, "trace.dump output_names", &outs) < 0) {
        PyMem_Free(ins);
        return NULL;
    }
    kiln_tensor **tensors = PyMem_Malloc(sizeof *tensors * (size_t)(ntensors ? ntensors : 1));
    kiln_graph *g = NULL;
    void *bytes = NULL;
    size_t size = 0;
    kiln_status s = tensors ? kiln_graph_clone(src, &g) : KILN_ERR_MEMORY;
    for (Py_ssize_t k = 0; tensors && k < ntensors; k++) tensors[k] = pykiln_unwrap(PyList_GET_ITEM(cases, k));
    kiln_pass_options popt = {(kiln_jit_level)level, inference, no_format, (kiln_conv_fusion)fusion, true};
    if (s == KILN_OK) s = name_graph(g, param_names, keep_var, keep_opr, keep_priority, ins, outs);
    if (s == KILN_OK) s = kiln_graph_base_name_locs(g); /* no user's directories in a shipped file */
    if (s == KILN_OK && float16) s = float16_storage(&g, &popt, float16);
    if (s == KILN_OK) s = kiln_optimize(&g, &popt);
    if (s == KILN_OK) {
        kiln_model_desc d = {g, ins, outs, metadata, user_info, per ? (int32_t)(ntensors / per) : 0, tensors,
                             graph_name};
        Py_BEGIN_ALLOW_THREADS
        s = kiln_model_write(&d, &bytes, &size);
        Py_END_ALLOW_THREADS
    }
    PyMem_Free(ins), PyMem_Free(outs), PyMem_Free(tensors);
    PyObject *result = NULL;
    if (s != KILN_OK && PyErr_Occurred()) {
        free(bytes);
        kiln_graph_free(g);
        return NULL;
    }
    if (s == KILN_OK) {
        /* what was written, read back: the file is checked, and its parameter bytes are those it holds */
        kiln_model *m = NULL;
        s = kiln_model_load_memory(bytes, size, &m);
        size_t params = m ? kiln_model_param_bytes(m) : 0;
        kiln_model_free(m);
        if (s != KILN_OK) {
            free(bytes);
            kiln_graph_free(g);
            return pykiln_raise(s);
        }
        char *text = kiln_graph_to_string(g);
        result = text ? Py_BuildValue("(y#inN)", (const char *)bytes, (Py_ssize_t)size, (int)g->nnodes,
                                      (Py_ssize_t)params, PyUnicode_FromString(text))
                      : PyErr_NoMemory();
        free(text);
    } else if (!PyErr_Occurred()) {
        pykiln_raise(s);
    }
    free(bytes);
    kiln_graph_free(g);
    return result;
}

/* ---- Model: a loaded file ------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    kiln_model *m;
} PyModel;

static PyTypeObject PyModel_Type;

/* Model(source): source is a path (str or os.PathLike: the file read into memory) or bytes-like (copied). */
static PyObject *model_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"source", "index", "name", NULL};
    PyObject *src;
    int index = 0;
    const char *name = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|iz:Model", kwlist, &src, &index, &name)) return NULL;
    if (index < 0) {
        PyErr_Format(PyExc_ValueError, "kiln.load: index must be 0 or more, got %d", index);
        return NULL;
    }
    kiln_model *m = NULL;
    kiln_status s;
    if (PyObject_CheckBuffer(src)) {
        Py_buffer view;
        if (PyObject_GetBuffer(src, &view, PyBUF_SIMPLE) < 0) return NULL;
        Py_BEGIN_ALLOW_THREADS
        s = kiln_model_load_memory_graph(view.buf, (size_t)view.len, index, name, &m);
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&view);
    } else {
        PyObject *path = NULL;
        if (!PyUnicode_FSConverter(src, &path)) return NULL;
        const char *p = PyBytes_AS_STRING(path);
        Py_BEGIN_ALLOW_THREADS
        s = kiln_model_load_graph(p, index, name, &m);
        Py_END_ALLOW_THREADS
        Py_DECREF(path);
    }
    if (s != KILN_OK) return pykiln_raise(s);
    PyModel *self = (PyModel *)type->tp_alloc(type, 0);
    if (!self) {
        kiln_model_free(m);
        return NULL;
    }
    self->m = m;
    return (PyObject *)self;
}

static void model_dealloc(PyObject *self) {
    kiln_model_free(((PyModel *)self)->m);
    Py_TYPE(self)->tp_free(self);
}

/* (name, dtype, shape) */
static PyObject *meta_tuple(const char *name, const kiln_meta *m) {
    PyObject *dt_shape = pykiln_meta_tuple(m);
    if (!dt_shape) return NULL;
    PyObject *o = Py_BuildValue("(sOO)", name, PyTuple_GET_ITEM(dt_shape, 0), PyTuple_GET_ITEM(dt_shape, 1));
    Py_DECREF(dt_shape);
    return o;
}

static PyObject *io_list(const kiln_model *m, bool inputs) {
    int32_t n = inputs ? kiln_model_num_inputs(m) : kiln_model_num_outputs(m);
    PyObject *list = PyList_New(n);
    for (int32_t k = 0; list && k < n; k++) {
        PyObject *item = inputs ? meta_tuple(kiln_model_input_name(m, k), kiln_model_input_meta(m, k))
                                : meta_tuple(kiln_model_output_name(m, k), kiln_model_output_meta(m, k));
        if (!item) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, k, item);
    }
    return list;
}

static PyObject *model_get_inputs(PyObject *self, void *c) {
    (void)c;
    return io_list(((PyModel *)self)->m, true);
}
static PyObject *model_get_outputs(PyObject *self, void *c) {
    (void)c;
    return io_list(((PyModel *)self)->m, false);
}
static PyObject *model_get_metadata(PyObject *self, void *c) {
    (void)c;
    return PyUnicode_FromString(kiln_model_metadata(((PyModel *)self)->m));
}
static PyObject *model_get_user_info(PyObject *self, void *c) {
    (void)c;
    return PyUnicode_FromString(kiln_model_user_info(((PyModel *)self)->m));
}
static PyObject *model_get_producer(PyObject *self, void *c) {
    (void)c;
    return PyUnicode_FromString(kiln_model_producer(((PyModel *)self)->m));
}
static PyObject *model_get_param_bytes(PyObject *self, void *c) {
    (void)c;
    return PyLong_FromSize_t(kiln_model_param_bytes(((PyModel *)self)->m));
}
static PyObject *model_get_num_nodes(PyObject *self, void *c) {
    (void)c;
    return PyLong_FromLong(kiln_model_graph(((PyModel *)self)->m)->nnodes);
}

static PyObject *wrap_borrowed(kiln_tensor *t) {
    kiln_tensor_retain(t);
    return pykiln_wrap(t);
}

/* cases() -> [(inputs tuple, expected outputs tuple)] (read-only tensors viewing the file) */
static PyObject *model_cases(PyObject *self, PyObject *unused) {
    (void)unused;
    const kiln_model *m = ((PyModel *)self)->m;
    int32_t nc = kiln_model_num_cases(m), ni = kiln_model_num_inputs(m), no = kiln_model_num_outputs(m);
    PyObject *list = PyList_New(nc);
    for (int32_t c = 0; list && c < nc; c++) {
        PyObject *ins = PyTuple_New(ni), *outs = PyTuple_New(no);
        bool ok = ins && outs;
        for (int32_t k = 0; ok && k < ni; k++) {
            PyObject *t = wrap_borrowed(kiln_model_case_input(m, c, k));
            ok = t != NULL;
            if (ok) PyTuple_SET_ITEM(ins, k, t);
        }
        for (int32_t k = 0; ok && k < no; k++) {
            PyObject *t = wrap_borrowed(kiln_model_case_output(m, c, k));
            ok = t != NULL;
            if (ok) PyTuple_SET_ITEM(outs, k, t);
        }
        if (!ok) {
            Py_XDECREF(ins), Py_XDECREF(outs), Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, c, Py_BuildValue("(NN)", ins, outs));
    }
    return list;
}

/* compile(options=None) -> Executable of the model's graph, optimized further at options' level
 * (options: a CompileOptions; None: the defaults) */
static PyObject *model_compile(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"options", NULL};
    PyObject *options = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|O:compile", kwlist, &options)) return NULL;
    const pykiln_compile_options *opt = pykiln_compile_options_of(options, "compile");
    if (!opt) return NULL;
    kiln_graph *g = NULL;
    kiln_status s = kiln_graph_clone(kiln_model_graph(((PyModel *)self)->m), &g);
    if (s == KILN_OK) s = kiln_optimize(&g, &opt->passes);
    if (s != KILN_OK) {
        kiln_graph_free(g);
        return pykiln_raise(s);
    }
    PyObject *e = pykiln_executable_new(g, &opt->compile);
    kiln_graph_free(g);
    return e;
}

static PyObject *model_graph_str(PyObject *self, PyObject *unused) {
    (void)unused;
    char *text = kiln_graph_to_string(kiln_model_graph(((PyModel *)self)->m));
    if (!text) return PyErr_NoMemory();
    PyObject *o = PyUnicode_FromString(text);
    free(text);
    return o;
}

/* names() -> ([(value id, is a capture, name)], [(node, name)], [priority per node] or []) */
static PyObject *model_names(PyObject *self, PyObject *unused) {
    (void)unused;
    const kiln_graph *g = kiln_model_graph(((PyModel *)self)->m);
    PyObject *values = PyList_New(0), *nodes = PyList_New(0), *prios = PyList_New(0);
    bool ok = values && nodes && prios, any = false;
    for (int32_t v = 0; ok && v < g->nvalues; v++) {
        const char *name = kiln_graph_value_name(g, v);
        if (!name) continue;
        PyObject *item = Py_BuildValue("(iNs)", (int)v, PyBool_FromLong(g->values[v].kind == KILN_VALUE_CAPTURED), name);
        ok = item && PyList_Append(values, item) == 0;
        Py_XDECREF(item);
    }
    for (int32_t i = 0; ok && i < g->nnodes; i++) {
        const char *name = kiln_graph_node_name(g, i);
        any |= kiln_graph_node_priority(g, i) != 0;
        if (!name) continue;
        PyObject *item = Py_BuildValue("(is)", (int)i, name);
        ok = item && PyList_Append(nodes, item) == 0;
        Py_XDECREF(item);
    }
    for (int32_t i = 0; ok && any && i < g->nnodes; i++) {
        PyObject *p = PyLong_FromLong(kiln_graph_node_priority(g, i));
        ok = p && PyList_Append(prios, p) == 0;
        Py_XDECREF(p);
    }
    if (!ok) {
        Py_XDECREF(values), Py_XDECREF(nodes), Py_XDECREF(prios);
        return NULL;
    }
    return Py_BuildValue("(NNN)", values, nodes, prios);
}

static PyObject *model_get_graph_names(PyObject *self, void *closure) {
    (void)closure;
    const kiln_model *m = ((PyModel *)self)->m;
    PyObject *list = PyList_New(kiln_model_num_graphs(m));
    for (int32_t k = 0; list && k < kiln_model_num_graphs(m); k++) {
        PyObject *name = PyUnicode_FromString(kiln_model_graph_name(m, k));
        if (!name) Py_CLEAR(list);
        else PyList_SET_ITEM(list, k, name);
    }
    return list;
}

static PyObject *model_get_name(PyObject *self, void *closure) {
    (void)closure;
    return PyUnicode_FromString(kiln_model_name(((PyModel *)self)->m));
}

static PyObject *model_get_index(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(kiln_model_index(((PyModel *)self)->m));
}

static PyObject *model_get_version(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(kiln_model_version(((PyModel *)self)->m));
}

static PyMethodDef model_methods[] = {
    {"names", model_names, METH_NOARGS,
     "([(value id, is a capture, name)], [(node, name)], [priority per node] or []): the names the file keeps"},
    {"cases", model_cases, METH_NOARGS, "[(inputs, expected outputs)] of the embedded test cases"},
    {"compile", (PyCFunction)(void (*)(void))model_compile, METH_VARARGS | METH_KEYWORDS,
     "compile(options=None) -> Executable of the model's graph (options: a CompileOptions)"},
    {"graph_str", model_graph_str, METH_NOARGS, "the graph in text form"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef model_getset[] = {
    {"inputs", model_get_inputs, NULL, "[(name, dtype, shape)] of the inputs", NULL},
    {"outputs", model_get_outputs, NULL, "[(name, dtype, shape)] of the outputs", NULL},
    {"metadata", model_get_metadata, NULL, "the metadata text", NULL},
    {"user_info", model_get_user_info, NULL, "the user info text", NULL},
    {"producer", model_get_producer, NULL, "what wrote the file", NULL},
    {"param_bytes", model_get_param_bytes, NULL, "bytes of the parameters", NULL},
    {"num_nodes", model_get_num_nodes, NULL, "nodes of the graph", NULL},
    {"name", model_get_name, NULL, "this graph's name in its file", NULL},
    {"index", model_get_index, NULL, "this graph's position in its file", NULL},
    {"graph_names", model_get_graph_names, NULL, "the names of the file's graphs, in order", NULL},
    {"version", model_get_version, NULL, "the file's format version", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PyModel_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.Model",
    .tp_basicsize = sizeof(PyModel),
    .tp_dealloc = model_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Model(path or bytes, index=0, name=None): one graph of a kiln model file",
    .tp_methods = model_methods,
    .tp_getset = model_getset,
    .tp_new = model_new,
};

static PyMethodDef model_functions[] = {
    {"model_write", py_model_write, METH_VARARGS,
     "model_write(graph, level, inference, disable_format_transform, conv_fusion, float16, input_names, output_names, metadata, "
     "user_info, cases, graph_name, param_names, keep_var_name, keep_opr_name, keep_opr_priority) -> (bytes, nodes, "
     "parameter bytes, graph text)"},
    {"graph_computes_16bit", py_graph_computes_16bit, METH_O,
     "graph_computes_16bit(graph) -> whether a node makes a float16 or bfloat16 value (amp)"},
    {NULL, NULL, 0, NULL},
};

int pykiln_model_init(PyObject *module) {
    if (PyType_Ready(&PyModel_Type) < 0) return -1;
    Py_INCREF(&PyModel_Type);
    if (PyModule_AddObject(module, "Model", (PyObject *)&PyModel_Type) < 0) return -1;
    return PyModule_AddFunctions(module, model_functions);
}
