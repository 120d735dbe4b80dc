/* Shared declarations of the kiln._C extension. */
#ifndef KILN_PYKILN_H
#define KILN_PYKILN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "core/internal.h"
#include "core/symdim.h"
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
/* value as a new tensor of dtype for Tensor(value, dtype): numbers and lists straight into dtype */
kiln_tensor *pykiln_to_tensor_as(PyObject *value, kiln_dtype dtype);
/* dtype object or None/NULL -> kiln_dtype; -1 with TypeError set. */
int pykiln_parse_dtype(PyObject *obj, kiln_dtype *out);

/* DLPack (dlpack.c): Tensor.__dlpack__ and __dlpack_device__, kiln.from_dlpack, and the tensor
 * sharing the memory of an object with __dlpack__ or of a DLPack capsule (NULL with an error set). */
PyObject *pykiln_tensor_dlpack(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *pykiln_tensor_dlpack_device(PyObject *self, PyObject *unused);
/* Gradient hooks (grad_hooks.c): TensorBase's methods, and the exception for a failed backward pass
 * (what a hook raised, else pykiln_raise's). */
PyObject *pykiln_tensor_add_grad_hook(PyObject *self, PyObject *fn);
PyObject *pykiln_tensor_remove_grad_hook(PyObject *self, PyObject *id);
PyObject *pykiln_tensor_has_grad_hooks(PyObject *self, PyObject *unused);
PyObject *pykiln_tensor_leaf_grad_hooks(PyObject *self, PyObject *unused);
PyObject *pykiln_raise_backward(kiln_status s);
/* The status for the Python error set while a backward pass ran Python code (a hook, a custom node's
 * rule): the exception is kept for pykiln_raise_backward, its text is the status's message. */
kiln_status pykiln_backward_error(void);
/* kiln._C.backward_passes() -> how many backward passes Python began (a capture that ran one guards
 * on the backward hooks of tensors: kiln.jit.capture_core) */
PyObject *pykiln_backward_passes(PyObject *module, PyObject *unused);
/* Forgets what a hook raised in a pass that did not hand it back (a pass run by C code). */
void pykiln_backward_begin(void);
/* Refusing autograd nodes on compiled outputs (custom_grad.c; kiln.jit.capture_core.refuse_backward):
 * whether refusal is (reads, positions, backward, name) (0 with a TypeError if not), and the node
 * made on outs (0, or -1 with an error set). */
int pykiln_refusal_check(PyObject *refusal);
int pykiln_refuse_outputs(PyObject *refusal, PyObject *outs);
PyObject *pykiln_from_dlpack(PyObject *module, PyObject *args, PyObject *kwargs);
kiln_tensor *pykiln_tensor_from_dlpack(PyObject *obj);
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
extern PyMethodDef pykiln_jvp_functions[];
/* kiln._C.profile_* (profile.c), registered with the graph functions. */
extern PyMethodDef pykiln_profile_functions[];
/* kiln._C.ProfileLog (profile.c), added with them. */
int pykiln_profile_log_ready(PyObject *module);
/* An Executable's memory_report() and graph_dot() (executable_report.c). */
PyObject *pykiln_executable_memory(const kiln_executable *e);
PyObject *pykiln_executable_dot(const kiln_executable *e);
/* Runs a compiled graph for the JitDispatcher's fast path (graph.c); args are tensors. */
PyObject *pykiln_executable_call(PyObject *exe, PyObject *const *args, Py_ssize_t nargs, bool single);
/* The options of one compile as C takes them: kiln._C.CompileOptions (compile_options.c) defines
 * their fields, defaults and validation once and fills this. */
typedef struct pykiln_compile_options {
    kiln_compile_options compile; /* order, poison, backend (a registered backend's name) */
    kiln_pass_options passes;     /* level, inference, disable_format_transform */
    PyObject *sublinear;          /* None or the sublinear-memory search's five ints */
} pykiln_compile_options;
/* The options o holds (a CompileOptions; None: the defaults), borrowed from o; NULL with TypeError
 * naming `who` for anything else. */
const pykiln_compile_options *pykiln_compile_options_of(PyObject *o, const char *who);
/* Registers CompileOptions and backend_names (compile_options.c). */
int pykiln_compile_options_init(PyObject *module);
/* An Executable compiling g (borrowed; the plan keeps its own copy) for opt (graph.c). */
PyObject *pykiln_executable_new(const kiln_graph *g, const kiln_compile_options *opt);
/* An Executable owning exe, a compiled graph of g (borrowed), or NULL with an exception (exe freed). */
PyObject *pykiln_executable_wrap(kiln_executable *exe, const kiln_graph *g);
/* kiln._C.plan_symbolic, bind_plan, plan_counts: one plan for every binding (plan_sym.c). */
extern PyMethodDef pykiln_plan_sym_functions[];
extern PyMethodDef pykiln_attention_functions[];
/* kiln._C.gemm_*: the GEMM provider table and its timing (gemm_select.c). */
int pykiln_gemm_select_init(PyObject *module);
/* A kiln._C.Graph owning g (freed on failure), new reference (graph.c). */
PyObject *pykiln_wrap_graph(kiln_graph *g);
/* Graph.symbolize, Graph.instantiate, Graph.value_shape_at and kiln._C.optimize_graph: graphs with
 * symbolic sizes (graph_sym.c). */
PyObject *pykiln_graph_symbolize(PyObject *self, PyObject *args);
PyObject *pykiln_graph_instantiate(PyObject *self, PyObject *values);
PyObject *pykiln_graph_symbolic_sizes(PyObject *self, PyObject *args);
PyObject *pykiln_graph_value_shape_at(PyObject *self, PyObject *args);
PyObject *pykiln_optimize_graph(PyObject *self, PyObject *args, PyObject *kwargs);
/* The graph of a kiln._C.Graph (borrowed), or NULL with TypeError set (graph.c). */
const kiln_graph *pykiln_graph_of(PyObject *o);
/* (dtype, shape tuple) of a meta, new reference (graph.c). */
PyObject *pykiln_meta_tuple(const kiln_meta *m);
/* Registers model_write and Model: model files (model.c). */
int pykiln_model_init(PyObject *module);
/* Registers JitDispatcher (dispatcher.c). */
int pykiln_dispatcher_init_type(PyObject *module);
/* How a guard compares the value its path reaches with the one it expects (guards.c). */
/* GUARD_VIEW: a tensor an attribute makes anew at each read (`w.T`, `w.mT`): the one read now views
 * the same storage with the same layout, dtype and requires_grad (its identity never holds). */
enum { GUARD_IDENTITY, GUARD_VALUE, GUARD_ABSENT, GUARD_METHOD, GUARD_VERSION, GUARD_WEAK, GUARD_WEAK_METHOD,
       GUARD_CONTENTS, GUARD_REQUIRES_GRAD, GUARD_VIEW, GUARD_MODE_COUNT };
/* A list's, dict's or set's contents as GUARD_CONTENTS compares them (new reference), or None. */
PyObject *pykiln_guard_contents(PyObject *value);
/* Whether k is a NumPy array (1, 0; -1 with an error set), NumPy imported only once an object with
 * the buffer protocol asks (indexing.c). */
int pykiln_is_ndarray(PyObject *k);
/* Registers GuardSet and its mode constants (guards.c). */
int pykiln_guards_init_type(PyObject *module);
int pykiln_is_guardset(PyObject *o);
/* GuardSet(specs): specs is a list of (root, path, expected, mode) (new reference). */
PyObject *pykiln_guardset_new(PyObject *specs);
/* Registers kiln._C.tree (flatten, unflatten, describe, ...) and ConstPayload (tree.c). */
int pykiln_tree_init(PyObject *module);
/* kiln._C.batch_graph, apply_graph, batch_rules: kiln.vmap's (vmap.c). */
int pykiln_vmap_init(PyObject *module);
/* kiln._C.apply without the parsing: inputs is a sequence of tensors, or values converted next to
 * the first tensor (NumPy 2's weak scalars); a tensor, or a tuple for several outputs (module.c). */
PyObject *pykiln_apply(kiln_op op, PyObject *inputs, const kiln_attrs *attrs);
/* Registers kiln._C.FrameHook (frame_hook.c). */
int pykiln_frame_hook_init(PyObject *module);
/* Registers kiln._C.Elementwise (elementwise.c). */
int pykiln_elementwise_init(PyObject *module);
/* An op's tensor argument as a new reference: itself, or Tensor(x) for anything else. */
PyObject *pykiln_as_tensor(PyObject *x);
/* After a failed call of the op function `op`: Python's own exception (from a conversion deep
 * inside) whose message names no op becomes "op: message" (shape_args.c). */
void pykiln_name_error(const char *op);
/* One axis in [0, ndim) (a 0-d tensor accepts 0 and -1); -1 with an exception naming op set. */
int pykiln_normalize_axis(const char *op, PyObject *axis, int ndim);
/* The bitmask of the axes `axis` names (None: all) as a Python int; NULL with an exception set. */
PyObject *pykiln_axes_mask(const char *op, PyObject *axis, int ndim);
/* Registers kiln._C.Reduction (reductions.c). */
int pykiln_reductions_init(PyObject *module);
/* Symbolic shapes while a dynamic capture records (sym_hooks.c): pykiln_sym_shape gives the hook's
 * answer for tensor's shape (what 0), size (1) or len (2): a new reference, None when it has none;
 * pykiln_sym_call gives the hook's result of op(*args) when args hold a symbolic size (or always,
 * while a capture records), else NULL with no exception set (NULL with one set when the hook failed). */
PyObject *pykiln_sym_shape(PyObject *tensor, int what);
PyObject *pykiln_sym_call(const char *op, PyObject *args, bool always);
/* Whether a dynamic capture records on this thread and its call hook is not running (a caller may
 * then build the arguments of pykiln_sym_call, which costs nothing otherwise). */
bool pykiln_sym_hooked(void);
/* Tells the hook that `out` (a new reference, returned; NULL passes through) is a reshape of x
 * whose size k is x's size src[k], 1 (src -1) or the rest of x's elements (-2): how the node
 * follows the symbols. Releases out and returns NULL when the hook fails. */
PyObject *pykiln_sym_derived(PyObject *x, PyObject *out, const int *src, int n);
/* Tells the hook that a backward pass is about to run (done false) or has recorded its nodes (done
 * true): a rebinding makes those nodes follow the forward's sizes; -1 with an exception set when
 * the hook failed. */
int pykiln_sym_note_backward(bool done);
int pykiln_sym_hooks_init(PyObject *module);
/* kiln._C.SymTable, SymExpr and SymLimitError (src/python/sym_expr.c). */
int pykiln_sym_expr_init(PyObject *module);
/* 1 with its table and size when o is a SymExpr, else 0. */
int pykiln_symexpr_get(PyObject *o, const kiln_symtab **t, kiln_sdim *d);
/* Registers kiln._C.shape: the shape functions and argument helpers of kiln.ops (shape_args.c). */
int pykiln_shape_init(PyObject *module);
/* Whether o is a kiln.nn.Cell (cell.c). */
int pykiln_is_cell(PyObject *o);
/* Registers CellBase and the Cell log functions (cell.c). */
int pykiln_cell_init(PyObject *module);
/* Registers record_grad, autograd nodes with a Python gradient (custom_grad.c). */
int pykiln_custom_grad_init(PyObject *module);
/* Registers the frame-evaluation hook of bytecode capture (eval_frame.c). */
int pykiln_eval_frame_init(PyObject *module);
PyObject *pykiln_frame_function(PyFrameObject *frame);
int pykiln_bytecode_steps_init(PyObject *module);
/* Registers GuardRecorder (guard_recorder.c). */
int pykiln_guard_recorder_init_type(PyObject *module);
/* Whether every guard of a GuardSet holds (a guard whose check raises fails; no error is left set). */
int pykiln_guards_hold(PyObject *guards);
/* Adds build_info, codegen_info, codegen_selftest and codegen_cache (config.c). */
int pykiln_config_init(PyObject *module);
/* the communication layer's functions (comm.c) */
int pykiln_comm_init(PyObject *module);

/* One bytecode instruction (code_facts.c): EXTENDED_ARG folded into arg, CACHE entries skipped;
 * name is the name or constant the argument designates (borrowed from the code object), or NULL. */
typedef struct {
    int op, arg, line, offset;
    PyObject *name;
} pykiln_instr;
/* Decodes a code object's bytecode into *out (PyMem_Free it); -1 with an exception set, also on
 * a Python other than 3.11. */
int pykiln_decode(PyCodeObject *code, pykiln_instr **out, Py_ssize_t *count);
/* kiln._C.code_facts(code): the CodeFacts of a code object (new reference; cached on the code). */
PyObject *pykiln_code_facts(PyObject *code);
/* The CodeFacts of the instructions of code at the offsets in the set `executed` (new reference,
 * not cached): what one run of part of it read (bytecode capture's pieces). */
PyObject *pykiln_code_facts_executed(PyObject *code, PyObject *executed);
/* kiln._C.read_names(code): (globals, cell variables) code and its nested code load and never store. */
PyObject *pykiln_read_names(PyObject *code);
/* Registers CodeFacts and code_facts (code_facts.c). */
int pykiln_code_facts_init_type(PyObject *module);

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

/* A comparison op (KILN_OP_EQ ... KILN_OP_GE) of an integer tensor with a Python int its dtype cannot
 * hold, answered by value as NumPy 2 does (int8 == 300: all False); NULL without an error when the int
 * fits or the operands are not such a pair (src/python/tensor.c). */
PyObject *pykiln_compare_out_of_range(PyObject *tensor, PyObject *v, kiln_op op);

#endif
