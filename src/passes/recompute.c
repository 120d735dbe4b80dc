/* Recomputation (sublinear memory, Chen et al. 2016 as MegEngine's seq_sublinear_memory does it):
 * values the backward reads long after the forward made them are dropped after their last early
 * reader and computed again, from the nearest kept values, just before their first late reader.
 *
 * The graph's node order is the sequence. Nodes are grouped into blocks (block[n] >= 0; -1: the
 * node is never dropped nor recomputed). A value v made by node p in block b is dropped when it
 * has a gap in its uses that ends at a reader outside b: it is kept up to the use before the
 * largest such gap, and the readers after it read a copy. The copy of p reads, for each input,
 * the copy of a value dropped from the same block, or of any value that is no checkpoint and
 * whose last reader has run by then (made recursively: a segment is made again from its
 * checkpoints, and the pre-activation of a dropped activation is not kept alive in its place),
 * otherwise the original (which then lives longer: what that costs is the planner's to measure).
 * Copies are shared by every later reader. Block endpoints (the last node of a block, when
 * `endpoint` says so) are the checkpoints: their outputs are never dropped.
 *
 * Never dropped nor recomputed: random ops (dropout keeps its mask), ops with effects or in-place
 * writes, control flow and fused groups holding such ops; and no copy runs after an in-place write
 * to a buffer its node reads (it would read the written data): such a value is kept, or its
 * original read. Graph outputs stay as they are.
 * Copies are ordinary nodes: the same kernels run on the same inputs, so results are bitwise those
 * without the pass, and the planner places them like any other node. */
#include "../ir/control.h"
#include "passes_internal.h"

/* A training batch_norm (an op with KILN_OPF_OPTIONAL_STATE, i[0] set) whose only effect is the
 * update of its running state: its copy is given empty state, writes nothing and makes the same
 * outputs, so it may run again. */
_Static_assert(KILN_A_BATCH_NORM_TRAINING == 0, "OPTIONAL_STATE ops hold their training flag first");
static bool state_only_effects(const kiln_node *n) {
    uint64_t f = kiln_op_table[n->op].flags;
    return (f & KILN_OPF_OPTIONAL_STATE) && n->attrs.ni > 0 && n->attrs.i[KILN_A_BATCH_NORM_TRAINING] != 0 &&
           !(f & (KILN_OPF_MUTATES | KILN_OPF_RANDOM | KILN_OPF_EFFECT | KILN_OPF_CONTROL));
}

static bool impure_subgraph(const kiln_graph *sub) {
    for (int32_t i = 0; i < sub->nnodes; i++)
        if (kiln_node_has_effects(&sub->nodes[i]) || kiln_op_is_control(sub->nodes[i].op)) return true;
    return false;
}

/* Per node: whether it may be recomputed at all (ok), and the first later node writing in place a
 * buffer it reads (next_write; nnodes when none): a copy must run before that write. Per value:
 * whether some node writes its buffer in place (written): a write to a copy would not reach the
 * original's views, so such values are never dropped. */
static kiln_status recomputable_nodes(const kiln_graph *g, bool *ok, int32_t *next_write, bool *written) {
    int32_t nv = g->nvalues, nn = g->nnodes;
    int32_t *root = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    int32_t *writer = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1)); /* per root: the next writer */
    if (!root || !writer) {
        free(root), free(writer);
        return kiln_error(KILN_ERR_MEMORY, "out of memory planning recomputation");
    }
    kiln_value_roots(g, root);
    for (int32_t v = 0; v < nv; v++) writer[v] = nn;
    for (int32_t i = nn - 1; i >= 0; i--) {
        const kiln_node *n = &g->nodes[i];
        bool good = (!kiln_node_has_effects(n) || state_only_effects(n)) && !kiln_op_is_control(n->op);
        kiln_graph *sub;
        if (good && n->op == KILN_OP_FUSED) /* a group whose subgraph is missing is not recomputed */
            good = kiln_graph_body(g, n, 0, &sub) == KILN_OK && !impure_subgraph(sub);
        ok[i] = good;
        next_write[i] = nn;
        for (int k = 0; k < n->nin; k++)
            if (writer[root[n->in[k]]] < next_write[i]) next_write[i] = writer[root[n->in[k]]];
        for (int k = 0; k < n->nin; k++)
            if (kiln_node_writes_buffer(n, k)) writer[root[n->in[k]]] = i;
    }
    for (int32_t v = 0; v < nv; v++) written[v] = writer[root[v]] < nn; /* now the first writer, if any */
    free(root), free(writer);
    return KILN_OK;
}

