/* The kiln._C module: op application driven by the op table, autograd entry points, seeds,
 * threads. Reference notes: arguments are borrowed; every returned object is a new reference. */
#include "pykiln.h"

#include "codegen/codegen.h"
#include "core/internal.h"
#include "ops/conv_epilogue.h"

/* Fills attrs from two optional sequences of ints and floats. */
static int parse_attrs(PyObject *ints, PyObject *floats, kiln_attrs *a) {
    kiln_attrs_clear(a);
    if (ints && ints != Py_None) {
        PyObject *seq = PySequence_Fast(ints, "op attributes must be a sequence of ints");
        if (!seq) return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n > KILN_MAX_ATTR_INTS) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "too many int attributes (%zd > %d)", n, KILN_MAX_ATTR_INTS);
            return -1;
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, k));
            if (v == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return -1;
            }
            kiln_attrs_push_int(a, v);
        }
        Py_DECREF(seq);
    }
    if (floats && floats != Py_None) {
        PyObject *seq = PySequence_Fast(floats, "op attributes must be a sequence of floats");
        if (!seq) return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n > KILN_MAX_ATTR_FLOATS) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "too many float attributes (%zd > %d)", n, KILN_MAX_ATTR_FLOATS);
            return -1;
        }
        for (Py_ssize_t k = 0; k < n; k++) {
            double v = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, k));
            if (v == -1.0 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return -1;
            }
            kiln_attrs_push_float(a, v);
        }
        Py_DECREF(seq);
    }
    return 0;
}

/* Converts a sequence of tensors (or values, converted next to the first tensor) into new refs. */
static kiln_tensor **tensors_from_seq(PyObject *seq_obj, Py_ssize_t *count) {
    PyObject *seq = PySequence_Fast(seq_obj, "expected a sequence of tensors");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    kiln_tensor **ts = PyMem_Calloc((size_t)(n ? n : 1), sizeof *ts);
    if (!ts) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return NULL;
    }
    const kiln_tensor *like = NULL;
    for (Py_ssize_t k = 0; k < n && !like; k++)
        if (pykiln_is_tensor(PySequence_Fast_GET_ITEM(seq, k))) like = pykiln_unwrap(PySequence_Fast_GET_ITEM(seq, k));
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, k);
        ts[k] = item == Py_None ? NULL : pykiln_to_tensor(item, like);
        if (!ts[k] && item != Py_None) {
            kiln_release_all(ts, (int)k);
            PyMem_Free(ts);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    *count = n;
    return ts;
}

static void free_tensors(kiln_tensor **ts, Py_ssize_t n) {
    kiln_release_all(ts, (int)n);
    PyMem_Free(ts);
}

static PyObject *wrap_outputs(kiln_tensor **out, int nout) {
    if (nout == 1) return pykiln_wrap(out[0]);
    PyObject *tup = PyTuple_New(nout);
    if (!tup) {
        kiln_release_all(out, nout);
        return NULL;
    }
    for (int k = 0; k < nout; k++) {
        PyObject *o = pykiln_wrap(out[k]);
        out[k] = NULL;
        if (!o) {
            kiln_release_all(out + k + 1, nout - k - 1);
            Py_DECREF(tup);
            return NULL;
        }
        PyTuple_SET_ITEM(tup, k, o);
    }
    return tup;
}

PyObject *pykiln_apply(kiln_op op, PyObject *inputs, const kiln_attrs *attrs) {
    if (pykiln_interrupt_stale() < 0) return NULL;
    kiln_tensor *small[8], **in = small;
    Py_ssize_t nin = 0;
    bool fast = PyTuple_Check(inputs) && PyTuple_GET_SIZE(inputs) <= 8;
    if (fast) { /* borrowed tensors straight from the tuple */
        nin = PyTuple_GET_SIZE(inputs);
        for (Py_ssize_t k = 0; k < nin && fast; k++) {
            PyObject *item = PyTuple_GET_ITEM(inputs, k);
            fast = pykiln_is_tensor(item);
            if (fast) in[k] = pykiln_unwrap(item);
        }
    }
    bool owned = !fast;
    if (owned) {
        in = tensors_from_seq(inputs, &nin);
        if (!in) return NULL;
    }
    kiln_tensor *out[KILN_MAX_OUTPUTS] = {0};
    kiln_status s = kiln_apply(op, (int)nin, in, attrs, out);
    if (owned) free_tensors(in, nin);
    if (s != KILN_OK) return pykiln_raise(s);
    return wrap_outputs(out, kiln_op_nout(op, attrs));
}

