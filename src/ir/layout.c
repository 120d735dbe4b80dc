/* Static layouts: views follow their input's strides by the rule of their kernels
 * (kiln_view_strides); every other node's result is a fresh contiguous tensor (or, for in-place
 * ops, the tensor they write). */
#include "layout.h"

#include "../ops/view.h"

bool kiln_graph_value_strides(const kiln_graph *g, int32_t v, int64_t *strides) {
    const kiln_value *val = &g->values[v];
    const kiln_meta *m = &val->meta;
    if (val->kind != KILN_VALUE_NODE) {
        kiln_contiguous_strides(m->ndim, m->shape, strides);
        return true;
    }
    const kiln_node *n = &g->nodes[val->node];
    const kiln_op_info *info = &kiln_op_table[n->op];
    if (!(info->flags & (KILN_OPF_VIEW | KILN_OPF_MUTATES)) || n->nin < 1) {
        kiln_contiguous_strides(m->ndim, m->shape, strides);
        return true;
    }
    int64_t in[KILN_MAX_DIMS];
    if (!kiln_graph_value_strides(g, n->in[0], in)) return false;
    if (!kiln_view_strides(n->op, &n->attrs, &g->values[n->in[0]].meta, in, strides)) /* a reshape that copies */
        kiln_contiguous_strides(m->ndim, m->shape, strides);
    return true;
}
