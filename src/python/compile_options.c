/* kiln._C.CompileOptions: the options of one compile of a graph, defined here once (fields,
 * defaults, validation) and mirrored by one C struct (pykiln_compile_options) that every compiling
 * entry of the extension (Tracer.finish, compile_graph, plan_symbolic, Model.compile) reads. A
 * CompileOptions is immutable; replace(**changes) gives a copy with fields changed.
 *
 *   CompileOptions(order="bfs", poison=False, level=0, inference=False,
 *                  disable_format_transform=False, backend="kbk", sublinear=None)
 *
 * order: "bfs" or "dfs"; level: 0-2 (O0-O2); backend: a registered backend's name
 * (kiln._C.backend_names(); an unknown one is a ValueError listing them); sublinear: None or the
 * sublinear-memory search's five ints. */
#include "pykiln.h"

#include "runtime/backend.h"

typedef struct {
    PyObject_HEAD
    pykiln_compile_options c; /* c.sublinear: owned */
} PyCompileOptions;

static PyTypeObject PyCompileOptions_Type;
static PyObject *default_options; /* CompileOptions(): what None stands for */

static char *fields[] = {"order", "poison", "level", "inference", "disable_format_transform", "backend", "sublinear",
                         NULL};

static int options_init(PyObject *self, PyObject *args, PyObject *kwargs) {
    const char *order = "bfs", *backend = "kbk";
    int poison = 0, level = 0, inference = 0, no_format = 0;
    PyObject *sublinear = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$spippsO:CompileOptions", fields, &order, &poison, &level,
                                     &inference, &no_format, &backend, &sublinear))
        return -1;
    if (strcmp(order, "bfs") != 0 && strcmp(order, "dfs") != 0) {
        PyErr_Format(PyExc_ValueError, "CompileOptions: order must be 'bfs' or 'dfs', got '%s'", order);
        return -1;
    }
    if (level < KILN_LEVEL_O0 || level > KILN_LEVEL_O2) {
        PyErr_Format(PyExc_ValueError, "CompileOptions: level must be 0, 1 or 2, got %d", level);
        return -1;
    }
    const kiln_backend *be = kiln_backend_find(backend);
    if (!be) {
        kiln_error_context(KILN_ERR_VALUE, "CompileOptions");
        pykiln_raise(KILN_ERR_VALUE);
        return -1;
    }
    if (sublinear != Py_None && !PyTuple_Check(sublinear)) {
        PyErr_SetString(PyExc_TypeError, "CompileOptions: sublinear must be None or a tuple of five ints");
        return -1;
    }
    pykiln_compile_options *c = &((PyCompileOptions *)self)->c;
    c->compile = (kiln_compile_options){strcmp(order, "dfs") == 0 ? KILN_ORDER_DFS : KILN_ORDER_BFS, poison, be->name};
    c->passes = (kiln_pass_options){(kiln_jit_level)level, inference, no_format, KILN_CONV_FUSE_ALL, false};
    Py_INCREF(sublinear);
    Py_XSETREF(c->sublinear, sublinear);
    return 0;
}

static void options_dealloc(PyObject *self) {
    Py_XDECREF(((PyCompileOptions *)self)->c.sublinear);
    Py_TYPE(self)->tp_free(self);
}

const pykiln_compile_options *pykiln_compile_options_of(PyObject *o, const char *who) {
    if (o == Py_None) o = default_options;
    if (!PyObject_TypeCheck(o, &PyCompileOptions_Type)) {
        PyErr_Format(PyExc_TypeError, "%s: options must be a kiln._C.CompileOptions or None, got %.80s", who,
                     Py_TYPE(o)->tp_name);
        return NULL;
    }
    return &((PyCompileOptions *)o)->c;
}

/* The fields as keyword arguments of the constructor (a new dict). */
static PyObject *as_dict(PyObject *self) {
    const pykiln_compile_options *c = &((PyCompileOptions *)self)->c;
    return Py_BuildValue("{s:s,s:O,s:i,s:O,s:O,s:s,s:O}", "order", c->compile.order == KILN_ORDER_DFS ? "dfs" : "bfs",
                         "poison", c->compile.poison_freed ? Py_True : Py_False, "level", (int)c->passes.level,
                         "inference", c->passes.inference ? Py_True : Py_False, "disable_format_transform",
                         c->passes.disable_format_transform ? Py_True : Py_False, "backend", c->compile.backend,
                         "sublinear", c->sublinear);
}

