/* Joins gradients written into disjoint slices of zeros. The gradient of a slice is its output
 * gradient written into zeros (full + slice_assign); when several slices of one tensor are read
 * (split, chunk, unbind, q/k/v cut from one projection), their gradients are summed:
 *
 *     add(slice_assign(full(0), g1, S1), slice_assign(full(0), g2, S2)) ...
 *
 * Such a value is a "canvas": zeros with pieces written into boxes. When the pieces of a canvas
 * built with at least one add lie in pairwise disjoint boxes, the sum is the zeros with every
 * piece written once: this pass emits one full and one slice_assign per piece in place of the
 * canvas, and a concat of the pieces when they tile the tensor along one axis (no zeros left).
 * Adding a zero to a piece is exact except for the sign of a zero: a -0 piece stays -0 here where
 * eager's -0 + 0 gives +0 (equal as numbers).
 *
 * Only plain canvases are taken: concrete sizes, unit steps, pieces of the slice's own shape and
 * the canvas's dtype, every intermediate used once (by the next slice_assign or add of the canvas,
 * never a graph output), and pieces whose buffers no node writes in place (their reads move to
 * the canvas's last node). */
#include "passes_internal.h"

bool *kiln_pass_written_buffers(const kiln_graph *g); /* cse.c */

#define MAX_PIECES 64

typedef struct {
    int32_t npieces;  /* -1: not a canvas */
    int32_t nadds;    /* adds that joined it */
    int32_t zeros;    /* the full node of its first canvas (its dtype and shape) */
    int32_t *piece;   /* src value written, per piece */
    int32_t *box;     /* src slice_assign node giving the piece's box, per piece */
} canvas;

typedef struct {
    const kiln_graph *g;
    const int32_t *uses;
    const bool *written, *is_output;
    canvas *cv; /* per src value */
} finder;

static bool concrete_value(const kiln_graph *g, int32_t v) {
    for (int d = 0; d < KILN_MAX_DIMS; d++)
        if (g->values[v].sym[d]) return false;
    return true;
}

static const kiln_node *producer(const kiln_graph *g, int32_t v) {
    const kiln_value *val = &g->values[v];
    return val->kind == KILN_VALUE_NODE ? &g->nodes[val->node] : NULL;
}

/* Whether v may disappear into a canvas: used once, by a node, never a graph output. */
static bool absorbable(const finder *f, int32_t v) { return f->uses[v] == 1 && !f->is_output[v]; }

/* Whether the boxes of slice_assign nodes a and b (unit steps) share no element. */
static bool disjoint(const kiln_node *a, const kiln_node *b, int ndim) {
    for (int d = 0; d < ndim; d++) {
        int64_t a0 = a->attrs.i[KILN_A_SLICE_START + d], a1 = a0 + a->attrs.i[KILN_A_SLICE_LENGTH + d];
        int64_t b0 = b->attrs.i[KILN_A_SLICE_START + d], b1 = b0 + b->attrs.i[KILN_A_SLICE_LENGTH + d];
        if (a1 <= b0 || b1 <= a0 || a0 == a1 || b0 == b1) return true;
    }
    return false;
}

static kiln_status add_piece(canvas *c, int32_t piece, int32_t box) {
    if (c->npieces >= MAX_PIECES) return KILN_OK; /* caller sees no growth and gives up */
    if (!c->piece) {
        c->piece = kiln_malloc(sizeof(int32_t) * MAX_PIECES);
        c->box = kiln_malloc(sizeof(int32_t) * MAX_PIECES);
        if (!c->piece || !c->box) return kiln_error(KILN_ERR_MEMORY, "out of memory in join_slice_writes");
    }
    c->piece[c->npieces] = piece;
    c->box[c->npieces++] = box;
    return KILN_OK;
}

/* Whether every piece of `from` is disjoint from every piece of `to` (and there is room). */
static bool fits(const finder *f, const canvas *to, const canvas *from, int ndim) {
    if (to->npieces + from->npieces > MAX_PIECES) return false;
    for (int i = 0; i < from->npieces; i++)
        for (int j = 0; j < to->npieces; j++)
            if (!disjoint(&f->g->nodes[from->box[i]], &f->g->nodes[to->box[j]], ndim)) return false;
    return true;
}

static kiln_status copy_pieces(canvas *to, const canvas *from) {
    for (int i = 0; i < from->npieces; i++) KILN_TRY(add_piece(to, from->piece[i], from->box[i]));
    return KILN_OK;
}

