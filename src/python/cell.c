/* kiln._C.CellBase: the per-call and per-write machinery of kiln.nn.Cell (MindSpore's nn.Cell),
 * which the Python class builds on:
 *   - calling a cell runs its construct: compiled instead when set_jit_config gave it a jitted
 *     function or set_context(mode=GRAPH_MODE) is on (Cell._graph_mode_jit makes that one), and
 *     logged while kiln.jit captures (the capture guards on the training mode of every Cell it
 *     saw);
 *   - assigning a Parameter or a Cell registers it (in the instance's _params / _cells, in
 *     assignment order; an unnamed Parameter is named after the attribute, and a sub-cell's
 *     auto-named parameters get the attribute as prefix); assigning anything else over a
 *     registered name is an error unless it is None, which unregisters it;
 *   - every attribute write or delete bumps the cell's state version `_kiln_version` (compiled
 *     graphs guard on it) and, while a capture runs, is logged with the writer's file:line (a
 *     Python side effect the compiled graph would skip).
 * The logs are the thread's own, like the capture (its tracer) that sets them (set_cell_logs):
 * two threads capturing at once each log their own Cells.
 * Reference notes: the logs and the registered types are owned here. */
#include "pykiln.h"

#include <frameobject.h>

static _Thread_local PyObject *call_log, *write_log; /* lists while this thread captures; else NULL */
static PyObject *parameter_type;       /* kiln.nn.Parameter */
static PyObject *context;              /* kiln.context._context: its "mode" 0 is GRAPH_MODE */
static PyObject *recompute_eager;      /* kiln.recompute's eager call, for Cell.recompute() (cell_setup) */
static PyObject *hooks_before, *hooks_after; /* kiln.nn.cell's forward-hook runners (cell_set_hook_runners) */
static PyObject *s_params, *s_cells, *s_jitted, *s_graph_mode_jit, *s_construct, *s_auto_prefix, *s_name,
    *s_auto_name, *s_version, *s_mode, *s_parameters_and_names, *s_recompute, *s_amp, *s_hooks;

static PyTypeObject PyCellBase_Type;

/* The instance __dict__ (new reference). */
static PyObject *dict_of(PyObject *self) {
    PyObject *d = PyObject_GenericGetDict(self, NULL);
    return d;
}

static int graph_mode(void) {
    PyObject *mode = context ? PyDict_GetItemWithError(context, s_mode) : NULL;
    if (!mode) return PyErr_Occurred() ? -1 : 0;
    return PyLong_CheckExact(mode) && PyLong_AsLong(mode) == 0;
}

static PyObject *cell_call_as_set(PyObject *self, PyObject *args, PyObject *kwargs, PyObject *jitted, bool hooked);

/* The cell's mixed precision (auto_mixed_precision, to_float: `_amp` = (level, dtype)) is the
 * thread's while it runs: its ops cast their inputs at dispatch, and a compiled call is keyed by it. */
static PyObject *cell_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    if (call_log && PyList_Append(call_log, self) < 0) return NULL;
    PyObject *d = dict_of(self), *jitted = NULL;
    if (!d) return NULL;
    jitted = PyDict_GetItemWithError(d, s_jitted); /* set_jit_config: run compiled (inside a capture, record) */
    Py_XINCREF(jitted);
    PyObject *amp = jitted || !PyErr_Occurred() ? PyDict_GetItemWithError(d, s_amp) : NULL;
    /* forward hooks (register_forward_pre_hook / register_forward_hook) run around construct */
    PyObject *hooks = PyErr_Occurred() ? NULL : PyDict_GetItemWithError(d, s_hooks);
    bool hooked = hooks && hooks != Py_None && hooks_before;
    Py_DECREF(d);
    if (PyErr_Occurred()) {
        Py_XDECREF(jitted);
        return NULL;
    }
    if (!amp || amp == Py_None) return cell_call_as_set(self, args, kwargs, jitted, hooked);
    int level;
    PyObject *dtype;
    kiln_dtype low;
    kiln_amp_level prev;
    kiln_dtype prev_low;
    if (!PyArg_ParseTuple(amp, "iO:Cell._amp", &level, &dtype) || pykiln_parse_dtype(dtype, &low) < 0) {
        Py_XDECREF(jitted);
        return NULL;
    }
    kiln_status st = kiln_amp_set((kiln_amp_level)level, low, &prev, &prev_low);
    if (st != KILN_OK) {
        Py_XDECREF(jitted);
        return pykiln_raise(st);
    }
    PyObject *out = cell_call_as_set(self, args, kwargs, jitted, hooked);
    kiln_amp_set(prev, prev_low, NULL, NULL);
    return out;
}

