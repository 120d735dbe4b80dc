/* Inference rewrite: batch_norm (inference mode) after conv2d folds into the convolution,
 *   w' = w * s[c],  b' = beta + (b - mean) * s,  s = gamma / sqrt(var + eps).
 * The scaled weight and bias are computed by small ops on the captured parameters at every
 * call, so later updates of the parameters or running statistics are still seen; the pass
 * saves the whole normalization pass over the activation. */
#include "passes_internal.h"

/* Emits op(in...) into the rewritten graph; *out is its first output. */
static kiln_status emit(kiln_rewriter *rw, kiln_op op, int nin, const int32_t *in, const kiln_attrs *a, int32_t loc,
                        int32_t *out) {
    int32_t outs[KILN_MAX_OUTPUTS];
    KILN_TRY(kiln_graph_add_node(rw->dst, op, nin, in, a, loc, outs));
    *out = outs[0];
    return KILN_OK;
}

static kiln_status emit_scalar(kiln_rewriter *rw, double v, kiln_dtype dtype, int32_t *out) {
    kiln_tensor *t;
    KILN_TRY(kiln_tensor_empty(KILN_DTYPE_FLOAT64, 0, NULL, &t));
    *(double *)t->data = v;
    kiln_tensor *c = t;
    kiln_status s = KILN_OK;
    if (dtype != KILN_DTYPE_FLOAT64) {
        c = NULL; /* (a failed allocation leaves it as it was: t, released just below) */
        s = kiln_tensor_empty(dtype, 0, NULL, &c);
        if (s == KILN_OK) s = kiln_copy_into(c, t);
        kiln_tensor_release(t);
    }
    if (s == KILN_OK) s = kiln_graph_add_capture(rw->dst, c, true, out);
    kiln_tensor_release(c);
    return s;
}

/* Whether the convolution (its input, weight, bias and result) and the batch_norm (its result and
 * the four parameters) share one dtype. Under amp they need not (a bfloat16 convolution normalized
 * with float32 parameters at O3): the folded weight w * s would then take the parameters' dtype and
 * the convolution's result with it, so the folded graph would return another dtype than eager. */
static bool same_dtype(const kiln_graph *g, const kiln_node *conv, const kiln_node *bn) {
    kiln_dtype d = g->values[conv->out[0]].meta.dtype;
    for (int k = 0; k < conv->nin; k++)
        if (g->values[conv->in[k]].meta.dtype != d) return false;
    for (int k = 1; k < 5 && k < bn->nin; k++)
        if (g->values[bn->in[k]].meta.dtype != d) return false;
    return g->values[bn->out[0]].meta.dtype == d;
}

static kiln_status fold(kiln_rewriter *rw, const kiln_node *conv, const kiln_node *bn, int32_t *y) {
    const kiln_graph *g = rw->src;
    int32_t loc = bn->loc;
    int32_t x = rw->map[conv->in[0]], w = rw->map[conv->in[1]];
    int32_t gamma = rw->map[bn->in[1]], beta = rw->map[bn->in[2]], mean = rw->map[bn->in[3]], var = rw->map[bn->in[4]];
    kiln_dtype dt = g->values[conv->in[1]].meta.dtype;
    int64_t cout = g->values[conv->in[1]].meta.shape[0];
    int32_t eps, sum, inv, scale, scale4, w2, shifted, b2, pair[2];
    kiln_attrs none = {0}, shape4 = {0};
    KILN_TRY(emit_scalar(rw, bn->attrs.f[KILN_A_BATCH_NORM_EPS], dt, &eps));
    pair[0] = var, pair[1] = eps;
    KILN_TRY(emit(rw, KILN_OP_ADD, 2, pair, &none, loc, &sum));
    KILN_TRY(emit(rw, KILN_OP_RSQRT, 1, &sum, &none, loc, &inv));
    pair[0] = gamma, pair[1] = inv;
    KILN_TRY(emit(rw, KILN_OP_MUL, 2, pair, &none, loc, &scale));
    kiln_attrs_push_int(&shape4, cout); /* (cout, 1, 1, 1) */
    for (int d = 1; d < 4; d++) kiln_attrs_push_int(&shape4, 1);
    KILN_TRY(emit(rw, KILN_OP_RESHAPE, 1, &scale, &shape4, loc, &scale4));
    pair[0] = w, pair[1] = scale4;
    KILN_TRY(emit(rw, KILN_OP_MUL, 2, pair, &none, loc, &w2));
    /* b' = beta + (b - mean) * scale */
    int32_t centered = -1;
    if (conv->nin == 3) {
        pair[0] = rw->map[conv->in[2]], pair[1] = mean;
        KILN_TRY(emit(rw, KILN_OP_SUB, 2, pair, &none, loc, &centered));
    } else {
        KILN_TRY(emit(rw, KILN_OP_NEG, 1, &mean, &none, loc, &centered));
    }
    pair[0] = centered, pair[1] = scale;
    KILN_TRY(emit(rw, KILN_OP_MUL, 2, pair, &none, loc, &shifted));
    pair[0] = beta, pair[1] = shifted;
    KILN_TRY(emit(rw, KILN_OP_ADD, 2, pair, &none, loc, &b2));
    int32_t ins[3] = {x, w2, b2};
    KILN_TRY(emit(rw, KILN_OP_CONV2D, 3, ins, &conv->attrs, conv->loc, y));
    return kiln_rewriter_stands_for(rw, (int32_t)(conv - g->nodes)); /* keeps the convolution's name */
}

