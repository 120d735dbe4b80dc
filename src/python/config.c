/* kiln._C's facts about this build and machine, for kiln.show_config and `python -m kiln`. */
#include "pykiln.h"

#include "codegen/codegen_info.h"
#include "kiln/config.h"

/* Returns a new dict: how kiln was built, the CPU, BLAS and oneDNN (include/kiln/config.h). */
static PyObject *py_build_info(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return Py_BuildValue("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s}", "options", kiln_build_options(), "build_isa",
                         kiln_build_isa(), "cpu_model", kiln_cpu_model(), "cpu_isa", kiln_cpu_isa(), "blas_config",
                         kiln_blas_config(), "blas_core", kiln_blas_core(), "dnnl_version", kiln_dnnl_version(),
                         "dnnl_isa", kiln_dnnl_isa());
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

static PyMethodDef config_methods[] = {
    {"build_info", py_build_info, METH_NOARGS, "how kiln was built, the CPU, BLAS and oneDNN (a dict of strings)"},
    {"codegen_info", py_codegen_info, METH_NOARGS, "the compiler of generated code and the disk cache's directory"},
    {"codegen_selftest", py_codegen_selftest, METH_NOARGS,
     "compile and run a tiny generated kernel; raises RuntimeError (or NotImplementedError: no compiler) on failure"},
    {"codegen_cache", (PyCFunction)(void (*)(void))py_codegen_cache, METH_VARARGS | METH_KEYWORDS,
     "codegen_cache(clear=False) -> (entries, bytes) of the disk cache; with clear=True, those deleted"},
    {NULL, NULL, 0, NULL},
};

int pykiln_config_init(PyObject *module) { return PyModule_AddFunctions(module, config_methods); }
