/* kiln — graph IR, trace capture and compiled graphs (a plan run by a backend).
 *
 * A graph holds typed, shaped SSA values. A value is a graph input (bound per call), a
 * captured tensor (bound by reference at capture time: parameters, closure tensors and the
 * constants Python scalars became), or the output of a node. Nodes name op-table entries.
 */
#ifndef KILN_GRAPH_H
#define KILN_GRAPH_H

#include "kiln/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kiln_value_kind {
    KILN_VALUE_INPUT,
    KILN_VALUE_CAPTURED,
    KILN_VALUE_NODE,
} kiln_value_kind;

typedef struct kiln_value {
    kiln_meta meta;
    kiln_value_kind kind;
    int32_t node;        /* NODE: producing node */
    int32_t index;       /* NODE: output index; INPUT: input position; CAPTURED: capture position */
    kiln_tensor *bound;  /* CAPTURED: the tensor (owned reference) */
    bool constant;       /* CAPTURED: baked in (a private copy) rather than a live reference */
    bool fresh;          /* CAPTURED by a trace: the tensor was made while the function ran (from a
                          * Python value, NumPy data...), not one that existed before (a Parameter) */
    /* per dimension: 0, the size is meta.shape[d]; else the entry of the graph's symbol table
     * (kiln_graph.syms) giving it, meta.shape[d] then its hint (its value at the symbols' hints) */
    int32_t sym[KILN_MAX_DIMS];
} kiln_value;

typedef struct kiln_node {
    kiln_op op;
    int32_t nin, nout;
    int32_t *in; /* value ids */
    int32_t out[KILN_MAX_OUTPUTS];
    kiln_attrs attrs;
    int32_t loc; /* index into the graph's source locations, or -1 */
    int32_t recompute; /* recorded in a call of a Cell marked with Cell.recompute(): the call's id (0: none) */
    /* NULL, or per int attribute (attrs.ni of them, owned): 0, or the symbol table entry the size
     * it holds is (attrs.i[k] then its hint): a reshape's, expand's, slice's or full's symbolic sizes */
    int32_t *attr_sym;
} kiln_node;

typedef struct kiln_graph {
    kiln_value *values;
    int32_t nvalues, cap_values;
    kiln_node *nodes;
    int32_t nnodes, cap_nodes;
    int32_t *inputs, ninputs, cap_inputs;
    int32_t *captures, ncaptures, cap_captures;
    int32_t *outputs, noutputs;
    char **locs; /* "file:line" of the user code behind nodes */
    int32_t nlocs, cap_locs;
    struct kiln_graph **subgraphs; /* control flow (capture modes that see it) */
    int32_t nsubgraphs;
    /* symbolic sizes (src/core/symdim.h, src/ir/symbolic.h): the symbols and expressions values'
     * dimensions refer to; NULL while every size is concrete */
    struct kiln_symtab *syms;
    /* names for deployment (trace.dump's keep_* options; src/ir/graph_names.c): per value and per
     * node, NULL when none; arrays as long as the highest id named so far (NULL when none) */
    char **value_names, **node_names;
    int32_t nvalue_names, nnode_names;
    int32_t *priorities; /* per node: its position in the recording (1, 2, ...), 0 when none */
    int32_t npriorities;
} kiln_graph;

KILN_API kiln_status kiln_graph_new(kiln_graph **out);
KILN_API void kiln_graph_free(kiln_graph *g);
KILN_API kiln_status kiln_graph_add_input(kiln_graph *g, const kiln_meta *meta, int32_t *value);
/* Binds t (retained). constant: capture a private copy of its current value instead. */
KILN_API kiln_status kiln_graph_add_capture(kiln_graph *g, kiln_tensor *t, bool constant, int32_t *value);
/* Infers the outputs' metas; fails (naming the op and shapes) like kiln_apply would. */
KILN_API kiln_status kiln_graph_add_node(kiln_graph *g, kiln_op op, int nin, const int32_t *in,
                                         const kiln_attrs *attrs, int32_t loc, int32_t *out);