/* apply(op: int, inputs: sequence, ints=(), floats=()) -> Tensor | tuple */
static PyObject *py_apply(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < 2 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "apply(op, inputs, ints=(), floats=())");
        return NULL;
    }
    long op = PyLong_AsLong(args[0]);
    if (op == -1 && PyErr_Occurred()) return NULL;
    if (op < 0 || op >= KILN_OP_COUNT) {
        PyErr_Format(PyExc_ValueError, "unknown op %ld", op);
        return NULL;
    }
    kiln_attrs attrs;
    if (parse_attrs(nargs > 2 ? args[2] : NULL, nargs > 3 ? args[3] : NULL, &attrs) != 0) return NULL;
    return pykiln_apply((kiln_op)op, args[1], &attrs);
}

/* infer(op, inputs, ints=(), floats=()) -> list of (shape, dtype) */
static PyObject *py_infer(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs < 2 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "infer(op, inputs, ints=(), floats=())");
        return NULL;
    }
    long op = PyLong_AsLong(args[0]);
    if (op < 0 || op >= KILN_OP_COUNT) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "unknown op %ld", op);
        return NULL;
    }
    kiln_attrs attrs;
    if (parse_attrs(nargs > 2 ? args[2] : NULL, nargs > 3 ? args[3] : NULL, &attrs) != 0) return NULL;
    Py_ssize_t nin = 0;
    kiln_tensor **in = tensors_from_seq(args[1], &nin);
    if (!in) return NULL;
    kiln_meta metas[KILN_MAX_OUTPUTS];
    kiln_status s = kiln_infer((kiln_op)op, (int)nin, in, &attrs, metas);
    free_tensors(in, nin);
    if (s != KILN_OK) return pykiln_raise(s);
    int nout = kiln_op_nout((kiln_op)op, &attrs);
    PyObject *list = PyList_New(nout);
    for (int k = 0; list && k < nout; k++) {
        PyObject *shape = PyTuple_New(metas[k].ndim);
        for (int d = 0; shape && d < metas[k].ndim; d++) PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(metas[k].shape[d]));
        PyList_SET_ITEM(list, k, Py_BuildValue("(NO)", shape, pykiln_dtypes[metas[k].dtype]));
    }
    return list;
}

/* op_table() -> list of (name, nin, nout, differentiable, fusion, c_expr, side_effects, control,
 * checks_values) in enum order */
static PyObject *py_op_table(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *list = PyList_New(KILN_OP_COUNT);
    for (int op = 0; list && op < KILN_OP_COUNT; op++) {
        const kiln_op_info *info = &kiln_op_table[op];
        PyList_SET_ITEM(list, op, Py_BuildValue("(siiOizOOO)", info->name, info->nin, info->nout,
                                                kiln_op_differentiable((kiln_op)op) ? Py_True : Py_False,
                                                (int)info->fusion, info->c_expr,
                                                kiln_op_has_side_effects((kiln_op)op) ? Py_True : Py_False,
                                                info->flags & KILN_OPF_CONTROL ? Py_True : Py_False,
                                                info->flags & KILN_OPF_CHECKS_VALUES ? Py_True : Py_False));
    }
    return list;
}