/* Uses of each value: the node indices reading it, ascending, once per node (CSR form). */
typedef struct {
    int32_t *start; /* nvalues + 1 */
    int32_t *at;
} uses;

static kiln_status collect_uses(const kiln_graph *g, uses *u) {
    int32_t nv = g->nvalues;
    u->start = kiln_calloc((size_t)nv + 1, sizeof(int32_t));
    int64_t total = 0;
    for (int32_t i = 0; i < g->nnodes; i++) total += g->nodes[i].nin;
    u->at = kiln_malloc(sizeof(int32_t) * (size_t)(total ? total : 1));
    if (!u->start || !u->at) return kiln_error(KILN_ERR_MEMORY, "out of memory planning recomputation");
    for (int32_t i = 0; i < g->nnodes; i++) {
        const kiln_node *n = &g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            bool seen = false;
            for (int j = 0; j < k; j++) seen |= n->in[j] == n->in[k];
            if (!seen) u->start[n->in[k] + 1]++;
        }
    }
    for (int32_t v = 0; v < nv; v++) u->start[v + 1] += u->start[v];
    int32_t *fill = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    if (!fill) return kiln_error(KILN_ERR_MEMORY, "out of memory planning recomputation");
    memcpy(fill, u->start, sizeof(int32_t) * (size_t)nv);
    for (int32_t i = 0; i < g->nnodes; i++) {
        const kiln_node *n = &g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            bool seen = false;
            for (int j = 0; j < k; j++) seen |= n->in[j] == n->in[k];
            if (!seen) u->at[fill[n->in[k]]++] = i;
        }
    }
    free(fill);
    return KILN_OK;
}

typedef struct {
    const kiln_graph *g;
    const int32_t *block;
    const bool *endpoint;  /* per node: its outputs are checkpoints */
    const bool *pinned;    /* per value: a graph output or written in place: never copied */
    const int32_t *last;   /* per value: its last reader in the graph, or -1 */
    int32_t *drop_after; /* per value: the last node reading the original, or -1 when kept */
    int32_t *copy;       /* per value: its copy in the new graph, or -1 */
    kiln_rewriter rw;
    const bool *ok;
    const int32_t *next_write;
    kiln_recompute_stats *st;
    bool *recomputed; /* per original node, optional */
} rewrite;

/* whether node p can run again just before node t */
static bool can_recompute(const rewrite *r, int32_t p, int32_t t) { return r->ok[p] && r->next_write[p] >= t; }

static bool dropped_at(const rewrite *r, int32_t v, int32_t reader) {
    return r->drop_after[v] >= 0 && reader > r->drop_after[v];
}

/* Whether a copy made for `reader` (of a node in block b) makes its input w again rather than
 * read the original: when w was dropped from block b, or when w is no checkpoint and its last
 * reader runs before `reader` (reading the original would keep it alive until then: an
 * activation's pre-activation, a normalization's input, kept in place of the value dropped). */
static bool copy_input(const rewrite *r, int32_t w, int32_t reader, int32_t b) {
    const kiln_value *wv = &r->g->values[w];
    if (wv->kind != KILN_VALUE_NODE) return false;
    int32_t q = wv->node;
    if (r->block[q] < 0 || !can_recompute(r, q, reader)) return false;
    if (dropped_at(r, w, reader)) return r->block[q] == b;
    return !r->pinned[w] && !(r->endpoint && r->endpoint[q]) && r->last[w] < reader;
}

/* An empty tensor of w's dtype, one dimension of size 0 (a copy's running state: none). */
static kiln_status empty_state(rewrite *r, int32_t w, int32_t loc, int32_t *out) {
    kiln_attrs a = {0};
    kiln_attrs_push_int(&a, r->g->values[w].meta.dtype);
    kiln_attrs_push_int(&a, 1);
    kiln_attrs_push_int(&a, 0);
    kiln_attrs_push_float(&a, 0.0);
    return kiln_graph_add_node(r->rw.dst, KILN_OP_FULL, 0, NULL, &a, loc, out);
}