KILN_API kiln_status kiln_graph_add_loc(kiln_graph *g, const char *loc, int32_t *id);
/* g's source locations (subgraphs too) without their directories ("/home/u/net.py:3" becomes
 * "net.py:3"; locations that become equal are merged): for model files, which are shipped. */
KILN_API kiln_status kiln_graph_base_name_locs(kiln_graph *g);
KILN_API kiln_status kiln_graph_set_outputs(kiln_graph *g, int n, const int32_t *values);
/* Takes ownership of sub (on failure the caller keeps it); *index is its position in g->subgraphs. */
KILN_API kiln_status kiln_graph_add_subgraph(kiln_graph *g, kiln_graph *sub, int32_t *index);
/* A deep copy (captured tensors shared, retained). */
KILN_API kiln_status kiln_graph_clone(const kiln_graph *g, kiln_graph **out);
/* Appends deep copies of from's subgraphs to to's (their indices shifted by to's count). */
KILN_API kiln_status kiln_graph_copy_subgraphs(const kiln_graph *from, kiln_graph *to);

/* ---- names (src/ir/graph_names.c): what trace.dump keeps of the recording ---------------- */

/* Sets (a copy of) name, or clears it with NULL. A value or node id out of range is an error. */
KILN_API kiln_status kiln_graph_set_value_name(kiln_graph *g, int32_t value, const char *name);
KILN_API kiln_status kiln_graph_set_node_name(kiln_graph *g, int32_t node, const char *name);
KILN_API kiln_status kiln_graph_set_node_priority(kiln_graph *g, int32_t node, int32_t priority);
/* NULL / 0 when none. */
KILN_API const char *kiln_graph_value_name(const kiln_graph *g, int32_t value);
KILN_API const char *kiln_graph_node_name(const kiln_graph *g, int32_t node);
KILN_API int32_t kiln_graph_node_priority(const kiln_graph *g, int32_t node);
/* Names a recording as trace.dump's keep options ask (docs/model_format.md, "Names"): nodes:
 * every node without a name is called "<op>(<its first input's name>)[<node index>]" ("<op>[i]"
 * when it has no input or its first input no name); values: every node output without a name
 * "<op><node index>" (output k > 0: "<op><node index>:<k>"; with "'" appended while a name set
 * before has it); priorities: every node without one
 * gets its index + 1 (the order the trace ran the ops). Value names are made before node names. */
KILN_API kiln_status kiln_graph_generate_names(kiln_graph *g, bool values, bool nodes, bool priorities);
/* Removes names: of captures (params), of the other values, of nodes, and priorities. */
KILN_API void kiln_graph_clear_names(kiln_graph *g, bool params, bool values, bool nodes, bool priorities);
/* After a rewrite from src to dst: value v of src that maps to map[v] >= 0 gives dst's value its
 * name, and a node of src whose output maps to a dst node's output gives that node its name and
 * priority (the first such, in src's order), unless origin (dst node -> src node + 1, 0: none,
 * norigin entries, may be NULL) names the src node a dst node stands for (a fused convolution
 * keeps its convolution's name). Names already set in dst stay. */
KILN_API kiln_status kiln_graph_carry_names(const kiln_graph *src, kiln_graph *dst, const int32_t *map,
                                            const int32_t *origin, int32_t norigin);
/* Copies every name and priority of src to dst (a clone: the same ids). */
KILN_API kiln_status kiln_graph_copy_names(const kiln_graph *src, kiln_graph *dst);
KILN_API void kiln_graph_free_names(kiln_graph *g);

/* The metas node n of g would have, inferred from its inputs' metas in g (checked like a tensor's). */
KILN_API kiln_status kiln_graph_infer_node(const kiln_graph *g, const kiln_node *n, kiln_meta *metas);

/* ---- rebinding: one recorded graph for other input shapes (dynamic shapes) ------------- */