/* grad(outputs, inputs, grad_outputs=None, create_graph=False) -> tuple (None where unused) */
static PyObject *py_grad(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *outs_obj, *ins_obj, *gouts_obj = Py_None;
    int create_graph = 0;
    if (!PyArg_ParseTuple(args, "OO|Op:grad", &outs_obj, &ins_obj, &gouts_obj, &create_graph)) return NULL;
    Py_ssize_t nout = 0, nin = 0, ngout = 0;
    kiln_tensor **outs = tensors_from_seq(outs_obj, &nout), **ins = NULL, **gouts = NULL, **grads = NULL;
    PyObject *result = NULL;
    if (!outs) return NULL;
    ins = tensors_from_seq(ins_obj, &nin);
    if (!ins) goto done;
    for (Py_ssize_t k = 0; k < nout; k++)
        if (!outs[k]) {
            PyErr_SetString(PyExc_TypeError, "grad: outputs must be tensors");
            goto done;
        }
    if (gouts_obj != Py_None) {
        gouts = tensors_from_seq(gouts_obj, &ngout);
        if (!gouts) goto done;
        if (ngout != nout) {
            PyErr_Format(PyExc_ValueError, "grad: %zd grad_outputs for %zd outputs", ngout, nout);
            goto done;
        }
    }
    grads = PyMem_Calloc((size_t)(nin ? nin : 1), sizeof *grads);
    if (!grads) {
        PyErr_NoMemory();
        goto done;
    }
    if (pykiln_interrupt_stale() < 0 || pykiln_sym_note_backward(false) < 0) goto done;
    pykiln_interrupt_arm(); /* a loop's gradient may run long */
    pykiln_backward_begin();
    kiln_status s = kiln_autograd_grad((int)nout, outs, gouts, (int)nin, ins, create_graph, grads);
    if (s != KILN_OK) {
        pykiln_raise_backward(s);
        goto done;
    }
    if (pykiln_sym_note_backward(true) < 0) goto done;
    result = PyTuple_New(nin);
    for (Py_ssize_t k = 0; result && k < nin; k++) {
        if (grads[k]) {
            PyTuple_SET_ITEM(result, k, pykiln_wrap(grads[k]));
            grads[k] = NULL;
        } else {
            Py_INCREF(Py_None);
            PyTuple_SET_ITEM(result, k, Py_None);
        }
    }
done:
    if (grads) free_tensors(grads, nin);
    if (gouts) free_tensors(gouts, ngout);
    if (ins) free_tensors(ins, nin);
    free_tensors(outs, nout);
    return result;
}

static PyObject *py_set_grad_enabled(PyObject *self, PyObject *arg) {
    (void)self;
    int flag = PyObject_IsTrue(arg);
    if (flag < 0) return NULL;
    return PyBool_FromLong(kiln_set_grad_enabled(flag));
}

static PyObject *py_is_grad_enabled(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(kiln_grad_enabled());
}

/* amp_set(level, dtype) -> (previous level, previous dtype or None): the thread's mixed precision */
static PyObject *py_amp_set(PyObject *self, PyObject *args) {
    (void)self;
    int level;
    PyObject *dtype;
    kiln_dtype low = KILN_DTYPE_FLOAT32;
    if (!PyArg_ParseTuple(args, "iO:amp_set", &level, &dtype)) return NULL;
    if (dtype != Py_None && pykiln_parse_dtype(dtype, &low) < 0) return NULL;
    kiln_amp_level prev;
    kiln_dtype prev_low;
    kiln_status s = kiln_amp_set((kiln_amp_level)level, low, &prev, &prev_low);
    if (s != KILN_OK) return pykiln_raise(s);
    return Py_BuildValue("(iO)", (int)prev, prev == KILN_AMP_O0 ? Py_None : pykiln_dtypes[prev_low]);
}

/* amp_state() -> None, or (level, dtype) while amp is on in this thread */
static PyObject *py_amp_state(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    kiln_amp_level level;
    kiln_dtype low;
    kiln_amp_get(&level, &low);
    if (level == KILN_AMP_O0) Py_RETURN_NONE;
    return Py_BuildValue("(iO)", (int)level, pykiln_dtypes[low]);
}

/* amp_class(op name) -> "low", "fp32", "accum" or "promote" (ops.def's KILN_AMP lines) */
static PyObject *py_amp_class(PyObject *self, PyObject *arg) {
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    kiln_op op = kiln_op_from_name(name);
    if (op == KILN_OP_COUNT) return PyErr_Format(PyExc_ValueError, "amp_class: unknown op '%s'", name);
    static const char *const names[] = {"promote", "low", "fp32", "accum"};
    return PyUnicode_FromString(names[kiln_amp_class_of(op)]);
}

static PyObject *py_manual_seed(PyObject *self, PyObject *arg) {
    (void)self;
    unsigned long long seed = PyLong_AsUnsignedLongLongMask(arg);
    if (PyErr_Occurred()) return NULL;
    kiln_manual_seed(seed);
    Py_RETURN_NONE;
}

/* random_state() -> (key, counter): the generator's state, for set_random_state */
static PyObject *py_random_state(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    uint64_t key, counter;
    kiln_random_get_state(&key, &counter);
    return Py_BuildValue("(KK)", (unsigned long long)key, (unsigned long long)counter);
}

static PyObject *py_set_random_state(PyObject *self, PyObject *arg) {
    (void)self;
    unsigned long long key, counter;
    if (!PyArg_ParseTuple(arg, "KK:set_random_state", &key, &counter)) return NULL;
    kiln_random_set_state(key, counter);
    Py_RETURN_NONE;
}

