/* Loop-invariant projections out of counted loops, as cuDNN does for an RNN's input weights:
 * where a while body multiplies the row it reads of a lifted tensor by another lifted tensor,
 *
 *     x_t = gather(X, t, axis 0);  y = matmul(x_t, W)           (X and W the same every step)
 *
 * the product of every row is one GEMM before the loop, P = matmul(X, W) (X's rows stacked: T x B
 * rows), handed to the loop as one more lifted tensor, and the body reads y = gather(P, t, axis 0).
 * matmul(X, W)[t] is matmul(X[t], W) element for element (W 2-D, X at least 2-D): each element is
 * the same dot product over K, so results are bitwise those of the loop it replaces
 * (tests/python/test_scan_hoist.py checks this against O0) as long as both products take the same
 * kernel (kiln_matmul_rows_same_sums: not where a step's product is small enough for the plain
 * loop and the stacked one is not). The row x_t is still read where the body needs it otherwise (a
 * stored residual for W's gradient).
 *
 * Counted loops only (scan, map, fori_loop with int bounds: i[TRIPS] > 0) over at most as many
 * rows as steps, so the hoisted GEMM computes no row the loop would not read; and P must fit the
 * loop residual budget (kiln.set_context(loop_residual_budget=MB)). Graphs with symbolic sizes are
 * left alone. It runs before the loop bodies' own passes (pipeline.c), which would otherwise fold
 * the product into a matmul epilogue. */
#include "../ir/control.h"
#include "../ops/matmul.h"
#include "passes_internal.h"

#define MAX_HOISTS 8

typedef struct {
    int32_t matmul; /* the body's matmul node */
    int32_t row;    /* the body value of the step's row index t */
    int x, w;       /* positions of X and W among the body's inputs */
} hoist;

static int input_position(const kiln_graph *b, int32_t v) {
    for (int32_t k = 0; k < b->ninputs; k++)
        if (b->inputs[k] == v) return k;
    return -1;
}

/* The matmuls of body b (inputs [nloop, ninputs) lifted) that read a row of a lifted X times a
 * lifted 2-D W; at most MAX_HOISTS, more inputs than the node can take never. */
static int find_hoists(const kiln_graph *b, int nloop, int64_t trips, int room, hoist *h) {
    int n = 0;
    int64_t budget = kiln_loop_residual_budget();
    for (int32_t i = 0; i < b->nnodes && n < MAX_HOISTS && n < room; i++) {
        const kiln_node *m = &b->nodes[i];
        if (m->op != KILN_OP_MATMUL) continue;
        const kiln_value *xv = &b->values[m->in[0]];
        if (xv->kind != KILN_VALUE_NODE) continue;
        const kiln_node *gnode = &b->nodes[xv->node];
        if (gnode->op != KILN_OP_GATHER || kiln_attr_int(&gnode->attrs, 0, 0) != 0) continue;
        int x = input_position(b, gnode->in[0]), w = input_position(b, m->in[1]);
        if (x < nloop || w < nloop) continue;
        const kiln_meta *X = &b->values[gnode->in[0]].meta, *W = &b->values[m->in[1]].meta;
        const kiln_meta *t = &b->values[gnode->in[1]].meta, *y = &b->values[m->out[0]].meta;
        if (t->ndim != 0 || X->ndim < 2 || W->ndim != 2 || X->shape[0] > trips || X->dtype != W->dtype ||
            !kiln_dtype_is_float(X->dtype))
            continue;
        int64_t bytes = X->shape[0] * kiln_meta_numel(y) * (int64_t)kiln_dtype_size(y->dtype);
        int64_t k = W->shape[0], ncols = W->shape[1], rows = kiln_meta_numel(y) / (ncols ? ncols : 1);
        if (bytes > budget || !kiln_matmul_rows_same_sums(rows, rows * X->shape[0], ncols, k)) continue;
        h[n++] = (hoist){i, gnode->in[1], x, w};
    }
    return n;
}

