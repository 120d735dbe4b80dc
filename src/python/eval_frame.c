/* The PEP 523 frame-evaluation hook of capture_mode="bytecode" (kiln/jit/bytecode.py).
 *
 * kiln.jit marks the code object of a function it captures from bytecode: mark(code, callback)
 * keeps the callback in the code object's co_extra. While run_hooked(fn, args, kwargs) calls a
 * function, kiln's frame evaluator is the interpreter's: a frame of a marked code object that
 * has not started (not a generator or coroutine, not resumed, not being unwound by a thrown
 * exception) is not evaluated; the callback gets (function, arguments) — the frame's first
 * localsplus slots, the parameters as CPython bound them (defaults, keywords, *args, **kwargs) —
 * and its result is the frame's. A callback that returns RUN_EAGER lets CPython evaluate the
 * frame as usual. Every other frame goes to CPython's own evaluator. suspend(True) turns the
 * hook off for the thread (while a capture interprets bytecode) and returns the previous state.
 *
 * CPython 3.11 only: in 3.11 the caller of the frame evaluator (_PyEval_Vector) clears and pops
 * the frame after it returns, so skipping evaluation needs nothing else; the frame layout and
 * that contract change with the version, so other versions get a clear error from run_hooked.
 * code_entries(code) keeps a dict in a second co_extra slot: the compiled entries of the code
 * (python/kiln/jit/code_cache.py), freed with the code object.
 * Reference notes: the co_extra slots own a reference to their callback and dict; run_hooked
 * restores the evaluator it found. */
#include "pykiln.h"

#define KILN_EVAL_FRAME_SUPPORTED (PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000)

#if KILN_EVAL_FRAME_SUPPORTED
#define Py_BUILD_CORE
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#endif

/* The function a frame runs (borrowed), or NULL where that is not known (not CPython 3.11): the
 * guard recorder then searches the heap for the functions with the frame's code. */
PyObject *pykiln_frame_function(PyFrameObject *frame) {
#if KILN_EVAL_FRAME_SUPPORTED
    _PyInterpreterFrame *f = frame->f_frame; /* (struct _frame of internal/pycore_frame.h) */
    return f && f->f_func && PyFunction_Check(f->f_func) ? (PyObject *)f->f_func : NULL;
#else
    (void)frame;
    return NULL;
#endif
}

static PyObject *run_eager; /* the RUN_EAGER sentinel */
static Py_ssize_t slot = -1;
static _Thread_local int suspended;
static _Thread_local Py_ssize_t hook_calls; /* frames the hook handed to a callback (for tests) */

static Py_ssize_t entries_slot = -1; /* the compiled entries of a code object (kiln/jit/code_cache.py) */

static void release_callback(void *cb) { Py_XDECREF((PyObject *)cb); }

static int ensure_slot(void) {
    if (slot < 0) slot = _PyEval_RequestCodeExtraIndex(release_callback);
    if (entries_slot < 0) entries_slot = _PyEval_RequestCodeExtraIndex(release_callback);
    return slot < 0 || entries_slot < 0 ? -1 : 0;
}

/* code_entries(code): the dict kept in the code object's co_extra for its compiled entries, made
 * empty on first use; it goes when the code object goes. What it holds must not lead back to the
 * code object: the garbage collector does not see co_extra, so such a cycle would never be freed. */
static PyObject *py_code_entries(PyObject *module, PyObject *code) {
    (void)module;
    if (!PyCode_Check(code)) return PyErr_Format(PyExc_TypeError, "code_entries: expected a code object");
    void *d = NULL;
    if (ensure_slot() < 0 || _PyCode_GetExtra(code, entries_slot, &d) < 0) return NULL;
    if (!d) {
        d = PyDict_New();
        if (!d) return NULL;
        if (_PyCode_SetExtra(code, entries_slot, d) < 0) {
            Py_DECREF((PyObject *)d);
            return NULL;
        }
    }
    return Py_NewRef((PyObject *)d);
}

/* mark(code, callback or None): sets (None: clears) the callback of a code object. */
static PyObject *py_mark(PyObject *module, PyObject *args) {
    PyObject *code, *cb;
    (void)module;
    if (!PyArg_ParseTuple(args, "O!O:mark", &PyCode_Type, &code, &cb)) return NULL;
    if (ensure_slot() < 0) return NULL;
    void *old = NULL;
    if (_PyCode_GetExtra(code, slot, &old) < 0) return NULL;
    PyObject *value = cb == Py_None ? NULL : Py_NewRef(cb);
    if (_PyCode_SetExtra(code, slot, value) < 0) {
        Py_XDECREF(value);
        return NULL;
    }
    Py_XDECREF((PyObject *)old);
    Py_RETURN_NONE;
}