/* set_num_threads(n): n an int (or has __index__) in [1, KILN_MAX_THREADS] */
static PyObject *py_set_num_threads(PyObject *self, PyObject *arg) {
    (void)self;
    if (PyBool_Check(arg) || !PyIndex_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "set_num_threads: the count must be an int, got %.100s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    PyObject *index = PyNumber_Index(arg); /* new reference */
    if (!index) return NULL;
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (overflow) n = overflow > 0 ? INT64_MAX : INT64_MIN; /* out of range either way */
    kiln_status s = kiln_set_num_threads((int64_t)n);
    if (s != KILN_OK) {
        if (overflow) PyErr_Format(PyExc_ValueError, "set_num_threads: the count must be between 1 and %d, got %R",
                                   KILN_MAX_THREADS, arg);
        else pykiln_raise(s);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_get_num_threads(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromLong(kiln_num_threads());
}

/* from_numpy(array): a tensor sharing the array's memory; read-only when the buffer is */
static PyObject *py_from_buffer(PyObject *self, PyObject *arg) {
    (void)self;
    if (pykiln_is_tensor(arg) || !PyObject_CheckBuffer(arg)) {
        PyErr_Format(PyExc_TypeError, "from_numpy expects a NumPy array (or another buffer), got %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    kiln_tensor *t = pykiln_to_tensor(arg, NULL);
    return t ? pykiln_wrap(t) : NULL;
}

static PyObject *py_set_tensor_class(PyObject *self, PyObject *cls) {
    (void)self;
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyKilnTensor_Type)) {
        PyErr_SetString(PyExc_TypeError, "_set_tensor_class expects a subclass of TensorBase");
        return NULL;
    }
    Py_INCREF(cls); /* kept for the life of the process */
    pykiln_tensor_class = (PyTypeObject *)cls;
    Py_RETURN_NONE;
}

static PyObject *py_tensor_class(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    Py_INCREF(pykiln_tensor_class);
    return (PyObject *)pykiln_tensor_class;
}

static PyObject *py_dtype_from_name(PyObject *self, PyObject *name) {
    (void)self;
    kiln_dtype d;
    if (pykiln_parse_dtype(name, &d) != 0) return NULL;
    Py_INCREF(pykiln_dtypes[d]);
    return pykiln_dtypes[d];
}

/* Returns a new dict: the fused-kernel compiler's counters of this process. */
static PyObject *py_codegen_stats(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    kiln_codegen_stats st;
    kiln_codegen_get_stats(&st);
    return Py_BuildValue("{s:L,s:L,s:L,s:L,s:d}", "compiles", (long long)st.compiles, "disk_hits",
                         (long long)st.disk_hits, "memory_hits", (long long)st.memory_hits, "rebuilt",
                         (long long)st.rebuilt, "compile_seconds", st.compile_seconds);
}

/* Returns a new int: the channel block of the blocked layout the layout pass uses on this CPU
 * (16 with AVX-512, 8 with AVX2; 0: the pass is off). */
static PyObject *py_conv_block_size(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromLong(kiln_conv_block_size());
}

/* Returns a new tuple (count, [descriptions]): the oneDNN primitives made with oneDNN's slow
 * reference implementation in this process (kiln_dnnl_ref_count), and the distinct ones. */
static PyObject *py_dnnl_ref_primitives(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    int64_t count = kiln_dnnl_ref_count();
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    const char *d;
    for (int64_t i = 0; (d = kiln_dnnl_ref_describe(i)); i++) {
        PyObject *str = PyUnicode_FromString(d);
        if (!str || PyList_Append(list, str) < 0) {
            Py_XDECREF(str);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(str);
    }
    return Py_BuildValue("(LN)", (long long)count, list); /* steals list */
}

/* The convolutions kiln's Winograd kernel ran in this process (kiln_conv_winograd_count). */
static PyObject *py_conv_winograd_count(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromLongLong((long long)kiln_conv_winograd_count());
}

static PyMethodDef module_methods[] = {
    {"register_check", pykiln_register_check, METH_O, "register_check(exception) -> id of a check op"},
    {"apply", (PyCFunction)(void (*)(void))py_apply, METH_FASTCALL, "apply(op, inputs, ints=(), floats=())"},
    {"infer", (PyCFunction)(void (*)(void))py_infer, METH_FASTCALL, "infer(op, inputs, ints=(), floats=())"},
    {"op_table", py_op_table, METH_NOARGS, "the op table: (name, nin, nout, differentiable, fusion, c_expr, side_effects, control, checks_values)"},
    {"grad", py_grad, METH_VARARGS, "grad(outputs, inputs, grad_outputs=None, create_graph=False)"},
    {"backward_passes", pykiln_backward_passes, METH_NOARGS, "backward_passes() -> how many backward passes Python began"},
    {"set_grad_enabled", py_set_grad_enabled, METH_O, "set grad mode; returns the previous mode"},
    {"amp_set", py_amp_set, METH_VARARGS, "amp_set(level, dtype) -> the previous (level, dtype): mixed precision of this thread"},
    {"amp_state", py_amp_state, METH_NOARGS, "None, or (level, dtype) while mixed precision is on in this thread"},
    {"amp_class", py_amp_class, METH_O, "amp_class(op) -> 'low', 'fp32', 'accum' or 'promote' (ops.def's KILN_AMP)"},
    {"is_grad_enabled", py_is_grad_enabled, METH_NOARGS, "whether grad mode is on"},
    {"manual_seed", py_manual_seed, METH_O, "seed the random generator"},
    {"random_state", py_random_state, METH_NOARGS, "random_state() -> (key, counter) of the random generator"},
    {"set_random_state", py_set_random_state, METH_O, "set_random_state((key, counter)): as random_state gave it"},
    {"set_num_threads", py_set_num_threads, METH_O, "set the number of threads"},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "the number of threads"},
    {"from_numpy", py_from_buffer, METH_O, "a tensor sharing the memory of a NumPy array (read-only if the buffer is)"},
    {"from_dlpack", (PyCFunction)(void (*)(void))pykiln_from_dlpack, METH_VARARGS | METH_KEYWORDS,
     "from_dlpack(x, /, *, device=None, copy=None): a tensor sharing the memory of a DLPack producer"},
    {"_set_tensor_class", py_set_tensor_class, METH_O, "register the class of new tensors"},
    {"tensor_class", py_tensor_class, METH_NOARGS,
     "tensor_class()\n--\n\nThe class of new tensors: kiln.Tensor once kiln._tensor registered it, TensorBase before."},
    {"dtype_from_name", py_dtype_from_name, METH_O, "the dtype object of a name"},
    {"codegen_stats", py_codegen_stats, METH_NOARGS, "counters of the fused-kernel compiler in this process"},
    {"conv_block_size", py_conv_block_size, METH_NOARGS, "the channel block of the CPU's blocked conv layout (0: none)"},
    {"conv_winograd_count", py_conv_winograd_count, METH_NOARGS,
     "the convolutions run through kiln's own Winograd kernel in this process"},
    {"dnnl_ref_primitives", py_dnnl_ref_primitives, METH_NOARGS,
     "(count, descriptions) of the oneDNN primitives made with its slow reference implementation"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kiln_module = {
    PyModuleDef_HEAD_INIT, "kiln._C", "The C core of kiln.", -1, module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__C(void);
PyMODINIT_FUNC PyInit__C(void) {
    PyObject *m = PyModule_Create(&kiln_module);
    if (!m) return NULL;
    if (pykiln_tensor_init_type(m) < 0 || pykiln_graph_init_types(m) < 0 || pykiln_compile_options_init(m) < 0 || pykiln_model_init(m) < 0 || pykiln_dispatcher_init_type(m) < 0 ||
        pykiln_guards_init_type(m) < 0 || pykiln_code_facts_init_type(m) < 0 ||
        pykiln_guard_recorder_init_type(m) < 0 || pykiln_tree_init(m) < 0 ||
        pykiln_shape_init(m) < 0 || pykiln_sym_hooks_init(m) < 0 || pykiln_sym_expr_init(m) < 0 || pykiln_cell_init(m) < 0 ||
        pykiln_reductions_init(m) < 0 || pykiln_elementwise_init(m) < 0 ||
        pykiln_frame_hook_init(m) < 0 || pykiln_eval_frame_init(m) < 0 || pykiln_bytecode_steps_init(m) < 0 || pykiln_custom_grad_init(m) < 0 || pykiln_vmap_init(m) < 0 || pykiln_config_init(m) < 0 || pykiln_gemm_select_init(m) < 0 || pykiln_comm_init(m) < 0 || pykiln_interrupt_init() < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
