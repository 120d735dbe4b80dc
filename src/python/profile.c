/* kiln._C's profiling functions: sessions of the C recorder (src/core/profile.h), its events as
 * dicts, its Chrome Trace JSON writer, and op footprints (kiln.profiler, trace.get_profile). */
#include "pykiln.h"

#include <dlfcn.h>

#include "../core/profile.h"
#include "../ops/footprint.h"

static PyObject *py_profile_start(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromSize_t(kiln_profile_start());
}

static PyObject *py_profile_stop(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    kiln_profile_stop();
    Py_RETURN_NONE;
}

static PyObject *py_profile_start_phases(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromSize_t(kiln_profile_start_phases());
}

static PyObject *py_profile_stop_phases(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    kiln_profile_stop_phases();
    Py_RETURN_NONE;
}

static PyObject *py_profile_now(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromLongLong(kiln_profile_now());
}

static PyObject *py_profile_phase(PyObject *self, PyObject *args) {
    (void)self;
    const char *name, *detail = NULL;
    long long start;
    if (!PyArg_ParseTuple(args, "sL|z", &name, &start, &detail)) return NULL;
    if (kiln_profiling_phases()) kiln_profile_phase(name, detail, start);
    Py_RETURN_NONE;
}

/* A thread's name is any str (Python allows NUL characters and lone surrogates in it): the trace
 * gets its UTF-8 text with each NUL written as the four characters \x00 and a lone surrogate as \udc80. */
static PyObject *py_profile_name_thread(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *name;
    int tid;
    if (!PyArg_ParseTuple(args, "iU", &tid, &name)) return NULL;
    PyObject *bytes = PyUnicode_AsEncodedString(name, "utf-8", "backslashreplace");
    if (!bytes) return NULL;
    const char *text = PyBytes_AS_STRING(bytes);
    Py_ssize_t n = PyBytes_GET_SIZE(bytes);
    char *copy = PyMem_Malloc((size_t)n * 4 + 1), *p = copy;
    if (!copy) {
        Py_DECREF(bytes);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (text[k]) *p++ = text[k];
        else memcpy(p, "\\x00", 4), p += 4;
    }
    *p = '\0';
    Py_DECREF(bytes);
    kiln_profile_name_thread(tid, copy);
    PyMem_Free(copy);
    Py_RETURN_NONE;
}

/* "float32[2,3];int64[4]" -> ["float32[2,3]", "int64[4]"] */
static PyObject *split_list(const char *s) {
    if (!s || !*s) return PyList_New(0);
    PyObject *text = PyUnicode_FromString(s), *sep = PyUnicode_FromString(";");
    PyObject *out = text && sep ? PyUnicode_Split(text, sep, -1) : NULL;
    Py_XDECREF(text), Py_XDECREF(sep);
    return out;
}

static const char *const kind_names[] = {"kernel", "phase", "alloc"};
static const char *const source_names[] = {"eager", "kbk", "sink", "compile", "memory"};

static PyObject *event_dict(const kiln_profile_event *e) {
    PyObject *ins = split_list(e->inputs), *outs = split_list(e->outputs);
    PyObject *d = ins && outs ? Py_BuildValue(
        "{s:s,s:s,s:s,s:i,s:i,s:i,s:i,s:K,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:z,s:O,s:O}", "kind", kind_names[e->kind],
        "source", source_names[e->source], "name", e->name, "op", (int)e->op, "node", (int)e->node, "tid", (int)e->tid,
        "depth", (int)e->depth, "graph", (unsigned long long)e->graph, "start", (long long)e->start_ns, "end",
        (long long)e->end_ns, "flops", (long long)e->flops, "bytes_read", (long long)e->bytes_read, "bytes_written",
        (long long)e->bytes_written, "bytes", (long long)e->bytes, "in_use", (long long)e->in_use, "peak",
        (long long)e->peak, "loc", e->loc, "inputs", ins, "outputs", outs) : NULL;
    Py_XDECREF(ins), Py_XDECREF(outs);
    return d;
}

/* profile_events(mark, kind=None): kind ("kernel", "phase", "alloc") keeps only those events,
 * chosen before any dict is built (a compile's phases among a first run's many kernels). */
static PyObject *py_profile_events(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *mark_obj;
    const char *kind = NULL;
    if (!PyArg_ParseTuple(args, "O|z", &mark_obj, &kind)) return NULL;
    size_t mark = PyLong_AsSize_t(mark_obj);
    if (mark == (size_t)-1 && PyErr_Occurred()) return NULL;
    int want = -1;
    for (int k = 0; kind && k < (int)(sizeof kind_names / sizeof kind_names[0]); k++)
        if (strcmp(kind, kind_names[k]) == 0) want = k;
    if (kind && want < 0) return PyErr_Format(PyExc_ValueError, "profile_events: unknown event kind %R", args);
    kiln_profile_event *ev = NULL;
    size_t n = 0;
    kiln_status s = kiln_profile_events(mark, &ev, &n);
    if (s != KILN_OK) return pykiln_raise(s);
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list && i < n; i++) {
        if (want >= 0 && ev[i].kind != want) continue;
        PyObject *d = event_dict(&ev[i]);
        if (!d || PyList_Append(list, d) < 0) Py_CLEAR(list);
        Py_XDECREF(d);
    }
    kiln_profile_events_free(ev, n);
    return list;
}

