/* Shared declarations of the kiln._C extension. */
#ifndef KILN_PYKILN_H
#define KILN_PYKILN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "core/internal.h"
#include "kiln/kiln.h"

/* A Python tensor owns one reference to a C tensor. */
typedef struct {
    PyObject_HEAD
    kiln_tensor *t;
    PyObject *weakrefs;
} PyKilnTensor;

typedef struct {
    PyObject_HEAD
    kiln_dtype id;
} PyKilnDType;

extern PyTypeObject PyKilnTensor_Type;
extern PyTypeObject PyKilnDType_Type;

/* The class new tensors are made of: kiln.Tensor once the package registers it. Process-wide
 * like the static types themselves; set once at import. */
extern PyTypeObject *pykiln_tensor_class;
/* The dtype singletons, indexed by kiln_dtype. */
extern PyObject *pykiln_dtypes[KILN_DTYPE_COUNT];

static inline int pykiln_is_tensor(PyObject *o) { return PyObject_TypeCheck(o, &PyKilnTensor_Type); }
static inline kiln_tensor *pykiln_unwrap(PyObject *o) { return ((PyKilnTensor *)o)->t; }

/* New Python tensor that steals the reference `t`; NULL (with t released) on failure. */
PyObject *pykiln_wrap(kiln_tensor *t);
/* Raises the Python exception for a failed status (message from kiln_last_error; for a failed
 * check op, the exception registered for it). */
PyObject *pykiln_raise(kiln_status s);
/* kiln._C.register_check(exception) -> id for a check op's attribute i[0]. */
PyObject *pykiln_register_check(PyObject *module, PyObject *exc);
/* Converts any value (tensor, Python scalar, sequence, buffer) to a new C tensor reference.
 * `like`, when given, sets the dtype of Python scalars the way NumPy 2 does for weak scalars. */
kiln_tensor *pykiln_to_tensor(PyObject *value, const kiln_tensor *like);
/* dtype object or None/NULL -> kiln_dtype; -1 with TypeError set. */
int pykiln_parse_dtype(PyObject *obj, kiln_dtype *out);

/* Tensor indexing: x[key] and x[key] = value (indexing.c) */
PyObject *pykiln_tensor_getitem(PyObject *self, PyObject *key);
int pykiln_tensor_setitem(PyObject *self, PyObject *key, PyObject *value);
/* Registers TensorBase, dtype and the dtype singletons (tensor.c). */
int pykiln_tensor_init_type(PyObject *module);
/* Registers Tracer, Executable and the memory functions (graph.c). */
int pykiln_graph_init_types(PyObject *module);
/* The graph a Tracer's finish_body kept (new owner: the caller), or NULL with an exception set. */
kiln_graph *pykiln_tracer_take_body(PyObject *tracer);
/* kiln._C.apply_control (src/python/control_flow.c) */
extern PyMethodDef pykiln_control_functions[];
/* Runs a compiled graph for the JitDispatcher's fast path (graph.c); args are tensors. */
PyObject *pykiln_executable_call(PyObject *exe, PyObject *const *args, Py_ssize_t nargs, bool single);
/* Registers JitDispatcher (dispatcher.c). */
int pykiln_dispatcher_init_type(PyObject *module);
/* Registers GuardSet and its mode constants (guards.c). */
int pykiln_guards_init_type(PyObject *module);
int pykiln_is_guardset(PyObject *o);
/* Whether every guard of a GuardSet holds (a guard whose check raises fails; no error is left set). */
int pykiln_guards_hold(PyObject *guards);

/* Interrupts (interrupt.c): kiln's SIGINT handler in front of Python's, installed at import. */
int pykiln_interrupt_init(void);
/* Before a run that may take long (GIL released, a loop): kiln's handler back in front when Python
 * code replaced it (one sigaction call). */
void pykiln_interrupt_arm(void);
/* A request left from a SIGINT Python handled outside a run: on the main thread it is cleared and
 * Python's pending handler runs (-1 with its exception set). */
int pykiln_interrupt_settle(void);
static inline int pykiln_interrupt_stale(void) {
    return atomic_load_explicit(&kiln_interrupt_flag, memory_order_relaxed) ? pykiln_interrupt_settle() : 0;
}
/* The exception of a run that stopped with KILN_ERR_INTERRUPTED (pykiln_raise calls it). */
PyObject *pykiln_raise_interrupted(void);

#endif