/* Fills f->cv[v] for the value made by node i (values in order: inputs were seen first). */
static kiln_status find(finder *f, int32_t i) {
    const kiln_graph *g = f->g;
    const kiln_node *n = &g->nodes[i];
    int32_t v = n->out[0];
    canvas *c = &f->cv[v];
    if (n->attr_sym || !concrete_value(g, v)) return KILN_OK;
    const kiln_meta *m = &g->values[v].meta;
    if (n->op == KILN_OP_FULL) {
        if (n->attrs.f[KILN_A_FULL_VALUE] == 0.0 && kiln_dtype_is_float(m->dtype)) c->npieces = 0, c->zeros = i;
        return KILN_OK;
    }
    if (n->op == KILN_OP_SLICE_ASSIGN) {
        int32_t base = n->in[0], piece = n->in[1];
        const canvas *b = &f->cv[base];
        if (b->npieces < 0 || !absorbable(f, base) || f->written[piece] || !concrete_value(g, piece)) return KILN_OK;
        const kiln_meta *pm = &g->values[piece].meta;
        if (pm->dtype != m->dtype || pm->ndim != m->ndim) return KILN_OK;
        for (int d = 0; d < m->ndim; d++)
            if (n->attrs.i[KILN_A_SLICE_STEP + d] != 1 || pm->shape[d] != n->attrs.i[KILN_A_SLICE_LENGTH + d]) return KILN_OK;
        canvas one = {.npieces = 0};
        int32_t box = i;
        canvas single = {.npieces = 1, .piece = &piece, .box = &box};
        if (!fits(f, b, &single, m->ndim)) return KILN_OK;
        one.zeros = b->zeros, one.nadds = b->nadds;
        kiln_status s = copy_pieces(&one, b);
        if (s == KILN_OK) s = add_piece(&one, piece, i);
        if (s != KILN_OK) {
            free(one.piece), free(one.box);
            return s;
        }
        *c = one;
        return KILN_OK;
    }
    if (n->op == KILN_OP_ADD && n->nin == 2) {
        int32_t a = n->in[0], b = n->in[1];
        const canvas *ca = &f->cv[a], *cb = &f->cv[b];
        if (a == b || ca->npieces < 0 || cb->npieces < 0 || !absorbable(f, a) || !absorbable(f, b)) return KILN_OK;
        if (!kiln_meta_equal(&g->values[a].meta, m) || !kiln_meta_equal(&g->values[b].meta, m)) return KILN_OK;
        if (!fits(f, ca, cb, m->ndim)) return KILN_OK;
        canvas one = {.npieces = 0, .zeros = ca->zeros, .nadds = ca->nadds + cb->nadds + 1};
        kiln_status s = copy_pieces(&one, ca);
        if (s == KILN_OK) s = copy_pieces(&one, cb);
        if (s != KILN_OK) {
            free(one.piece), free(one.box);
            return s;
        }
        *c = one;
    }
    return KILN_OK;
}

/* Whether node i's canvas is extended by a later node (then that node emits it). */
static bool extended(const finder *f, int32_t v, const int32_t *user) {
    return user[v] >= 0 && f->cv[f->g->nodes[user[v]].out[0]].npieces >= 0 && absorbable(f, v);
}

/* Marks the nodes behind canvas value v (its zeros, slice_assigns and adds) as absorbed. */
static void absorb(const finder *f, int32_t v, bool *gone) {
    const kiln_node *n = producer(f->g, v);
    if (!n) return;
    gone[f->g->values[v].node] = true;
    if (n->op == KILN_OP_SLICE_ASSIGN) absorb(f, n->in[0], gone);
    else if (n->op == KILN_OP_ADD) absorb(f, n->in[0], gone), absorb(f, n->in[1], gone);
}

/* The axis along which c's pieces tile the whole tensor (other axes whole, the boxes end to end),
 * their order in *order; -1 when they do not. */
static int tiling_axis(const finder *f, const canvas *c, const kiln_meta *m, int32_t *order) {
    for (int ax = 0; ax < m->ndim; ax++) {
        bool ok = true;
        for (int p = 0; p < c->npieces && ok; p++) {
            const kiln_node *b = &f->g->nodes[c->box[p]];
            for (int d = 0; d < m->ndim && ok; d++)
                if (d != ax) ok = b->attrs.i[KILN_A_SLICE_START + d] == 0 && b->attrs.i[KILN_A_SLICE_LENGTH + d] == m->shape[d];
        }
        if (!ok) continue;
        int64_t at = 0;
        int32_t k = 0;
        while (at < m->shape[ax] && k < c->npieces) { /* pieces are disjoint: at most one starts at `at` */
            int32_t next = -1;
            for (int p = 0; p < c->npieces; p++) {
                const kiln_node *b = &f->g->nodes[c->box[p]];
                if (b->attrs.i[KILN_A_SLICE_START + ax] == at && b->attrs.i[KILN_A_SLICE_LENGTH + ax] > 0) next = p;
            }
            if (next < 0) break;
            order[k++] = next;
            at += f->g->nodes[c->box[next]].attrs.i[KILN_A_SLICE_LENGTH + ax];
        }
        if (at == m->shape[ax] && k == c->npieces) return ax;
    }
    return -1;
}

