/* kiln._C.record_grad: a node of the eager autograd tape whose gradient is a Python callable
 * (kiln.jit's bytecode capture: a compiled piece of a function, whose backward is the compiled
 * backward graph of that piece). */
#include "pykiln.h"

/* The node's rule: backward(grads, needs) -> a sequence of nin gradients (Tensor or None). */
static kiln_status call_backward(void *ctx, int nout, kiln_tensor *const *grads, int nin, const bool *needs,
                                 bool create_graph, kiln_tensor **gin) {
    PyGILState_STATE st = PyGILState_Ensure();
    kiln_status s = KILN_OK;
    PyObject *g = PyTuple_New(nout), *nd = PyTuple_New(nin), *r = NULL, *seq = NULL;
    for (int k = 0; g && k < nout; k++) {
        if (grads[k]) kiln_tensor_retain(grads[k]);
        PyObject *item = grads[k] ? pykiln_wrap(grads[k]) : Py_NewRef(Py_None);
        if (!item) Py_CLEAR(g);
        else PyTuple_SET_ITEM(g, k, item);
    }
    for (int k = 0; nd && k < nin; k++) PyTuple_SET_ITEM(nd, k, PyBool_FromLong(needs[k]));
    if (g && nd) r = PyObject_CallFunctionObjArgs((PyObject *)ctx, g, nd, create_graph ? Py_True : Py_False, NULL);
    if (r) seq = PySequence_Fast(r, "record_grad: backward must return a sequence");
    if (seq && PySequence_Fast_GET_SIZE(seq) != nin)
        PyErr_Format(PyExc_ValueError, "record_grad: backward returned %zd gradients for %d inputs",
                     PySequence_Fast_GET_SIZE(seq), nin);
    for (int k = 0; seq && !PyErr_Occurred() && k < nin; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, k);
        if (item == Py_None) continue;
        if (!pykiln_is_tensor(item)) {
            PyErr_Format(PyExc_TypeError, "record_grad: gradient %d is a %s, not a Tensor", k, Py_TYPE(item)->tp_name);
            break;
        }
        gin[k] = pykiln_unwrap(item);
        kiln_tensor_retain(gin[k]);
    }
    if (PyErr_Occurred()) { /* the Python error, as kiln's (the engine adds where it happened) */
        kiln_release_all(gin, nin);
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        PyObject *text = exc ? PyObject_Str(exc) : NULL;
        const char *msg = text ? PyUnicode_AsUTF8(text) : NULL;
        s = kiln_error(KILN_ERR_RUNTIME, "%s: %s", exc ? Py_TYPE(exc)->tp_name : "error", msg ? msg : "?");
        PyErr_Clear();
        Py_XDECREF(text);
        Py_XDECREF(type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
    }
    Py_XDECREF(seq);
    Py_XDECREF(r);
    Py_XDECREF(nd);
    Py_XDECREF(g);
    PyGILState_Release(st);
    return s;
}

static void release_backward(void *ctx) {
    PyGILState_STATE st = PyGILState_Ensure();
    Py_DECREF((PyObject *)ctx);
    PyGILState_Release(st);
}

/* record_grad(inputs, outputs, backward, name): outputs (fresh tensors) become the outputs of one
 * autograd node over inputs whose gradient is backward(grads, needs, create_graph) (see
 * kiln_autograd_record_custom); grads holds None for outputs no gradient reached. */
static PyObject *py_record_grad(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *ins, *outs, *fn;
    const char *name;
    if (!PyArg_ParseTuple(args, "O!O!Os:record_grad", &PyTuple_Type, &ins, &PyTuple_Type, &outs, &fn, &name))
        return NULL;
    Py_ssize_t nin = PyTuple_GET_SIZE(ins), nout = PyTuple_GET_SIZE(outs);
    kiln_tensor **t = PyMem_Calloc((size_t)(nin + nout + 1), sizeof *t);
    if (!t) return PyErr_NoMemory();
    for (Py_ssize_t k = 0; k < nin + nout; k++) {
        PyObject *o = k < nin ? PyTuple_GET_ITEM(ins, k) : PyTuple_GET_ITEM(outs, k - nin);
        if (!pykiln_is_tensor(o)) {
            PyMem_Free(t);
            return PyErr_Format(PyExc_TypeError, "record_grad: %s %zd is not a Tensor", k < nin ? "input" : "output",
                                k < nin ? k : k - nin);
        }
        t[k] = pykiln_unwrap(o);
        if (k >= nin && t[k]->grad_fn) {
            PyMem_Free(t);
            return PyErr_Format(PyExc_ValueError, "record_grad: output %zd already has autograd history", k - nin);
        }
    }
    /* the name lives as long as the node: interned, kept by the interpreter */
    PyObject *interned = PyUnicode_InternFromString(name);
    if (!interned) {
        PyMem_Free(t);
        return NULL;
    }
    kiln_custom_grad rule = {call_backward, release_backward, Py_NewRef(fn), PyUnicode_AsUTF8(interned)};
    kiln_status s = kiln_autograd_record_custom((int)nin, t, (int)nout, t + nin, &rule);
    PyMem_Free(t);
    if (s != KILN_OK) return pykiln_raise(s);
    Py_RETURN_NONE;
}

static PyMethodDef custom_grad_functions[] = {
    {"record_grad", py_record_grad, METH_VARARGS,
     "record_grad(inputs, outputs, backward, name): outputs become one autograd node over inputs, whose gradient "
     "is backward(grads, needs, create_graph) -> per input a Tensor or None"},
    {NULL, NULL, 0, NULL},
};

int pykiln_custom_grad_init(PyObject *module) { return PyModule_AddFunctions(module, custom_grad_functions); }