static PyObject *py_marked(PyObject *module, PyObject *code) {
    (void)module;
    if (!PyCode_Check(code)) return PyErr_Format(PyExc_TypeError, "marked: expected a code object");
    void *cb = NULL;
    if (ensure_slot() < 0 || _PyCode_GetExtra(code, slot, &cb) < 0) return NULL;
    return Py_NewRef(cb ? (PyObject *)cb : Py_None);
}

static PyObject *py_suspend(PyObject *module, PyObject *on) {
    (void)module;
    int v = PyObject_IsTrue(on);
    if (v < 0) return NULL;
    int prev = suspended;
    suspended = v;
    return PyBool_FromLong(prev);
}

static PyObject *py_hook_calls(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyLong_FromSsize_t(hook_calls);
}

#if KILN_EVAL_FRAME_SUPPORTED

enum { GENERATOR_FLAGS = CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE };

static PyObject *kiln_eval_frame(PyThreadState *ts, _PyInterpreterFrame *frame, int throwflag) {
    PyCodeObject *code = frame->f_code;
    void *cb = NULL;
    if (throwflag || suspended || (code->co_flags & GENERATOR_FLAGS) || frame->owner != FRAME_OWNED_BY_THREAD ||
        _PyInterpreterFrame_LASTI(frame) != -1 || _PyCode_GetExtra((PyObject *)code, slot, &cb) < 0 || !cb)
        return _PyEval_EvalFrameDefault(ts, frame, throwflag);
    int n = code->co_argcount + code->co_kwonlyargcount + !!(code->co_flags & CO_VARARGS) +
            !!(code->co_flags & CO_VARKEYWORDS);
    PyObject *args = PyTuple_New(n);
    if (!args) return NULL;
    for (int k = 0; k < n; k++) {
        PyObject *v = frame->localsplus[k];
        PyTuple_SET_ITEM(args, k, Py_NewRef(v ? v : Py_None));
    }
    PyObject *callback = Py_NewRef((PyObject *)cb), *func = Py_NewRef((PyObject *)frame->f_func);
    hook_calls++;
    PyObject *result = PyObject_CallFunctionObjArgs(callback, func, args, NULL);
    Py_DECREF(callback);
    Py_DECREF(func);
    Py_DECREF(args);
    if (result == run_eager) {
        Py_DECREF(result);
        return _PyEval_EvalFrameDefault(ts, frame, 0);
    }
    return result;
}

/* run_hooked(fn, args, kwargs): fn(*args, **kwargs) with kiln's frame evaluator installed. */
static PyObject *py_run_hooked(PyObject *module, PyObject *a) {
    PyObject *fn, *args, *kwargs;
    (void)module;
    if (!PyArg_ParseTuple(a, "OO!O:run_hooked", &fn, &PyTuple_Type, &args, &kwargs)) return NULL;
    if (ensure_slot() < 0) return NULL;
    PyInterpreterState *interp = PyInterpreterState_Get();
    _PyFrameEvalFunction prev = _PyInterpreterState_GetEvalFrameFunc(interp);
    if (prev != kiln_eval_frame) _PyInterpreterState_SetEvalFrameFunc(interp, kiln_eval_frame);
    PyObject *r = PyObject_Call(fn, args, kwargs == Py_None ? NULL : kwargs);
    if (prev != kiln_eval_frame) _PyInterpreterState_SetEvalFrameFunc(interp, prev);
    return r;
}

#else

static PyObject *py_run_hooked(PyObject *module, PyObject *a) {
    (void)module, (void)a;
    return PyErr_Format(PyExc_RuntimeError,
                        "kiln.jit(capture_mode=\"bytecode\") supports CPython 3.11 only; this is Python %s",
                        Py_GetVersion());
}

#endif

static PyMethodDef eval_frame_functions[] = {
    {"eval_frame_mark", py_mark, METH_VARARGS,
     "eval_frame_mark(code, callback): the frame hook hands frames of code to callback(function, arguments)"},
    {"eval_frame_marked", py_marked, METH_O, "eval_frame_marked(code) -> the callback marked on code, or None"},
    {"eval_frame_suspend", py_suspend, METH_O, "eval_frame_suspend(on) -> previous: turn the hook off for this thread"},
    {"code_entries", py_code_entries, METH_O,
     "code_entries(code) -> the dict of compiled entries kept with code (in its co_extra; it dies with code)"},
    {"eval_frame_calls", py_hook_calls, METH_NOARGS, "eval_frame_calls() -> frames handed to a callback so far"},
    {"run_hooked", py_run_hooked, METH_VARARGS, "run_hooked(fn, args, kwargs): call fn with the frame hook installed"},
    {NULL, NULL, 0, NULL},
};

int pykiln_eval_frame_init(PyObject *module) {
    run_eager = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    if (!run_eager || PyModule_AddObjectRef(module, "RUN_EAGER", run_eager) < 0) return -1;
    return PyModule_AddFunctions(module, eval_frame_functions);
}
