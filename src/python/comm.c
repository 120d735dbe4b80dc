/* kiln._C's bindings of the communication layer (src/comm/comm.h): init and finalize, ranks,
 * groups, the timeout and the agreement check, abort. The collectives themselves are ops
 * (kiln.ops.collective applies them). */
#include "pykiln.h"

#include "comm/comm.h"

static PyObject *py_comm_init(PyObject *self, PyObject *args) {
    (void)self;
    const char *backend = NULL;
    if (!PyArg_ParseTuple(args, "|z:comm_init", &backend)) return NULL;
    kiln_status s;
    Py_BEGIN_ALLOW_THREADS
    s = kiln_comm_init(backend);
    Py_END_ALLOW_THREADS
    if (s != KILN_OK) return pykiln_raise(s);
    return PyUnicode_FromString(kiln_comm_backend_name());
}

static PyObject *py_comm_finalize(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    kiln_status s = kiln_comm_finalize();
    if (s != KILN_OK) return pykiln_raise(s);
    Py_RETURN_NONE;
}

static PyObject *py_comm_initialized(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(kiln_comm_initialized());
}

static PyObject *py_comm_backend(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyUnicode_FromString(kiln_comm_backend_name());
}

static PyObject *py_comm_backend_names(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *text = PyUnicode_FromString(kiln_comm_backend_names());
    if (!text) return NULL;
    PyObject *sep = PyUnicode_FromString(",");
    PyObject *out = sep ? PyUnicode_Split(text, sep, -1) : NULL;
    Py_XDECREF(sep);
    Py_DECREF(text);
    return out;
}

static PyObject *py_comm_default_backend(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyUnicode_FromString(kiln_comm_default_backend());
}

static PyObject *py_comm_rank(PyObject *self, PyObject *args) {
    (void)self;
    int group = 0, rank = 0;
    if (!PyArg_ParseTuple(args, "|i:comm_rank", &group)) return NULL;
    kiln_status s = kiln_comm_rank(group, &rank);
    if (s != KILN_OK) return pykiln_raise(s);
    return PyLong_FromLong(rank);
}

static PyObject *py_comm_size(PyObject *self, PyObject *args) {
    (void)self;
    int group = 0, size = 0;
    if (!PyArg_ParseTuple(args, "|i:comm_size", &group)) return NULL;
    kiln_status s = kiln_comm_size(group, &size);
    if (s != KILN_OK) return pykiln_raise(s);
    return PyLong_FromLong(size);
}

static PyObject *py_comm_create_group(PyObject *self, PyObject *arg) {
    (void)self;
    PyObject *seq = PySequence_Fast(arg, "comm_create_group: ranks must be a sequence of ints");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > 1 << 20) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "comm_create_group: %zd ranks", n);
    }
    int *ranks = PyMem_Malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!ranks) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, k);
        long v = PyLong_Check(item) && !PyBool_Check(item) ? PyLong_AsLong(item) : -1;
        if (!PyLong_Check(item) || PyBool_Check(item) || v < 0 || v > 1 << 30) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "create_group: rank %zd must be an int >= 0", k);
            PyMem_Free(ranks);
            Py_DECREF(seq);
            return NULL;
        }
        ranks[k] = (int)v;
    }
    Py_DECREF(seq);
    int group = 0;
    kiln_status s;
    Py_BEGIN_ALLOW_THREADS
    s = kiln_comm_group_create(ranks, (int)n, &group);
    Py_END_ALLOW_THREADS
    PyMem_Free(ranks);
    if (s != KILN_OK) return pykiln_raise(s);
    return PyLong_FromLong(group);
}

static PyObject *py_comm_destroy_group(PyObject *self, PyObject *arg) {
    (void)self;
    int group = (int)PyLong_AsLong(arg);
    if (group == -1 && PyErr_Occurred()) return NULL;
    kiln_status s = kiln_comm_group_destroy(group);
    if (s != KILN_OK) return pykiln_raise(s);
    Py_RETURN_NONE;
}

static PyObject *py_comm_set_timeout(PyObject *self, PyObject *arg) {
    (void)self;
    double t = PyFloat_AsDouble(arg);
    if (t == -1.0 && PyErr_Occurred()) return NULL;
    kiln_comm_set_timeout(t);
    Py_RETURN_NONE;
}

static PyObject *py_comm_timeout(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyFloat_FromDouble(kiln_comm_timeout());
}

static PyObject *py_comm_set_check(PyObject *self, PyObject *arg) {
    (void)self;
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    kiln_comm_set_check(on);
    Py_RETURN_NONE;
}

static PyObject *py_comm_set_deterministic(PyObject *self, PyObject *arg) {
    (void)self;
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    kiln_comm_set_deterministic(on);
    Py_RETURN_NONE;
}

static PyObject *py_comm_deterministic(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(kiln_comm_deterministic());
}

static PyObject *py_comm_set_fusion_bytes(PyObject *self, PyObject *arg) {
    (void)self;
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n <= 0) {
        PyErr_SetString(PyExc_ValueError, "comm_set_fusion_bytes: the bucket size must be > 0 bytes");
        return NULL;
    }
    kiln_comm_set_fusion_bytes(n);
    Py_RETURN_NONE;
}

