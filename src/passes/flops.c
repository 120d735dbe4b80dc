/* kiln_node_flops: the estimated work of a node, for what recomputation costs: the op table's
 * footprint (KILN_COST in ops.def, kiln_op_flops), summed over a fused group's own nodes. */
#include "passes_internal.h"

#include "../ir/body.h"
#include "../ops/footprint.h"

int64_t kiln_node_flops(const kiln_graph *g, int32_t i) {
    const kiln_node *n = &g->nodes[i];
    kiln_graph *sub;
    if (n->op == KILN_OP_FUSED && kiln_graph_body(g, n, 0, &sub) == KILN_OK) {
        int64_t sum = 0;
        for (int32_t j = 0; j < sub->nnodes; j++) sum += kiln_node_flops(sub, j);
        return sum;
    }
    const kiln_meta *in[16], *out[KILN_MAX_OUTPUTS]; /* (footprints read the first operands only) */
    int nin = n->nin < 16 ? n->nin : 16;
    for (int k = 0; k < nin; k++) in[k] = &g->values[n->in[k]].meta;
    for (int k = 0; k < n->nout; k++) out[k] = &g->values[n->out[k]].meta;
    return kiln_op_flops(n->op, &n->attrs, nin, in, n->nout, out);
}