/* cell_call with the amp setting made; takes the reference to jitted; hooked: the cell has forward hooks */
static PyObject *cell_call_as_set(PyObject *self, PyObject *args, PyObject *kwargs, PyObject *jitted, bool hooked) {
    if (!call_log) {
        int graph = jitted ? 0 : graph_mode();
        if (graph < 0) return NULL;
        if (graph) jitted = PyObject_CallMethodNoArgs(self, s_graph_mode_jit);
        if (graph && !jitted) return NULL;
        if (jitted) {
            PyObject *out = PyObject_Call(jitted, args, kwargs);
            Py_DECREF(jitted);
            return out;
        }
    }
    Py_XDECREF(jitted);
    /* Cell.recompute(): the ops recorded while construct runs are recomputed for the backward;
     * eagerly, construct runs through recompute_eager (kiln.recompute's eager path) */
    kiln_tracer *tr = kiln_tracer_active();
    int marked = 0;
    if (tr || recompute_eager) {
        PyObject *flag = PyObject_GetAttr(self, s_recompute);
        marked = flag ? PyObject_IsTrue(flag) : -1;
        Py_XDECREF(flag);
        if (marked < 0) return NULL;
    }
    /* (a jitted cell's hooks run in its compiled function's target instead: kiln.jit.function) */
    PyObject *hooked_args = hooked ? PyObject_CallFunctionObjArgs(hooks_before, self, args, NULL) : Py_NewRef(args);
    if (!hooked_args) return NULL;
    int32_t was = marked && tr ? kiln_tracer_begin_recompute(tr) : 0;
    PyObject *construct = PyObject_GetAttr(self, s_construct);
    PyObject *out = NULL;
    if (construct && marked && !tr)
        out = PyObject_CallFunctionObjArgs(recompute_eager, construct, hooked_args, kwargs ? kwargs : Py_None, NULL);
    else if (construct)
        out = PyObject_Call(construct, hooked_args, kwargs);
    Py_XDECREF(construct);
    if (marked && tr) kiln_tracer_end_recompute(tr, was);
    if (out && hooked) Py_SETREF(out, PyObject_CallFunctionObjArgs(hooks_after, self, hooked_args, out, NULL));
    Py_DECREF(hooked_args);
    return out;
}

/* Bumps the state version after a write of attribute name, and logs the write (with the file
 * and line of the Python code that made it) while a capture runs. */
static int touch(PyObject *self, PyObject *name) {
    PyObject *d = dict_of(self);
    if (!d) return -1;
    PyObject *old = PyDict_GetItemWithError(d, s_version);
    long long version = old ? PyLong_AsLongLong(old) : 0;
    PyObject *next = (version == -1 && PyErr_Occurred()) || (!old && PyErr_Occurred())
                         ? NULL
                         : PyLong_FromLongLong(version + 1);
    int rc = next ? PyDict_SetItem(d, s_version, next) : -1;
    Py_XDECREF(next);
    Py_DECREF(d);
    if (rc < 0 || !write_log) return rc;
    PyFrameObject *frame = PyEval_GetFrame(); /* the Python code that assigned (borrowed) */
    PyCodeObject *code = frame ? PyFrame_GetCode(frame) : NULL;
    PyObject *where = code ? PyUnicode_FromFormat("%U:%d", code->co_filename, PyFrame_GetLineNumber(frame))
                           : PyUnicode_FromString("<unknown>:0");
    PyObject *entry = where ? PyTuple_Pack(3, self, name, where) : NULL;
    rc = entry ? PyList_Append(write_log, entry) : -1;
    Py_XDECREF(code);
    Py_XDECREF(where);
    Py_XDECREF(entry);
    return rc;
}

/* The instance's _params and _cells (new references), or an AttributeError naming the attribute
 * assigned before Cell.__init__ ran. */
static int registries(PyObject *self, PyObject *name, PyObject **params, PyObject **cells) {
    PyObject *d = dict_of(self);
    if (!d) return -1;
    *params = PyDict_GetItemWithError(d, s_params);
    *cells = *params ? PyDict_GetItemWithError(d, s_cells) : NULL;
    Py_XINCREF(*params);
    Py_XINCREF(*cells);
    Py_DECREF(d);
    if (*params && *cells) return 0;
    Py_CLEAR(*params);
    if (!PyErr_Occurred())
        PyErr_Format(PyExc_AttributeError, "cannot assign %R before %s.__init__() calls super().__init__()", name,
                     _PyType_Name(Py_TYPE(self)));
    return -1;
}

