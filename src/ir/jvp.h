/* Forward mode over a recorded graph (src/ir/jvp.c): the graph's nodes run again through kiln_apply
 * with each op's JVP rule (ops.def KILN_JVP) after it, so one pass computes the outputs and their
 * tangents; the active tracer, when there is one, records every op of that pass (so kiln.jit and
 * kiln.trace get the forward-mode graph as nodes of their own), and autograd sees them as eager ops. */
#ifndef KILN_IR_JVP_H
#define KILN_IR_JVP_H

#include "../core/internal.h"
#include "kiln/graph.h"

/* Whether forward mode goes through op: a JVP rule in ops.def, or `if` / `while` (this transform's
 * own: an if over its branches' JVP graphs, a while carrying the tangents with the values). */
bool kiln_jvp_supports(kiln_op op);

/* Runs g on inputs x (nin = g->ninputs) whose tangents are t (t or entries of
 * it may be NULL: zero); y gets g's outputs and, when ty is not NULL, ty their tangents (new
 * references; zeros where none flows). KILN_ERR_VALUE naming the op (and the user's source line when
 * recorded) for an op without a JVP rule that a tangent reaches (while_grad among them). */
kiln_status kiln_jvp_run(const kiln_graph *g, int nin, kiln_tensor *const *x, kiln_tensor *const *t, int nout,
                         kiln_tensor **y, kiln_tensor **ty);

/* The JVP graph of g: inputs (x..., t...) -> outputs (y..., ty...), one pass (recorded while it runs
 * once on x and zero tangents). */
kiln_status kiln_jvp_graph(const kiln_graph *g, int nin, kiln_tensor *const *x, kiln_graph **out);

/* g's JVP graph cut in two at the values its tangent part reads (JAX's linearize): *primal takes x
 * and returns (y..., residuals...) (*nresiduals of them), *linear takes (residuals..., t...) and
 * returns ty..., holding only the nodes that read a tangent, so each call of it reuses the
 * linearization instead of running the forward again. */
kiln_status kiln_jvp_linearize(const kiln_graph *g, int nin, kiln_tensor *const *x, kiln_graph **primal,
                               kiln_graph **linear, int32_t *nresiduals);

#endif
