/* kiln._C.gemm_*: the table of GEMM providers per shape class (src/ops/gemm_select.h), which
 * kiln.gemm_select fills from its calibration, and the timing that calibration runs. Classes and
 * providers travel by name. */
#include "pykiln.h"

#include "ops/gemm_bf16.h"
#include "ops/gemm_select.h"

static int find_name(PyObject *name, const char *(*name_of)(int), int count, const char *what) {
    const char *s = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
    if (s)
        for (int i = 0; i < count; i++)
            if (!strcmp(s, name_of(i))) return i;
    if (!PyErr_Occurred()) {
        PyObject *names = PyList_New(0);
        for (int i = 0; names && i < count; i++) {
            PyObject *n = PyUnicode_FromString(name_of(i));
            if (!n || PyList_Append(names, n) < 0) Py_CLEAR(names);
            Py_XDECREF(n);
        }
        if (names) PyErr_Format(PyExc_ValueError, "unknown GEMM %s %R; accepted: %R", what, name, names);
        Py_XDECREF(names);
    }
    return -1;
}

static PyObject *names_tuple(const char *(*name_of)(int), int count) {
    PyObject *t = PyTuple_New(count);
    for (int i = 0; t && i < count; i++) {
        PyObject *n = PyUnicode_FromString(name_of(i));
        if (!n) Py_CLEAR(t);
        else PyTuple_SET_ITEM(t, i, n);
    }
    return t;
}

static PyObject *py_gemm_classes(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return names_tuple(kiln_gemm_class_name, KILN_GEMM_CLASSES);
}

static PyObject *py_gemm_providers(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return names_tuple(kiln_gemm_provider_name, KILN_GEMM_PROVIDERS);
}

