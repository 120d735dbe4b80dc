/* Finding the forward value whose sizes a backward node follows (follow.h). */
#include "follow.h"

#define MAX_VOTES 8

bool kiln_follow_span(const kiln_node *n, int *first, int *count) {
    switch (n->op) {
    case KILN_OP_RESHAPE:
    case KILN_OP_EXPAND: *first = 0, *count = n->attrs.ni; return *count <= KILN_MAX_DIMS;
    case KILN_OP_FULL:
        *first = KILN_A_FULL_SHAPE, *count = (int)kiln_attr_int(&n->attrs, KILN_A_FULL_NDIM, -1);
        return *count >= 0 && *count <= KILN_MAX_DIMS && KILN_A_FULL_SHAPE + *count <= n->attrs.ni;
    case KILN_OP_CONV2D_BACKWARD_INPUT:
    case KILN_OP_CONV2D_BACKWARD_WEIGHT:
        *first = KILN_A_CONV_SHAPE, *count = KILN_A_CONV_WINOGRAD - KILN_A_CONV_SHAPE; /* Winograd flag optional */
        return n->attrs.ni == KILN_A_CONV_WINOGRAD || n->attrs.ni == KILN_A_CONV_NI;
    case KILN_OP_AVG_POOL2D_BACKWARD:
        *first = KILN_A_POOL_SHAPE, *count = KILN_A_POOL_NI - KILN_A_POOL_SHAPE;
        return n->attrs.ni == KILN_A_POOL_NI;
    default: return false;
    }
}

/* One value's vote (`got`, from its recorded shape `old` and its shape `now` in c): j == 1, sizes
 * `was` equal to the value's, a size 1 where the value's is not kept at 1; j >= 2 (reshapes), the
 * value's leading j sizes merged into the first. */
static bool vote(kiln_symtab *t, const int64_t *was, int count, const kiln_meta *old, const kiln_sshape *now, int j,
                 kiln_sdim *got) {
    if (old->ndim != count + j - 1) return false;
    if (j == 1) {
        for (int k = 0; k < count; k++) {
            if (was[k] != old->shape[k] && was[k] != 1) return false;
            got[k] = was[k] == old->shape[k] ? now->d[k] : kiln_sdim_const(1);
        }
        return true;
    }
    int64_t lead = 1;
    kiln_sdim lead_now = kiln_sdim_const(1);
    for (int k = 0; k < j; k++) {
        lead *= old->shape[k];
        if (kiln_sym_mul(t, lead_now, now->d[k], &lead_now) != KILN_OK) return false;
    }
    if (count < 1 || was[0] != lead) return false;
    got[0] = lead_now;
    for (int k = 1; k < count; k++) {
        if (was[k] != old->shape[j + k - 1]) return false;
        got[k] = now->d[j + k - 1];
    }
    return true;
}

static bool same_sizes(int count, const kiln_sdim *a, const kiln_sdim *b) {
    for (int k = 0; k < count; k++)
        if (!kiln_sdim_same(a[k], b[k])) return false;
    return true;
}

kiln_status kiln_follow_sizes(const kiln_graph *orig, const kiln_graph *c, int32_t node, kiln_follow_fits fits,
                              void *ctx, const char *what, int pick, int *options, kiln_sdim *out) {
    const kiln_node *n = &orig->nodes[node];
    const char *name = kiln_op_table[n->op].name;
    int first, count;
    *options = 0;
    if (!kiln_follow_span(n, &first, &count))
        return kiln_error(KILN_ERR_VALUE, "%s: node %d (%s) holds no sizes to follow", what, node, name);
    const int64_t *was = &n->attrs.i[first];
    kiln_sdim votes[MAX_VOTES][KILN_MAX_DIMS], got[KILN_MAX_DIMS];
    int nv = 0, merges = n->op == KILN_OP_RESHAPE ? KILN_MAX_DIMS : 1;
    for (int32_t v = 0; v < orig->nvalues; v++) {
        const kiln_value *ov = &orig->values[v];
        if (ov->kind == KILN_VALUE_NODE && ov->node >= node) continue;
        kiln_sshape now;
        kiln_graph_value_sshape(c, v, &now);
        for (int j = 1; j <= merges; j++) {
            if (!vote(c->syms, was, count, &ov->meta, &now, j, got)) continue;
            bool known = false;
            for (int k = 0; k < nv && !known; k++) known = same_sizes(count, votes[k], got);
            if (known) continue;
            if (nv == MAX_VOTES)
                return kiln_error(KILN_ERR_VALUE, "%s: node %d (%s) follows values whose sizes now differ", what, node,
                                  name);
            memcpy(votes[nv++], got, sizeof got);
        }
    }
    if (nv == 0)
        return kiln_error(KILN_ERR_VALUE, "%s: node %d (%s) has no value whose sizes it follows", what, node, name);
    int left = 0;
    for (int k = 0; k < nv; k++) /* the votes the node infers with, in order */
        if (nv == 1 || fits(ctx, votes[k])) memmove(votes[left++], votes[k], sizeof votes[k]);
    if (left == 0)
        return kiln_error(KILN_ERR_VALUE, "%s: node %d (%s) follows values whose sizes now differ", what, node, name);
    *options = left;
    memcpy(out, votes[pick >= 0 && pick < left ? pick : 0], sizeof(kiln_sdim) * (size_t)count);
    return KILN_OK;
}
