/* Epilogue fusion into convolutions: conv2d -> add(bias) -> add(residual) -> activation chains
 * become one conv2d_fused node, which oneDNN runs as a single primitive with post-ops. Any
 * prefix of the chain fuses (a per-channel bias add only when the convolution has no bias
 * yet), and only where each intermediate has no other consumer and is no graph output: in
 * training graphs the activation's input is saved for its gradient, so that step stays.
 * In inference graphs every convolution becomes conv2d_fused with Winograd allowed. */
#include "passes_internal.h"
#include "../ops/conv_epilogue.h"

typedef struct {
    int32_t last;     /* the last node absorbed (-1: nothing fuses) */
    int32_t bias;     /* value added as a per-channel bias (-1: none, or the conv's own) */
    int32_t residual; /* value added as a residual (-1: none) */
    int32_t act_node; /* the activation node (-1: none) */
} conv_chain;

/* The other operand of the add node n whose operand `v` is, or -1 when v is both. */
static int32_t other_operand(const kiln_node *n, int32_t v) {
    if (n->in[0] == v && n->in[1] != v) return n->in[1];
    if (n->in[1] == v && n->in[0] != v) return n->in[0];
    return -1;
}

/* Whether m is a per-channel bias for a 4-D output of `channels` channels: (O, 1, 1) or (1, O, 1, 1). */
static bool is_channel_bias(const kiln_meta *m, int64_t channels) {
    if (m->ndim == 3) return m->shape[0] == channels && m->shape[1] == 1 && m->shape[2] == 1;
    if (m->ndim == 4) return m->shape[0] == 1 && m->shape[1] == channels && m->shape[2] == 1 && m->shape[3] == 1;
    return false;
}

/* The chain after conv node c; consumer[v] is v's only consumer (-1: none, several, or an output).
 * A node another convolution's chain has absorbed (claimed[n]) ends the chain before it: in
 * conv_a(x) + conv_b(x) the add is one chain's residual step, and the other convolution stays. */
static conv_chain find_chain(const kiln_graph *g, int32_t c, const int32_t *consumer, const bool *claimed,
                             kiln_conv_fusion mode) {
    conv_chain ch = {-1, -1, -1, -1};
    if (mode == KILN_CONV_FUSE_NONE) return ch;
    const kiln_node *conv = &g->nodes[c];
    int32_t cur = conv->out[0];
    const kiln_meta *ym = &g->values[cur].meta;
    if (!kiln_dtype_is_float(ym->dtype)) return ch;
    int32_t n = consumer[cur];
    if (n >= 0 && claimed[n]) return ch;
    if (n >= 0 && g->nodes[n].op == KILN_OP_ADD && conv->nin == 2) {
        int32_t b = other_operand(&g->nodes[n], cur);
        if (b >= 0 && !g->values[cur].sym[1] && is_channel_bias(&g->values[b].meta, ym->shape[1]) &&
            g->values[b].meta.dtype == ym->dtype &&
            kiln_meta_equal(&g->values[g->nodes[n].out[0]].meta, ym)) {
            ch.bias = b, ch.last = n, cur = g->nodes[n].out[0];
            n = consumer[cur];
            if (n >= 0 && claimed[n]) return ch;
        }
    }
    if (n >= 0 && g->nodes[n].op == KILN_OP_ADD && mode == KILN_CONV_FUSE_ALL) {
        int32_t r = other_operand(&g->nodes[n], cur);
        if (r >= 0 && kiln_meta_equal(&g->values[r].meta, ym) && kiln_meta_equal(&g->values[g->nodes[n].out[0]].meta, ym) &&
            kiln_value_same_shape(&g->values[r], &g->values[cur])) { /* symbolic sizes: equal as expressions too */
            ch.residual = r, ch.last = n, cur = g->nodes[n].out[0];
            n = consumer[cur];
            if (n >= 0 && claimed[n]) return ch;
        }
    }
    if (n >= 0 && kiln_conv_activation_of(g->nodes[n].op) != KILN_CONV_ACT_NONE &&
        kiln_meta_equal(&g->values[g->nodes[n].out[0]].meta, ym))
        ch.act_node = n, ch.last = n;
    return ch;
}

