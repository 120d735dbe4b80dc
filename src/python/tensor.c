/* The kiln._C.TensorBase type (kiln.Tensor derives from it in Python) and the dtype type. */
#include "pykiln.h"

#include "autograd/node.h"

PyTypeObject *pykiln_tensor_class = &PyKilnTensor_Type;
PyObject *pykiln_dtypes[KILN_DTYPE_COUNT];

PyObject *pykiln_wrap(kiln_tensor *t) {
    PyObject *o = pykiln_tensor_class->tp_alloc(pykiln_tensor_class, 0);
    if (!o) {
        kiln_tensor_release(t);
        return NULL;
    }
    ((PyKilnTensor *)o)->t = t;
    return o;
}

/* ---- dtype objects ------------------------------------------------------------------------ */

static PyObject *dtype_repr(PyObject *self) {
    return PyUnicode_FromFormat("kiln.%s", kiln_dtype_name(((PyKilnDType *)self)->id));
}

static PyObject *dtype_get_name(PyObject *self, void *c) {
    (void)c;
    return PyUnicode_FromString(kiln_dtype_name(((PyKilnDType *)self)->id));
}
static PyObject *dtype_get_itemsize(PyObject *self, void *c) {
    (void)c;
    return PyLong_FromSize_t(kiln_dtype_size(((PyKilnDType *)self)->id));
}
static PyObject *dtype_get_is_floating_point(PyObject *self, void *c) {
    (void)c;
    return PyBool_FromLong(kiln_dtype_is_float(((PyKilnDType *)self)->id));
}
static PyObject *dtype_get_id(PyObject *self, void *c) {
    (void)c;
    return PyLong_FromLong(((PyKilnDType *)self)->id);
}

static PyObject *dtype_reduce(PyObject *self, PyObject *unused) {
    (void)unused;
    /* a singleton: pickled as the global kiln.<name> */
    return PyUnicode_FromString(kiln_dtype_name(((PyKilnDType *)self)->id));
}