/* The copy of value v for reader `reader`, made (with the copies it needs) when missing. */
static kiln_status recompute_value(rewrite *r, int32_t v, int32_t reader, int depth) {
    if (r->copy[v] >= 0) return KILN_OK;
    if (depth > 100000) return kiln_error(KILN_ERR_RUNTIME, "recompute: chain too deep");
    const kiln_graph *g = r->g;
    int32_t p = g->values[v].node;
    const kiln_node *n = &g->nodes[p];
    int32_t small[8], *in = n->nin <= 8 ? small : kiln_malloc(sizeof(int32_t) * (size_t)n->nin);
    if (!in) return kiln_error(KILN_ERR_MEMORY, "out of memory recomputing");
    kiln_status s = KILN_OK;
    for (int k = 0; k < n->nin && s == KILN_OK; k++) {
        int32_t w = n->in[k];
        if (copy_input(r, w, reader, r->block[p])) {
            s = recompute_value(r, w, reader, depth + 1);
            in[k] = r->copy[w];
        } else if (k < 8 && (kiln_op_table[n->op].flags & KILN_OPF_WRITES_INPUT(k))) {
            s = empty_state(r, w, n->loc, &in[k]); /* (state_only_effects: the copy updates nothing) */
        } else {
            in[k] = r->rw.map[w];
        }
    }
    int32_t outs[KILN_MAX_OUTPUTS];
    if (s == KILN_OK) s = kiln_graph_add_node(r->rw.dst, n->op, n->nin, in, &n->attrs, n->loc, outs);
    if (s == KILN_OK) {
        for (int k = 0; k < n->nout; k++) r->copy[n->out[k]] = outs[k];
        r->st->recomputed_ops++;
        r->st->extra_flops += kiln_node_flops(g, p);
        if (r->recomputed) r->recomputed[p] = true;
    }
    if (in != small) free(in);
    return s;
}