/* d.pop(key, None) for a mapping. */
static int discard(PyObject *d, PyObject *key) {
    PyObject *r = PyObject_CallMethod(d, "pop", "OO", key, Py_None);
    Py_XDECREF(r);
    return r ? 0 : -1;
}

/* Whether a parameter is named by the cell that registers it: it has no name, or its name was
 * given that way (p.name is None or p._auto_name); -1 on error. */
static int auto_named(PyObject *p) {
    PyObject *pname = PyObject_GetAttr(p, s_name);
    if (!pname) return -1;
    int unnamed = pname == Py_None;
    Py_DECREF(pname);
    if (unnamed) return 1;
    PyObject *flag = PyObject_GetAttr(p, s_auto_name);
    if (!flag) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        return 0;
    }
    int yes = PyObject_IsTrue(flag);
    Py_DECREF(flag);
    return yes;
}

/* Names a sub-cell's auto-named parameters `name.path` (the attribute as prefix). */
static int prefix_parameters(PyObject *value, PyObject *name) {
    PyObject *pairs = PyObject_CallMethodNoArgs(value, s_parameters_and_names);
    PyObject *it = pairs ? PyObject_GetIter(pairs) : NULL, *pair;
    Py_XDECREF(pairs);
    if (!it) return -1;
    int rc = 0;
    while (rc == 0 && (pair = PyIter_Next(it))) {
        PyObject *path, *p;
        int rename = PyArg_ParseTuple(pair, "OO", &path, &p) ? auto_named(p) : -1;
        PyObject *full = rename == 1 ? PyUnicode_FromFormat("%U.%S", name, path) : NULL;
        if (rename < 0 || (rename == 1 && (!full || PyObject_SetAttr(p, s_name, full) < 0 ||
                                           PyObject_SetAttr(p, s_auto_name, Py_True) < 0)))
            rc = -1;
        Py_XDECREF(full);
        Py_DECREF(pair);
    }
    Py_DECREF(it);
    return rc == 0 && PyErr_Occurred() ? -1 : rc;
}

static int register_parameter(PyObject *self, PyObject *name, PyObject *value) {
    PyObject *params, *cells;
    if (registries(self, name, &params, &cells) < 0) return -1;
    int rc = discard(cells, name) == 0 && PyObject_SetItem(params, name, value) == 0 ? 0 : -1;
    Py_DECREF(params);
    Py_DECREF(cells);
    PyObject *pname = rc == 0 ? PyObject_GetAttr(value, s_name) : NULL;
    if (rc == 0 && (!pname || (pname == Py_None && (PyObject_SetAttr(value, s_name, name) < 0 ||
                                                    PyObject_SetAttr(value, s_auto_name, Py_True) < 0))))
        rc = -1;
    Py_XDECREF(pname);
    return rc;
}

static int register_cell(PyObject *self, PyObject *name, PyObject *value) {
    PyObject *params, *cells;
    if (registries(self, name, &params, &cells) < 0) return -1;
    int rc = discard(params, name) == 0 && PyObject_SetItem(cells, name, value) == 0 ? 0 : -1;
    Py_DECREF(params);
    Py_DECREF(cells);
    PyObject *prefix = rc == 0 ? PyObject_GetAttr(self, s_auto_prefix) : NULL;
    int yes = prefix ? PyObject_IsTrue(prefix) : -1;
    Py_XDECREF(prefix);
    return yes < 0 ? -1 : yes ? prefix_parameters(value, name) : 0;
}

/* Assigning anything but a Parameter or Cell over a registered name: None unregisters it. */
static int replace_registered(PyObject *self, PyObject *name, PyObject *value) {
    PyObject *d = dict_of(self);
    if (!d) return -1;
    PyObject *params = PyDict_GetItemWithError(d, s_params), *cells = params ? PyDict_GetItemWithError(d, s_cells) : NULL;
    Py_XINCREF(params);
    Py_XINCREF(cells);
    Py_DECREF(d);
    int rc = PyErr_Occurred() ? -1 : 0;
    int in_params = rc == 0 && params && cells ? PySequence_Contains(params, name) : 0;
    int in_cells = in_params == 0 && params && cells ? PySequence_Contains(cells, name) : 0;
    if (in_params < 0 || in_cells < 0) rc = -1;
    if (rc == 0 && (in_params || in_cells)) {
        const char *kind = in_params ? "parameter" : "cell";
        if (value != Py_None) {
            PyErr_Format(PyExc_TypeError, "cannot assign a %s to %s %R of %s (%s or None expected)",
                         _PyType_Name(Py_TYPE(value)), kind, name, _PyType_Name(Py_TYPE(self)),
                         in_params ? "Parameter" : "Cell");
            rc = -1;
        } else {
            rc = discard(in_params ? params : cells, name);
        }
    }
    Py_XDECREF(params);
    Py_XDECREF(cells);
    return rc;
}