/* Body b with one more input per hoist (P_k, after b's inputs) and each hoisted matmul replaced
 * by gather(P_k, t, 0); dead code dropped. */
static kiln_status rewrite_body(const kiln_graph *b, const hoist *h, int nh, const kiln_meta *pmeta, kiln_graph **out) {
    kiln_rewriter rw;
    KILN_TRY(kiln_rewriter_begin(&rw, b));
    int32_t p[MAX_HOISTS];
    kiln_status s = KILN_OK;
    for (int k = 0; k < nh && s == KILN_OK; k++) s = kiln_graph_add_input(rw.dst, &pmeta[k], &p[k]);
    for (int32_t i = 0; i < b->nnodes && s == KILN_OK; i++) {
        int k = 0;
        while (k < nh && h[k].matmul != i) k++;
        if (k == nh) {
            s = kiln_rewriter_copy_node(&rw, i);
            continue;
        }
        kiln_attrs a = {0};
        a.ni = 1; /* i[0]: axis 0 */
        int32_t in[2] = {p[k], rw.map[h[k].row]}, y;
        s = kiln_graph_add_node(rw.dst, KILN_OP_GATHER, 2, in, &a, b->nodes[i].loc, &y);
        if (s == KILN_OK) s = kiln_rewriter_stands_for(&rw, i);
        rw.map[b->nodes[i].out[0]] = y;
    }
    kiln_graph *g = NULL;
    if (s != KILN_OK) {
        kiln_rewriter_abort(&rw);
        return s;
    }
    KILN_TRY(kiln_rewriter_finish(&rw, &g));
    kiln_pass_options o0 = {KILN_LEVEL_O0, false, false, KILN_CONV_FUSE_ALL, false};
    kiln_graph *pruned = NULL;
    s = kiln_pass_dce(g, &o0, &pruned);
    if (pruned) kiln_graph_free(g), g = pruned;
    if (s != KILN_OK) {
        kiln_graph_free(g);
        return s;
    }
    *out = g;
    return KILN_OK;
}

/* cond c taking n more inputs it does not read */
static kiln_status widen_cond(const kiln_graph *c, int n, const kiln_meta *metas, kiln_graph **out) {
    KILN_TRY(kiln_graph_clone(c, out));
    kiln_status s = KILN_OK;
    for (int k = 0; k < n && s == KILN_OK; k++) {
        int32_t v;
        s = kiln_graph_add_input(*out, &metas[k], &v);
    }
    if (s != KILN_OK) kiln_graph_free(*out), *out = NULL;
    return s;
}

/* How many nodes of g name subgraph idx. */
static int subgraph_users(const kiln_graph *g, int32_t idx) {
    int users = 0;
    for (int32_t i = 0; i < g->nnodes; i++) {
        int nb = kiln_op_nbodies(g->nodes[i].op);
        for (int k = 0; k < nb; k++) {
            int32_t at;
            users += kiln_graph_body_index(g, g->nodes[i].op, &g->nodes[i].attrs, k, &at) == KILN_OK && at == idx;
        }
    }
    return users;
}

/* sub (taken) as body k of node n in rw's graph: in place of the old one when n alone names it
 * (a while_grad may share its while's body, which it must keep), else after the others. */
static kiln_status place_body(kiln_rewriter *rw, const kiln_node *n, int k, kiln_graph *sub, kiln_attrs *a) {
    int32_t old, idx;
    kiln_status s = kiln_graph_body_index(rw->src, n->op, &n->attrs, k, &old);
    if (s == KILN_OK && subgraph_users(rw->src, old) == 1) {
        kiln_graph_free(rw->dst->subgraphs[old]);
        rw->dst->subgraphs[old] = sub;
        idx = old;
    } else if (s == KILN_OK) {
        s = kiln_graph_add_subgraph(rw->dst, sub, &idx);
    }
    if (s != KILN_OK) {
        kiln_graph_free(sub);
        return s;
    }
    a->i[kiln_op_body_attr(n->op, k)] = idx;
    return KILN_OK;
}

