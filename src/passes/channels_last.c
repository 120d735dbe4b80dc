/* NCHW -> channels-last layout propagation: float32 convolutions that feed one another
 * (directly or through elementwise ops) keep their activations in the layout oneDNN computes
 * in, in place of reordering them around every convolution: oneDNN's blocked layout, as the
 * 5-D (N, C/b, H, W, b), when every such convolution has channels divisible by b, else NHWC.
 * The block b is the CPU's (kiln_conv_block_size: 16 with AVX-512, whose Winograd and direct
 * kernels read nChw16c; 8 with AVX2 and older, whose direct kernels read nChw8c and fall
 * back to oneDNN's reference kernel, ~1000x slower, on nChw16c); with no blocked kernels at
 * all the pass leaves the graph alone. The elementwise ops between them (those
 * whose result reaches a convolution) run on the converted values (broadcast operands become
 * permuted views, full-size ones are converted); relayout nodes are inserted only at the
 * chain's edges, each value converted at most once, and NCHW values are rebuilt only where
 * something outside the chain (a graph output included) reads them, so outputs keep the
 * user's layout. Off with
 * disable_format_transform, and for graphs with backward convolutions: those read the saved
 * activations in NCHW, so a training graph converts many values back and forth (measured:
 * conv -> relu -> conv + x -> silu, 1x64x96x96, forward+backward, no faster with it). */
#include "passes_internal.h"
#include "../ops/conv_epilogue.h"

typedef struct {
    kiln_rewriter rw;
    kiln_conv_layout layout; /* of the chains */
    int32_t *converted;      /* src value -> dst value of its converted form (-1: none yet) */
} layout_state;

static bool is_layout_conv(const kiln_graph *g, const kiln_node *n) {
    if (n->op != KILN_OP_CONV2D && !(n->op == KILN_OP_CONV2D_FUSED && n->attrs.i[KILN_A_CONV2D_FUSED_LAYOUT] == KILN_CONV_NCHW))
        return false;
    return g->values[n->out[0]].meta.dtype == KILN_DTYPE_FLOAT32;
}

/* An elementwise node the chain can run through: one 4-D output, inputs of at most 4 axes. */
static bool is_layout_elementwise(const kiln_graph *g, const kiln_node *n) {
    if (kiln_op_table[n->op].fusion != KILN_FUSE_ELEMENTWISE || n->nout != 1 || kiln_node_has_effects(n)) return false;
    if (g->values[n->out[0]].meta.ndim != 4) return false;
    for (int k = 0; k < n->nin; k++)
        if (g->values[n->in[k]].meta.ndim > 4) return false;
    return true;
}

static kiln_status add_node(layout_state *st, kiln_op op, int nin, const int32_t *in, const kiln_attrs *a, int32_t loc,
                            int32_t *out) {
    int32_t outs[KILN_MAX_OUTPUTS];
    KILN_TRY(kiln_graph_add_node(st->rw.dst, op, nin, in, a, loc, outs));
    *out = outs[0];
    return KILN_OK;
}

/* The chain-layout form of src value v (4-D, defined in NCHW): converted once. */
static kiln_status convert(layout_state *st, int32_t v, int32_t loc, int32_t *out) {
    if (st->converted[v] < 0) {
        kiln_attrs a = {.ni = KILN_A_RELAYOUT_NI};
        a.i[KILN_A_RELAYOUT_FROM] = KILN_CONV_NCHW, a.i[KILN_A_RELAYOUT_TO] = st->layout;
        KILN_TRY(add_node(st, KILN_OP_RELAYOUT, 1, &st->rw.map[v], &a, loc, &st->converted[v]));
    }
    *out = st->converted[v];
    return KILN_OK;
}

/* Makes the NCHW form of src value v available (converting back from the chain layout). */
static kiln_status need_nchw(layout_state *st, int32_t v) {
    if (st->rw.map[v] >= 0) return KILN_OK;
    kiln_attrs a = {.ni = KILN_A_RELAYOUT_NI};
    a.i[KILN_A_RELAYOUT_FROM] = st->layout, a.i[KILN_A_RELAYOUT_TO] = KILN_CONV_NCHW;
    return add_node(st, KILN_OP_RELAYOUT, 1, &st->converted[v], &a, -1, &st->rw.map[v]);
}

/* An operand of an elementwise op running in the chain layout, whose output (as NCHW) is 4-D
 * of numel n. */