typedef enum kiln_attr_set_kind {
    KILN_ATTR_SET_VALUE, /* i[index] = value */
    KILN_ATTR_SET_DIM,   /* i[index] = the rebound size of dimension `value` of the node's input 0 */
    KILN_ATTR_SET_REST,  /* i[index] = numel(input 0) / the product of the node's other int attrs
                            (a reshape's -1; inexact division fails) */
    KILN_ATTR_SET_FOLLOW /* the sizes of a reshape, expand or full (index and value unused) follow the
                            earlier value whose recorded sizes they equal (1s kept; a reshape's may
                            also be a value's with its leading sizes merged), those of a slice
                            or slice_assign the earlier slice with its recorded attributes; every such
                            value must agree (a gradient rule's nodes: they take their sizes from the
                            forward's values). Other ops: the set names nothing */
} kiln_attr_set_kind;

typedef struct kiln_attr_set {
    int32_t node, index;
    kiln_attr_set_kind kind;
    int64_t value;
} kiln_attr_set;

/* A copy of g (captured tensors shared) whose inputs have the shapes `inputs` (same dtypes and
 * ranks as g's), with the int attributes `sets` given anew, and every node's outputs inferred again
 * in order; if and while nodes whose inputs changed shape get their subgraphs rebound likewise
 * (with no sets). A node whose op keeps sizes in its attributes (KILN_OPF_SIZED) and whose inputs
 * changed shape must be named by a set (which then gives all of them): otherwise KILN_ERR_VALUE
 * naming the node, as for any inference that fails (the graph does not hold for those shapes). */
KILN_API kiln_status kiln_graph_rebind(const kiln_graph *g, const kiln_meta *inputs, int nset,
                                       const kiln_attr_set *sets, kiln_graph **out);
/* Splits g, whose first nforward_inputs inputs and nforward_outputs outputs are a forward's and the
 * rest a backward's (gradients recorded on it: its inputs the outputs' gradients), in two graphs
 * (src/ir/split.c). *forward takes the forward inputs and returns the forward outputs, then the
 * *nresiduals forward values the backward reads; *backward takes those residuals, then the
 * backward inputs, and returns the backward outputs. The forward holds the nodes the forward
 * outputs need and the side effects that do not read backward inputs; every other node is the
 * backward's. KILN_ERR_VALUE when a forward output reads a backward input. */
KILN_API kiln_status kiln_graph_split(const kiln_graph *g, int nforward_inputs, int nforward_outputs,
                                      kiln_graph **forward, kiln_graph **backward, int32_t *nresiduals);
/* Checks wiring, order (SSA: inputs defined before use) and every node's inferred metas. */
KILN_API kiln_status kiln_graph_verify(const kiln_graph *g);
/* Readable text form (malloc'd; free with free()). */
KILN_API char *kiln_graph_to_string(const kiln_graph *g);
/* The graph as Graphviz DOT text (malloc'd; NULL when out of memory): fused groups and control-flow
 * bodies drawn as clusters, nodes labelled with op, shape and source line (src/ir/dot.c). */
KILN_API char *kiln_graph_to_dot(const kiln_graph *g);
/* The graph a text in kiln_graph_to_string's form describes. Text from anywhere is safe to give
 * it: beyond these limits, and on any other error, it returns KILN_ERR_VALUE with a message
 * naming the line ("graph text line N: ..."; KILN_ERR_MEMORY when an allocation fails), having
 * allocated nothing it keeps. Shapes are
 * checked as kiln_shape_numel_checked does (at most KILN_MAX_DIMS dimensions). */
#define KILN_GRAPH_TEXT_MAX_DEPTH 64               /* subgraphs nested in subgraphs */
#define KILN_GRAPH_TEXT_MAX_VALUES (1 << 20)       /* values per graph: ids %0 ... %1048575 */
#define KILN_GRAPH_TEXT_MAX_CONSTANT ((int64_t)1 << 24) /* elements of a constant, captured or parameter line */
KILN_API kiln_status kiln_graph_parse(const char *text, kiln_graph **out);

/* ---- tracing: kiln_apply records into the thread's active tracer ------------------------ */

typedef struct kiln_tracer kiln_tracer;

/* Starts recording on this thread. Begun while another tracer records, it nests inside it (the
 * bodies of control flow): the outer one resumes when this one ends. */