KILN_PASS(fold_batch_norm) {
    *out = NULL;
    if (!opt->inference) return KILN_OK;
    int32_t *uses = kiln_graph_use_counts(in);
    int32_t *conv_of = kiln_malloc(sizeof(int32_t) * (size_t)(in->nnodes ? in->nnodes : 1)); /* bn -> its conv */
    if (!uses || !conv_of) {
        free(uses), free(conv_of);
        return kiln_error(KILN_ERR_MEMORY, "out of memory in fold_batch_norm");
    }
    int found = 0;
    for (int32_t i = 0; i < in->nnodes; i++) conv_of[i] = -1;
    for (int32_t i = 0; i < in->nnodes; i++) {
        const kiln_node *bn = &in->nodes[i];
        if (bn->op != KILN_OP_BATCH_NORM || kiln_attr_int(&bn->attrs, KILN_A_BATCH_NORM_TRAINING, 1) != 0) continue; /* inference mode only */
        const kiln_value *y = &in->values[bn->in[0]];
        if (y->kind != KILN_VALUE_NODE || uses[bn->in[0]] != 1) continue;
        const kiln_node *conv = &in->nodes[y->node];
        if (conv->op != KILN_OP_CONV2D || !kiln_dtype_is_float(y->meta.dtype)) continue;
        if (!same_dtype(in, conv, bn)) continue; /* amp: a 16-bit convolution, float32 statistics */
        if (uses[bn->out[1]] || uses[bn->out[2]]) continue;       /* its statistics outputs are read */
        if (in->values[bn->in[3]].meta.ndim != 1 || in->values[bn->in[3]].meta.shape[0] == 0) continue;
        conv_of[i] = y->node;
        found++;
    }
    kiln_status s = KILN_OK;
    if (found) {
        bool *folded_conv = kiln_calloc((size_t)in->nnodes, sizeof(bool));
        kiln_rewriter rw;
        s = folded_conv ? kiln_rewriter_begin(&rw, in) : kiln_error(KILN_ERR_MEMORY, "out of memory in fold_batch_norm");
        for (int32_t i = 0; i < in->nnodes && s == KILN_OK; i++)
            if (conv_of[i] >= 0) folded_conv[conv_of[i]] = true;
        /* the folded convolution is emitted where its batch_norm was: every input is defined by then */
        for (int32_t i = 0; i < in->nnodes && s == KILN_OK; i++) {
            if (folded_conv[i]) continue;
            if (conv_of[i] >= 0) {
                int32_t y;
                s = fold(&rw, &in->nodes[conv_of[i]], &in->nodes[i], &y);
                if (s == KILN_OK) rw.map[in->nodes[i].out[0]] = y;
                continue;
            }
            s = kiln_rewriter_copy_node(&rw, i);
        }
        if (s == KILN_OK) s = kiln_rewriter_finish(&rw, out);
        else if (folded_conv) kiln_rewriter_abort(&rw);
        free(folded_conv);
    }
    free(uses), free(conv_of);
    return s;
}