static int cell_setattro(PyObject *self, PyObject *name, PyObject *value) {
    if (!value) { /* del cell.name: it is no longer registered */
        PyObject *d = dict_of(self), *params = d ? PyDict_GetItemWithError(d, s_params) : NULL;
        PyObject *cells = params ? PyDict_GetItemWithError(d, s_cells) : NULL;
        int rc = (params && discard(params, name) < 0) || (cells && discard(cells, name) < 0) || PyErr_Occurred() ? -1
                                                                                                                 : 0;
        Py_XDECREF(d);
        if (rc < 0 || PyObject_GenericSetAttr(self, name, NULL) < 0) return -1;
        return touch(self, name);
    }
    int is_param = parameter_type ? PyObject_IsInstance(value, parameter_type) : 0;
    if (is_param == 1) { /* `self.p += x`: Parameter.__iadd__ updated p in place and returned it */
        PyObject *d = dict_of(self);
        PyObject *cur = d ? PyDict_GetItemWithError(d, name) : NULL;
        Py_XDECREF(d);
        if (cur == value) return 0; /* the same object again: nothing changes, no write to log */
        if (PyErr_Occurred()) return -1;
    }
    int is_cell = is_param == 0 ? PyObject_TypeCheck(value, &PyCellBase_Type) : 0;
    int rc = is_param < 0 ? -1
             : is_param   ? register_parameter(self, name, value)
             : is_cell    ? register_cell(self, name, value)
                          : replace_registered(self, name, value);
    if (rc < 0 || PyObject_GenericSetAttr(self, name, value) < 0) return -1;
    return touch(self, name);
}

/* set_raw(cell, name, value): object.__setattr__ for a Cell: no registration, no version bump. */
static PyObject *py_set_raw(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3 || !PyUnicode_Check(args[1]))
        return PyErr_Format(PyExc_TypeError, "cell_set_raw(cell, name: str, value)");
    if (PyObject_GenericSetAttr(args[0], args[1], args[2]) < 0) return NULL;
    Py_RETURN_NONE;
}

/* set_cell_logs(call_log, write_log): the lists a capture collects in (None: not capturing);
 * returns the previous pair. */
static PyObject *py_set_cell_logs(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *calls, *writes;
    if (!PyArg_ParseTuple(args, "OO:set_cell_logs", &calls, &writes)) return NULL;
    if ((calls != Py_None && !PyList_Check(calls)) || (writes != Py_None && !PyList_Check(writes)))
        return PyErr_Format(PyExc_TypeError, "set_cell_logs: expected lists or None");
    PyObject *prev = Py_BuildValue("(OO)", call_log ? call_log : Py_None, write_log ? write_log : Py_None);
    if (!prev) return NULL;
    Py_XSETREF(call_log, calls == Py_None ? NULL : Py_NewRef(calls));
    Py_XSETREF(write_log, writes == Py_None ? NULL : Py_NewRef(writes));
    return prev;
}

static PyObject *py_cell_logs(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return Py_BuildValue("(OO)", call_log ? call_log : Py_None, write_log ? write_log : Py_None);
}

/* log_cell_call(cell): notes a cell called while a capture runs (a converted construct called
 * without Cell.__call__). */
static PyObject *py_log_cell_call(PyObject *module, PyObject *cell) {
    (void)module;
    if (call_log && PyList_Append(call_log, cell) < 0) return NULL;
    Py_RETURN_NONE;
}

/* cell_setup(Parameter, context, recompute_eager=None): the types and settings CellBase reads. */
static PyObject *py_cell_setup(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *param, *ctx, *recompute = Py_None;
    if (!PyArg_ParseTuple(args, "O!O!|O:cell_setup", &PyType_Type, &param, &PyDict_Type, &ctx, &recompute))
        return NULL;
    Py_XSETREF(parameter_type, Py_NewRef(param));
    Py_XSETREF(context, Py_NewRef(ctx));
    Py_CLEAR(recompute_eager);
    if (recompute != Py_None) recompute_eager = Py_NewRef(recompute);
    Py_RETURN_NONE;
}

