/* kiln._C.FrameHook(tracer, package_dir, on_call=None): the sys.settrace hook a capture runs
 * under. As the global hook it sees each new frame: frames of kiln itself (under package_dir)
 * and frozen modules are not traced; a frame of user code is shown to on_call (the guard
 * recorder) and traced by the hook itself as the local hook, which tells the tracer the source
 * line of the ops that follow (tracer.set_loc("file:line")) at each line event.
 * Reference notes: the hook owns its tracer, package_dir and on_call. */
#include "pykiln.h"

#include <frameobject.h>

typedef struct {
    PyObject_HEAD
    PyObject *tracer;      /* a kiln._C.Tracer */
    PyObject *package_dir; /* str */
    PyObject *on_call;     /* callable(frame), or NULL */
    PyObject *set_loc;     /* the tracer's bound set_loc */
} PyFrameHook;

static PyObject *s_call, *s_line, *s_frozen;

static PyObject *hook_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    PyFrameHook *h = (PyFrameHook *)self;
    PyObject *frame, *event, *arg;
    if (kwargs && PyDict_GET_SIZE(kwargs)) return PyErr_Format(PyExc_TypeError, "FrameHook takes no keywords");
    if (!PyArg_ParseTuple(args, "O!UO:FrameHook", &PyFrame_Type, &frame, &event, &arg)) return NULL;
    PyCodeObject *code = PyFrame_GetCode((PyFrameObject *)frame);
    PyObject *filename = code->co_filename, *out = NULL;
    if (PyUnicode_Compare(event, s_call) == 0) { /* a new frame: trace it unless it is kiln's own */
        int own = PyUnicode_Tailmatch(filename, h->package_dir, 0, PY_SSIZE_T_MAX, -1);
        int frozen = own == 0 ? PyUnicode_Tailmatch(filename, s_frozen, 0, PY_SSIZE_T_MAX, -1) : 0;
        if (own < 0 || frozen < 0) goto done;
        if (own || frozen) {
            out = Py_NewRef(Py_None);
            goto done;
        }
        PyObject *r = h->on_call ? PyObject_CallOneArg(h->on_call, frame) : Py_NewRef(Py_None);
        if (!r) goto done;
        Py_DECREF(r);
    } else if (PyUnicode_Compare(event, s_line) == 0) {
        PyObject *loc = PyUnicode_FromFormat("%U:%d", filename, PyFrame_GetLineNumber((PyFrameObject *)frame));
        PyObject *r = loc ? PyObject_CallOneArg(h->set_loc, loc) : NULL;
        Py_XDECREF(loc);
        if (!r) goto done;
        Py_DECREF(r);
    }
    out = Py_NewRef(self);
done:
    Py_DECREF(code);
    return out;
}

static int hook_init(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"tracer", "package_dir", "on_call", NULL};
    PyFrameHook *h = (PyFrameHook *)self;
    PyObject *tracer, *dir, *on_call = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OU|O:FrameHook", kwlist, &tracer, &dir, &on_call)) return -1;
    PyObject *set_loc = PyObject_GetAttrString(tracer, "set_loc");
    if (!set_loc) return -1;
    Py_XSETREF(h->tracer, Py_NewRef(tracer));
    Py_XSETREF(h->package_dir, Py_NewRef(dir));
    Py_XSETREF(h->on_call, on_call == Py_None ? NULL : Py_NewRef(on_call));
    Py_XSETREF(h->set_loc, set_loc);
    return 0;
}

static int hook_traverse(PyObject *self, visitproc visit, void *arg) {
    PyFrameHook *h = (PyFrameHook *)self;
    Py_VISIT(h->tracer);
    Py_VISIT(h->on_call);
    Py_VISIT(h->set_loc);
    return 0;
}

static int hook_clear(PyObject *self) {
    PyFrameHook *h = (PyFrameHook *)self;
    Py_CLEAR(h->tracer);
    Py_CLEAR(h->package_dir);
    Py_CLEAR(h->on_call);
    Py_CLEAR(h->set_loc);
    return 0;
}

static void hook_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    hook_clear(self);
    Py_TYPE(self)->tp_free(self);
}

static PyTypeObject PyFrameHook_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.FrameHook",
    .tp_basicsize = sizeof(PyFrameHook),
    .tp_dealloc = hook_dealloc,
    .tp_call = hook_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "FrameHook(tracer, package_dir, on_call=None): the sys.settrace hook of a capture.",
    .tp_traverse = hook_traverse,
    .tp_clear = hook_clear,
    .tp_init = hook_init,
    .tp_new = PyType_GenericNew,
};

int pykiln_frame_hook_init(PyObject *module) {
    if (!(s_call = PyUnicode_InternFromString("call")) || !(s_line = PyUnicode_InternFromString("line")) ||
        !(s_frozen = PyUnicode_InternFromString("<frozen")))
        return -1;
    if (PyType_Ready(&PyFrameHook_Type) < 0) return -1;
    Py_INCREF(&PyFrameHook_Type);
    return PyModule_AddObject(module, "FrameHook", (PyObject *)&PyFrameHook_Type);
}