static kiln_status converted_operand(layout_state *st, int32_t v, int64_t n, int32_t loc, int32_t *out) {
    const kiln_meta *m = &st->rw.src->values[v].meta;
    if (st->converted[v] >= 0) return *out = st->converted[v], KILN_OK;
    KILN_TRY(need_nchw(st, v));
    if (m->ndim == 0) return *out = st->rw.map[v], KILN_OK;
    int64_t numel = 1;
    for (int d = 0; d < m->ndim; d++) numel *= m->shape[d];
    if (m->ndim == 4 && numel == n) return convert(st, v, loc, out);
    /* a broadcast operand, padded to 4 axes (n, c, h, w): a permuted view of it, for the
     * blocked layout of (n, c/b, b, h, w) (c is 1 or the channel count) */
    int64_t s4[4], block = kiln_conv_layout_block(st->layout);
    for (int d = 0; d < 4; d++) s4[d] = d < 4 - m->ndim ? 1 : m->shape[d - (4 - m->ndim)];
    int32_t x = st->rw.map[v];
    kiln_attrs r = {0}, p = {0}; /* a reshape's shape, a permutation */
    if (block) {
        int64_t blk = s4[1] == 1 ? 1 : block;
        const int64_t shape[5] = {s4[0], s4[1] / blk, blk, s4[2], s4[3]}, perm[5] = {0, 1, 3, 4, 2};
        for (int d = 0; d < 5; d++) kiln_attrs_push_int(&r, shape[d]), kiln_attrs_push_int(&p, perm[d]);
    } else {
        const int64_t perm[4] = {0, 2, 3, 1};
        for (int d = 0; d < 4; d++) kiln_attrs_push_int(&r, s4[d]), kiln_attrs_push_int(&p, perm[d]);
    }
    if (m->ndim < 4 || block) KILN_TRY(add_node(st, KILN_OP_RESHAPE, 1, &x, &r, loc, &x));
    return add_node(st, KILN_OP_PERMUTE, 1, &x, &p, loc, out);
}

static kiln_status emit_conv(layout_state *st, const kiln_node *n) {
    int32_t ins[4], y;
    KILN_TRY(convert(st, n->in[0], n->loc, &ins[0]));
    for (int k = 1; k < n->nin; k++) {
        KILN_TRY(need_nchw(st, n->in[k]));
        ins[k] = st->rw.map[n->in[k]];
    }
    kiln_attrs a = n->attrs;
    if (n->op == KILN_OP_CONV2D) { /* conv2d(x, w[, b]) as conv2d_fused with no epilogue */
        a.ni = KILN_A_CONV2D_FUSED_NI, a.i[KILN_A_CONV2D_FUSED_HAS_BIAS] = n->nin == 3;
        a.i[KILN_A_CONV2D_FUSED_HAS_RESIDUAL] = 0, a.i[KILN_A_CONV2D_FUSED_ACT] = 0;
        a.i[KILN_A_CONV2D_FUSED_WINOGRAD] = 0;
    } else if (n->attrs.i[KILN_A_CONV2D_FUSED_HAS_RESIDUAL]) { /* the residual, converted too */
        KILN_TRY(convert(st, n->in[n->nin - 1], n->loc, &ins[n->nin - 1]));
    }
    a.i[KILN_A_CONV2D_FUSED_LAYOUT] = st->layout;
    KILN_TRY(add_node(st, KILN_OP_CONV2D_FUSED, n->nin, ins, &a, n->loc, &y));
    st->converted[n->out[0]] = y;
    return KILN_OK;
}

static kiln_status emit_elementwise(layout_state *st, const kiln_node *n) {
    const kiln_meta *om = &st->rw.src->values[n->out[0]].meta;
    int64_t numel = om->shape[0] * om->shape[1] * om->shape[2] * om->shape[3];
    int32_t small[8], *ins = n->nin <= 8 ? small : kiln_malloc(sizeof(int32_t) * (size_t)n->nin);
    if (!ins) return kiln_error(KILN_ERR_MEMORY, "out of memory in channels_last");
    kiln_status s = KILN_OK;
    for (int k = 0; k < n->nin && s == KILN_OK; k++) s = converted_operand(st, n->in[k], numel, n->loc, &ins[k]);
    if (s == KILN_OK) s = add_node(st, n->op, n->nin, ins, &n->attrs, n->loc, &st->converted[n->out[0]]);
    if (ins != small) free(ins);
    return s;
}

/* feeds_conv[v]: v reaches the input (or residual) of a convertible convolution through
 * elementwise nodes only. */