kiln_status kiln_recompute_rewrite(const kiln_graph *g, const int32_t *block, const bool *endpoint, kiln_graph **out,
                                   kiln_recompute_stats *st, bool *recomputed) {
    *out = NULL;
    memset(st, 0, sizeof *st);
    int32_t nv = g->nvalues, nn = g->nnodes;
    uses u = {0};
    bool *ok = kiln_malloc(sizeof(bool) * (size_t)(nn ? nn : 1));
    int32_t *next_write = kiln_malloc(sizeof(int32_t) * (size_t)(nn ? nn : 1));
    rewrite r = {g, block, endpoint, NULL, NULL, NULL, NULL, {0}, ok, next_write, st, recomputed};
    bool *output = kiln_calloc((size_t)(nv ? nv : 1), sizeof(bool));
    bool *written = kiln_malloc(sizeof(bool) * (size_t)(nv ? nv : 1));
    int32_t *block_end = kiln_malloc(sizeof(int32_t) * (size_t)(nn ? nn : 1));
    int32_t *last = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    r.drop_after = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    r.copy = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    r.pinned = output, r.last = last;
    kiln_status s = ok && next_write && output && written && block_end && last && r.drop_after && r.copy
                        ? KILN_OK
                        : kiln_error(KILN_ERR_MEMORY, "out of memory planning recomputation");
    if (recomputed) memset(recomputed, 0, sizeof(bool) * (size_t)nn);
    if (s == KILN_OK) s = recomputable_nodes(g, ok, next_write, written);
    if (s == KILN_OK) s = collect_uses(g, &u);
    if (s != KILN_OK) goto done;
    /* the last node of each block (blocks are runs of equal ids in node order) */
    for (int32_t i = nn - 1; i >= 0; i--)
        block_end[i] = (i + 1 < nn && block[i + 1] == block[i] && block[i] >= 0) ? block_end[i + 1] : i;
    for (int32_t k = 0; k < g->noutputs; k++) output[g->outputs[k]] = true;
    for (int32_t v = 0; v < nv; v++) {
        output[v] |= written[v]; /* (pinned: never dropped nor copied) */
        last[v] = u.start[v + 1] > u.start[v] ? u.at[u.start[v + 1] - 1] : -1;
    }
    bool any = false;
    for (int32_t v = 0; v < nv; v++) {
        r.drop_after[v] = -1;
        r.copy[v] = -1;
        const kiln_value *val = &g->values[v];
        if (val->kind != KILN_VALUE_NODE || output[v]) continue;
        int32_t p = val->node;
        const kiln_node *n = &g->nodes[p];
        if (block[p] < 0 || !ok[p] || (endpoint && endpoint[p])) continue;
        /* accesses: the producer, then the readers; keep up to the access before the largest
         * gap that ends outside the block (dropping right after the producer saves nothing
         * unless other outputs of the node are kept) */
        int32_t best = -1, best_gap = 0, prev = p;
        for (int32_t j = u.start[v]; j < u.start[v + 1]; j++) {
            int32_t t = u.at[j], gap = t - prev;
            bool eligible = (prev != p || n->nout > 1) && t > block_end[p] && gap > g->nodes[t].nin &&
                            next_write[p] >= t;
            if (eligible && gap > best_gap) best = prev, best_gap = gap;
            prev = t;
        }
        r.drop_after[v] = best;
        any |= best >= 0;
    }
    if (!any) goto done; /* unchanged */
    s = kiln_rewriter_begin(&r.rw, g);
    for (int32_t i = 0; i < nn && s == KILN_OK; i++) {
        const kiln_node *n = &g->nodes[i];
        for (int k = 0; k < n->nin && s == KILN_OK; k++)
            if (dropped_at(&r, n->in[k], i)) s = recompute_value(&r, n->in[k], i, 0);
        if (s != KILN_OK) break;
        int32_t small[8], *in = n->nin <= 8 ? small : kiln_malloc(sizeof(int32_t) * (size_t)n->nin);
        if (!in) {
            s = kiln_error(KILN_ERR_MEMORY, "out of memory recomputing");
            break;
        }
        for (int k = 0; k < n->nin; k++) in[k] = dropped_at(&r, n->in[k], i) ? r.copy[n->in[k]] : r.rw.map[n->in[k]];
        int32_t outs[KILN_MAX_OUTPUTS];
        s = kiln_graph_add_node(r.rw.dst, n->op, n->nin, in, &n->attrs, n->loc, outs);
        if (s == KILN_OK) {
            r.rw.dst->nodes[r.rw.dst->nnodes - 1].recompute = n->recompute;
            for (int k = 0; k < n->nout; k++) r.rw.map[n->out[k]] = outs[k];
        }
        if (in != small) free(in);
    }
    if (s == KILN_OK && st->recomputed_ops > 0) s = kiln_rewriter_finish(&r.rw, out);
    else kiln_rewriter_abort(&r.rw);
done:
    free(ok), free(next_write), free(output), free(written), free(block_end), free(last), free(r.drop_after), free(r.copy), free(u.start), free(u.at);
    return s;
}

kiln_status kiln_recompute_marked(const kiln_graph *g, kiln_graph **out, kiln_recompute_stats *st) {
    *out = NULL;
    memset(st, 0, sizeof *st);
    int32_t nn = g->nnodes;
    bool marked = false;
    for (int32_t i = 0; i < nn; i++) marked |= g->nodes[i].recompute != 0;
    if (!marked) return KILN_OK;
    int32_t *block = kiln_malloc(sizeof(int32_t) * (size_t)(nn ? nn : 1));
    bool *endpoint = kiln_calloc((size_t)(nn ? nn : 1), sizeof(bool));
    if (!block || !endpoint) {
        free(block), free(endpoint);
        return kiln_error(KILN_ERR_MEMORY, "out of memory planning recomputation");
    }
    /* each marked Cell call is a block; its last node makes the cell's output, which is kept
     * (MindSpore: everything in the cell but its outputs is recomputed) */
    for (int32_t i = 0; i < nn; i++) {
        int32_t id = g->nodes[i].recompute;
        block[i] = id ? id : -1;
        endpoint[i] = id && (i + 1 == nn || g->nodes[i + 1].recompute != id);
    }
    kiln_status s = kiln_recompute_rewrite(g, block, endpoint, out, st, NULL);
    free(block), free(endpoint);
    return s;
}
