/* Which graph nodes generated C computes. */
#include "fusion.h"
#include "symbolic.h"

static bool is_float(kiln_dtype d) { return d == KILN_DTYPE_FLOAT32 || d == KILN_DTYPE_FLOAT64; }

static bool is_half(kiln_dtype d) { return d == KILN_DTYPE_FLOAT16 || d == KILN_DTYPE_BFLOAT16; }

kiln_dtype kiln_node_compute_dtype(const kiln_graph *g, const kiln_node *n) {
    kiln_dtype d = g->values[n->out[0]].meta.dtype;
    if (d == KILN_DTYPE_BOOL && n->nin > 0) {
        d = g->values[n->in[0]].meta.dtype;
        for (int k = 1; k < n->nin; k++) d = kiln_dtype_promote(d, g->values[n->in[k]].meta.dtype);
    }
    return d;
}

bool kiln_node_half_root(const kiln_graph *g, int32_t node) {
    const kiln_node *n = &g->nodes[node];
    return n->op == KILN_OP_CAST && n->nout == 1 && n->nin == 1 && is_half(g->values[n->out[0]].meta.dtype) &&
           is_float(g->values[n->in[0]].meta.dtype);
}

bool kiln_node_fusable(const kiln_graph *g, int32_t node) {
    const kiln_node *n = &g->nodes[node];
    const kiln_op_info *info = &kiln_op_table[n->op];
    if (n->nout != 1 || (info->flags & (KILN_OPF_MUTATES | KILN_OPF_WRITES_ANY | KILN_OPF_RANDOM | KILN_OPF_VIEW)))
        return false;
    kiln_dtype od = g->values[n->out[0]].meta.dtype;
    if (n->op == KILN_OP_FULL) return n->nin == 0 && n->attrs.nf >= 1 && is_float(od);
    if (info->fusion == KILN_FUSE_REDUCTION) return kiln_node_row_op(g, node);
    if (info->fusion != KILN_FUSE_ELEMENTWISE || !info->c_expr || n->nin != info->nin) return false;
    /* 16-bit floats (amp): read as group inputs (widening is exact), and written only by a cast
     * that is its group's root (kiln_node_half_root), which rounds its float result once as the
     * cast op does; every value inside a group is float32 or float64 */
    if (kiln_node_half_root(g, node)) return true;
    if (!is_float(od) && od != KILN_DTYPE_BOOL) return false;
    return is_float(kiln_node_compute_dtype(g, n));
}

bool kiln_node_row_op(const kiln_graph *g, int32_t node) {
    const kiln_node *n = &g->nodes[node];
    const kiln_row_recipe *rows = &kiln_op_rows[n->op];
    if (rows->axis == KILN_ROWS_NONE || n->nout != 1 || n->nin < 1 || n->nin != kiln_op_table[n->op].nin) return false;
    const kiln_meta *x = &g->values[n->in[0]].meta, *o = &g->values[n->out[0]].meta;
    if (x->ndim < 1 || x->shape[x->ndim - 1] < 2 || !is_float(x->dtype) || o->dtype != x->dtype) return false;
    const int32_t row_sym = g->values[n->in[0]].sym[x->ndim - 1]; /* rows of at least 2 at every binding */
    if (row_sym && kiln_sym_lower_bound(g->syms, (kiln_sdim){row_sym, x->shape[x->ndim - 1]}) < 2) return false;
    int last = x->ndim - 1;
    if (rows->axis == KILN_ROWS_REDUCE)
        return n->attrs.ni > KILN_A_REDUCE_KEEPDIMS && n->attrs.i[KILN_A_REDUCE_AXES] == ((int64_t)1 << last);
    /* ALONG: the ops of KILN_ROWS lines with an axis are the softmax family */
    if (kiln_attr_int(&n->attrs, KILN_A_SOFTMAX_AXIS, -1) != last || !kiln_graph_same_shape(g, n->out[0], n->in[0]))
        return false;
    for (int k = 1; k < n->nin; k++)
        if (!kiln_meta_equal(&g->values[n->in[k]].meta, x) || !kiln_graph_same_shape(g, n->in[k], n->in[0])) return false;
    return true;
}