KILN_API kiln_status kiln_tracer_begin(kiln_tracer **out);
/* Stops recording on this thread; the tracer keeps what it saw. */
KILN_API void kiln_tracer_end(kiln_tracer *tr);
KILN_API void kiln_tracer_free(kiln_tracer *tr);
/* Declares t as graph input number `position` (in order). */
KILN_API kiln_status kiln_tracer_add_input(kiln_tracer *tr, kiln_tensor *t);
/* Treat tensors met for the first time as constants (copied) instead of live references. */
KILN_API void kiln_tracer_set_capture_constants(kiln_tracer *tr, bool constants);
/* Source location recorded with the following ops ("file:line"; NULL clears). */
KILN_API kiln_status kiln_tracer_set_loc(kiln_tracer *tr, const char *loc);
/* The value of t in the graph (capturing it when unknown). */
KILN_API kiln_status kiln_tracer_value_of(kiln_tracer *tr, kiln_tensor *t, int32_t *value);
/* Whether t was produced by an op recorded by this tracer or is one of its inputs. */
KILN_API bool kiln_tracer_knows(const kiln_tracer *tr, const kiln_tensor *t);
KILN_API kiln_graph *kiln_tracer_graph(kiln_tracer *tr);
KILN_API kiln_tracer *kiln_tracer_active(void);
/* Stops recording on this thread (MegEngine's exclude_from_trace): ops run eagerly, unrecorded,
 * until kiln_tracer_resume(the tracer returned), which must follow on the same thread. */
KILN_API kiln_tracer *kiln_tracer_suspend(void);
KILN_API void kiln_tracer_resume(kiln_tracer *suspended);
/* Whether the active trace is nested in another (a control-flow body traced once to be recorded; its ops
 * run again for real when the node runs). */
KILN_API bool kiln_tracer_in_body(void);
/* Called where a tensor's value leaves kiln for the caller (a truth test, item(), a buffer export):
 * when an active trace recorded t, the trace (and those enclosing it) count the read, since what the
 * caller computes from the value is fixed in the graph. */
KILN_API void kiln_tracer_note_value_read(const kiln_tensor *t);
/* Reads counted by tr; *first_loc (when not NULL) is set to the "file:line" of the first, or NULL. */
KILN_API int32_t kiln_tracer_value_reads(const kiln_tracer *tr, const char **first_loc);
/* The tensors no active trace knew whose values were read while tr was active (a global tensor's
 * item()): the k-th (borrowed) and the storage version it had then. A graph that holds what the
 * caller computed from such a value is right while that version holds. */
KILN_API int32_t kiln_tracer_num_outside_reads(const kiln_tracer *tr);
KILN_API kiln_tensor *kiln_tracer_outside_read(const kiln_tracer *tr, int32_t k, int64_t *version);
/* The tensors a capture_constants trace copied in as constants: the k-th original (borrowed), the
 * graph value it became and the storage version it had then (a later in-place write changes it). */
KILN_API int32_t kiln_tracer_num_constant_sources(const kiln_tracer *tr);
KILN_API kiln_tensor *kiln_tracer_constant_source(const kiln_tracer *tr, int32_t k, int32_t *value,
                                                  int64_t *version);
/* Marks the ops recorded from now on, until kiln_tracer_end_recompute, with a new call id to be
 * recomputed for the backward (kiln_node.recompute: a call of a Cell marked with
 * Cell.recompute()); inside a marked call, nothing changes. Returns what to pass to the end. */
KILN_API int32_t kiln_tracer_begin_recompute(kiln_tracer *tr);
KILN_API void kiln_tracer_end_recompute(kiln_tracer *tr, int32_t previous);
/* Number of ops recorded so far. */
KILN_API int32_t kiln_tracer_count(const kiln_tracer *tr);
/* An undo log: while `keep` is set, each tensor the traced ops (or those of traces nested in it)
 * write in place is copied before its first write; kiln_tracer_undo_writes puts those values back
 * (a capture that ran an in-place update which the compiled graph is about to run again) and
 * kiln_tracer_drop_undo forgets them. */