static PyGetSetDef dtype_getset[] = {
    {"name", dtype_get_name, NULL, "dtype name, e.g. 'float32'", NULL},
    {"itemsize", dtype_get_itemsize, NULL, "bytes per element", NULL},
    {"is_floating_point", dtype_get_is_floating_point, NULL, "whether the dtype is a float type", NULL},
    {"id", dtype_get_id, NULL, "the kiln_dtype enum value", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef dtype_methods[] = {
    {"__reduce__", dtype_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject PyKilnDType_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln.dtype",
    .tp_basicsize = sizeof(PyKilnDType),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The element type of a tensor (kiln.float32, kiln.int64, ...).",
    .tp_repr = dtype_repr,
    .tp_str = dtype_repr,
    .tp_getset = dtype_getset,
    .tp_methods = dtype_methods,
};

/* ---- construction and lifetime -------------------------------------------------------- */

static PyObject *tensor_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"input_data", "dtype", NULL};
    PyObject *data = NULL, *dtype_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:Tensor", kwlist, &data, &dtype_obj)) return NULL;
    if (!data) {
        PyErr_SetString(PyExc_TypeError, "Tensor() needs input_data (a NumPy array, a number or a nested list)");
        return NULL;
    }
    kiln_dtype dtype = KILN_DTYPE_FLOAT32;
    if (dtype_obj != Py_None && pykiln_parse_dtype(dtype_obj, &dtype) != 0) return NULL;
    kiln_tensor *src = dtype_obj != Py_None ? pykiln_to_tensor_as(data, dtype) : pykiln_to_tensor(data, NULL);
    if (!src) return NULL;
    if (dtype_obj == Py_None) dtype = src->meta.dtype;
    /* always an owned copy: the new tensor never aliases the caller's memory */
    kiln_tensor *t = NULL;
    kiln_status s;
    if (pykiln_is_tensor(data) && kiln_tracer_active()) {
        /* Tensor(x) inside a capture: the copy is an op the trace records (a copy made here would be
         * a constant, this call's values at every later call); detached, as eagerly */
        bool was = kiln_set_grad_enabled(false);
        s = kiln_apply(KILN_OP_CONTIGUOUS, 1, &src, NULL, &t);
        kiln_set_grad_enabled(was);
    } else {
        s = kiln_tensor_empty(dtype, src->meta.ndim, src->meta.shape, &t);
        if (s == KILN_OK) s = kiln_copy_into(t, src);
    }
    if (s == KILN_OK) t->amp_exact = src->amp_exact; /* an integer-valued number: amp keeps it */
    kiln_tensor_release(src);
    if (s != KILN_OK) {
        kiln_tensor_release(t);
        return pykiln_raise(s);
    }
    PyObject *o = type->tp_alloc(type, 0);
    if (!o) {
        kiln_tensor_release(t);
        return NULL;
    }
    ((PyKilnTensor *)o)->t = t;
    return o;
}

static void tensor_dealloc(PyObject *self) {
    PyKilnTensor *p = (PyKilnTensor *)self;
    if (p->weakrefs) PyObject_ClearWeakRefs(self);
    kiln_tensor_release(p->t);
    p->t = NULL;
    Py_TYPE(self)->tp_free(self);
}

static Py_hash_t tensor_hash(PyObject *self) { return (Py_hash_t)((uintptr_t)self >> 4); }

/* ---- properties ---------------------------------------------------------------------------- */

#define T(self) (((PyKilnTensor *)(self))->t)

static PyObject *get_shape(PyObject *self, void *c) {
    (void)c;
    kiln_tensor *t = T(self);
    PyObject *sym = pykiln_sym_shape(self, 0);
    if (sym != Py_None) return sym;
    Py_DECREF(sym);
    PyObject *tup = PyTuple_New(t->meta.ndim);
    for (int d = 0; tup && d < t->meta.ndim; d++) PyTuple_SET_ITEM(tup, d, PyLong_FromLongLong(t->meta.shape[d]));
    return tup;
}

static PyObject *get_strides(PyObject *self, void *c) {
    (void)c;
    kiln_tensor *t = T(self);
    PyObject *tup = PyTuple_New(t->meta.ndim);
    for (int d = 0; tup && d < t->meta.ndim; d++) PyTuple_SET_ITEM(tup, d, PyLong_FromLongLong(t->strides[d]));
    return tup;
}

static PyObject *get_dtype(PyObject *self, void *c) {
    (void)c;
    PyObject *d = pykiln_dtypes[T(self)->meta.dtype];
    Py_INCREF(d);
    return d;
}

static PyObject *get_ndim(PyObject *self, void *c) {
    (void)c;
    return PyLong_FromLong(T(self)->meta.ndim);
}

static PyObject *get_size(PyObject *self, void *c) {
    (void)c;
    PyObject *sym = pykiln_sym_shape(self, 1);
    if (!sym) return NULL;
    Py_DECREF(sym);
    return PyLong_FromLongLong(T(self)->numel);
}

static PyObject *get_requires_grad(PyObject *self, void *c) {
    (void)c;
    return PyBool_FromLong(T(self)->requires_grad);
}

static int set_requires_grad(PyObject *self, PyObject *value, void *c) {
    (void)c;
    if (!value) {
        PyErr_SetString(PyExc_AttributeError, "requires_grad cannot be deleted");
        return -1;
    }
    int flag = PyObject_IsTrue(value);
    if (flag < 0) return -1;
    kiln_status s = kiln_tensor_set_requires_grad(T(self), flag);
    if (s != KILN_OK) {
        pykiln_raise(s);
        return -1;
    }
    return 0;
}

static PyObject *get_grad(PyObject *self, void *c) {
    (void)c;
    kiln_tensor *g = T(self)->grad;
    if (!g) Py_RETURN_NONE;
    kiln_tensor_retain(g);
    return pykiln_wrap(g);
}

static int set_grad(PyObject *self, PyObject *value, void *c) {
    (void)c;
    kiln_tensor *t = T(self);
    if (value && value != Py_None && !pykiln_is_tensor(value)) {
        PyErr_SetString(PyExc_TypeError, "grad must be a Tensor or None");
        return -1;
    }
    kiln_tensor *g = value && value != Py_None ? pykiln_unwrap(value) : NULL;
    if (g) kiln_tensor_retain(g);
    kiln_tensor_release(t->grad);
    t->grad = g;
    return 0;
}

static PyObject *get_is_leaf(PyObject *self, void *c) {
    (void)c;
    return PyBool_FromLong(T(self)->grad_fn == NULL);
}

static PyObject *get_version(PyObject *self, void *c) {
    (void)c;
    return PyLong_FromLongLong(kiln_tensor_version(T(self)));
}

static PyObject *get_read_only(PyObject *self, void *c) {
    (void)c;
    return PyBool_FromLong(kiln_tensor_is_read_only(T(self)));
}

static PyObject *get_data_ptr(PyObject *self, void *c) {
    (void)c;
    return PyLong_FromVoidPtr(T(self)->data);
}

static PyGetSetDef tensor_getset[] = {
    {"shape", get_shape, NULL, "the shape, a tuple of ints", NULL},
    {"dtype", get_dtype, NULL, "the element type", NULL},
    {"ndim", get_ndim, NULL, "the number of dimensions", NULL},
    {"size", get_size, NULL, "the number of elements", NULL},
    {"requires_grad", get_requires_grad, set_requires_grad, "whether gradients flow to this tensor", NULL},
    {"grad", get_grad, set_grad, "the gradient accumulated by backward()", NULL},
    {"is_leaf", get_is_leaf, NULL, "whether the tensor was not produced by a recorded op", NULL},
    {"_strides", get_strides, NULL, "strides in elements", NULL},
    {"_version", get_version, NULL, "storage version, bumped by in-place writes", NULL},
    {"_read_only", get_read_only, NULL, "whether the storage is read-only (shares a read-only buffer)", NULL},
    {"_data_ptr", get_data_ptr, NULL, "address of the first element", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* ---- methods -------------------------------------------------------------------------------- */

static PyObject *tensor_detach(PyObject *self, PyObject *unused) {
    (void)unused;
    kiln_tensor *d = NULL;
    kiln_status s = kiln_tensor_detach(T(self), &d);
    return s == KILN_OK ? pykiln_wrap(d) : pykiln_raise(s);
}

static PyObject *tensor_is_contiguous(PyObject *self, PyObject *unused) {
    (void)unused;
    return PyBool_FromLong(kiln_tensor_is_contiguous(T(self)));
}

static PyObject *tensor_shares_storage(PyObject *self, PyObject *other) {
    if (!pykiln_is_tensor(other)) {
        PyErr_SetString(PyExc_TypeError, "_shares_storage expects a Tensor");
        return NULL;
    }
    return PyBool_FromLong(kiln_tensor_same_storage(T(self), pykiln_unwrap(other)));
}

/* backward(gradient=None): accumulates into .grad of the leaves */
static PyObject *tensor_backward(PyObject *self, PyObject *args) {
    PyObject *gradient = Py_None;
    if (!PyArg_ParseTuple(args, "|O:backward", &gradient)) return NULL;
    kiln_tensor *t = T(self), *g = NULL;
    if (gradient != Py_None) {
        g = pykiln_to_tensor(gradient, t);
        if (!g) return NULL;
    } else if (t->numel != 1) {
        PyErr_Format(PyExc_RuntimeError, "backward: the gradient can be implied only for single-element outputs; "
                     "pass gradient= for a tensor of %lld elements", (long long)t->numel);
        return NULL;
    }
    if (pykiln_interrupt_stale() < 0 || pykiln_sym_note_backward(false) < 0) {
        kiln_tensor_release(g);
        return NULL;
    }
    pykiln_interrupt_arm(); /* a loop's gradient may run long */
    pykiln_backward_begin();
    kiln_status s = kiln_autograd_backward(1, &t, &g);
    kiln_tensor_release(g);
    if (s != KILN_OK) return pykiln_raise_backward(s);
    if (pykiln_sym_note_backward(true) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *tensor_item(PyObject *self, PyObject *unused) {
    (void)unused;
    kiln_tensor *t = T(self);
    if (t->numel != 1) {
        char buf[160];
        PyErr_Format(PyExc_ValueError, "item: only a tensor with one element can be converted to a Python "
                     "scalar, got shape %s", kiln_shape_str(&t->meta, buf, sizeof buf));
        return NULL;
    }
    kiln_tracer_note_value_read(t);
    double v = kiln_tensor_get_double(t, 0);
    switch (t->meta.dtype) {
    case KILN_DTYPE_BOOL: return PyBool_FromLong(v != 0);
    case KILN_DTYPE_INT64: return PyLong_FromLongLong(*(const int64_t *)t->data);
    case KILN_DTYPE_INT8: case KILN_DTYPE_INT32: return PyLong_FromLongLong((long long)v);
    default: return PyFloat_FromDouble(v);
    }
}

static PyObject *tensor_op_name(PyObject *self, PyObject *unused) {
    (void)unused;
    struct kiln_grad_node *n = T(self)->grad_fn;
    if (!n) Py_RETURN_NONE;
    return PyUnicode_FromString(kiln_grad_node_name(n));
}

static PyMethodDef tensor_methods[] = {
    {"detach", tensor_detach, METH_NOARGS, "a tensor sharing storage, without autograd history"},
    {"is_contiguous", tensor_is_contiguous, METH_NOARGS, "whether elements are laid out row-major without gaps"},
    {"_shares_storage", tensor_shares_storage, METH_O, "whether two tensors share storage"},
    {"backward", tensor_backward, METH_VARARGS, "accumulate gradients of this tensor into the leaves' .grad"},
    {"item", tensor_item, METH_NOARGS, "the single element as a Python scalar"},
    {"_grad_fn_name", tensor_op_name, METH_NOARGS, "name of the op that produced this tensor, if recorded"},
    {"__dlpack__", (PyCFunction)(void (*)(void))pykiln_tensor_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None): a DLPack capsule sharing this "
     "tensor's memory"},
    {"__dlpack_device__", pykiln_tensor_dlpack_device, METH_NOARGS, "(1, 0): DLPack's CPU device"},
    {"_add_grad_hook", pykiln_tensor_add_grad_hook, METH_O, "_add_grad_hook(fn) -> id: fn(grad) runs on this tensor's gradient"},
    {"_remove_grad_hook", pykiln_tensor_remove_grad_hook, METH_O, "_remove_grad_hook(id) -> whether it was there"},
    {"_has_grad_hooks", pykiln_tensor_has_grad_hooks, METH_NOARGS, "whether a gradient hook would see this tensor's gradient"},
    {"_leaf_grad_hooks", pykiln_tensor_leaf_grad_hooks, METH_NOARGS, "the Python gradient hooks of a leaf, in order"},
    {NULL, NULL, 0, NULL},
};

/* ---- operators ------------------------------------------------------------------------------ */

static PyObject *binary(PyObject *a, PyObject *b, kiln_op op) {
    kiln_tensor *ta, *tb, *out = NULL;
    bool ia = pykiln_is_tensor(a), ib = pykiln_is_tensor(b);
    if (ia && ib) {
        ta = pykiln_unwrap(a);
        tb = pykiln_unwrap(b);
        kiln_tensor *in[2] = {ta, tb};
        kiln_status s = kiln_apply(op, 2, in, NULL, &out);
        return s == KILN_OK ? pykiln_wrap(out) : pykiln_raise(s);
    }
    PyObject *other = ia ? b : a;
    if (!PyFloat_Check(other) && !PyLong_Check(other) && !PyObject_CheckBuffer(other) && !PyList_Check(other) &&
        !PyTuple_Check(other))
        Py_RETURN_NOTIMPLEMENTED;
    kiln_tensor *self_t = pykiln_unwrap(ia ? a : b);
    kiln_tensor *conv = pykiln_to_tensor(other, self_t);
    if (!conv) return NULL;
    kiln_tensor *in[2] = {ia ? self_t : conv, ia ? conv : self_t};
    kiln_status s = kiln_apply(op, 2, in, NULL, &out);
    kiln_tensor_release(conv);
    return s == KILN_OK ? pykiln_wrap(out) : pykiln_raise(s);
}

static PyObject *unary(PyObject *a, kiln_op op) {
    kiln_tensor *out = NULL, *t = T(a);
    kiln_status s = kiln_apply(op, 1, &t, NULL, &out);
    return s == KILN_OK ? pykiln_wrap(out) : pykiln_raise(s);
}

static PyObject *nb_add(PyObject *a, PyObject *b) { return binary(a, b, KILN_OP_ADD); }
static PyObject *nb_sub(PyObject *a, PyObject *b) { return binary(a, b, KILN_OP_SUB); }
static PyObject *nb_mul(PyObject *a, PyObject *b) { return binary(a, b, KILN_OP_MUL); }
static PyObject *nb_div(PyObject *a, PyObject *b) { return binary(a, b, KILN_OP_DIV); }
static PyObject *nb_matmul(PyObject *a, PyObject *b) { return binary(a, b, KILN_OP_MATMUL); }
static PyObject *nb_floor_divide(PyObject *a, PyObject *b) { return binary(a, b, KILN_OP_FLOOR_DIVIDE); }
static PyObject *nb_remainder(PyObject *a, PyObject *b) { return binary(a, b, KILN_OP_REMAINDER); }
/* divmod(a, b): (a // b, a % b), as NumPy's */
static PyObject *nb_divmod(PyObject *a, PyObject *b) {
    PyObject *q = nb_floor_divide(a, b);
    if (!q || q == Py_NotImplemented) return q;
    PyObject *r = nb_remainder(a, b);
    if (!r) {
        Py_DECREF(q);
        return NULL;
    }
    return Py_BuildValue("(NN)", q, r);
}
static PyObject *nb_neg(PyObject *a) { return unary(a, KILN_OP_NEG); }
static PyObject *nb_abs(PyObject *a) { return unary(a, KILN_OP_ABS); }
static PyObject *nb_pos(PyObject *a) {
    Py_INCREF(a);
    return a;
}

static PyObject *nb_pow(PyObject *a, PyObject *b, PyObject *mod) {
    if (mod != Py_None) {
        PyErr_SetString(PyExc_TypeError, "pow() with a modulus is not supported for tensors");
        return NULL;
    }
    /* an integer tensor to a negative integer power: Python gives a float, integer arithmetic 0 or
     * garbage; refused, as NumPy and PyTorch do */
    if (pykiln_is_tensor(a) && PyLong_Check(b) && !PyBool_Check(b)) {
        const kiln_tensor *t = pykiln_unwrap(a);
        int overflow = 0;
        long long e = PyLong_AsLongLongAndOverflow(b, &overflow);
        if (!kiln_dtype_is_float(t->meta.dtype) && t->meta.dtype != KILN_DTYPE_BOOL && (e < 0 || overflow < 0)) {
            char buf[160];
            PyErr_Format(PyExc_ValueError,
                         "pow: an integer tensor (%s %s) to a negative integer power (%S) is not an integer; "
                         "use x.float() ** n",
                         kiln_dtype_name(t->meta.dtype), kiln_shape_str(&t->meta, buf, sizeof buf), b);
            return NULL;
        }
    }
    return binary(a, b, KILN_OP_POW);
}

static int is_bool_tensor(PyObject *o) {
    return pykiln_is_tensor(o) && pykiln_unwrap(o)->meta.dtype == KILN_DTYPE_BOOL;
}

/* & | ^ of bool tensors (or a bool tensor and a Python bool) are the logical ops, as before and as
 * NumPy's; any integer operand makes them bitwise (floats: bitwise inference's TypeError) */
static PyObject *bitwise(PyObject *a, PyObject *b, kiln_op logical_op, kiln_op bitwise_op) {
    bool logical = (is_bool_tensor(a) || PyBool_Check(a)) && (is_bool_tensor(b) || PyBool_Check(b));
    return binary(a, b, logical ? logical_op : bitwise_op);
}

static PyObject *nb_and(PyObject *a, PyObject *b) { return bitwise(a, b, KILN_OP_LOGICAL_AND, KILN_OP_BITWISE_AND); }
static PyObject *nb_or(PyObject *a, PyObject *b) { return bitwise(a, b, KILN_OP_LOGICAL_OR, KILN_OP_BITWISE_OR); }
/* bool ^ bool is "not equal" */
static PyObject *nb_xor(PyObject *a, PyObject *b) { return bitwise(a, b, KILN_OP_NE, KILN_OP_BITWISE_XOR); }
static PyObject *nb_lshift(PyObject *a, PyObject *b) { return binary(a, b, KILN_OP_LEFT_SHIFT); }
static PyObject *nb_rshift(PyObject *a, PyObject *b) { return binary(a, b, KILN_OP_RIGHT_SHIFT); }
static PyObject *nb_invert(PyObject *a) { return unary(a, is_bool_tensor(a) ? KILN_OP_LOGICAL_NOT : KILN_OP_BITWISE_NOT); }

static int nb_bool(PyObject *self) {
    kiln_tensor *t = T(self);
    if (t->numel != 1) {
        char buf[160];
        PyErr_Format(PyExc_ValueError, "the truth value of a tensor of shape %s is ambiguous; use .any() or .all()",
                     kiln_shape_str(&t->meta, buf, sizeof buf));
        return -1;
    }
    kiln_tracer_note_value_read(t);
    return kiln_tensor_get_double(t, 0) != 0;
}

static PyObject *nb_float(PyObject *self) {
    PyObject *v = tensor_item(self, NULL);
    if (!v) return NULL;
    PyObject *f = PyNumber_Float(v);
    Py_DECREF(v);
    return f;
}

static PyObject *nb_int(PyObject *self) {
    PyObject *v = tensor_item(self, NULL);
    if (!v) return NULL;
    PyObject *i = PyNumber_Long(v);
    Py_DECREF(v);
    return i;
}

static PyObject *nb_index(PyObject *self) {
    kiln_tensor *t = T(self);
    if (kiln_dtype_is_float(t->meta.dtype) || t->numel != 1) {
        PyErr_SetString(PyExc_TypeError, "only integer tensors of a single element can be used as an index");
        return NULL;
    }
    return nb_int(self);
}

static PyNumberMethods tensor_as_number = {
    .nb_add = nb_add,
    .nb_subtract = nb_sub,
    .nb_multiply = nb_mul,
    .nb_true_divide = nb_div,
    .nb_floor_divide = nb_floor_divide,
    .nb_remainder = nb_remainder,
    .nb_divmod = nb_divmod,
    .nb_power = nb_pow,
    .nb_negative = nb_neg,
    .nb_positive = nb_pos,
    .nb_absolute = nb_abs,
    .nb_bool = nb_bool,
    .nb_invert = nb_invert,
    .nb_and = nb_and,
    .nb_or = nb_or,
    .nb_xor = nb_xor,
    .nb_lshift = nb_lshift,
    .nb_rshift = nb_rshift,
    .nb_int = nb_int,
    .nb_float = nb_float,
    .nb_index = nb_index,
    .nb_matrix_multiply = nb_matmul,
};

/* (pykiln.h) tensor OP v for a Python int v outside the integer tensor's dtype: NumPy 2 answers by the values
 * (int8 == 300 is all False, int8 < 300 all True) where arithmetic would raise. The answer is the
 * comparison of the tensor with its dtype's bound that holds for every element or for none, so it
 * stays an op on the tensor (recorded as such in a graph). Returns NULL with no error set when v
 * fits (or is no int, or the tensor no integer one). */
PyObject *pykiln_compare_out_of_range(PyObject *a, PyObject *v, kiln_op op) {
    if (!PyLong_Check(v) || PyBool_Check(v)) return NULL;
    kiln_dtype d = T(a)->meta.dtype;
    long long lo, hi;
    switch (d) {
    case KILN_DTYPE_INT8: lo = INT8_MIN, hi = INT8_MAX; break;
    case KILN_DTYPE_INT32: lo = INT32_MIN, hi = INT32_MAX; break;
    case KILN_DTYPE_INT64: lo = INT64_MIN, hi = INT64_MAX; break;
    default: return NULL;
    }
    int overflow = 0;
    long long iv = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (iv == -1 && PyErr_Occurred()) return NULL;
    bool above = overflow > 0 || (!overflow && iv > hi), below = overflow < 0 || (!overflow && iv < lo);
    if (!above && !below) return NULL;
    /* every element x has lo <= x <= hi: "x > hi" and "x < lo" are all False, "x <= hi", "x >= lo" all True */
    bool all_true = op == KILN_OP_NE || (above ? (op == KILN_OP_LT || op == KILN_OP_LE)
                                               : (op == KILN_OP_GT || op == KILN_OP_GE));
    kiln_op bound_op = above ? (all_true ? KILN_OP_LE : KILN_OP_GT) : (all_true ? KILN_OP_GE : KILN_OP_LT);
    PyObject *bound = PyLong_FromLongLong(above ? hi : lo);
    if (!bound) return NULL;
    PyObject *r = binary(a, bound, bound_op);
    Py_DECREF(bound);
    return r;
}

static PyObject *tensor_richcompare(PyObject *a, PyObject *b, int cmp) {
    static const kiln_op ops[] = {[Py_LT] = KILN_OP_LT, [Py_LE] = KILN_OP_LE, [Py_EQ] = KILN_OP_EQ,
                                  [Py_NE] = KILN_OP_NE, [Py_GT] = KILN_OP_GT, [Py_GE] = KILN_OP_GE};
    if (!pykiln_is_tensor(a)) { /* reflected: scalar OP tensor */
        static const int flip[] = {[Py_LT] = Py_GT, [Py_LE] = Py_GE, [Py_EQ] = Py_EQ,
                                   [Py_NE] = Py_NE, [Py_GT] = Py_LT, [Py_GE] = Py_LE};
        PyObject *r = pykiln_compare_out_of_range(b, a, ops[flip[cmp]]);
        return r || PyErr_Occurred() ? r : binary(b, a, ops[flip[cmp]]);
    }
    if (b == Py_None) {
        if (cmp == Py_EQ) Py_RETURN_FALSE;
        if (cmp == Py_NE) Py_RETURN_TRUE;
    }
    PyObject *r = pykiln_compare_out_of_range(a, b, ops[cmp]);
    return r || PyErr_Occurred() ? r : binary(a, b, ops[cmp]);
}

static Py_ssize_t mp_length(PyObject *self) {
    kiln_tensor *t = T(self);
    if (t->meta.ndim == 0) {
        PyErr_SetString(PyExc_TypeError, "len() of a 0-d tensor");
        return -1;
    }
    PyObject *sym = pykiln_sym_shape(self, 2);
    if (!sym) return -1;
    Py_DECREF(sym);
    return (Py_ssize_t)t->meta.shape[0];
}

static PyMappingMethods tensor_as_mapping = {
    .mp_length = mp_length,
    .mp_subscript = pykiln_tensor_getitem,
    .mp_ass_subscript = pykiln_tensor_setitem,
};

/* ---- buffer protocol: zero-copy views for NumPy ------------------------------------------ */

static const char *buffer_format(kiln_dtype d) {
    switch (d) {
    case KILN_DTYPE_BOOL: return "?";
    case KILN_DTYPE_INT8: return "b";
    case KILN_DTYPE_INT32: return "i";
    case KILN_DTYPE_INT64: return "q";
    case KILN_DTYPE_FLOAT16: return "e";
    case KILN_DTYPE_FLOAT32: return "f";
    case KILN_DTYPE_FLOAT64: return "d";
    default: return NULL;
    }
}

static int tensor_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    kiln_tensor *t = T(self);
    kiln_tracer_note_value_read(t);
    const char *fmt = buffer_format(t->meta.dtype);
    if (!fmt) {
        PyErr_Format(PyExc_BufferError, "%s tensors have no buffer format; convert with .astype(kiln.float32)",
                     kiln_dtype_name(t->meta.dtype));
        return -1;
    }
    if ((flags & PyBUF_ND) == PyBUF_ND && (flags & PyBUF_STRIDES) != PyBUF_STRIDES && !kiln_tensor_is_contiguous(t)) {
        PyErr_SetString(PyExc_BufferError, "tensor is not contiguous; call .contiguous() first");
        return -1;
    }
    /* read-only storage and broadcast views are exported read-only, as NumPy marks them */
    bool read_only = kiln_tensor_is_read_only(t) || kiln_tensor_overlaps(t);
    if (read_only && (flags & PyBUF_WRITABLE)) {
        PyErr_SetString(PyExc_BufferError, "tensor is read-only (it shares a read-only buffer or is a broadcast view)");
        return -1;
    }
    Py_ssize_t *dims = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)(t->meta.ndim ? t->meta.ndim : 1));
    if (!dims) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t item = (Py_ssize_t)kiln_dtype_size(t->meta.dtype);
    for (int d = 0; d < t->meta.ndim; d++) {
        dims[d] = (Py_ssize_t)t->meta.shape[d];
        dims[t->meta.ndim + d] = (Py_ssize_t)t->strides[d] * item;
    }
    if (!read_only) kiln_tensor_mark_escaped(t); /* NumPy may write it without a version bump */
    view->buf = t->data;
    view->obj = self;
    Py_INCREF(self);
    view->len = (Py_ssize_t)t->numel * item;
    view->readonly = read_only;
    view->itemsize = item;
    view->format = (flags & PyBUF_FORMAT) ? (char *)fmt : NULL;
    view->ndim = t->meta.ndim;
    view->shape = (flags & PyBUF_ND) ? dims : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? dims + t->meta.ndim : NULL;
    view->suboffsets = NULL;
    view->internal = dims;
    return 0;
}

static void tensor_releasebuffer(PyObject *self, Py_buffer *view) {
    (void)self;
    PyMem_Free(view->internal);
}

static PyBufferProcs tensor_as_buffer = {tensor_getbuffer, tensor_releasebuffer};

PyTypeObject PyKilnTensor_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._C.TensorBase",
    .tp_basicsize = sizeof(PyKilnTensor),
    .tp_dealloc = tensor_dealloc,
    .tp_as_number = &tensor_as_number,
    .tp_as_mapping = &tensor_as_mapping,
    .tp_as_buffer = &tensor_as_buffer,
    .tp_hash = tensor_hash,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The C side of kiln.Tensor.",
    .tp_richcompare = tensor_richcompare,
    .tp_weaklistoffset = offsetof(PyKilnTensor, weakrefs),
    .tp_methods = tensor_methods,
    .tp_getset = tensor_getset,
    .tp_new = tensor_new,
};

int pykiln_tensor_init_type(PyObject *module) {
    if (PyType_Ready(&PyKilnDType_Type) < 0 || PyType_Ready(&PyKilnTensor_Type) < 0) return -1;
    Py_INCREF(&PyKilnTensor_Type);
    if (PyModule_AddObject(module, "TensorBase", (PyObject *)&PyKilnTensor_Type) < 0) return -1;
    Py_INCREF(&PyKilnDType_Type);
    if (PyModule_AddObject(module, "dtype", (PyObject *)&PyKilnDType_Type) < 0) return -1;
    for (int d = 0; d < KILN_DTYPE_COUNT; d++) {
        PyKilnDType *o = PyObject_New(PyKilnDType, &PyKilnDType_Type);
        if (!o) return -1;
        o->id = (kiln_dtype)d;
        pykiln_dtypes[d] = (PyObject *)o; /* one reference kept for the life of the process */
        Py_INCREF(o);
        if (PyModule_AddObject(module, kiln_dtype_name((kiln_dtype)d), (PyObject *)o) < 0) return -1;
    }
    return 0;
}