/* recompute_begin() -> the mark to restore (recompute_end), or None when no trace records: the
 * ops recorded until then are marked for recomputation, as a Cell.recompute() cell's are. */
static PyObject *py_recompute_begin(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    kiln_tracer *tr = kiln_tracer_active();
    if (!tr) Py_RETURN_NONE;
    return PyLong_FromLong(kiln_tracer_begin_recompute(tr));
}

static PyObject *py_recompute_end(PyObject *module, PyObject *mark) {
    (void)module;
    kiln_tracer *tr = kiln_tracer_active();
    long was = PyLong_AsLong(mark);
    if (was == -1 && PyErr_Occurred()) return NULL;
    if (tr) kiln_tracer_end_recompute(tr, (int32_t)was);
    Py_RETURN_NONE;
}

/* cell_set_hook_runners(before, after): before(cell, args) -> args and after(cell, args, output) ->
 * output run a cell's forward hooks (kiln.nn.cell) */
static PyObject *py_cell_set_hook_runners(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *before, *after;
    if (!PyArg_ParseTuple(args, "OO:cell_set_hook_runners", &before, &after)) return NULL;
    Py_XSETREF(hooks_before, Py_NewRef(before));
    Py_XSETREF(hooks_after, Py_NewRef(after));
    Py_RETURN_NONE;
}

static PyMethodDef cell_functions[] = {
    {"cell_set_hook_runners", py_cell_set_hook_runners, METH_VARARGS,
     "cell_set_hook_runners(before, after): the functions that run a cell's forward hooks around construct"},
    {"recompute_begin", py_recompute_begin, METH_NOARGS,
     "recompute_begin() -> mark or None: the ops recorded from now on are recomputed for the backward"},
    {"recompute_end", py_recompute_end, METH_O, "recompute_end(mark): ends what recompute_begin began"},
    {"cell_set_raw", (PyCFunction)(void (*)(void))py_set_raw, METH_FASTCALL,
     "cell_set_raw(cell, name, value): set an attribute without registering it or bumping the version"},
    {"set_cell_logs", py_set_cell_logs, METH_VARARGS,
     "set_cell_logs(call_log, write_log) -> previous pair: the lists a capture logs Cell calls and writes in"},
    {"cell_logs", py_cell_logs, METH_NOARGS, "cell_logs() -> (call_log, write_log) of the capture running, or Nones"},
    {"log_cell_call", py_log_cell_call, METH_O, "log_cell_call(cell): note a Cell called while a capture runs"},
    {"cell_setup", py_cell_setup, METH_VARARGS,
     "cell_setup(Parameter, context dict, recompute_eager=None): what CellBase reads; recompute_eager(construct, "
     "args, kwargs or None) runs a Cell.recompute() cell's construct eagerly"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PyCellBase_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.CellBase",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The per-call and per-write machinery of kiln.nn.Cell (see src/python/cell.c).",
    .tp_call = cell_call,
    .tp_setattro = cell_setattro,
    .tp_new = PyType_GenericNew,
};

int pykiln_is_cell(PyObject *o) { return PyObject_TypeCheck(o, &PyCellBase_Type); }

int pykiln_cell_init(PyObject *module) {
    static const struct {
        PyObject **s;
        const char *text;
    } names[] = {{&s_params, "_params"},       {&s_cells, "_cells"},
                 {&s_jitted, "_jitted"},       {&s_graph_mode_jit, "_graph_mode_jit"},
                 {&s_construct, "construct"}, {&s_recompute, "_recompute"}, {&s_amp, "_amp"},  {&s_hooks, "_kiln_hooks"}, {&s_auto_prefix, "_auto_prefix"},
                 {&s_name, "name"},            {&s_auto_name, "_auto_name"},
                 {&s_version, "_kiln_version"}, {&s_mode, "mode"},
                 {&s_parameters_and_names, "parameters_and_names"}};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
        if (!(*names[k].s = PyUnicode_InternFromString(names[k].text))) return -1;
    if (PyType_Ready(&PyCellBase_Type) < 0) return -1;
    Py_INCREF(&PyCellBase_Type);
    if (PyModule_AddObject(module, "CellBase", (PyObject *)&PyCellBase_Type) < 0) return -1;
    return PyModule_AddFunctions(module, cell_functions);
}