static PyObject *options_replace(PyObject *self, PyObject *args, PyObject *kwargs) {
    if (PyTuple_GET_SIZE(args) != 0) return PyErr_Format(PyExc_TypeError, "replace: takes keyword arguments only");
    PyObject *all = as_dict(self), *empty = PyTuple_New(0), *made = NULL;
    if (all && empty && (!kwargs || PyDict_Update(all, kwargs) == 0))
        made = PyObject_Call((PyObject *)&PyCompileOptions_Type, empty, all);
    Py_XDECREF(all);
    Py_XDECREF(empty);
    return made;
}

static PyObject *options_get(PyObject *self, void *field) {
    PyObject *all = as_dict(self);
    if (!all) return NULL;
    PyObject *v = PyDict_GetItemString(all, (const char *)field);
    Py_XINCREF(v);
    Py_DECREF(all);
    return v;
}

static PyObject *options_repr(PyObject *self) {
    PyObject *all = as_dict(self);
    if (!all) return NULL;
    PyObject *r = PyUnicode_FromFormat(
        "CompileOptions(order=%R, poison=%R, level=%R, inference=%R, disable_format_transform=%R, backend=%R, "
        "sublinear=%R)",
        PyDict_GetItemString(all, "order"), PyDict_GetItemString(all, "poison"), PyDict_GetItemString(all, "level"),
        PyDict_GetItemString(all, "inference"), PyDict_GetItemString(all, "disable_format_transform"),
        PyDict_GetItemString(all, "backend"), PyDict_GetItemString(all, "sublinear"));
    Py_DECREF(all);
    return r;
}

static PyObject *options_richcompare(PyObject *a, PyObject *b, int op) {
    if (!PyObject_TypeCheck(b, &PyCompileOptions_Type) || (op != Py_EQ && op != Py_NE)) Py_RETURN_NOTIMPLEMENTED;
    PyObject *da = as_dict(a), *db = as_dict(b);
    PyObject *r = da && db ? PyObject_RichCompare(da, db, op) : NULL;
    Py_XDECREF(da);
    Py_XDECREF(db);
    return r;
}

static PyGetSetDef options_getset[] = {
    {"order", options_get, NULL, "'bfs' or 'dfs': the plan's node order", "order"},
    {"poison", options_get, NULL, "debug: fill buffers with NaN after their last use", "poison"},
    {"level", options_get, NULL, "the pass pipeline's level, 0-2 (O0-O2)", "level"},
    {"inference", options_get, NULL, "forward-only graph: inference rewrites allowed", "inference"},
    {"disable_format_transform", options_get, NULL, "no channels-last rewrite", "disable_format_transform"},
    {"backend", options_get, NULL, "the registered backend that runs the graph", "backend"},
    {"sublinear", options_get, NULL, "None or the sublinear-memory search's five ints", "sublinear"},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef options_methods[] = {
    {"replace", (PyCFunction)(void (*)(void))options_replace, METH_VARARGS | METH_KEYWORDS,
     "replace(**changes) -> a copy with these fields changed (validated as the constructor does)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PyCompileOptions_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.CompileOptions",
    .tp_basicsize = sizeof(PyCompileOptions),
    .tp_dealloc = options_dealloc,
    .tp_repr = options_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "CompileOptions(order='bfs', poison=False, level=0, inference=False, disable_format_transform=False, "
              "backend='kbk', sublinear=None): the options of one compile of a graph",
    .tp_richcompare = options_richcompare,
    .tp_methods = options_methods,
    .tp_getset = options_getset,
    .tp_init = options_init,
    .tp_new = PyType_GenericNew,
};

/* backend_names() -> the registered backends' names, in registration order (the first is the default). */
static PyObject *py_backend_names(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    int n = kiln_backend_count();
    PyObject *t = PyTuple_New(n);
    for (int k = 0; t && k < n; k++) {
        PyObject *s = PyUnicode_FromString(kiln_backend_name_at(k));
        if (!s) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, k, s);
    }
    return t;
}

static PyMethodDef functions[] = {
    {"backend_names", py_backend_names, METH_NOARGS, "backend_names() -> the registered backends' names"},
    {NULL, NULL, 0, NULL},
};

int pykiln_compile_options_init(PyObject *module) {
    if (PyType_Ready(&PyCompileOptions_Type) < 0) return -1;
    default_options = PyObject_CallNoArgs((PyObject *)&PyCompileOptions_Type);
    if (!default_options || PyModule_AddFunctions(module, functions) < 0) return -1;
    Py_INCREF(&PyCompileOptions_Type);
    return PyModule_AddObject(module, "CompileOptions", (PyObject *)&PyCompileOptions_Type);
}
