/* Control flow: the body registry, capture lifting, shape inference of control-flow nodes and
 * the eager graph interpreter (src/ir/control.c); the runtime of if/while nodes is
 * src/runtime/control_flow.h.
 *
 * A control-flow node names its subgraphs through attrs. Inside a graph those are indices into
 * the graph's `subgraphs` (the graph owns them); given to kiln_apply (eagerly, or while tracing)
 * they are ids of bodies in the registry below, and the tracer copies the bodies it meets into
 * the graph it records. Registered bodies are reference counted: the caller that registers them
 * for one kiln_apply releases them after it, and a tape node recording the op holds them until
 * it goes; so they live as long as something can still run them. */
#ifndef KILN_IR_CONTROL_H
#define KILN_IR_CONTROL_H

#include "../core/internal.h"
#include "kiln/graph.h"
#include "body.h"

/* The attr slots of a control-flow op that name subgraphs (at most 4; kiln_op_body_attr of each
 * body, body.h); returns how many (0 for other ops, fused ones included). */
int kiln_control_slots(kiln_op op, int *slots);
static inline bool kiln_op_is_control(kiln_op op) { return kiln_op_table[op].flags & KILN_OPF_CONTROL; }

/* Stored residuals (ops.def, src/ir/control_grad.c): how many a while or while_grad node stores
 * (i[NRES]); whether a while_grad is given them as inputs by its while (i[GIVEN]); and the loop
 * values of a while / while_grad node with nin inputs and nout outputs. */
static inline int kiln_loop_nres(kiln_op op, const kiln_attrs *a) {
    return op == KILN_OP_WHILE || op == KILN_OP_WHILE_GRAD ? (int)kiln_attr_int(a, KILN_A_WHILE_NRES, 0) : 0;
}
static inline bool kiln_loop_given(kiln_op op, const kiln_attrs *a) {
    return op == KILN_OP_WHILE_GRAD && kiln_attr_int(a, KILN_A_WHILE_GIVEN, 0) != 0;
}
/* The stacked cotangents a given while_grad returns after its gradients (ops.def STACK). */
static inline int kiln_loop_nstacked(kiln_op op, const kiln_attrs *a) {
    if (!kiln_loop_given(op, a)) return 0;
    int n = (int)kiln_attr_int(a, KILN_A_WHILE_NSTACK, 0), nd = 0;
    for (int t = 0; t < n && KILN_A_WHILE_STACK + 3 * t + 2 < a->ni; t++)
        if (a->i[KILN_A_WHILE_STACK + 3 * t + 2] + 1 > nd) nd = (int)a->i[KILN_A_WHILE_STACK + 3 * t + 2] + 1;
    return nd;
}
static inline int kiln_loop_nloop(kiln_op op, const kiln_attrs *a, int nin, int nout) {
    int nres = kiln_loop_nres(op, a);
    return op == KILN_OP_WHILE ? nout - nres
                               : nin - (nout - kiln_loop_nstacked(op, a)) - (kiln_loop_given(op, a) ? nres : 0);
}
/* The meta of a buffer holding `trips` rows of meta m (a stored residual of every step). */
kiln_status kiln_loop_stacked_meta(const kiln_meta *m, int64_t trips, kiln_meta *out);

/* Output metas of a control-flow node from its inputs' metas and subgraphs (subs[k] is the
 * subgraph named by slot k of kiln_control_slots); errors name the op, the subgraph and metas. */
kiln_status kiln_control_infer(kiln_op op, int nin, const kiln_meta *in, const kiln_attrs *a,
                               const kiln_graph *const *subs, kiln_meta *out);

/* ---- the body registry ---------------------------------------------------------------------- */

/* Takes ownership of g (verified; bodies must not write tensors in place or draw random numbers);
 * its subgraphs are registered too (the body holds them). The caller holds the one reference
 * the new body starts with. */
kiln_status kiln_body_register(kiln_graph *g, int64_t *id);
/* References to a body: whoever keeps an id for later holds one (the node of the tape that recorded
 * a control-flow op holds its bodies, see core/hooks.h). The last release frees the body; its id
 * then names nothing. Unknown or released ids are ignored. */
void kiln_body_retain(int64_t id);
void kiln_body_release(int64_t id);
/* Body `holder` holds a reference to body `held` until it is freed (a loop's stored-residual
 * forward body holds its backward body: the gradient rule of the node finds it there). */
kiln_status kiln_body_hold(int64_t holder, int64_t held);
/* The body `id` holds (borrowed), or -1 (an error set when id names no body). */
int64_t kiln_body_held(int64_t id);
/* Bodies registered and not yet released (for tests). */
int64_t kiln_body_live_count(void);
/* The body's graph (borrowed: valid while a reference is held), or NULL with an error set. */
const kiln_graph *kiln_body_graph(int64_t id);
/* Body k of a control-flow op given to kiln_apply (its attrs name registered bodies): borrowed, or
 * NULL with an error naming the op when a lacks the int or it names no registered body. */
const kiln_graph *kiln_body_of(kiln_op op, const kiln_attrs *a, int k);
/* attrs of a node of body `id`'s graph with its subgraph indices turned into registry ids. */
kiln_status kiln_body_node_attrs(int64_t id, const kiln_node *n, kiln_attrs *out);

/* Runs body `id` by applying its nodes with kiln_apply, so the active tracer and autograd see
 * its ops (gradient rules record backward bodies this way). Outputs are new references. */
kiln_status kiln_body_interpret(int64_t id, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out);

/* ---- lifting ---------------------------------------------------------------------------------- */

/* Turns the live (non-constant) captures of the n bodies into extra trailing inputs that all of
 * them share: the union of the captured tensors, in order of first appearance, lands in
 * *lifted (malloc'd array of new references, *nlifted of them); each body gets one input per
 * lifted tensor, in that order, whether it reads it or not. */
kiln_status kiln_bodies_lift(int n, kiln_graph *const *bodies, kiln_tensor ***lifted, int *nlifted);
/* Makes captured value v of g its next input (the captured tensor is released). */
kiln_status kiln_graph_capture_to_input(kiln_graph *g, int32_t v);

/* ---- loops recorded for a gradient (src/ir/control_grad.c) ----------------------------------- */

/* A while about to be applied (attrs a naming registered bodies, i[TRIPS] its trip count) over
 * inputs in[0..nin) whose gradient the caller will take (the front end knows: inside kiln.grad):
 * when autograd records it (on, a float input requiring grad), its trip count is known and its
 * stored residuals fit kiln_loop_residual_budget, a is made
 * the storing while (ops.def: i[1] the stored-residual body F, which holds its backward body; the
 * node returns the residual buffers after the loop values) and *fwd is F's id (a reference the
 * caller releases after applying it); else a is left as it is and *fwd is -1. The loop then runs
 * forward once for its value and its gradient. */
kiln_status kiln_while_for_gradient(int nin, kiln_tensor *const *in, kiln_attrs *a, int64_t *fwd);

#endif
