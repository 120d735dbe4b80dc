/* kiln_node_flops: the estimated work of a node, for what recomputation costs. */
#include "passes_internal.h"

#include <math.h>

int64_t kiln_node_flops(const kiln_graph *g, int32_t i) {
    const kiln_node *n = &g->nodes[i];
    const kiln_op_info *info = &kiln_op_table[n->op];
    if (info->fusion == KILN_FUSE_VIEW || (info->flags & KILN_OPF_VIEW)) return 0;
    int64_t out = 0;
    for (int k = 0; k < n->nout; k++) out += kiln_meta_numel(&g->values[n->out[k]].meta);
    /* a product (ops.def's KILN_OPF_PRODUCT): 2*M*N*K is 2*sqrt(|A|*|B|*|C|) for 2-D operands;
     * convolutions: 2*|C|*|W|/out_channels */
    if ((info->flags & KILN_OPF_PRODUCT) && n->nin >= 2 && n->nout == 1) {
        const kiln_meta *a = &g->values[n->in[0]].meta, *b = &g->values[n->in[1]].meta;
        const kiln_meta *c = &g->values[n->out[0]].meta;
        if (a->ndim == 4 && b->ndim == 4 && c->ndim == 4 && b->shape[0] > 0)
            return 2 * kiln_meta_numel(c) * (kiln_meta_numel(b) / b->shape[0]);
        if (a->ndim >= 2 && b->ndim >= 2)
            return (int64_t)(2.0 * sqrt((double)kiln_meta_numel(a) * (double)kiln_meta_numel(b) * (double)out));
    }
    return out;
}