/* Emits conv2d_fused for conv node c and its chain; *y is its output. */
static kiln_status emit_fused(kiln_rewriter *rw, const kiln_node *conv, const conv_chain *ch, bool inference,
                              int32_t *y) {
    const kiln_graph *g = rw->src;
    int32_t ins[4], nin = 0, outs[KILN_MAX_OUTPUTS];
    ins[nin++] = rw->map[conv->in[0]];
    ins[nin++] = rw->map[conv->in[1]];
    bool bias = conv->nin == 3 || ch->bias >= 0;
    if (conv->nin == 3) ins[nin++] = rw->map[conv->in[2]];
    if (ch->bias >= 0) {
        kiln_attrs flat = {0}; /* the bias as (C) */
        kiln_attrs_push_int(&flat, g->values[conv->out[0]].meta.shape[1]);
        KILN_TRY(kiln_graph_add_node(rw->dst, KILN_OP_RESHAPE, 1, &rw->map[ch->bias], &flat, conv->loc, outs));
        ins[nin++] = outs[0];
    }
    if (ch->residual >= 0) ins[nin++] = rw->map[ch->residual];
    kiln_attrs a = {.ni = KILN_A_CONV2D_FUSED_NI};
    /* the convolution's own ints (stride, padding, dilation, groups) are the first of either layout */
    _Static_assert((int)KILN_A_CONV_SHAPE == (int)KILN_A_CONV2D_FUSED_HAS_BIAS &&
                       (int)KILN_A_CONV_GROUPS == (int)KILN_A_CONV2D_FUSED_GROUPS,
                   "conv2d_fused starts with conv2d's attributes");
    memcpy(a.i, conv->attrs.i, sizeof(int64_t) * KILN_A_CONV_SHAPE);
    a.i[KILN_A_CONV2D_FUSED_HAS_BIAS] = bias;
    a.i[KILN_A_CONV2D_FUSED_HAS_RESIDUAL] = ch->residual >= 0;
    kiln_conv_activation act = ch->act_node >= 0 ? kiln_conv_activation_of(g->nodes[ch->act_node].op) : KILN_CONV_ACT_NONE;
    a.i[KILN_A_CONV2D_FUSED_ACT] = act;
    a.i[KILN_A_CONV2D_FUSED_LAYOUT] = KILN_CONV_NCHW; /* the channels_last pass decides layouts */
    a.i[KILN_A_CONV2D_FUSED_WINOGRAD] = inference;
    if (act == KILN_CONV_ACT_CLAMP) {
        a.nf = KILN_A_CONV2D_FUSED_NF;
        a.f[KILN_A_CONV2D_FUSED_ACT_MIN] = g->nodes[ch->act_node].attrs.f[KILN_A_CLAMP_MIN];
        a.f[KILN_A_CONV2D_FUSED_ACT_MAX] = g->nodes[ch->act_node].attrs.f[KILN_A_CLAMP_MAX];
    }
    KILN_TRY(kiln_keep_recompute_mark(kiln_graph_add_node(rw->dst, KILN_OP_CONV2D_FUSED, nin, ins, &a, conv->loc, outs),
                                      rw->dst, conv->recompute));
    *y = outs[0];
    return kiln_rewriter_stands_for(rw, (int32_t)(conv - g->nodes)); /* keeps the convolution's name */
}

KILN_PASS(fuse_conv_epilogue) {
    *out = NULL;
    size_t nn = (size_t)(in->nnodes ? in->nnodes : 1);
    int32_t *uses = kiln_graph_use_counts(in);
    int32_t *consumer = kiln_malloc(sizeof(int32_t) * (size_t)(in->nvalues ? in->nvalues : 1));
    conv_chain *chain = kiln_malloc(sizeof(conv_chain) * nn);
    int32_t *fused_at = kiln_malloc(sizeof(int32_t) * nn); /* last absorbed node -> its conv */
    bool *skip = kiln_calloc(nn, sizeof(bool));
    bool *claimed = kiln_calloc(nn, sizeof(bool)); /* absorbed into some convolution's chain */
    kiln_status s = KILN_OK;
    if (!uses || !consumer || !chain || !fused_at || !skip || !claimed) {
        s = kiln_error(KILN_ERR_MEMORY, "out of memory in fuse_conv_epilogue");
        goto done;
    }
    for (int32_t v = 0; v < in->nvalues; v++) consumer[v] = -1;
    for (int32_t i = 0; i < in->nnodes; i++)
        for (int k = 0; k < in->nodes[i].nin; k++) consumer[in->nodes[i].in[k]] = i;
    for (int32_t v = 0; v < in->nvalues; v++)
        if (uses[v] != 1) consumer[v] = -1; /* several uses, or the one use is a graph output */
    for (int32_t k = 0; k < in->noutputs; k++) consumer[in->outputs[k]] = -1;
    int found = 0;
    for (int32_t i = 0; i < in->nnodes; i++) fused_at[i] = -1;
    for (int32_t i = 0; i < in->nnodes; i++) {
        if (in->nodes[i].op != KILN_OP_CONV2D) continue;
        chain[i] = find_chain(in, i, consumer, claimed, opt->conv_fusion);
        if (chain[i].last < 0 && !opt->inference) continue;
        found++;
        skip[i] = true;
        if (chain[i].last < 0) { /* no epilogue: replaced in place */
            fused_at[i] = i;
            continue;
        }
        for (int32_t v = in->nodes[i].out[0];; v = in->nodes[consumer[v]].out[0]) {
            claimed[consumer[v]] = true;
            if (consumer[v] == chain[i].last) break;
            skip[consumer[v]] = true;
        }
        fused_at[chain[i].last] = i;
    }
    if (found) {
        kiln_rewriter rw;
        s = kiln_rewriter_begin(&rw, in);
        /* the fused node goes where its chain ends: every input is defined by then */
        for (int32_t i = 0; i < in->nnodes && s == KILN_OK; i++) {
            if (skip[i] && fused_at[i] != i) continue;
            if (fused_at[i] >= 0) {
                int32_t y;
                s = emit_fused(&rw, &in->nodes[fused_at[i]], &chain[fused_at[i]], opt->inference, &y);
                if (s == KILN_OK) rw.map[in->nodes[i].out[0]] = y;
                continue;
            }
            s = kiln_rewriter_copy_node(&rw, i);
        }
        if (s == KILN_OK) s = kiln_rewriter_finish(&rw, out);
        else kiln_rewriter_abort(&rw);
    }
done:
    free(uses), free(consumer), free(chain), free(fused_at), free(skip), free(claimed);
    return s;
}