static void mark_feeds_conv(const kiln_graph *g, bool *feeds_conv) {
    for (int32_t i = g->nnodes - 1; i >= 0; i--) {
        const kiln_node *n = &g->nodes[i];
        if (is_layout_conv(g, n)) {
            feeds_conv[n->in[0]] = true;
            if (n->op == KILN_OP_CONV2D_FUSED && n->attrs.i[KILN_A_CONV2D_FUSED_HAS_RESIDUAL]) feeds_conv[n->in[n->nin - 1]] = true;
        } else if (is_layout_elementwise(g, n) && feeds_conv[n->out[0]]) {
            for (int k = 0; k < n->nin; k++) feeds_conv[n->in[k]] = true;
        }
    }
}

/* Whether node n runs in the chain layout: a convolution whose input is converted already or
 * whose output reaches another one; an elementwise op with a converted input whose result
 * reaches a convolution. */
static bool converts_conv(const layout_state *st, const bool *feeds_conv, const kiln_node *n) {
    return is_layout_conv(st->rw.src, n) && (st->converted[n->in[0]] >= 0 || feeds_conv[n->out[0]]);
}

static bool converts_elementwise(const layout_state *st, const bool *feeds_conv, const kiln_node *n) {
    if (!is_layout_elementwise(st->rw.src, n) || !feeds_conv[n->out[0]]) return false;
    for (int k = 0; k < n->nin; k++)
        if (st->converted[n->in[k]] >= 0) return true;
    return false;
}

KILN_PASS(channels_last) {
    *out = NULL;
    int block = kiln_conv_block_size();
    if (opt->disable_format_transform || !block) return KILN_OK;
    int32_t nv = in->nvalues ? in->nvalues : 1;
    bool *feeds_conv = kiln_calloc((size_t)nv, sizeof(bool));
    layout_state st = {.rw.src = in, .converted = kiln_malloc(sizeof(int32_t) * (size_t)nv)};
    kiln_status s = KILN_OK;
    if (!feeds_conv || !st.converted) {
        s = kiln_error(KILN_ERR_MEMORY, "out of memory in channels_last");
        goto done;
    }
    for (int32_t i = 0; i < in->nnodes; i++)
        if (in->nodes[i].op == KILN_OP_CONV2D_BACKWARD_INPUT || in->nodes[i].op == KILN_OP_CONV2D_BACKWARD_WEIGHT) goto done;
    mark_feeds_conv(in, feeds_conv);
    for (int32_t v = 0; v < in->nvalues; v++) st.converted[v] = -1;
    /* a dry run (converted = 1 marks values) picks the layout: blocked unless a convolution
     * to convert has channels that are no multiple of the block */
    int chained = 0;
    st.layout = kiln_conv_blocked_layout(block);
    for (int32_t i = 0; i < in->nnodes; i++) {
        const kiln_node *n = &in->nodes[i];
        if (converts_conv(&st, feeds_conv, n)) {
            chained++;
            st.converted[n->out[0]] = 1;
            if (in->values[n->in[0]].meta.shape[1] % block || in->values[n->out[0]].meta.shape[1] % block)
                st.layout = KILN_CONV_NHWC;
        } else if (converts_elementwise(&st, feeds_conv, n)) {
            st.converted[n->out[0]] = 1;
        }
    }
    if (!chained) goto done;
    for (int32_t v = 0; v < in->nvalues; v++) st.converted[v] = -1;
    s = kiln_rewriter_begin(&st.rw, in);
    if (s != KILN_OK) goto done;
    for (int32_t i = 0; i < in->nnodes && s == KILN_OK; i++) {
        const kiln_node *n = &in->nodes[i];
        if (converts_conv(&st, feeds_conv, n)) {
            s = emit_conv(&st, n);
            continue;
        }
        if (converts_elementwise(&st, feeds_conv, n)) {
            s = emit_elementwise(&st, n);
            continue;
        }
        for (int k = 0; k < n->nin && s == KILN_OK; k++) s = need_nchw(&st, n->in[k]);
        if (s == KILN_OK) s = kiln_rewriter_copy_node(&st.rw, i);
    }
    for (int32_t k = 0; k < in->noutputs && s == KILN_OK; k++) s = need_nchw(&st, in->outputs[k]);
    if (s == KILN_OK) s = kiln_rewriter_finish(&st.rw, out);
    else kiln_rewriter_abort(&st.rw);
done:
    free(feeds_conv), free(st.converted);
    return s;
}
