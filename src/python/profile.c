/* kiln._C's profiling functions: sessions of the C recorder (src/core/profile.h), its events as
 * dicts, its Chrome Trace JSON writer, and op footprints (kiln.profiler, trace.get_profile). */
#include "pykiln.h"

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

static PyObject *py_profile_now(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromLongLong(kiln_profile_now());
}

static PyObject *py_profile_phase(PyObject *self, PyObject *args) {
    (void)self;
    const char *name, *detail = NULL;
    long long start;
    if (!PyArg_ParseTuple(args, "sL|z", &name, &start, &detail)) return NULL;
    if (kiln_profiling()) kiln_profile_phase(name, detail, start);
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

static PyObject *py_profile_events(PyObject *self, PyObject *arg) {
    (void)self;
    size_t mark = PyLong_AsSize_t(arg);
    if (mark == (size_t)-1 && PyErr_Occurred()) return NULL;
    kiln_profile_event *ev = NULL;
    size_t n = 0;
    kiln_status s = kiln_profile_events(mark, &ev, &n);
    if (s != KILN_OK) return pykiln_raise(s);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *d = event_dict(&ev[i]);
        if (!d) Py_CLEAR(list);
        else PyList_SET_ITEM(list, (Py_ssize_t)i, d);
    }
    kiln_profile_events_free(ev, n);
    return list;
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
    {"profile_now", py_profile_now, METH_NOARGS, "the recorder's clock (monotonic ns)"},
    {"profile_phase", py_profile_phase, METH_VARARGS, "profile_phase(name, start_ns, detail=None): a phase until now"},
    {"profile_name_thread", py_profile_name_thread, METH_VARARGS,
     "profile_name_thread(tid, name): name OS thread tid (0: the calling thread) in traces"},
    {"profile_events", py_profile_events, METH_O, "profile_events(mark) -> the events recorded since mark, as dicts"},
    {"profile_write_chrome", py_profile_write_chrome, METH_VARARGS,
     "profile_write_chrome(path, mark, shapes=True, memory=True): Chrome Trace Event JSON of the events since mark"},
    {NULL, NULL, 0, NULL},
};
