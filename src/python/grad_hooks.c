/* Gradient hooks of tensors (Tensor.register_hook, through kiln.grad_hooks): the C hook that runs a
 * Python callable on a gradient during a backward pass, the TensorBase methods that add and remove
 * them, and the Python exception a hook raised, handed back to the caller of the pass (the engine
 * carries kiln statuses only). */
#include "pykiln.h"

/* What a hook raised, kept (with the GIL) until the pass that ran it returns. */
static PyObject *raised_type, *raised_value, *raised_tb;

kiln_status pykiln_backward_error(void) {
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    PyObject *text = exc ? PyObject_Str(exc) : NULL;
    const char *msg = text ? PyUnicode_AsUTF8(text) : NULL;
    kiln_status s = kiln_error(KILN_ERR_RUNTIME, "%s: %s", exc ? Py_TYPE(exc)->tp_name : "error", msg ? msg : "?");
    PyErr_Clear();
    Py_XDECREF(text);
    if (!raised_type && type) { /* the first one is the caller's (a later one is what unwinding it raised) */
        raised_type = type, raised_value = exc, raised_tb = tb;
    } else {
        Py_XDECREF(type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
    }
    return s;
}

/* ctx(grad) -> Tensor (the new gradient) or None. */
static kiln_status call_hook(void *ctx, kiln_tensor *grad, kiln_tensor **out) {
    PyGILState_STATE st = PyGILState_Ensure();
    kiln_tensor_retain(grad);
    PyObject *g = pykiln_wrap(grad);
    PyObject *r = g ? PyObject_CallOneArg((PyObject *)ctx, g) : NULL;
    if (r && r != Py_None) {
        if (pykiln_is_tensor(r)) {
            *out = pykiln_unwrap(r);
            kiln_tensor_retain(*out);
        } else {
            PyErr_Format(PyExc_TypeError, "a gradient hook must return a Tensor or None, got %s", Py_TYPE(r)->tp_name);
        }
    }
    kiln_status s = PyErr_Occurred() ? pykiln_backward_error() : KILN_OK;
    Py_XDECREF(r);
    Py_XDECREF(g);
    PyGILState_Release(st);
    return s;
}

static void release_hook(void *ctx) {
    PyGILState_STATE st = PyGILState_Ensure();
    Py_DECREF((PyObject *)ctx);
    PyGILState_Release(st);
}

static Py_ssize_t backward_passes; /* begun from Python (kiln._C.backward_passes) */

PyObject *pykiln_backward_passes(PyObject *module, PyObject *unused) {
    (void)module, (void)unused;
    return PyLong_FromSsize_t(backward_passes);
}

void pykiln_backward_begin(void) {
    backward_passes++;
    Py_CLEAR(raised_type);
    Py_CLEAR(raised_value);
    Py_CLEAR(raised_tb);
}

PyObject *pykiln_raise_backward(kiln_status s) {
    if (raised_type) {
        PyErr_Restore(raised_type, raised_value, raised_tb);
        raised_type = raised_value = raised_tb = NULL;
        return NULL;
    }
    return pykiln_raise(s);
}

/* t._add_grad_hook(fn) -> id: fn(grad) runs on t's gradient in each backward pass (kiln_autograd_add_hook) */
PyObject *pykiln_tensor_add_grad_hook(PyObject *self, PyObject *fn) {
    if (!PyCallable_Check(fn)) return PyErr_Format(PyExc_TypeError, "register_hook: the hook must be callable, got %s",
                                                   Py_TYPE(fn)->tp_name);
    kiln_grad_hook hook = {call_hook, release_hook, Py_NewRef(fn), 0, 0, NULL};
    int64_t id;
    kiln_status s = kiln_autograd_add_hook(pykiln_unwrap(self), &hook, &id); /* (releases fn on failure) */
    if (s != KILN_OK) return pykiln_raise(s);
    return PyLong_FromLongLong((long long)id);
}

/* t._remove_grad_hook(id) -> whether t held it */
PyObject *pykiln_tensor_remove_grad_hook(PyObject *self, PyObject *id) {
    long long v = PyLong_AsLongLong(id);
    if (v == -1 && PyErr_Occurred()) return NULL;
    return PyBool_FromLong(kiln_autograd_remove_hook(pykiln_unwrap(self), (int64_t)v));
}

/* t._has_grad_hooks() -> whether a hook would see t's gradient */
PyObject *pykiln_tensor_has_grad_hooks(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(kiln_autograd_has_hooks(pykiln_unwrap(self)));
}

/* t._leaf_grad_hooks() -> [fn, ...]: the Python hooks of a leaf, in order (a copy of it made for a
 * grad call takes them: kiln.autograd) */
PyObject *pykiln_tensor_leaf_grad_hooks(PyObject *self, PyObject *unused) {
    (void)unused;
    PyObject *list = PyList_New(0);
    for (const kiln_grad_hook *h = pykiln_unwrap(self)->grad_hooks; list && h; h = h->next) {
        if (h->fn != call_hook) continue;
        if (PyList_Append(list, (PyObject *)h->ctx) < 0) Py_CLEAR(list);
    }
    return list;
}
