/* Kernel events of graph nodes: a fused node is named by its group's ops ("fused(mul+add)") and
 * counts their FLOPs over the group's own shapes. */
#include "profile_node.h"

#include "../ir/body.h"
#include "../ops/footprint.h"

/* Sum of the FLOPs of sub's nodes; their names joined by '+' into name. */
static int64_t group_footprint(const kiln_graph *sub, char *name, size_t size) {
    int64_t flops = 0;
    size_t used = (size_t)snprintf(name, size, "fused(");
    for (int32_t i = 0; i < sub->nnodes; i++) {
        const kiln_node *nd = &sub->nodes[i];
        const kiln_meta *in[16], *out[KILN_MAX_OUTPUTS];
        int nin = nd->nin < 16 ? nd->nin : 16;
        for (int k = 0; k < nin; k++) in[k] = &sub->values[nd->in[k]].meta;
        for (int k = 0; k < nd->nout; k++) out[k] = &sub->values[nd->out[k]].meta;
        flops += kiln_op_flops(nd->op, &nd->attrs, nin, in, nd->nout, out);
        if (used + 2 < size)
            used += (size_t)snprintf(name + used, size - used, "%s%s", i ? "+" : "", kiln_op_table[nd->op].name);
    }
    if (used + 2 < size) snprintf(name + used, size - used, ")");
    return flops;
}

static const char *group_loc(const kiln_graph *sub) {
    for (int32_t i = 0; i < sub->nnodes; i++)
        if (sub->nodes[i].loc >= 0) return sub->locs[sub->nodes[i].loc];
    return NULL;
}

void kiln_profile_node(int32_t source, const kiln_graph *g, int32_t i, kiln_tensor *const *in, kiln_tensor *const *out,
                       int64_t start) {
    const kiln_node *nd = &g->nodes[i];
    kiln_profile_op_info what = {.source = source, .op = nd->op, .attrs = &nd->attrs, .node = i,
                                 .graph = (uint64_t)(uintptr_t)g, .flops = -1,
                                 .loc = nd->loc >= 0 ? g->locs[nd->loc] : NULL};
    char name[256];
    kiln_graph *sub;
    if (nd->op == KILN_OP_FUSED && kiln_graph_body(g, nd, 0, &sub) == KILN_OK) {
        what.flops = group_footprint(sub, name, sizeof name);
        what.name = name;
        if (!what.loc) what.loc = group_loc(sub);
    }
    kiln_profile_tensors(&what, nd->nin, in, nd->nout, out, start);
}