static PyObject *py_comm_fusion_bytes(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromLongLong(kiln_comm_fusion_bytes());
}

static PyObject *py_comm_collective_count(PyObject *self, PyObject *args) {
    (void)self;
    int group = 0;
    if (!PyArg_ParseTuple(args, "|i", &group)) return NULL;
    long long n = 0;
    kiln_status s = kiln_comm_collective_count(group, &n);
    if (s != KILN_OK) return pykiln_raise(s);
    return PyLong_FromLongLong(n);
}

static PyObject *py_comm_set_overlap(PyObject *self, PyObject *arg) {
    (void)self;
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    kiln_comm_set_overlap(on);
    Py_RETURN_NONE;
}

static PyObject *py_comm_overlap(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(kiln_comm_overlap());
}

static PyObject *py_comm_all_reduce_seconds(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyFloat_FromDouble(kiln_comm_all_reduce_seconds());
}

static PyObject *py_comm_bucket_counts(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    long long in_place, packed;
    double seconds;
    kiln_comm_bucket_counts(&in_place, &packed, &seconds);
    return Py_BuildValue("(LLd)", in_place, packed, seconds);
}

static PyObject *py_comm_abort(PyObject *self, PyObject *arg) {
    (void)self;
    int code = (int)PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred()) return NULL;
    kiln_comm_abort(code);
}

static PyMethodDef comm_methods[] = {
    {"comm_init", py_comm_init, METH_VARARGS,
     "comm_init(backend=None) -> the backend's name; None chooses (KILN_COMM_BACKEND, the launcher's, else local)"},
    {"comm_finalize", py_comm_finalize, METH_NOARGS, "ends communication (MPI_Finalize for mpi)"},
    {"comm_initialized", py_comm_initialized, METH_NOARGS, "whether comm_init ran (and no finalize after it)"},
    {"comm_backend", py_comm_backend, METH_NOARGS, "the initialized backend's name ('' before init)"},
    {"comm_backend_names", py_comm_backend_names, METH_NOARGS, "the communication backends, a list of names"},
    {"comm_default_backend", py_comm_default_backend, METH_NOARGS, "the backend comm_init() would choose now"},
    {"comm_rank", py_comm_rank, METH_VARARGS, "comm_rank(group=0): this process's rank in the group"},
    {"comm_size", py_comm_size, METH_VARARGS, "comm_size(group=0): the number of ranks of the group"},
    {"comm_create_group", py_comm_create_group, METH_O, "comm_create_group(ranks) -> group id (members call it)"},
    {"comm_destroy_group", py_comm_destroy_group, METH_O, "comm_destroy_group(group)"},
    {"comm_set_timeout", py_comm_set_timeout, METH_O, "seconds a collective waits for the other ranks (<= 0: ever)"},
    {"comm_timeout", py_comm_timeout, METH_NOARGS, "seconds a collective waits for the other ranks"},
    {"comm_set_check", py_comm_set_check, METH_O,
     "whether ranks compare each collective, dtype and shape before its data (default True)"},
    {"comm_set_deterministic", py_comm_set_deterministic, METH_O,
     "whether float all-reduces (sum, mean, prod) combine the ranks' tensors in rank order (default False)"},
    {"comm_deterministic", py_comm_deterministic, METH_NOARGS, "whether all-reduces combine in rank order"},
    {"comm_set_fusion_bytes", py_comm_set_fusion_bytes, METH_O,
     "the most bytes one fused (bucketed) all-reduce carries; the bucketing pass reads it at compile time"},
    {"comm_fusion_bytes", py_comm_fusion_bytes, METH_NOARGS, "the most bytes one fused all-reduce carries"},
    {"comm_collective_count", py_comm_collective_count, METH_VARARGS,
     "comm_collective_count(group=0): how many collectives this rank ran in the group"},
    {"comm_set_overlap", py_comm_set_overlap, METH_O,
     "whether graphs compiled from now on start each gradient bucket's all-reduce after its last gradient and "
     "wait at its first use (default False; KILN_COMM_OVERLAP=1 at init)"},
    {"comm_overlap", py_comm_overlap, METH_NOARGS, "whether compiled buckets overlap (comm_set_overlap)"},
    {"comm_all_reduce_seconds", py_comm_all_reduce_seconds, METH_NOARGS,
     "seconds this process spent in the backend's all-reduce calls (blocking, starts and waits)"},
    {"comm_bucket_counts", py_comm_bucket_counts, METH_NOARGS,
     "(in place, packed, seconds): how many gradient buckets this process reduced where the plan laid their "
     "tensors out, and by packing them, and the seconds spent in those calls (headers, packing, all-reduce)"},
    {"comm_abort", py_comm_abort, METH_O, "comm_abort(code): ends every rank of the job; does not return"},
    {NULL, NULL, 0, NULL},
};

int pykiln_comm_init(PyObject *module) { return PyModule_AddFunctions(module, comm_methods); }