/* Emits node i of the source graph (a while whose body has the hoists h) into rw: the GEMMs, then
 * the loop over the rewritten bodies. */
static kiln_status emit_hoisted(kiln_rewriter *rw, int32_t i, const kiln_graph *body, const kiln_graph *cond,
                                const hoist *h, int nh) {
    const kiln_node *n = &rw->src->nodes[i];
    int32_t in[KILN_MAX_OUTPUTS + MAX_HOISTS];
    kiln_meta pmeta[MAX_HOISTS];
    kiln_status s = KILN_OK;
    for (int k = 0; k < n->nin; k++) in[k] = rw->map[n->in[k]];
    for (int k = 0; k < nh && s == KILN_OK; k++) {
        kiln_attrs none = {0};
        int32_t mm_in[2] = {in[h[k].x], in[h[k].w]}, loc = -1, bloc = body->nodes[h[k].matmul].loc;
        if (bloc >= 0 && bloc < body->nlocs) s = kiln_graph_add_loc(rw->dst, body->locs[bloc], &loc);
        if (s == KILN_OK) s = kiln_graph_add_node(rw->dst, KILN_OP_MATMUL, 2, mm_in, &none, loc, &in[n->nin + k]);
        if (s == KILN_OK) s = kiln_rewriter_stands_for(rw, i);
        if (s == KILN_OK) pmeta[k] = rw->dst->values[in[n->nin + k]].meta;
    }
    kiln_graph *nb = NULL, *nc = NULL;
    kiln_attrs a = n->attrs;
    if (s == KILN_OK) s = rewrite_body(body, h, nh, pmeta, &nb);
    if (s == KILN_OK) s = widen_cond(cond, nh, pmeta, &nc);
    if (s == KILN_OK) s = place_body(rw, n, 0, nc, &a); /* (each place_body takes its graph) */
    if (s == KILN_OK) s = place_body(rw, n, 1, nb, &a);
    else kiln_graph_free(nb);
    int32_t outs[KILN_MAX_OUTPUTS];
    if (s == KILN_OK) s = kiln_graph_add_node(rw->dst, n->op, n->nin + nh, in, &a, n->loc, outs);
    if (s == KILN_OK) s = kiln_rewriter_stands_for(rw, i);
    for (int k = 0; k < n->nout && s == KILN_OK; k++) rw->map[n->out[k]] = outs[k];
    return s;
}

KILN_PASS(hoist_loop_projections) {
    (void)opt;
    *out = NULL;
    if (kiln_graph_is_symbolic(in)) return KILN_OK;
    kiln_rewriter rw;
    bool started = false;
    kiln_status s = KILN_OK;
    for (int32_t i = 0; i < in->nnodes && s == KILN_OK; i++) {
        const kiln_node *n = &in->nodes[i];
        hoist h[MAX_HOISTS];
        int nh = 0;
        kiln_graph *body = NULL, *cond = NULL;
        int64_t trips = kiln_attr_int(&n->attrs, KILN_A_WHILE_TRIPS, 0);
        if (n->op == KILN_OP_WHILE && trips > 0 && kiln_graph_body(in, n, 0, &cond) == KILN_OK &&
            kiln_graph_body(in, n, 1, &body) == KILN_OK)
            nh = find_hoists(body, kiln_loop_nloop(n->op, &n->attrs, n->nin, n->nout), trips,
                             KILN_MAX_OUTPUTS - n->nin, h);
        if (nh && !started) {
            s = kiln_rewriter_begin(&rw, in);
            started = s == KILN_OK;
            for (int32_t j = 0; j < i && s == KILN_OK; j++) s = kiln_rewriter_copy_node(&rw, j);
        }
        if (!started || s != KILN_OK) continue;
        s = nh ? emit_hoisted(&rw, i, body, cond, h, nh) : kiln_rewriter_copy_node(&rw, i);
    }
    if (!started) return s;
    if (s == KILN_OK) return kiln_rewriter_finish(&rw, out);
    kiln_rewriter_abort(&rw);
    return s;
}
