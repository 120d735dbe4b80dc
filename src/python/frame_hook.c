/* kiln._C.FrameHook(tracer, package_dir, on_call=None): the sys.settrace hook a capture runs
 * under. As the global hook it sees each new frame: frames of kiln itself (under package_dir)
 * and frozen modules are not traced; a frame of user code is shown to on_call (the guard
 * recorder) and traced by the hook itself as the local hook, which tells the tracer the source
 * line of the ops that follow (tracer.set_loc("file:line")) at each line event. Frames of Python's
 * standard library (under stdlib_dir but not under one of site_dirs) are shown to on_call but
 * not traced: an op kiln records while, say, weakref or functools runs is the user's line's op.
 * Reference notes: the hook owns its tracer, package_dir and on_call. */
#include "pykiln.h"

#include <frameobject.h>

typedef struct {
    PyObject_HEAD
    PyObject *tracer;      /* a kiln._C.Tracer */
    PyObject *package_dir; /* str */
    PyObject *on_call;     /* callable(frame), or NULL */
    PyObject *stdlib_dir;  /* str, or NULL */
    PyObject *site_dirs;   /* tuple of str (installed packages inside stdlib_dir are user code) */
    PyObject *set_loc;     /* the tracer's bound set_loc */
} PyFrameHook;

static PyObject *s_call, *s_line, *s_frozen;

/* 1 when filename lies in the standard library (not in an installed package there), 0 if not, -1 on error */
static int in_stdlib(PyFrameHook *h, PyObject *filename) {
    int stdlib = h->stdlib_dir ? PyUnicode_Tailmatch(filename, h->stdlib_dir, 0, PY_SSIZE_T_MAX, -1) : 0;
    for (Py_ssize_t i = 0; stdlib == 1 && i < PyTuple_GET_SIZE(h->site_dirs); i++) {
        int site = PyUnicode_Tailmatch(filename, PyTuple_GET_ITEM(h->site_dirs, i), 0, PY_SSIZE_T_MAX, -1);
        if (site) stdlib = site < 0 ? -1 : 0;
    }
    return stdlib;
}

/* Whether a frame is library code, not the user's lines: the standard library's, or code made by
 * eval/exec ("<string>": a namedtuple's __new__, a dataclass's __init__) that the standard library or
 * kiln called. 1 / 0, -1 on error. */
static int library_frame(PyFrameHook *h, PyFrameObject *frame, PyObject *filename) {
    int stdlib = in_stdlib(h, filename);
    if (stdlib != 0 || PyUnicode_GET_LENGTH(filename) == 0 || PyUnicode_READ_CHAR(filename, 0) != '<') return stdlib;
    PyFrameObject *back = PyFrame_GetBack(frame);
    if (!back) return 0;
    PyCodeObject *code = PyFrame_GetCode(back);
    int lib = PyUnicode_Tailmatch(code->co_filename, h->package_dir, 0, PY_SSIZE_T_MAX, -1);
    if (lib == 0) lib = in_stdlib(h, code->co_filename);
    Py_DECREF(code);
    Py_DECREF(back);
    return lib;
}

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
        int stdlib = library_frame(h, (PyFrameObject *)frame, filename);
        if (stdlib < 0) goto done;
        if (stdlib) {
            out = Py_NewRef(Py_None);
            goto done;
        }
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
    static char *kwlist[] = {"tracer", "package_dir", "on_call", "stdlib_dir", "site_dirs", NULL};
    PyFrameHook *h = (PyFrameHook *)self;
    PyObject *tracer, *dir, *on_call = Py_None, *stdlib_dir = Py_None, *site_dirs = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OU|OOO!:FrameHook", kwlist, &tracer, &dir, &on_call, &stdlib_dir,
                                     &PyTuple_Type, &site_dirs))
        return -1;
    if (stdlib_dir != Py_None && !PyUnicode_Check(stdlib_dir)) {
        PyErr_SetString(PyExc_TypeError, "FrameHook: stdlib_dir must be a str or None");
        return -1;
    }
    for (Py_ssize_t i = 0; site_dirs && i < PyTuple_GET_SIZE(site_dirs); i++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(site_dirs, i))) {
            PyErr_SetString(PyExc_TypeError, "FrameHook: site_dirs must be a tuple of str");
            return -1;
        }
    PyObject *set_loc = PyObject_GetAttrString(tracer, "set_loc");
    if (!set_loc) return -1;
    Py_XSETREF(h->tracer, Py_NewRef(tracer));
    Py_XSETREF(h->package_dir, Py_NewRef(dir));
    Py_XSETREF(h->on_call, on_call == Py_None ? NULL : Py_NewRef(on_call));
    Py_XSETREF(h->set_loc, set_loc);
    Py_XSETREF(h->stdlib_dir, stdlib_dir == Py_None ? NULL : Py_NewRef(stdlib_dir));
    Py_XSETREF(h->site_dirs, site_dirs ? Py_NewRef(site_dirs) : PyTuple_New(0));
    return h->site_dirs ? 0 : -1;
}

static int hook_traverse(PyObject *self, visitproc visit, void *arg) {
    PyFrameHook *h = (PyFrameHook *)self;
    Py_VISIT(h->tracer);
    Py_VISIT(h->on_call);
    Py_VISIT(h->set_loc);
    Py_VISIT(h->site_dirs);
    return 0;
}

static int hook_clear(PyObject *self) {
    PyFrameHook *h = (PyFrameHook *)self;
    Py_CLEAR(h->tracer);
    Py_CLEAR(h->package_dir);
    Py_CLEAR(h->on_call);
    Py_CLEAR(h->set_loc);
    Py_CLEAR(h->stdlib_dir);
    Py_CLEAR(h->site_dirs);
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
    .tp_doc = "FrameHook(tracer, package_dir, on_call=None, stdlib_dir=None, site_dirs=()): the sys.settrace hook of a capture.",
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
