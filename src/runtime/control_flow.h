/* The runtime of control-flow nodes (src/runtime/control_flow.c): executables of an if's
 * branches or a while's cond, body (and backward body), and composed iteration. */
#ifndef KILN_RUNTIME_CONTROL_FLOW_H
#define KILN_RUNTIME_CONTROL_FLOW_H

#include "../plan/plan.h"

typedef struct kiln_control_node kiln_control_node;
struct kiln_backend; /* backend.h */
/* The executables of node `node` of p, over p's nested plans (which outlive them), run by backend
 * be (the enclosing plan's own, so a body runs as the graph around it does). */
kiln_status kiln_control_prepare(const kiln_plan *p, int32_t node, const struct kiln_backend *be,
                                 kiln_control_node **out);
/* Runs it; out[] arrive allocated (the node's output metas) and are filled. */
kiln_status kiln_control_run(kiln_control_node *c, int nin, kiln_tensor *const *in, int nout, kiln_tensor **out);
void kiln_control_free(kiln_control_node *c);
/* How many times loops' bodies have run forward in this process (every while iteration, and every
 * iteration of a while_grad's rerun of its loop; not backward bodies): tests count with it. */
int64_t kiln_loop_body_runs(void);
/* How many loop-invariant GEMM operands while_grad runs have packed (laid out transposed once per
 * loop, control_flow.c pack_transposed) in this process: tests count with it. */
int64_t kiln_loop_packed_operands(void);

#endif
