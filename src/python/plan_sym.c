/* One plan for every binding of a graph with symbolic sizes (kiln/jit/dynamic.py's instances):
 * plan_symbolic plans the optimized symbolic graph once (kiln_plan_build_symbolic: order, fused
 * groups' code, buffers at the hints) and bind_plan gives the Executable of one binding
 * (kiln_executable_bind: sizes and offsets evaluated, no planning, no code generated), its buffers in
 * the arena the plan's bindings share (grown to the largest binding seen), the sink's function the one
 * generated for the first binding. */
#include "pykiln.h"

#include "ir/symbolic.h"
#include "runtime/backend.h"
#include "runtime/weight_cache.h"

#define CAPSULE "kiln.symbolic_plan"

typedef struct {
    kiln_plan *plan;
    const kiln_backend *be;
    kiln_bindings *shared; /* what its bindings share: the arena of the largest, the sink's code */
} symbolic_plan;

static void capsule_free(PyObject *capsule) {
    symbolic_plan *sp = PyCapsule_GetPointer(capsule, CAPSULE);
    if (!sp) return;
    kiln_plan_free(sp->plan);
    kiln_bindings_free(sp->shared);
    free(sp);
}

/* plan_symbolic(graph, options=None) -> an opaque plan for bind_plan (options: a CompileOptions; its
 * order, poison and backend are used) */
static PyObject *py_plan_symbolic(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *kwlist[] = {"graph", "options", NULL};
    PyObject *graph, *options = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:plan_symbolic", kwlist, &graph, &options)) return NULL;
    const kiln_graph *g = pykiln_graph_of(graph);
    const pykiln_compile_options *opt = g ? pykiln_compile_options_of(options, "plan_symbolic") : NULL;
    if (!opt) return NULL;
    const kiln_backend *be = kiln_backend_find(opt->compile.backend); /* a CompileOptions names a registered one */
    if (!be) return pykiln_raise(KILN_ERR_VALUE);
    symbolic_plan *sp = kiln_calloc(1, sizeof *sp);
    if (!sp) return PyErr_NoMemory();
    sp->be = be;
    kiln_status s = kiln_bindings_new(&sp->shared);
    if (s != KILN_OK) {
        free(sp);
        return pykiln_raise(s);
    }
    Py_BEGIN_ALLOW_THREADS
    s = kiln_plan_build_symbolic(g, &opt->compile, &sp->plan);
    Py_END_ALLOW_THREADS
    PyObject *capsule = s == KILN_OK ? PyCapsule_New(sp, CAPSULE, capsule_free) : NULL;
    if (!capsule) {
        kiln_plan_free(sp->plan);
        kiln_bindings_free(sp->shared);
        free(sp);
        if (s != KILN_OK) return pykiln_raise(s);
    }
    return capsule;
}

/* bind_plan(plan, values) -> Executable of the binding symbol k = values[k] (ValueError when the
 * graph does not hold there) */
static PyObject *py_bind_plan(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *capsule, *values;
    if (!PyArg_ParseTuple(args, "OO!:bind_plan", &capsule, &PyList_Type, &values)) return NULL;
    symbolic_plan *sp = PyCapsule_GetPointer(capsule, CAPSULE);
    if (!sp) return NULL;
    const kiln_graph *g = sp->plan->g;
    int32_t n = g->syms ? kiln_sym_count(g->syms) : 0;
    if (PyList_GET_SIZE(values) != n) return PyErr_Format(PyExc_ValueError, "bind_plan: expected %d sizes, one per symbol", n);
    int64_t b[KILN_MAX_DIMS * 8];
    int64_t *bind = n <= (int32_t)(sizeof b / sizeof b[0]) ? b : PyMem_Malloc(sizeof *bind * (size_t)n);
    if (!bind) return PyErr_NoMemory();
    for (int32_t k = 0; k < n; k++) {
        bind[k] = PyLong_AsLongLong(PyList_GET_ITEM(values, k));
        if (bind[k] == -1 && PyErr_Occurred()) {
            if (bind != b) PyMem_Free(bind);
            return NULL;
        }
    }
    kiln_executable *exe = NULL;
    kiln_status s = kiln_executable_bind(sp->plan, bind, sp->be, sp->shared, &exe);
    if (bind != b) PyMem_Free(bind);
    if (s != KILN_OK) return pykiln_raise(s);
    return pykiln_executable_wrap(exe, kiln_executable_plan(exe)->g);
}

/* plan_counts() -> (plans built, plans bound) in this process */
static PyObject *py_plan_counts(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    int64_t built, bound;
    kiln_plan_counts(&built, &bound);
    return Py_BuildValue("(LL)", (long long)built, (long long)bound);
}

/* weight_cast_counts() -> (kept, cast): compiled calls of weight casts (plan.h: weight_cast) that reused
 * the result kept from an earlier call, and those that cast, in this process */
static PyObject *py_weight_cast_counts(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    int64_t hits, misses;
    kiln_weight_cache_counts(&hits, &misses);
    return Py_BuildValue("(LL)", (long long)hits, (long long)misses);
}

PyMethodDef pykiln_plan_sym_functions[] = {
    {"plan_symbolic", (PyCFunction)(void (*)(void))py_plan_symbolic, METH_VARARGS | METH_KEYWORDS,
     "plan_symbolic(graph, options=None) -> one plan for every binding"},
    {"bind_plan", py_bind_plan, METH_VARARGS, "bind_plan(plan, values) -> the Executable of one binding"},
    {"plan_counts", py_plan_counts, METH_NOARGS, "(plans built, plans bound) in this process"},
    {"weight_cast_counts", py_weight_cast_counts, METH_NOARGS,
     "(kept, cast): compiled weight casts that reused the last call's result, and those that cast, in this process"},
    {NULL, NULL, 0, NULL},
};