/* ---- where eager kernels are called from ------------------------------------------------------ */

static char kiln_dir[4096]; /* the kiln package's folder, with a trailing '/' ("" when unknown) */

/* kiln_profile_eager_loc: the innermost Python frame whose file is outside the kiln package (the
 * user's line calling kiln.ops, a Cell, ...), when this thread holds the GIL. */
static const char *eager_loc(char *buf, size_t size) {
    if (!PyGILState_Check()) return NULL;
    PyFrameObject *f = PyEval_GetFrame();
    Py_XINCREF(f);
    const char *result = NULL;
    while (f && !result) {
        PyCodeObject *code = PyFrame_GetCode(f);
        const char *file = PyUnicode_AsUTF8(code->co_filename);
        if (!file) PyErr_Clear();
        else if (!kiln_dir[0] || strncmp(file, kiln_dir, strlen(kiln_dir)) != 0) {
            snprintf(buf, size, "%s:%d", file, PyFrame_GetLineNumber(f));
            result = buf;
        }
        Py_DECREF(code);
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    return result;
}

/* The kiln package's folder: that of this extension's file. */
static void find_kiln_dir(void) {
    Dl_info info;
    if (!dladdr((void *)eager_loc, &info) || !info.dli_fname) return;
    const char *slash = strrchr(info.dli_fname, '/');
    size_t n = slash ? (size_t)(slash - info.dli_fname) + 1 : 0;
    if (n && n < sizeof kiln_dir) memcpy(kiln_dir, info.dli_fname, n), kiln_dir[n] = '\0';
}

/* ---- ProfileLog: a session's events, packed in C (kiln.profiler keeps one per profile) ---------- */

typedef struct {
    PyObject_HEAD
    kiln_profile_log *log;
} PyProfileLog;

static PyTypeObject PyProfileLog_Type;

static PyObject *py_profile_take(PyObject *self, PyObject *arg) {
    (void)self;
    size_t mark = PyLong_AsSize_t(arg);
    if (mark == (size_t)-1 && PyErr_Occurred()) return NULL;
    kiln_profile_log *log = NULL;
    kiln_status s;
    Py_BEGIN_ALLOW_THREADS
    s = kiln_profile_take(mark, &log);
    Py_END_ALLOW_THREADS
    if (s != KILN_OK) return pykiln_raise(s);
    PyProfileLog *o = PyObject_New(PyProfileLog, &PyProfileLog_Type);
    if (!o) {
        kiln_profile_log_free(log);
        return NULL;
    }
    o->log = log;
    return (PyObject *)o;
}

static void log_dealloc(PyObject *self) {
    kiln_profile_log_free(((PyProfileLog *)self)->log);
    PyObject_Free(self);
}

static Py_ssize_t log_len(PyObject *self) { return (Py_ssize_t)kiln_profile_log_count(((PyProfileLog *)self)->log); }

/* Event i as the dict profile_events gives. */
static PyObject *log_item(PyObject *self, Py_ssize_t i) {
    const kiln_profile_log *log = ((PyProfileLog *)self)->log;
    if (i < 0 || (size_t)i >= kiln_profile_log_count(log)) {
        PyErr_SetString(PyExc_IndexError, "ProfileLog: event index out of range");
        return NULL;
    }
    kiln_profile_event e;
    kiln_profile_log_get(log, (size_t)i, &e);
    return event_dict(&e);
}

/* kernels() -> [(name, inputs text, tid, start, end, depth, flops, bytes read + written)] */
static PyObject *log_kernels(PyObject *self, PyObject *unused) {
    (void)unused;
    const kiln_profile_log *log = ((PyProfileLog *)self)->log;
    PyObject *list = PyList_New(0);
    size_t n = kiln_profile_log_count(log);
    for (size_t i = 0; list && i < n; i++) {
        kiln_profile_event e;
        kiln_profile_log_get(log, i, &e);
        if (e.kind != KILN_PROFILE_KERNEL) continue;
        PyObject *t = Py_BuildValue("(ssiLLiLL)", e.name, e.inputs ? e.inputs : "", (int)e.tid, (long long)e.start_ns,
                                    (long long)e.end_ns, (int)e.depth, (long long)e.flops,
                                    (long long)(e.bytes_read + e.bytes_written));
        if (!t || PyList_Append(list, t) < 0) Py_CLEAR(list);
        Py_XDECREF(t);
    }
    return list;
}

/* peak_in_use() -> the most bytes of tensor memory in use at an allocation event (0: none) */
static PyObject *log_peak_in_use(PyObject *self, PyObject *unused) {
    (void)unused;
    const kiln_profile_log *log = ((PyProfileLog *)self)->log;
    long long peak = 0;
    for (size_t i = 0; i < kiln_profile_log_count(log); i++) {
        kiln_profile_event e;
        kiln_profile_log_get(log, i, &e);
        if (e.kind == KILN_PROFILE_ALLOC && e.in_use > peak) peak = e.in_use;
    }
    return PyLong_FromLongLong(peak);
}

static PyObject *log_write_chrome(PyObject *self, PyObject *args) {
    PyObject *path_obj;
    int shapes = 1, memory = 1;
    if (!PyArg_ParseTuple(args, "O&|pp", PyUnicode_FSConverter, &path_obj, &shapes, &memory)) return NULL;
    const kiln_profile_log *log = ((PyProfileLog *)self)->log;
    kiln_status s;
    Py_BEGIN_ALLOW_THREADS
    s = kiln_profile_log_write_chrome(log, PyBytes_AS_STRING(path_obj),
                                      (shapes ? KILN_PROFILE_WRITE_SHAPES : 0) | (memory ? KILN_PROFILE_WRITE_MEMORY : 0));
    Py_END_ALLOW_THREADS
    Py_DECREF(path_obj);
    if (s != KILN_OK) return pykiln_raise(s);
    Py_RETURN_NONE;
}

static PyObject *log_nbytes(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromSize_t(kiln_profile_log_bytes(((PyProfileLog *)self)->log));
}

static PySequenceMethods log_sequence = {.sq_length = log_len, .sq_item = log_item};

static PyMethodDef log_methods[] = {
    {"kernels", log_kernels, METH_NOARGS,
     "kernels() -> [(name, inputs, tid, start, end, depth, flops, bytes)] of the kernel events"},
    {"peak_in_use", log_peak_in_use, METH_NOARGS, "the most bytes of tensor memory in use at once"},
    {"write_chrome", log_write_chrome, METH_VARARGS,
     "write_chrome(path, shapes=True, memory=True): the log as Chrome Trace Event JSON, streamed from C"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef log_getset[] = {
    {"nbytes", log_nbytes, NULL, "bytes the log holds in C (packed events, interned texts)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PyProfileLog_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.ProfileLog",
    .tp_basicsize = sizeof(PyProfileLog),
    .tp_dealloc = log_dealloc,
    .tp_as_sequence = &log_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A profiling session's events, packed in C: len(), log[i] (a dict), kernels(), write_chrome()",
    .tp_methods = log_methods,
    .tp_getset = log_getset,
};

int pykiln_profile_log_ready(PyObject *module) {
    find_kiln_dir();
    kiln_profile_eager_loc = eager_loc;
    if (PyType_Ready(&PyProfileLog_Type) < 0) return -1;
    Py_INCREF(&PyProfileLog_Type);
    return PyModule_AddObject(module, "ProfileLog", (PyObject *)&PyProfileLog_Type);
}

static PyObject *py_profile_write_chrome(PyObject *self, PyObject *args) {
    (void)self;
    const char *path;
    Py_ssize_t mark;
    int shapes = 1, memory = 1;
    if (!PyArg_ParseTuple(args, "sn|pp", &path, &mark, &shapes, &memory)) return NULL;
    if (mark < 0) return PyErr_Format(PyExc_ValueError, "profile_write_chrome: mark must be >= 0, got %zd", mark);
    kiln_status s;
    Py_BEGIN_ALLOW_THREADS
    s = kiln_profile_write_chrome(path, (size_t)mark,
                                  (shapes ? KILN_PROFILE_WRITE_SHAPES : 0) | (memory ? KILN_PROFILE_WRITE_MEMORY : 0));
    Py_END_ALLOW_THREADS
    if (s != KILN_OK) return pykiln_raise(s);
    Py_RETURN_NONE;
}

PyMethodDef pykiln_profile_functions[] = {
    {"profile_start", py_profile_start, METH_NOARGS, "open a recorder session; returns its mark"},
    {"profile_stop", py_profile_stop, METH_NOARGS, "close a recorder session (the last one empties the list)"},
    {"profile_start_phases", py_profile_start_phases, METH_NOARGS,
     "open a session that records compile phases only (no kernel or allocation events); returns its mark"},
    {"profile_stop_phases", py_profile_stop_phases, METH_NOARGS, "close a session opened by profile_start_phases"},
    {"profile_now", py_profile_now, METH_NOARGS, "the recorder's clock (monotonic ns)"},
    {"profile_phase", py_profile_phase, METH_VARARGS, "profile_phase(name, start_ns, detail=None): a phase until now"},
    {"profile_name_thread", py_profile_name_thread, METH_VARARGS,
     "profile_name_thread(tid, name): name OS thread tid (0: the calling thread) in traces"},
    {"profile_events", py_profile_events, METH_VARARGS,
     "profile_events(mark, kind=None) -> the events recorded since mark (only those of kind: 'kernel', 'phase', "
     "'alloc'), as dicts"},
    {"profile_take", py_profile_take, METH_O, "profile_take(mark) -> a ProfileLog of the events recorded since mark"},
    {"profile_write_chrome", py_profile_write_chrome, METH_VARARGS,
     "profile_write_chrome(path, mark, shapes=True, memory=True): Chrome Trace Event JSON of the events since mark"},
    {NULL, NULL, 0, NULL},
};
