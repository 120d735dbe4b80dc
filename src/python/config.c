/* kiln._C's facts about this build and machine, for kiln.show_config and `python -m kiln`. */
#include "pykiln.h"

#include <string.h>

#include "codegen/codegen.h"
#include "codegen/codegen_info.h"
#include "isa_dispatch.h"
#include "conv_dnnl.h"
#include "dnnl_lowp.h"
#include "kiln/config.h"

/* Returns a new dict: how kiln was built, the CPU, BLAS and oneDNN (include/kiln/config.h), and
 * the instruction-set level kiln uses (the CPU's, capped by KILN_MAX_CPU_ISA: max_cpu_isa). */
static PyObject *py_build_info(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return Py_BuildValue("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:z}", "options", kiln_build_options(), "build_isa",
                         kiln_build_isa(), "cpu_model", kiln_cpu_model(), "cpu_isa", kiln_cpu_isa(), "blas_config",
                         kiln_blas_config(), "blas_core", kiln_blas_core(), "dnnl_version", kiln_dnnl_version(),
                         "dnnl_isa", kiln_dnnl_isa(), "isa", kiln_isa_name(kiln_isa_level()), "cpu_isa_level",
                         kiln_isa_name(kiln_cpu_isa_level()), "max_cpu_isa", kiln_max_isa_setting());
}

