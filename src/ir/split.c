/* Splitting a forward-and-backward graph in two at the values the backward reads (the forward's
 * "residuals"): kiln.jit's bytecode capture records a piece's forward and the gradient rules run on
 * it as one graph, then runs the forward part at each call (keeping the residuals) and the backward
 * part only when the eager tape asks for the piece's gradients. */
#include "../core/internal.h"
#include "kiln/graph.h"
#include "symbolic.h"

typedef struct {
    const kiln_graph *g;
    int32_t *map; /* value of g -> value of the graph being built, or -1 */
} builder;

static kiln_status copy_capture(const kiln_graph *g, int32_t v, kiln_graph *to, int32_t *out) {
    const kiln_value *val = &g->values[v];
    KILN_TRY(kiln_graph_add_capture(to, val->bound, false, out));
    to->values[*out].constant = val->constant; /* the bound tensor already is the private copy */
    to->values[*out].fresh = val->fresh;
    return KILN_OK;
}

/* Adds node n of b->g to `to`, its inputs mapped (captures copied in when first met). */
static kiln_status copy_node(builder *b, int32_t n, kiln_graph *to) {
    const kiln_node *node = &b->g->nodes[n];
    int32_t small[16], *in = node->nin <= 16 ? small : kiln_malloc(sizeof(int32_t) * (size_t)node->nin);
    if (!in) return kiln_error(KILN_ERR_MEMORY, "out of memory splitting a graph");
    kiln_status s = KILN_OK;
    for (int k = 0; k < node->nin && s == KILN_OK; k++) {
        int32_t v = node->in[k];
        if (b->map[v] < 0 && b->g->values[v].kind == KILN_VALUE_CAPTURED) s = copy_capture(b->g, v, to, &b->map[v]);
        in[k] = b->map[v];
        KILN_ASSERT(s != KILN_OK || in[k] >= 0); /* nodes are copied in order, inputs mapped before */
    }
    int32_t loc = -1, out[KILN_MAX_OUTPUTS];
    if (s == KILN_OK && node->loc >= 0) s = kiln_graph_add_loc(to, b->g->locs[node->loc], &loc);
    if (s == KILN_OK) s = kiln_graph_add_node(to, node->op, node->nin, in, &node->attrs, loc, out);
    if (in != small) free(in);
    if (s != KILN_OK) return kiln_error_context(s, "splitting node %d (%s)", n, kiln_op_table[node->op].name);
    to->nodes[to->nnodes - 1].recompute = node->recompute;
    for (int k = 0; k < node->nout; k++) b->map[node->out[k]] = out[k];
    return KILN_OK;
}

/* Marks in `fwd` the nodes value v needs (itself included when a node makes it). */
static void mark_needed(const kiln_graph *g, int32_t v, bool *fwd, int32_t *stack) {
    int depth = 0;
    if (g->values[v].kind == KILN_VALUE_NODE) stack[depth++] = g->values[v].node;
    while (depth > 0) {
        int32_t n = stack[--depth];
        if (fwd[n]) continue;
        fwd[n] = true;
        for (int k = 0; k < g->nodes[n].nin; k++) {
            const kiln_value *in = &g->values[g->nodes[n].in[k]];
            if (in->kind == KILN_VALUE_NODE && !fwd[in->node]) stack[depth++] = in->node;
        }
    }
}

