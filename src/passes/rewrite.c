/* Helpers for passes that rebuild a graph node by node. */
#include "passes_internal.h"

void kiln_value_roots(const kiln_graph *g, int32_t *root) {
    for (int32_t v = 0; v < g->nvalues; v++) { /* values are numbered in trace order */
        const kiln_value *val = &g->values[v];
        root[v] = v;
        if (val->kind == KILN_VALUE_NODE && val->index == 0 &&
            (kiln_op_table[g->nodes[val->node].op].flags & (KILN_OPF_VIEW | KILN_OPF_MUTATES)))
            root[v] = root[g->nodes[val->node].in[0]];
    }
}

kiln_status kiln_rewriter_begin(kiln_rewriter *rw, const kiln_graph *src) {
    memset(rw, 0, sizeof *rw);
    rw->src = src;
    rw->map = kiln_malloc(sizeof(int32_t) * (size_t)(src->nvalues ? src->nvalues : 1));
    if (!rw->map) return kiln_error(KILN_ERR_MEMORY, "out of memory rewriting a graph");
    for (int32_t v = 0; v < src->nvalues; v++) rw->map[v] = -1;
    kiln_status s = kiln_graph_new(&rw->dst);
    if (s == KILN_OK) s = kiln_graph_copy_symbols(src, rw->dst); /* the same entries: sizes copy as they are */
    for (int32_t i = 0; i < src->ninputs && s == KILN_OK; i++) {
        const kiln_value *v = &src->values[src->inputs[i]];
        s = kiln_graph_add_input(rw->dst, &v->meta, &rw->map[src->inputs[i]]);
        if (s == KILN_OK) memcpy(rw->dst->values[rw->map[src->inputs[i]]].sym, v->sym, sizeof v->sym);
    }
    for (int32_t c = 0; c < src->ncaptures && s == KILN_OK; c++) {
        const kiln_value *v = &src->values[src->captures[c]];
        /* already a private copy when constant: share it rather than copy again */
        s = kiln_graph_add_capture(rw->dst, v->bound, false, &rw->map[src->captures[c]]);
        if (s == KILN_OK) rw->dst->values[rw->map[src->captures[c]]].constant = v->constant;
        if (s == KILN_OK) rw->dst->values[rw->map[src->captures[c]]].fresh = v->fresh;
    }
    for (int32_t l = 0; l < src->nlocs && s == KILN_OK; l++) {
        int32_t id;
        s = kiln_graph_add_loc(rw->dst, src->locs[l], &id);
    }
    for (int32_t k = 0; k < src->nsubgraphs && s == KILN_OK; k++) {
        kiln_graph *sub = NULL;
        int32_t idx;
        s = kiln_graph_clone(src->subgraphs[k], &sub);
        if (s == KILN_OK) s = kiln_graph_add_subgraph(rw->dst, sub, &idx);
        if (s != KILN_OK) kiln_graph_free(sub);
    }
    if (s != KILN_OK) kiln_rewriter_abort(rw);
    return s;
}

kiln_status kiln_rewriter_copy_node(kiln_rewriter *rw, int32_t node) {
    const kiln_node *n = &rw->src->nodes[node];
    int32_t small[8] = {0}, *in = n->nin <= 8 ? small : kiln_malloc(sizeof(int32_t) * (size_t)n->nin);
    if (!in) return kiln_error(KILN_ERR_MEMORY, "out of memory rewriting a graph");
    kiln_status s = KILN_OK;
    for (int k = 0; k < n->nin && s == KILN_OK; k++) {
        in[k] = rw->map[n->in[k]];
        if (in[k] < 0) s = kiln_error(KILN_ERR_VALUE, "rewrite: %s uses a value the pass dropped", kiln_op_table[n->op].name);
    }
    int32_t outs[KILN_MAX_OUTPUTS];
    kiln_sdim ai[KILN_MAX_ATTR_INTS];
    kiln_graph_attr_dims(n, ai);
    if (s == KILN_OK) s = kiln_graph_add_node_sym(rw->dst, n->op, n->nin, in, &n->attrs, ai, n->loc, outs);
    if (s == KILN_OK) rw->dst->nodes[rw->dst->nnodes - 1].recompute = n->recompute;
    for (int k = 0; k < n->nout && s == KILN_OK; k++) rw->map[n->out[k]] = outs[k];
    if (in != small) free(in);
    return s;
}

kiln_status kiln_rewriter_finish(kiln_rewriter *rw, kiln_graph **out) {
    const kiln_graph *src = rw->src;
    int32_t *outs = kiln_malloc(sizeof(int32_t) * (size_t)(src->noutputs ? src->noutputs : 1));
    kiln_status s = outs ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory rewriting a graph");
    for (int32_t k = 0; k < src->noutputs && s == KILN_OK; k++) {
        outs[k] = rw->map[src->outputs[k]];
        if (outs[k] < 0) s = kiln_error(KILN_ERR_VALUE, "rewrite: graph output %d was dropped", k);
    }
    if (s == KILN_OK) s = kiln_graph_set_outputs(rw->dst, src->noutputs, outs);
    if (s == KILN_OK) s = kiln_graph_carry_names(src, rw->dst, rw->map, rw->origin, rw->norigin);
    free(outs);
    if (s != KILN_OK) {
        kiln_rewriter_abort(rw);
        return s;
    }
    *out = rw->dst;
    rw->dst = NULL;
    free(rw->map), free(rw->origin);
    rw->map = rw->origin = NULL;
    return KILN_OK;
}

void kiln_rewriter_abort(kiln_rewriter *rw) {
    kiln_graph_free(rw->dst);
    free(rw->map), free(rw->origin);
    rw->dst = NULL;
    rw->map = rw->origin = NULL;
}

kiln_status kiln_rewriter_stands_for(kiln_rewriter *rw, int32_t src_node) {
    int32_t d = rw->dst->nnodes - 1;
    if (d < 0) return KILN_OK;
    if (d >= rw->norigin) {
        int32_t want = d + 1 > 2 * rw->norigin ? d + 1 : 2 * rw->norigin;
        int32_t *grown = kiln_realloc(rw->origin, sizeof(int32_t) * (size_t)want);
        if (!grown) return kiln_error(KILN_ERR_MEMORY, "out of memory rewriting a graph");
        memset(grown + rw->norigin, 0, sizeof(int32_t) * (size_t)(want - rw->norigin));
        rw->origin = grown, rw->norigin = want;
    }
    rw->origin[d] = src_node + 1;
    return KILN_OK;
}

int32_t *kiln_graph_use_counts(const kiln_graph *g) {
    int32_t *uses = kiln_calloc((size_t)(g->nvalues ? g->nvalues : 1), sizeof(int32_t));
    if (!uses) {
        kiln_error(KILN_ERR_MEMORY, "out of memory counting uses");
        return NULL;
    }
    for (int32_t n = 0; n < g->nnodes; n++)
        for (int k = 0; k < g->nodes[n].nin; k++) uses[g->nodes[n].in[k]]++;
    for (int32_t k = 0; k < g->noutputs; k++) uses[g->outputs[k]]++;
    return uses;
}
