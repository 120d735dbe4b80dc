/* Where core and ops reach the layers above them without including them (layers call downward
 * only): the tracer (src/ir/trace.c) and the autograd tape (src/autograd/engine.c) fill in
 * kiln_hooks when the library loads; the tracer keeps the thread's tracing state (kiln_thread)
 * up to date as traces begin and end. */
#ifndef KILN_CORE_HOOKS_H
#define KILN_CORE_HOOKS_H

#include "internal.h"

struct kiln_grad_node;
struct kiln_graph;
typedef struct kiln_tracer kiln_tracer; /* the tracer of include/kiln/graph.h, opaque here */

typedef struct kiln_layer_hooks {
    /* the tracer: records an op kiln_apply just ran into the thread's active trace */
    void (*trace_record)(kiln_op op, int nin, kiln_tensor *const *in, const kiln_attrs *attrs, int nout,
                         kiln_tensor **out);
    /* the tracer: an op that writes some of its inputs in place is about to run (kept for
     * kiln_tracer_undo_writes when the trace keeps an undo log) */
    void (*trace_before_write)(kiln_op op, int nin, kiln_tensor *const *in);
    /* the tracer: `alias` (a detached view of t) stands for t's value in the active trace */
    void (*trace_alias)(const kiln_tensor *t, const kiln_tensor *alias);
    /* autograd: records a differentiable op kiln_apply ran with inputs that require grad */
    kiln_status (*autograd_record)(kiln_op op, int nin, kiln_tensor *const *in, const kiln_attrs *attrs,
                                   int nout, kiln_tensor **out);
    /* autograd: drops a reference to a tensor's grad_fn */
    void (*grad_node_release)(struct kiln_grad_node *node);
    /* control flow (ir/control.c): takes (delta 1) or drops (delta -1) a reference to the bodies a
     * control-flow node's attrs name in the body registry, for a tape node that keeps the attrs */
    void (*bodies_hold)(kiln_op op, const kiln_attrs *attrs, int delta);
    /* the tracer: which trace is active (a serial, 0: none) and the source location its next op
     * takes (-1: none), for a tape node to keep */
    void (*trace_loc_get)(uint64_t *trace, int32_t *loc);
    /* the tracer: while trace `trace` is active, the ops it records take location loc (-1: their
     * own again); returns the one set before (-1 when `trace` is not the active trace) */
    int32_t (*trace_loc_set)(uint64_t trace, int32_t loc);
    /* control flow: the op table's if / while / while_grad entries (src/ops/control_ops.c) run
     * their eager shape inference and kernel from the runtime (runtime/control_flow.c) and their
     * gradient rules from the IR (ir/control_grad.c), which fill these in */
    kiln_status (*control_infer)(kiln_op op, int nin, kiln_tensor *const *in, const kiln_attrs *a, kiln_meta *out);
    kiln_status (*control_kernel)(kiln_op op, kiln_tensor *const *in, int nin, const kiln_attrs *a,
                                  kiln_tensor **out);
    kiln_status (*control_grad)(kiln_op op, const kiln_grad_ctx *ctx, kiln_tensor *const *gout, kiln_tensor **gin);
    /* the pass pipeline (passes/pipeline.c): dead code elimination over *g (replaced by the result),
     * for the IR's gradient bodies */
    kiln_status (*eliminate_dead_code)(struct kiln_graph **g);
    /* the pass pipeline: O1's rewrites and fusion over a loop or branch body (replaced by the
     * result), for the runtime's eager control-flow kernels: the loop a trace runs once to record
     * it runs as fast as the compiled graph's (a jitted function's first call) */
    kiln_status (*optimize_body)(struct kiln_graph **g);
} kiln_layer_hooks;

/* Hidden: defined in this library, so kiln_apply reads them without going through the GOT. */
#define KILN_HIDDEN __attribute__((visibility("hidden")))

extern KILN_HIDDEN kiln_layer_hooks kiln_hooks;

/* What kiln_apply reads of the thread's state (read directly: no call into the layers above). */
typedef struct kiln_thread_state {
    kiln_tracer *trace_active; /* the active tracer, NULL when none */
    bool trace_in_body;        /* it records a control-flow body (a trace nested in another: its ops
                                * run again for real when the node runs) */
    bool grad_disabled;        /* grad mode off (kiln_set_grad_enabled(false)) */
    bool trace_symbolic;       /* a dynamic-shape capture records: gradient rules take sizes from
                                * ops (which a rebinding follows) rather than baking them in */
    int8_t amp_level;          /* kiln_amp_level: casts kiln_apply inserts (src/ops/amp.c) */
    int8_t amp_low;            /* kiln_dtype those casts narrow to */
} kiln_thread_state;

extern KILN_HIDDEN _Thread_local kiln_thread_state kiln_thread;

#endif