static kiln_status split(const kiln_graph *g, int nfin, int nfout, bool *fwd, bool *from_b, int32_t *stack,
                         builder *fb, builder *bb, kiln_graph *f, kiln_graph *b, int32_t *nresiduals) {
    /* the forward: what its outputs need, and the side effects (random draws, writes, prints) that
     * do not read the backward's inputs */
    for (int k = 0; k < g->ninputs; k++) from_b[g->inputs[k]] = k >= nfin;
    for (int32_t n = 0; n < g->nnodes; n++) {
        bool reads_b = false;
        for (int k = 0; k < g->nodes[n].nin; k++) reads_b |= from_b[g->nodes[n].in[k]];
        for (int k = 0; k < g->nodes[n].nout; k++) from_b[g->nodes[n].out[k]] = reads_b;
    }
    for (int k = 0; k < nfout; k++) {
        if (from_b[g->outputs[k]])
            return kiln_error(KILN_ERR_VALUE, "split: forward output %d reads an input of the backward", k);
        mark_needed(g, g->outputs[k], fwd, stack);
    }
    for (int32_t n = 0; n < g->nnodes; n++)
        if (g->nodes[n].nout > 0 && kiln_op_has_side_effects(g->nodes[n].op) && !from_b[g->nodes[n].out[0]])
            mark_needed(g, g->nodes[n].out[0], fwd, stack);
    /* the forward graph: its inputs, nodes, outputs; then the residuals: forward values (inputs
     * and node outputs) that backward nodes or backward outputs read */
    KILN_TRY(kiln_graph_copy_subgraphs(g, f));
    KILN_TRY(kiln_graph_copy_subgraphs(g, b));
    for (int k = 0; k < nfin; k++) KILN_TRY(kiln_graph_add_input(f, &g->values[g->inputs[k]].meta, &fb->map[g->inputs[k]]));
    for (int32_t n = 0; n < g->nnodes; n++)
        if (fwd[n]) KILN_TRY(copy_node(fb, n, f));
    int32_t nout = nfout;
    int32_t *outs = kiln_malloc(sizeof(int32_t) * (size_t)(g->nvalues + nfout + 1));
    if (!outs) return kiln_error(KILN_ERR_MEMORY, "out of memory splitting a graph");
    kiln_status s = KILN_OK;
    for (int k = 0; k < nfout && s == KILN_OK; k++) {
        int32_t v = g->outputs[k];
        if (fb->map[v] < 0 && g->values[v].kind == KILN_VALUE_CAPTURED) s = copy_capture(g, v, f, &fb->map[v]);
        outs[k] = fb->map[v];
    }
    /* a residual: read by a backward node or a backward output, made by the forward */
    for (int32_t n = 0; n <= g->nnodes && s == KILN_OK; n++) {
        int nin = n < g->nnodes ? (fwd[n] ? 0 : g->nodes[n].nin) : g->noutputs - nfout;
        for (int k = 0; k < nin && s == KILN_OK; k++) {
            int32_t v = n < g->nnodes ? g->nodes[n].in[k] : g->outputs[nfout + k];
            const kiln_value *val = &g->values[v];
            bool forward_made = (val->kind == KILN_VALUE_NODE && fwd[val->node]) ||
                                (val->kind == KILN_VALUE_INPUT && !from_b[v]);
            if (!forward_made || bb->map[v] >= 0) continue;
            s = kiln_graph_add_input(b, &val->meta, &bb->map[v]);
            outs[nout++] = fb->map[v];
        }
    }
    if (s == KILN_OK) s = kiln_graph_set_outputs(f, nout, outs);
    *nresiduals = nout - nfout;
    /* the backward graph: residuals (added above), its own inputs, the other nodes, its outputs */
    for (int k = nfin; k < g->ninputs && s == KILN_OK; k++)
        s = kiln_graph_add_input(b, &g->values[g->inputs[k]].meta, &bb->map[g->inputs[k]]);
    for (int32_t n = 0; n < g->nnodes && s == KILN_OK; n++)
        if (!fwd[n]) s = copy_node(bb, n, b);
    for (int k = nfout; k < g->noutputs && s == KILN_OK; k++) {
        int32_t v = g->outputs[k];
        if (bb->map[v] < 0 && g->values[v].kind == KILN_VALUE_CAPTURED) s = copy_capture(g, v, b, &bb->map[v]);
        outs[k - nfout] = bb->map[v];
    }
    if (s == KILN_OK) s = kiln_graph_set_outputs(b, g->noutputs - nfout, outs);
    free(outs);
    return s;
}

kiln_status kiln_graph_split(const kiln_graph *g, int nforward_inputs, int nforward_outputs, kiln_graph **forward,
                             kiln_graph **backward, int32_t *nresiduals) {
    *forward = *backward = NULL;
    KILN_TRY(kiln_graph_require_concrete(g, "split"));
    if (nforward_inputs < 0 || nforward_inputs > g->ninputs || nforward_outputs < 0 ||
        nforward_outputs > g->noutputs)
        return kiln_error(KILN_ERR_VALUE, "split: %d forward inputs and %d forward outputs of a graph with %d and %d",
                          nforward_inputs, nforward_outputs, g->ninputs, g->noutputs);
    bool *fwd = kiln_calloc((size_t)g->nnodes + 1, sizeof(bool));
    bool *from_b = kiln_calloc((size_t)g->nvalues + 1, sizeof(bool));
    size_t edges = 1;
    for (int32_t n = 0; n < g->nnodes; n++) edges += (size_t)g->nodes[n].nin + 1;
    int32_t *stack = kiln_malloc(sizeof(int32_t) * edges); /* mark_needed pushes a node once per reader at most */
    int32_t *fmap = kiln_malloc(sizeof(int32_t) * ((size_t)g->nvalues + 1));
    int32_t *bmap = kiln_malloc(sizeof(int32_t) * ((size_t)g->nvalues + 1));
    kiln_graph *f = NULL, *b = NULL;
    kiln_status s = fwd && from_b && stack && fmap && bmap ? KILN_OK
                                                           : kiln_error(KILN_ERR_MEMORY, "out of memory splitting a graph");
    if (s == KILN_OK) s = kiln_graph_new(&f);
    if (s == KILN_OK) s = kiln_graph_new(&b);
    if (s == KILN_OK) {
        for (int32_t v = 0; v < g->nvalues; v++) fmap[v] = bmap[v] = -1;
        builder fb = {g, fmap}, bb = {g, bmap};
        s = split(g, nforward_inputs, nforward_outputs, fwd, from_b, stack, &fb, &bb, f, b, nresiduals);
    }
    free(fwd);
    free(from_b);
    free(stack);
    free(fmap);
    free(bmap);
    if (s != KILN_OK) {
        kiln_graph_free(f);
        kiln_graph_free(b);
        return s;
    }
    *forward = f;
    *backward = b;
    return KILN_OK;
}
