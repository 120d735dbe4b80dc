/* Static layouts: views (permute, expand, slice, reshape of contiguous values) follow their
 * input's strides; every other node's result is a fresh contiguous tensor (or, for in-place ops,
 * the tensor they write). */
#include "layout.h"

static bool is_contiguous(const kiln_meta *m, const int64_t *strides) {
    int64_t want[KILN_MAX_DIMS];
    kiln_contiguous_strides(m->ndim, m->shape, want);
    for (int d = 0; d < m->ndim; d++)
        if (m->shape[d] != 1 && strides[d] != want[d]) return false;
    return true;
}

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
    const kiln_meta *im = &g->values[n->in[0]].meta;
    if (!kiln_graph_value_strides(g, n->in[0], in)) return false;
    switch (n->op) {
    case KILN_OP_PERMUTE:
        for (int d = 0; d < m->ndim; d++) strides[d] = in[n->attrs.i[d]];
        return true;
    case KILN_OP_EXPAND: {
        int lead = m->ndim - im->ndim;
        for (int d = 0; d < m->ndim; d++) {
            int sd = d - lead;
            strides[d] = (sd < 0 || (im->shape[sd] == 1 && m->shape[d] != 1)) ? 0 : in[sd];
        }
        return true;
    }
    case KILN_OP_SLICE:
        for (int d = 0; d < m->ndim; d++) strides[d] = in[d] * n->attrs.i[8 + d];
        return true;
    case KILN_OP_RESHAPE:
        if (!is_contiguous(im, in)) return false;
        kiln_contiguous_strides(m->ndim, m->shape, strides);
        return true;
    default:
        if (info->flags & KILN_OPF_MUTATES) { /* the written tensor itself */
            for (int d = 0; d < m->ndim; d++) strides[d] = in[d];
            return m->ndim == im->ndim;
        }
        return false;
    }
}