KILN_API void kiln_tracer_keep_undo(kiln_tracer *tr, bool keep);
KILN_API kiln_status kiln_tracer_undo_writes(kiln_tracer *tr);
KILN_API void kiln_tracer_drop_undo(kiln_tracer *tr);

/* ---- loop gradients --------------------------------------------------------------------- */

/* The gradient of a loop whose trip count the front end knows (kiln.ops.scan, fori_loop with int
 * bounds) stores each step's residuals (the values the body's backward reads) when trip count x
 * residual bytes per step is at most this budget, and otherwise recomputes them from each step's
 * loop values in the backward (src/ir/control_grad.c). Read when a gradient is built; 1 GiB by
 * default; 0 always recomputes. Process-wide. */
#define KILN_LOOP_RESIDUAL_BUDGET_DEFAULT ((int64_t)1 << 30)
KILN_API void kiln_set_loop_residual_budget(int64_t bytes);
KILN_API int64_t kiln_loop_residual_budget(void);

/* ---- compiled graphs ------------------------------------------------------------------- */

typedef enum kiln_exec_order { KILN_ORDER_BFS, KILN_ORDER_DFS } kiln_exec_order;

typedef struct kiln_executable kiln_executable;

typedef struct kiln_compile_options {
    kiln_exec_order order;
    bool poison_freed;   /* debug: fill buffers with NaN after their last use */
    const char *backend; /* a registered backend's name (kiln_backend_names); NULL: "kbk" */
} kiln_compile_options;

/* The backends a compiled graph can run on, registered by name (src/runtime/backends.def):
 * "kbk" (kernel by kernel), "sink" (the whole graph as one generated function: MindSpore's GE /
 * exc_mode="sink"; graphs with control-flow nodes run kernel by kernel) and "reference" (each
 * node's kernel from the op table, fused groups node by node: a check of the others). Their names
 * in registration order, ", "-separated ("kbk, sink, reference"); static. */
KILN_API const char *kiln_backend_names(void);
KILN_API int kiln_backend_count(void);
KILN_API const char *kiln_backend_name_at(int k); /* NULL past the end */

/* Plans g (order, memory, fused groups: the plan keeps its own copy of g, which may be freed) and
 * prepares the backend named opt->backend (kbk when opt or the name is NULL; KILN_ERR_VALUE naming
 * the registered ones for a name not registered) to run it. KILN_DUMP_PLAN=1 prints the plan. */
KILN_API kiln_status kiln_compile(const kiln_graph *g, const kiln_compile_options *opt, kiln_executable **out);
KILN_API void kiln_executable_free(kiln_executable *e);
/* Runs with the graph inputs bound to `inputs` (metas must match); outputs are new references. */
KILN_API kiln_status kiln_executable_run(kiln_executable *e, int nin, kiln_tensor *const *inputs, int nout,
                                         kiln_tensor **outputs);
KILN_API int kiln_executable_num_outputs(const kiln_executable *e);
/* Bytes of the planned arena (all intermediates) and of the outputs of one call. */
KILN_API size_t kiln_executable_arena_bytes(const kiln_executable *e);
KILN_API size_t kiln_executable_output_bytes(const kiln_executable *e);
/* Node order as op names, for tests and dumps ("mul add"). malloc'd. */
KILN_API char *kiln_executable_order_string(const kiln_executable *e);
/* The plan's text form (see src/plan/plan.h). malloc'd. */
KILN_API char *kiln_executable_plan_string(const kiln_executable *e);
/* The name of the backend that runs it ("kbk", "sink", ...). */
KILN_API const char *kiln_executable_backend(const kiln_executable *e);
/* sink: whether the graph runs as generated native code (false: the interpreted loop, or kbk). */
KILN_API bool kiln_executable_is_native(const kiln_executable *e);
/* sink: calls run kernel by kernel over the same plan (inputs in layouts the generated code was
 * not made for, when the graph writes or returns them). */
KILN_API int64_t kiln_executable_fallback_calls(const kiln_executable *e);


#ifdef __cplusplus
}
#endif
#endif