/* Emits canvas c (the value of src node i) into the rewritten graph. */
static kiln_status emit(kiln_rewriter *rw, const finder *f, const canvas *c, int32_t i) {
    const kiln_node *n = &f->g->nodes[i];
    const kiln_meta *m = &f->g->values[n->out[0]].meta;
    int32_t order[MAX_PIECES], ins[MAX_PIECES], out[KILN_MAX_OUTPUTS];
    int ax = tiling_axis(f, c, m, order);
    if (ax >= 0 && c->npieces > 1) {
        for (int k = 0; k < c->npieces; k++) ins[k] = rw->map[c->piece[order[k]]];
        kiln_attrs a = {.ni = 1};
        a.i[KILN_A_CONCAT_AXIS] = ax;
        KILN_TRY(kiln_keep_recompute_mark(kiln_graph_add_node(rw->dst, KILN_OP_CONCAT, c->npieces, ins, &a, n->loc, out),
                                          rw->dst, n->recompute));
    } else {
        const kiln_node *z = &f->g->nodes[c->zeros];
        KILN_TRY(kiln_keep_recompute_mark(kiln_graph_add_node(rw->dst, KILN_OP_FULL, 0, NULL, &z->attrs, z->loc, out),
                                          rw->dst, n->recompute));
        for (int k = 0; k < c->npieces; k++) {
            const kiln_node *b = &f->g->nodes[c->box[k]];
            int32_t two[2] = {out[0], rw->map[c->piece[k]]};
            KILN_TRY(kiln_keep_recompute_mark(kiln_graph_add_node(rw->dst, KILN_OP_SLICE_ASSIGN, 2, two, &b->attrs, b->loc, out),
                                              rw->dst, n->recompute));
        }
    }
    rw->map[n->out[0]] = out[0];
    return KILN_OK;
}

KILN_PASS(join_slice_writes) {
    (void)opt;
    *out = NULL;
    const kiln_graph *g = in;
    int32_t nv = g->nvalues ? g->nvalues : 1, nn = g->nnodes ? g->nnodes : 1;
    finder f = {.g = g};
    int32_t *uses = kiln_graph_use_counts(g);
    bool *written = kiln_pass_written_buffers(g);
    bool *is_output = kiln_calloc((size_t)nv, sizeof(bool)), *gone = kiln_calloc((size_t)nn, sizeof(bool));
    bool *emits = kiln_calloc((size_t)nn, sizeof(bool));
    int32_t *user = kiln_malloc(sizeof(int32_t) * (size_t)nv);
    f.cv = kiln_calloc((size_t)nv, sizeof(canvas));
    kiln_status s = KILN_OK;
    if (!uses || !written || !is_output || !gone || !emits || !user || !f.cv) {
        s = kiln_error(KILN_ERR_MEMORY, "out of memory in join_slice_writes");
        goto done;
    }
    f.uses = uses, f.written = written, f.is_output = is_output;
    for (int32_t k = 0; k < g->noutputs; k++) is_output[g->outputs[k]] = true;
    for (int32_t v = 0; v < g->nvalues; v++) f.cv[v].npieces = -1, user[v] = -1;
    for (int32_t i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++) user[g->nodes[i].in[k]] = i;
    for (int32_t i = 0; i < g->nnodes && s == KILN_OK; i++)
        if (g->nodes[i].nout == 1) s = find(&f, i);
    int found = 0;
    for (int32_t i = g->nnodes - 1; i >= 0 && s == KILN_OK; i--) {
        const kiln_node *n = &g->nodes[i];
        if (gone[i] || n->nout != 1) continue;
        int32_t v = n->out[0];
        if (f.cv[v].npieces < 1 || f.cv[v].nadds < 1 || extended(&f, v, user)) continue;
        absorb(&f, v, gone);
        gone[i] = false, emits[i] = true, found++;
    }
    if (s != KILN_OK || !found) goto done;
    kiln_rewriter rw;
    if ((s = kiln_rewriter_begin(&rw, g)) != KILN_OK) goto done;
    for (int32_t i = 0; i < g->nnodes && s == KILN_OK; i++) {
        if (emits[i]) s = emit(&rw, &f, &f.cv[g->nodes[i].out[0]], i);
        else if (!gone[i]) s = kiln_rewriter_copy_node(&rw, i);
    }
    if (s == KILN_OK) s = kiln_rewriter_finish(&rw, out);
    else kiln_rewriter_abort(&rw);
done:
    if (f.cv)
        for (int32_t v = 0; v < g->nvalues; v++) free(f.cv[v].piece), free(f.cv[v].box);
    free(f.cv), free(uses), free(written), free(is_output), free(gone), free(emits), free(user);
    return s;
}
