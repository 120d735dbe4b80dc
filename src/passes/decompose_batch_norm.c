/* decompose_batch_norm (O2): a float32 batch_norm that normalizes with its running statistics
 * (inference mode) and whose statistics outputs nothing reads becomes the per-channel affine map
 * its kernel computes, as elementwise ops:
 *   scale = (float)(gamma * rsqrt(var + eps)),  shift = (float)(beta - mean * (gamma * rsqrt(var + eps)))
 *   y = x * scale[c] + shift[c]
 * with scale and shift computed in float64 from the parameters at every call (so later updates of
 * the parameters and running statistics are seen) and reshaped to (C, 1, ...). These are the
 * operations of src/ops/norm.c's batch_norm in the same order and precision (its per-channel
 * coefficients in double, rounded to float, then one multiply and one add per element, neither
 * contracted), so the results are its results bit for bit. What it buys: the affine map is
 * elementwise, so fuse_elementwise joins it with the ReLU or residual add after it (one pass over
 * the activation instead of two or three), and channels_last carries a convolution's blocked
 * layout through it to the next convolution (conv -> batch_norm -> relu -> conv no longer
 * reorders the activation out of and back into oneDNN's layout). Inference graphs fold a
 * batch_norm after a convolution into it first (fold_batch_norm, which changes the rounding);
 * graphs that compute gradients read the statistics outputs and keep the op. O1 keeps the op too:
 * its graphs show batch_norm unless infer_boost folds it (what tests/python/test_jit_config.py and
 * test_trace.py assert), so the rewrite is O2's, the level of more aggressive fusion. */
#include "passes_internal.h"

static kiln_status emit(kiln_rewriter *rw, kiln_op op, int nin, const int32_t *in, const kiln_attrs *a, int32_t loc,
                        int32_t *out) {
    int32_t outs[KILN_MAX_OUTPUTS];
    KILN_TRY(kiln_graph_add_node(rw->dst, op, nin, in, a, loc, outs));
    *out = outs[0];
    return KILN_OK;
}

static kiln_status emit_cast(kiln_rewriter *rw, int32_t v, kiln_dtype to, int32_t loc, int32_t *out) {
    kiln_attrs a = {0};
    kiln_attrs_push_int(&a, to);
    return emit(rw, KILN_OP_CAST, 1, &v, &a, loc, out);
}

static kiln_status emit_float64_scalar(kiln_rewriter *rw, double v, int32_t *out) {
    kiln_tensor *t;
    KILN_TRY(kiln_tensor_empty(KILN_DTYPE_FLOAT64, 0, NULL, &t));
    *(double *)t->data = v;
    kiln_status s = kiln_graph_add_capture(rw->dst, t, true, out);
    kiln_tensor_release(t);
    return s;
}

/* Whether batch_norm node bn can be decomposed: inference mode with running statistics of C
 * elements, every operand and the result float32, the statistics outputs unread, concrete sizes. */
static bool decomposable(const kiln_graph *g, const kiln_node *bn, const int32_t *uses) {
    if (bn->op != KILN_OP_BATCH_NORM || bn->nin != 5 || kiln_attr_int(&bn->attrs, KILN_A_BATCH_NORM_TRAINING, 1) != 0)
        return false;
    if (uses[bn->out[1]] || uses[bn->out[2]]) return false;
    const kiln_value *x = &g->values[bn->in[0]];
    if (x->meta.ndim < 2 || x->meta.dtype != KILN_DTYPE_FLOAT32) return false;
    for (int d = 0; d < x->meta.ndim; d++)
        if (x->sym[d]) return false;
    if (g->values[bn->out[0]].meta.dtype != KILN_DTYPE_FLOAT32) return false;
    int64_t C = x->meta.shape[1];
    if (C <= 0) return false;
    for (int k = 1; k < 5; k++) {
        const kiln_meta *m = &g->values[bn->in[k]].meta;
        if (m->dtype != KILN_DTYPE_FLOAT32 || m->ndim != 1 || m->shape[0] != C) return false;
    }
    return true;
}

