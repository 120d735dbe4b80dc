/* conv_algorithm (O1, training graphs): chooses Winograd F(4x4, 3x3) for the 3x3 stride-1
 * convolutions of a graph that computes gradients — its forward conv2d (which becomes a
 * conv2d_fused with Winograd allowed and no epilogue), conv2d_fused nodes, and both backward
 * ops (their optional WINOGRAD attribute) — where kiln_conv_winograd_pays says it beats the
 * direct convolution at that shape (src/ops/conv_winograd.c: the rule and how it was fitted).
 * Inference graphs get Winograd from fuse_conv_epilogue (infer_boost); O0 keeps every
 * convolution direct. The choice shows in the graph text (kiln.jit.explain lists it per
 * convolution). Winograd's results differ from the direct convolution's by rounding: the
 * tolerance is documented in docs/guide/jit.md. 16-bit convolutions (amp) get the same policy:
 * the fp32-compute fallback runs them as float32 convolutions of their widened operands, so
 * Winograd pays there as it does in float32 (docs/guide/mixed_precision.md: the tolerance). */
#include "../ops/conv_winograd_cost.h"
#include "passes_internal.h"

/* Whether a convolution of this dtype (its operands and result alike) may take Winograd: float32,
 * and the 16-bit dtypes, which the fp32-compute fallback widens and computes as float32 — the same
 * arithmetic as the float32 convolution of the widened operands, so the same policy and tolerance.
 * Where oneDNN's bf16 primitives run a bfloat16 convolution (the bf16 hardware path) the attribute
 * is not used: oneDNN 2.x has no bf16 Winograd, and the convolution runs direct (src/ops/conv.c). */
static bool winograd_dtype(kiln_dtype t) {
    return t == KILN_DTYPE_FLOAT32 || t == KILN_DTYPE_BFLOAT16 || t == KILN_DTYPE_FLOAT16;
}

/* The convolution problem of node n (conv2d, conv2d_fused in NCHW, or a backward op) when it
 * is a 3x3, stride-1, dilation-1, ungrouped one in float32 or a 16-bit dtype (all its operands
 * and its result of one dtype); false otherwise. */
static bool winograd_problem(const kiln_graph *g, const kiln_node *n, kiln_conv_kind *kind, kiln_conv_params *p) {
    const int64_t *a = n->attrs.i;
    const kiln_meta *y = &g->values[n->out[0]].meta;
    if (!winograd_dtype(y->dtype) || n->attrs.ni < KILN_A_CONV_SHAPE) return false;
    const kiln_meta *x, *w;
    switch (n->op) {
    case KILN_OP_CONV2D: *kind = KILN_CONV_FORWARD, x = &g->values[n->in[0]].meta, w = &g->values[n->in[1]].meta; break;
    case KILN_OP_CONV2D_FUSED:
        if (a[KILN_A_CONV2D_FUSED_LAYOUT] != KILN_CONV_NCHW || a[KILN_A_CONV2D_FUSED_WINOGRAD]) return false;
        *kind = KILN_CONV_FORWARD, x = &g->values[n->in[0]].meta, w = &g->values[n->in[1]].meta;
        break;
    case KILN_OP_CONV2D_BACKWARD_INPUT: /* (gy, w) -> gx */
        if (n->attrs.ni != KILN_A_CONV_WINOGRAD) return false;
        *kind = KILN_CONV_BACKWARD_INPUT, x = y, w = &g->values[n->in[1]].meta;
        break;
    case KILN_OP_CONV2D_BACKWARD_WEIGHT: /* (x, gy) -> gw */
        if (n->attrs.ni != KILN_A_CONV_WINOGRAD) return false;
        *kind = KILN_CONV_BACKWARD_WEIGHT, x = &g->values[n->in[0]].meta, w = y;
        break;
    default: return false;
    }
    if (x->ndim != 4 || w->ndim != 4 || x->dtype != y->dtype || w->dtype != y->dtype) return false;
    if (w->shape[2] != 3 || w->shape[3] != 3 || a[0] != 1 || a[1] != 1 || a[6] != 1 || a[7] != 1 || a[8] != 1)
        return false;
    *p = (kiln_conv_params){.N = x->shape[0], .C = x->shape[1], .H = x->shape[2], .W = x->shape[3], .O = w->shape[0],
                            .KH = 3, .KW = 3, .sh = 1, .sw = 1, .pt = a[2], .pb = a[3], .pl = a[4], .pr = a[5],
                            .dh = 1, .dw = 1, .groups = 1};
    p->OH = p->H + p->pt + p->pb - 2, p->OW = p->W + p->pl + p->pr - 2;
    return w->shape[1] == p->C && p->OH > 0 && p->OW > 0 && kiln_conv_winograd_pays(*kind, p);
}

