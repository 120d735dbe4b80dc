/* Dead-code elimination: drops nodes none of whose outputs are used. Nodes with effects stay:
 * in-place writes (batch_norm's running statistics too), and random ops (the generator's
 * stream must advance as in eager code). */
#include "passes_internal.h"

kiln_status kiln_pass_dce(const kiln_graph *in, const kiln_pass_options *opt, kiln_graph **out) {
    (void)opt;
    int32_t *uses = kiln_graph_use_counts(in);
    bool *keep = kiln_calloc((size_t)(in->nnodes ? in->nnodes : 1), sizeof(bool));
    if (!uses || !keep) {
        free(uses), free(keep);
        return kiln_error(KILN_ERR_MEMORY, "out of memory in dce");
    }
    int32_t dropped = 0;
    for (int32_t i = in->nnodes - 1; i >= 0; i--) { /* backwards: a dropped node frees its inputs */
        const kiln_node *n = &in->nodes[i];
        bool live = kiln_node_has_effects(n);
        for (int k = 0; k < n->nout && !live; k++) live = uses[n->out[k]] > 0;
        keep[i] = live;
        if (!live) {
            dropped++;
            for (int k = 0; k < n->nin; k++) uses[n->in[k]]--;
        }
    }
    kiln_status s = KILN_OK;
    *out = NULL;
    if (dropped) {
        kiln_rewriter rw;
        s = kiln_rewriter_begin(&rw, in);
        for (int32_t i = 0; i < in->nnodes && s == KILN_OK; i++)
            if (keep[i]) s = kiln_rewriter_copy_node(&rw, i);
        if (s == KILN_OK) s = kiln_rewriter_finish(&rw, out);
        else kiln_rewriter_abort(&rw);
    }
    free(uses), free(keep);
    return s;
}