/* isa_kernels() -> {family: variant it runs} for the kernels compiled per instruction set. */
static PyObject *py_isa_kernels(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *d = PyDict_New();
    for (int k = 0; d && k < kiln_isa_kernel_count(); k++) {
        const kiln_isa_kernel *f = kiln_isa_kernel_at(k);
        PyObject *v = PyUnicode_FromString(kiln_variant_name(kiln_isa_kernel_chosen(f)));
        if (!v || PyDict_SetItemString(d, f->name, v) < 0) Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

/* isa_variants() -> the variants this CPU runs and this build compiled, in order. */
static PyObject *py_isa_variants(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    PyObject *l = PyList_New(0);
    for (int v = 0; l && v < KILN_VARIANT_COUNT; v++) {
        if (!kiln_variant_runs((kiln_variant)v)) continue;
        PyObject *s = PyUnicode_FromString(kiln_variant_name((kiln_variant)v));
        if (!s || PyList_Append(l, s) < 0) Py_CLEAR(l);
        Py_XDECREF(s);
    }
    return l;
}

/* isa_select(name) makes every family run that variant; isa_select(None) goes back to the
 * level's choice. For tests; not while kernels run on other threads. */
static PyObject *py_isa_select(PyObject *self, PyObject *arg) {
    (void)self;
    if (arg == Py_None) {
        kiln_isa_select_default();
        Py_RETURN_NONE;
    }
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    for (int v = 0; v < KILN_VARIANT_COUNT; v++)
        if (!strcmp(name, kiln_variant_name((kiln_variant)v))) {
            kiln_status s = kiln_isa_select((kiln_variant)v);
            if (s != KILN_OK) return pykiln_raise(s);
            Py_RETURN_NONE;
        }
    return PyErr_Format(PyExc_ValueError, "isa_select: no kernel variant named '%s' (baseline, avx2, avx512)", name);
}

/* Returns a new dict: the compiler of generated code and the disk cache's directory. */
static PyObject *py_codegen_info(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    kiln_codegen_description d;
    Py_BEGIN_ALLOW_THREADS /* the first call runs `cc --version` */
    kiln_codegen_describe(&d);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("{s:s,s:s,s:s,s:s,s:O}", "command", d.command, "identity", d.identity, "flags", d.flags,
                         "cache_dir", d.cache_dir, "cache_usable", d.cache_usable ? Py_True : Py_False);
}

/* Compiles and runs a tiny kernel; None, or the error of the first failing step. */
static PyObject *py_codegen_selftest(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    kiln_status s;
    Py_BEGIN_ALLOW_THREADS
    s = kiln_codegen_selftest();
    Py_END_ALLOW_THREADS
    if (s != KILN_OK) return pykiln_raise(s);
    Py_RETURN_NONE;
}

/* codegen_cache(clear=False) -> (entries, bytes) of the disk cache; with clear, those deleted. */
static PyObject *py_codegen_cache(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *names[] = {"clear", NULL};
    int clear = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p:codegen_cache", names, &clear)) return NULL;
    int64_t entries, bytes;
    kiln_status s;
    Py_BEGIN_ALLOW_THREADS
    s = kiln_codegen_cache_scan(clear != 0, &entries, &bytes);
    Py_END_ALLOW_THREADS
    if (s != KILN_OK) return pykiln_raise(s);
    return Py_BuildValue("(LL)", (long long)entries, (long long)bytes);
}

/* codegen_background(on=None) -> whether generated code builds in the background (setting it when
 * on is given: True or False). */
static PyObject *py_codegen_background(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *on = Py_None;
    if (!PyArg_ParseTuple(args, "|O:codegen_background", &on)) return NULL;
    if (on != Py_None) {
        if (!PyBool_Check(on)) return PyErr_Format(PyExc_TypeError, "codegen_background: on must be a bool");
        kiln_codegen_set_background(on == Py_True);
    }
    return PyBool_FromLong(kiln_codegen_background());
}

/* codegen_wait(): until no background build of generated code is queued or running. */
static PyObject *py_codegen_wait(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    Py_BEGIN_ALLOW_THREADS
    kiln_codegen_wait();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* amp_native() -> {"bf16": bool, "f16": bool, "conv_bf16_runs": int}: whether oneDNN runs bf16 /
 * fp16 products on this CPU (dnnl_lowp.h), and the bf16 convolutions it ran in this process. */
static PyObject *py_amp_native(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return Py_BuildValue("{s:O,s:O,s:L}", "bf16", kiln_dnnl_bf16_native() ? Py_True : Py_False, "f16",
                         kiln_dnnl_f16_native() ? Py_True : Py_False, "conv_bf16_runs",
                         (long long)kiln_conv_dnnl_lowp_count());
}

/* amp_native_allow(on) -> the previous setting: allows or forbids oneDNN's bf16 primitives in this
 * process (forbidden: the fp32-compute fallback; tests and benchmarks). */
static PyObject *py_amp_native_allow(PyObject *self, PyObject *on) {
    (void)self;
    if (!PyBool_Check(on)) return PyErr_Format(PyExc_TypeError, "amp_native_allow: expected a bool");
    return PyBool_FromLong(kiln_dnnl_bf16_allow(on == Py_True));
}

static PyMethodDef config_methods[] = {
    {"amp_native_allow", py_amp_native_allow, METH_O,
     "amp_native_allow(on) -> previous: allow or forbid oneDNN's bf16 primitives in this process (tests, benchmarks)"},
    {"amp_native", py_amp_native, METH_NOARGS,
     "{'bf16', 'f16': oneDNN runs them natively here; 'conv_bf16_runs': bf16 convolutions run in this process}"},
    {"codegen_background", py_codegen_background, METH_VARARGS,
     "codegen_background(on=None) -> whether generated code builds on a background thread (set when on is given)"},
    {"codegen_wait", py_codegen_wait, METH_NOARGS, "waits until no background build of generated code is queued or running"},
    {"build_info", py_build_info, METH_NOARGS, "how kiln was built, the CPU, BLAS and oneDNN (a dict of strings)"},
    {"codegen_info", py_codegen_info, METH_NOARGS, "the compiler of generated code and the disk cache's directory"},
    {"codegen_selftest", py_codegen_selftest, METH_NOARGS,
     "compile and run a tiny generated kernel; raises RuntimeError (or NotImplementedError: no compiler) on failure"},
    {"codegen_cache", (PyCFunction)(void (*)(void))py_codegen_cache, METH_VARARGS | METH_KEYWORDS,
     "codegen_cache(clear=False) -> (entries, bytes) of the disk cache; with clear=True, those deleted"},
    {"isa_kernels", py_isa_kernels, METH_NOARGS, "{family: variant it runs} of the kernels compiled per instruction set"},
    {"isa_variants", py_isa_variants, METH_NOARGS, "the kernel variants this CPU runs and this build compiled"},
    {"isa_select", py_isa_select, METH_O,
     "isa_select(variant) makes every dispatched kernel run it (tests); isa_select(None): the level's again"},
    {NULL, NULL, 0, NULL},
};

/* A bad KILN_MAX_CPU_ISA stops the import with the reason (ValueError). */
int pykiln_config_init(PyObject *module) {
    kiln_status s = kiln_max_isa_check();
    if (s != KILN_OK) {
        pykiln_raise(s);
        return -1;
    }
    return PyModule_AddFunctions(module, config_methods);
}