/* Adds n with Winograd chosen to rw's graph in place of node i. */
static kiln_status emit_winograd(kiln_rewriter *rw, int32_t i) {
    const kiln_node *n = &rw->src->nodes[i];
    int32_t ins[4], outs[KILN_MAX_OUTPUTS]; /* x, w, bias, residual at most */
    for (int k = 0; k < n->nin; k++) ins[k] = rw->map[n->in[k]];
    kiln_attrs a = n->attrs;
    kiln_op op = n->op;
    if (op == KILN_OP_CONV2D) { /* conv2d(x, w[, b]) as conv2d_fused with no epilogue */
        op = KILN_OP_CONV2D_FUSED;
        a.ni = KILN_A_CONV2D_FUSED_NI, a.nf = 0;
        a.i[KILN_A_CONV2D_FUSED_HAS_BIAS] = n->nin == 3, a.i[KILN_A_CONV2D_FUSED_HAS_RESIDUAL] = 0;
        a.i[KILN_A_CONV2D_FUSED_ACT] = 0, a.i[KILN_A_CONV2D_FUSED_LAYOUT] = KILN_CONV_NCHW;
    }
    if (op == KILN_OP_CONV2D_FUSED) a.i[KILN_A_CONV2D_FUSED_WINOGRAD] = 1;
    else a.i[KILN_A_CONV_WINOGRAD] = 1, a.ni = KILN_A_CONV_NI;
    KILN_TRY(kiln_keep_recompute_mark(kiln_graph_add_node(rw->dst, op, n->nin, ins, &a, n->loc, outs), rw->dst,
                                      n->recompute));
    for (int k = 0; k < n->nout; k++) rw->map[n->out[k]] = outs[k];
    return kiln_rewriter_stands_for(rw, i);
}

KILN_PASS(conv_algorithm) {
    *out = NULL;
    if (opt->inference || opt->level == KILN_LEVEL_O0) return KILN_OK;
    bool training = false;
    for (int32_t i = 0; i < in->nnodes && !training; i++)
        training = in->nodes[i].op == KILN_OP_CONV2D_BACKWARD_INPUT || in->nodes[i].op == KILN_OP_CONV2D_BACKWARD_WEIGHT;
    if (!training) return KILN_OK;
    bool *chosen = kiln_calloc((size_t)(in->nnodes ? in->nnodes : 1), sizeof(bool));
    if (!chosen) return kiln_error(KILN_ERR_MEMORY, "out of memory in conv_algorithm");
    int found = 0;
    for (int32_t i = 0; i < in->nnodes; i++) {
        kiln_conv_kind kind;
        kiln_conv_params p;
        if (winograd_problem(in, &in->nodes[i], &kind, &p)) chosen[i] = true, found++;
    }
    kiln_status s = KILN_OK;
    if (found) {
        kiln_rewriter rw;
        if ((s = kiln_rewriter_begin(&rw, in)) == KILN_OK) {
            for (int32_t i = 0; i < in->nnodes && s == KILN_OK; i++)
                s = chosen[i] ? emit_winograd(&rw, i) : kiln_rewriter_copy_node(&rw, i);
            if (s == KILN_OK) s = kiln_rewriter_finish(&rw, out);
            else kiln_rewriter_abort(&rw);
        }
    }
    free(chosen);
    return s;
}