static kiln_status decompose(kiln_rewriter *rw, const kiln_node *bn, int32_t *y) {
    const kiln_graph *g = rw->src;
    int32_t loc = bn->loc;
    const kiln_meta *xm = &g->values[bn->in[0]].meta;
    int32_t p64[4]; /* gamma, beta, mean, var in float64 */
    for (int k = 0; k < 4; k++) KILN_TRY(emit_cast(rw, rw->map[bn->in[1 + k]], KILN_DTYPE_FLOAT64, loc, &p64[k]));
    kiln_attrs none = {0};
    int32_t eps, sum, inv, scale64, meanscale, shift64, scale, shift, pair[2];
    KILN_TRY(emit_float64_scalar(rw, bn->attrs.f[KILN_A_BATCH_NORM_EPS], &eps));
    pair[0] = p64[3], pair[1] = eps;
    KILN_TRY(emit(rw, KILN_OP_ADD, 2, pair, &none, loc, &sum));           /* var + eps */
    KILN_TRY(emit(rw, KILN_OP_RSQRT, 1, &sum, &none, loc, &inv));         /* 1 / sqrt(var + eps) */
    pair[0] = inv, pair[1] = p64[0];
    KILN_TRY(emit(rw, KILN_OP_MUL, 2, pair, &none, loc, &scale64));       /* invstd * gamma */
    pair[0] = p64[2], pair[1] = scale64;
    KILN_TRY(emit(rw, KILN_OP_MUL, 2, pair, &none, loc, &meanscale));     /* mean * scale */
    pair[0] = p64[1], pair[1] = meanscale;
    KILN_TRY(emit(rw, KILN_OP_SUB, 2, pair, &none, loc, &shift64));       /* beta - mean * scale */
    KILN_TRY(emit_cast(rw, scale64, KILN_DTYPE_FLOAT32, loc, &scale));
    KILN_TRY(emit_cast(rw, shift64, KILN_DTYPE_FLOAT32, loc, &shift));
    kiln_attrs shape = {0}; /* (C, 1, ...): broadcast over the axes after the channels */
    kiln_attrs_push_int(&shape, xm->shape[1]);
    for (int d = 2; d < xm->ndim; d++) kiln_attrs_push_int(&shape, 1);
    KILN_TRY(emit(rw, KILN_OP_RESHAPE, 1, &scale, &shape, loc, &scale));
    KILN_TRY(emit(rw, KILN_OP_RESHAPE, 1, &shift, &shape, loc, &shift));
    int32_t scaled;
    pair[0] = rw->map[bn->in[0]], pair[1] = scale;
    KILN_TRY(emit(rw, KILN_OP_MUL, 2, pair, &none, loc, &scaled));
    pair[0] = scaled, pair[1] = shift;
    KILN_TRY(emit(rw, KILN_OP_ADD, 2, pair, &none, loc, y));
    return kiln_rewriter_stands_for(rw, (int32_t)(bn - g->nodes)); /* the add keeps the batch_norm's name */
}

KILN_PASS(decompose_batch_norm) {
    *out = NULL;
    if (opt->level != KILN_LEVEL_O2) return KILN_OK;
    int32_t *uses = kiln_graph_use_counts(in);
    bool *chosen = kiln_calloc((size_t)(in->nnodes ? in->nnodes : 1), sizeof(bool));
    kiln_status s = KILN_OK;
    if (!uses || !chosen) {
        s = kiln_error(KILN_ERR_MEMORY, "out of memory in decompose_batch_norm");
        goto done;
    }
    int found = 0;
    for (int32_t i = 0; i < in->nnodes; i++)
        if (decomposable(in, &in->nodes[i], uses)) chosen[i] = true, found++;
    if (found) {
        kiln_rewriter rw;
        s = kiln_rewriter_begin(&rw, in);
        for (int32_t i = 0; i < in->nnodes && s == KILN_OK; i++) {
            if (!chosen[i]) {
                s = kiln_rewriter_copy_node(&rw, i);
                continue;
            }
            int32_t y;
            s = decompose(&rw, &in->nodes[i], &y);
            if (s == KILN_OK) rw.map[in->nodes[i].out[0]] = y;
        }
        if (s == KILN_OK) s = kiln_rewriter_finish(&rw, out);
        else kiln_rewriter_abort(&rw);
    }
done:
    free(uses), free(chosen);
    return s;
}
