/* BatchNorm+ReLU backward fusion, for training graphs: batch_norm_backward(relu_backward(gy, r), x,
 * gamma, mean, invstd) becomes batch_norm_relu_backward(gy, x, gamma, mean, invstd, r), whose kernel
 * (src/ops/norm.c) applies relu's mask while it reads gy, so the masked gradient is never written
 * and read back. The relu_backward must feed only that batch_norm_backward's gy (one use, no graph
 * output), take no broadcast (gy, r and its result of x's shape and dtype), and nothing between the
 * two nodes may have side effects (an in-place write of gy or r in between would otherwise be seen).
 * The fused node takes the batch_norm_backward's position. */
#include "passes_internal.h"

/* The relu_backward node that feeds bn (node i) and can fuse into it, or -1. */
static int32_t fusable_relu(const kiln_graph *g, int32_t i, const int32_t *uses) {
    const kiln_node *bn = &g->nodes[i];
    const kiln_value *gy = &g->values[bn->in[0]];
    if (gy->kind != KILN_VALUE_NODE || uses[bn->in[0]] != 1) return -1;
    int32_t j = gy->node;
    const kiln_node *rb = &g->nodes[j];
    if (rb->op != KILN_OP_RELU_BACKWARD || rb->nin != 2 || rb->recompute != bn->recompute) return -1;
    const kiln_meta *x = &g->values[bn->in[1]].meta;
    for (int k = 0; k < 2; k++)
        if (!kiln_meta_equal(&g->values[rb->in[k]].meta, x)) return -1;
    if (!kiln_meta_equal(&gy->meta, x)) return -1;
    for (int32_t k = j + 1; k < i; k++)
        if (kiln_node_has_effects(&g->nodes[k])) return -1;
    return j;
}

KILN_PASS(fuse_bn_relu_backward) {
    (void)opt;
    *out = NULL;
    int32_t nn = in->nnodes;
    int32_t *uses = kiln_graph_use_counts(in);
    int32_t *relu_of = kiln_malloc(sizeof(int32_t) * (size_t)(nn ? nn : 1)); /* bn -> its relu_backward */
    bool *fused = kiln_calloc((size_t)(nn ? nn : 1), sizeof(bool));          /* relu_backward nodes taken */
    kiln_status s = KILN_OK;
    if (!uses || !relu_of || !fused) {
        s = kiln_error(KILN_ERR_MEMORY, "out of memory in fuse_bn_relu_backward");
        goto done;
    }
    int found = 0;
    for (int32_t i = 0; i < nn; i++) {
        relu_of[i] = in->nodes[i].op == KILN_OP_BATCH_NORM_BACKWARD ? fusable_relu(in, i, uses) : -1;
        if (relu_of[i] >= 0) fused[relu_of[i]] = true, found++;
    }
    if (!found) goto done;
    kiln_rewriter rw;
    if ((s = kiln_rewriter_begin(&rw, in)) != KILN_OK) goto done;
    for (int32_t i = 0; i < nn && s == KILN_OK; i++) {
        const kiln_node *bn = &in->nodes[i];
        if (fused[i]) continue;
        if (relu_of[i] < 0) {
            s = kiln_rewriter_copy_node(&rw, i);
            continue;
        }
        const kiln_node *rb = &in->nodes[relu_of[i]];
        int32_t ins[6] = {rw.map[rb->in[0]], rw.map[bn->in[1]], rw.map[bn->in[2]],
                          rw.map[bn->in[3]], rw.map[bn->in[4]], rw.map[rb->in[1]]};
        int32_t outs[KILN_MAX_OUTPUTS];
        s = kiln_keep_recompute_mark(
            kiln_graph_add_node(rw.dst, KILN_OP_BATCH_NORM_RELU_BACKWARD, 6, ins, &bn->attrs, bn->loc, outs), rw.dst,
            bn->recompute);
        for (int k = 0; k < bn->nout && s == KILN_OK; k++) rw.map[bn->out[k]] = outs[k];
    }
    if (s == KILN_OK) s = kiln_rewriter_finish(&rw, out);
    else kiln_rewriter_abort(&rw);
done:
    free(uses), free(relu_of), free(fused);
    return s;
}