/* gemm_table(used=False) -> {class: provider}: the table, or (used) what kiln_sgemm runs now. */
static PyObject *py_gemm_table(PyObject *self, PyObject *args) {
    (void)self;
    int used = 0;
    if (!PyArg_ParseTuple(args, "|p", &used)) return NULL;
    PyObject *d = PyDict_New();
    for (int c = 0; d && c < KILN_GEMM_CLASSES; c++) {
        PyObject *v = PyUnicode_FromString(
            kiln_gemm_provider_name(used ? kiln_gemm_provider_used(c) : kiln_gemm_provider_of(c)));
        if (!v || PyDict_SetItemString(d, kiln_gemm_class_name(c), v) < 0) Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

static PyObject *py_gemm_set_provider(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cls, *provider;
    if (!PyArg_ParseTuple(args, "OO", &cls, &provider)) return NULL;
    int c = find_name(cls, kiln_gemm_class_name, KILN_GEMM_CLASSES, "shape class");
    if (c < 0) return NULL;
    int p = find_name(provider, kiln_gemm_provider_name, KILN_GEMM_PROVIDERS, "provider");
    if (p < 0) return NULL;
    kiln_status st = kiln_gemm_set_provider(c, p);
    if (st != KILN_OK) return pykiln_raise(st);
    Py_RETURN_NONE;
}

static PyObject *py_gemm_class_of(PyObject *self, PyObject *args) {
    (void)self;
    long long m, n, k;
    if (!PyArg_ParseTuple(args, "LLL", &m, &n, &k)) return NULL;
    if (m < 0 || n < 0 || k < 0) {
        PyErr_SetString(PyExc_ValueError, "gemm_class_of: sizes must be >= 0");
        return NULL;
    }
    return PyUnicode_FromString(kiln_gemm_class_name(kiln_gemm_class_of(m, n, k)));
}

static PyObject *py_gemm_set_pinned(PyObject *self, PyObject *arg) {
    (void)self;
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    kiln_gemm_set_pinned(on);
    Py_RETURN_NONE;
}

static PyObject *py_gemm_pinned(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(kiln_gemm_pinned());
}

/* gemm_rate(provider, M, N, K, threads=1, rounds=3, min_seconds=0.002) -> best GFLOP/s */
static PyObject *py_gemm_rate(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *provider;
    long long m, n, k;
    int threads = 1, rounds = 3;
    double min_seconds = 0.002, gflops = 0;
    if (!PyArg_ParseTuple(args, "OLLL|iid", &provider, &m, &n, &k, &threads, &rounds, &min_seconds)) return NULL;
    int p = find_name(provider, kiln_gemm_provider_name, KILN_GEMM_PROVIDERS, "provider");
    if (p < 0) return NULL;
    kiln_status st;
    Py_BEGIN_ALLOW_THREADS st = kiln_gemm_rate(p, m, n, k, threads, rounds, min_seconds, &gflops);
    Py_END_ALLOW_THREADS if (st != KILN_OK) return pykiln_raise(st);
    return PyFloat_FromDouble(gflops);
}

/* gemm_calls() -> {provider: GEMMs kiln_sgemm ran on it in this process} */
static PyObject *py_gemm_calls(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *d = PyDict_New();
    for (int p = 0; d && p < KILN_GEMM_PROVIDERS; p++) {
        PyObject *v = PyLong_FromLongLong((long long)kiln_gemm_calls(p));
        if (!v || PyDict_SetItemString(d, kiln_gemm_provider_name(p), v) < 0) Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

/* gemm_bf16_info() -> {"path": "oneDNN avx512_core_bf16" or None (off or absent), "hardware": whether
 * the CPU and oneDNN's cap give it, "calls": products run on it, "cached":
 * primitives in its cache} */
static PyObject *py_gemm_bf16_info(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    const char *path = kiln_gemm_bf16_path();
    return Py_BuildValue("{s:z,s:O,s:s,s:L,s:i}", "path", path, "hardware",
                         kiln_gemm_bf16_hardware() ? Py_True : Py_False, "why", kiln_gemm_bf16_why(), "calls", (long long)kiln_gemm_bf16_calls(), "cached", kiln_gemm_bf16_cached());
}

/* gemm_bf16_rate(M, N, K, threads=1, rounds=3, min_seconds=0.002) -> best GFLOP/s of oneDNN's bf16 matmul */
static PyObject *py_gemm_bf16_rate(PyObject *self, PyObject *args) {
    (void)self;
    long long m, n, k;
    int threads = 1, rounds = 3;
    double min_seconds = 0.002, gflops = 0;
    if (!PyArg_ParseTuple(args, "LLL|iid", &m, &n, &k, &threads, &rounds, &min_seconds)) return NULL;
    kiln_status st;
    Py_BEGIN_ALLOW_THREADS st = kiln_gemm_bf16_rate(m, n, k, threads, rounds, min_seconds, &gflops);
    Py_END_ALLOW_THREADS if (st != KILN_OK) return pykiln_raise(st);
    return PyFloat_FromDouble(gflops);
}

/* gemm_bf16_force(how): 1 the bfloat16 hardware path (where it exists), 0 the fallback, -1 the choice */
static PyObject *py_gemm_bf16_force(PyObject *self, PyObject *args) {
    (void)self;
    int how;
    if (!PyArg_ParseTuple(args, "i", &how)) return NULL;
    kiln_gemm_bf16_force(how);
    Py_RETURN_NONE;
}

static PyMethodDef gemm_functions[] = {
    {"gemm_bf16_force", py_gemm_bf16_force, METH_VARARGS,
     "gemm_bf16_force(how): bfloat16 products on the hardware path (1, where it exists), the fallback (0), or as "
     "chosen (-1, the default)"},
    {"gemm_bf16_info", py_gemm_bf16_info, METH_NOARGS,
     "{path: the bfloat16 hardware path or None, calls: bfloat16 products run on it, cached: its primitives}"},
    {"gemm_bf16_rate", py_gemm_bf16_rate, METH_VARARGS,
     "gemm_bf16_rate(M, N, K, threads=1, rounds=3, min_seconds=0.002) -> best GFLOP/s of oneDNN's bfloat16 matmul"},
    {"gemm_calls", py_gemm_calls, METH_NOARGS, "{provider: float32 GEMMs run on it in this process}"},
    {"gemm_classes", py_gemm_classes, METH_NOARGS, "the GEMM shape classes, in the order they are tested"},
    {"gemm_providers", py_gemm_providers, METH_NOARGS, "the GEMM providers (the first is the default)"},
    {"gemm_table", py_gemm_table, METH_VARARGS,
     "gemm_table(used=False) -> {class: provider}: the table, or (used) what runs now (OpenBLAS while pinned)"},
    {"gemm_set_provider", py_gemm_set_provider, METH_VARARGS, "gemm_set_provider(class, provider)"},
    {"gemm_class_of", py_gemm_class_of, METH_VARARGS, "gemm_class_of(M, N, K) -> the shape class of a product"},
    {"gemm_set_pinned", py_gemm_set_pinned, METH_O, "pin every GEMM to OpenBLAS (set_deterministic)"},
    {"gemm_pinned", py_gemm_pinned, METH_NOARGS, "whether every GEMM is pinned to OpenBLAS"},
    {"gemm_rate", py_gemm_rate, METH_VARARGS,
     "gemm_rate(provider, M, N, K, threads=1, rounds=3, min_seconds=0.002) -> best GFLOP/s of a NoTrans product"},
    {NULL, NULL, 0, NULL},
};

int pykiln_gemm_select_init(PyObject *module) { return PyModule_AddFunctions(module, gemm_functions); }
