/* Attention written as ops becomes the fused attention op (src/ops/attention.c) where the cost
 * model (src/ops/attention_cost.c) says it pays:
 *
 *   matmul(q, kᵀ = permute(x))  [* c | c * | / c]  [+ mask | where(b, ·, -inf)]
 *     -> softmax(last axis) -> matmul(·, v)
 *
 * where k, what the op reads, is kᵀ with its last two axes swapped: x itself when the permute
 * swaps x's last two axes (k.swapaxes(-1, -2), transpose), else a permute of x (a head split's
 * permute composed with the swap, as nn.MultiheadAttention's graph has it after simplify);
 * c a constant scalar, q, k, v of one float dtype and at least 3 axes with equal leading
 * axes (the reshapes that fold grouped query heads onto their kv head give exactly that: the
 * folded queries are rows of one head), the mask broadcasting to the scores without widening them
 * (float: the scores' dtype; bool b: true keeps the key). Every intermediate (scores, scaled,
 * masked, probabilities) must have this chain as its only user and be no graph output, so a
 * training graph whose backward reads the probabilities keeps the unfused ops; no op with effects
 * may run between the first product and the last (the fused op reads q, k, v and the mask at
 * the last one's place), and the scale must be a value no op writes. Symbolic graphs are left
 * alone. */
#include <math.h>

#include "../ops/attention_cost.h"
#include "passes_internal.h"

typedef struct {
    int32_t qk, scale, mask, softmax, pv, kt; /* nodes (-1: absent) */
    int32_t q, k, v, maskv;               /* values (maskv -1: none) */
    double c;
    bool divide;
} pattern;

/* The producing node of value v (-1: an input or capture) */
static int32_t producer(const kiln_graph *g, int32_t v) {
    return g->values[v].kind == KILN_VALUE_NODE ? g->values[v].node : -1;
}

/* Whether value v is one constant scalar no op writes (a constant capture or a full node, maybe
 * reshaped or expanded), giving it in *c. */
static bool scalar_constant(const kiln_graph *g, const bool *written, const int32_t *root, int32_t v, double *c) {
    for (int depth = 0; depth < 8; depth++) {
        const kiln_value *val = &g->values[v];
        if (written[root[v]]) return false;
        if (val->kind == KILN_VALUE_CAPTURED) {
            if (!val->constant || val->bound->numel < 1) return false;
            *c = kiln_tensor_get_double(val->bound, 0);
            for (int64_t e = 1; e < val->bound->numel && e < 64; e++)
                if (kiln_tensor_get_double(val->bound, e) != *c) return false;
            return val->bound->numel < 64;
        }
        if (val->kind != KILN_VALUE_NODE) return false;
        const kiln_node *n = &g->nodes[val->node];
        if (n->op == KILN_OP_FULL) {
            if (n->attrs.nf <= KILN_A_FULL_VALUE) return false;
            *c = n->attrs.f[KILN_A_FULL_VALUE];
            return true;
        }
        if (n->op != KILN_OP_RESHAPE && n->op != KILN_OP_EXPAND) return false;
        v = n->in[0];
    }
    return false;
}

/* The permutation that gives k from the input of kᵀ's permute node: its own with the last two
 * axes swapped (sets perm; returns whether it is the identity) */
static bool k_permutation(const kiln_node *kt, int nd, int64_t *perm) {
    bool identity = true;
    for (int d = 0; d < nd; d++) {
        perm[d] = kt->attrs.i[KILN_A_PERMUTE_PERM + (d < nd - 2 ? d : (d == nd - 2 ? nd - 1 : nd - 2))];
        identity = identity && perm[d] == d;
    }
    return identity;
}

/* Whether value v has one use (no other node, and no graph output, reads it) */
static bool single_use(const kiln_graph *g, const int32_t *uses, int32_t v) {
    (void)g;
    return uses[v] == 1;
}

/* Matches the chain ending at softmax node sm; fills p. */
static bool match(const kiln_graph *g, const int32_t *uses, const int32_t *consumer, const bool *written,
                  const int32_t *root, int32_t sm, pattern *p) {
    const kiln_node *s = &g->nodes[sm];
    const kiln_meta *sm_meta = &g->values[s->out[0]].meta;
    int nd = sm_meta->ndim;
    if (nd < 3 || s->attrs.ni <= KILN_A_SOFTMAX_AXIS || s->attrs.i[KILN_A_SOFTMAX_AXIS] != nd - 1) return false;
    if (!kiln_dtype_is_float(sm_meta->dtype)) return false;
    memset(p, -1, sizeof *p);
    p->c = 1.0, p->divide = false, p->softmax = sm;
    /* the product with v */
    int32_t pv = consumer[s->out[0]];
    if (pv < 0 || !single_use(g, uses, s->out[0]) || g->nodes[pv].op != KILN_OP_MATMUL ||
        g->nodes[pv].in[0] != s->out[0])
        return false;
    p->pv = pv, p->v = g->nodes[pv].in[1];
    /* the mask */
    int32_t x = s->in[0], n = producer(g, x);
    if (n < 0 || !single_use(g, uses, x)) return false;
    if (g->nodes[n].op == KILN_OP_ADD || g->nodes[n].op == KILN_OP_WHERE) {
        const kiln_node *m = &g->nodes[n];
        int32_t scores = -1, mask = -1;
        if (m->op == KILN_OP_ADD) {
            for (int side = 0; side < 2 && scores < 0; side++) {
                int32_t a = m->in[side], pa = producer(g, a);
                if (pa >= 0 && (g->nodes[pa].op == KILN_OP_MATMUL || g->nodes[pa].op == KILN_OP_MUL ||
                                g->nodes[pa].op == KILN_OP_DIV))
                    scores = a, mask = m->in[1 - side];
            }
            if (scores < 0 || g->values[mask].meta.dtype != sm_meta->dtype) return false;
        } else {
            double fill;
            if (g->values[m->in[0]].meta.dtype != KILN_DTYPE_BOOL ||
                !scalar_constant(g, written, root, m->in[2], &fill) || fill != -INFINITY)
                return false;
            scores = m->in[1], mask = m->in[0];
        }
        if (!kiln_meta_equal(&g->values[scores].meta, sm_meta) || !kiln_meta_equal(&g->values[m->out[0]].meta, sm_meta))
            return false;
        if (g->values[mask].meta.ndim > nd) return false;
        p->mask = n, p->maskv = mask;
        x = scores, n = producer(g, x);
        if (n < 0 || !single_use(g, uses, x)) return false;
    }
    /* the scale */
    if (g->nodes[n].op == KILN_OP_MUL || g->nodes[n].op == KILN_OP_DIV) {
        const kiln_node *m = &g->nodes[n];
        int32_t scores = -1;
        for (int side = 0; side < 2 && scores < 0; side++) {
            if (m->op == KILN_OP_DIV && side == 1) break;
            int32_t a = m->in[side], pa = producer(g, a);
            if (pa >= 0 && g->nodes[pa].op == KILN_OP_MATMUL &&
                scalar_constant(g, written, root, m->in[1 - side], &p->c))
                scores = a;
        }
        if (scores < 0 || !kiln_meta_equal(&g->values[m->out[0]].meta, &g->values[scores].meta)) return false;
        if (m->op == KILN_OP_DIV) p->divide = true;
        p->scale = n;
        x = scores, n = producer(g, x);
        if (!single_use(g, uses, x)) return false;
    }
    /* q @ kᵀ */
    if (n < 0 || g->nodes[n].op != KILN_OP_MATMUL) return false;
    int32_t kt = g->nodes[n].in[1], ktn = producer(g, kt);
    if (ktn < 0 || g->nodes[ktn].op != KILN_OP_PERMUTE || g->nodes[ktn].attrs.ni != nd) return false;
    p->qk = n, p->q = g->nodes[n].in[0], p->kt = ktn, p->k = g->nodes[ktn].in[0];
    const kiln_meta *q = &g->values[p->q].meta, *kt_meta = &g->values[kt].meta, *v = &g->values[p->v].meta;
    kiln_meta k_meta = *kt_meta; /* k as attention reads it: kᵀ with its last two axes swapped */
    k_meta.shape[nd - 2] = kt_meta->shape[nd - 1], k_meta.shape[nd - 1] = kt_meta->shape[nd - 2];
    const kiln_meta *k = &k_meta;
    if (q->ndim != nd || k->ndim != nd || v->ndim != nd || q->dtype != sm_meta->dtype || k->dtype != q->dtype ||
        v->dtype != q->dtype)
        return false;
    for (int d = 0; d < nd - 2; d++)
        if (k->shape[d] != q->shape[d] || v->shape[d] != q->shape[d]) return false;
    return k->shape[nd - 2] == v->shape[nd - 2] && k->shape[nd - 1] == q->shape[nd - 1] && p->c != 0 &&
           isfinite(p->c);
}

static kiln_status emit(kiln_rewriter *rw, const pattern *p) {
    const kiln_graph *g = rw->src;
    const kiln_node *last = &g->nodes[p->pv];
    int nd = g->values[p->q].meta.ndim;
    int32_t in[4] = {rw->map[p->q], rw->map[p->k], rw->map[p->v], -1};
    int nin = 3;
    int64_t perm[KILN_MAX_DIMS];
    if (!k_permutation(&g->nodes[p->kt], nd, perm)) { /* k = kᵀ's input permuted (a view) */
        kiln_attrs pa = {0};
        for (int d = 0; d < nd; d++) kiln_attrs_push_int(&pa, perm[d]);
        if (in[1] < 0) return kiln_error(KILN_ERR_VALUE, "fuse_attention: an operand is not defined before its node");
        KILN_TRY(kiln_graph_add_node(rw->dst, KILN_OP_PERMUTE, 1, &in[1], &pa, last->loc, &in[1]));
    }
    if (p->maskv >= 0) {
        in[3] = rw->map[p->maskv];
        const kiln_meta *mm = &g->values[p->maskv].meta;
        if (mm->ndim < nd) { /* leading axes of 1, as the op takes it */
            kiln_attrs ra = {0};
            for (int d = 0, lead = nd - mm->ndim; d < nd; d++)
                kiln_attrs_push_int(&ra, d < lead ? 1 : mm->shape[d - lead]);
            KILN_TRY(kiln_graph_add_node(rw->dst, KILN_OP_RESHAPE, 1, &in[3], &ra, last->loc, &in[3]));
        }
        nin = 4;
    }
    for (int k = 0; k < nin; k++)
        if (in[k] < 0) return kiln_error(KILN_ERR_VALUE, "fuse_attention: an operand is not defined before its node");
    kiln_attrs a = {0};
    kiln_attrs_push_float(&a, p->divide ? 1.0 / p->c : p->c);
    kiln_attrs_push_int(&a, 0);
    int32_t outs[2];
    KILN_TRY(kiln_keep_recompute_mark(kiln_graph_add_node(rw->dst, KILN_OP_ATTENTION, nin, in, &a, last->loc, outs),
                                      rw->dst, last->recompute));
    rw->map[last->out[0]] = outs[0];
    return kiln_rewriter_stands_for(rw, p->pv);
}

static bool chosen(const kiln_graph *g, const pattern *p) {
    const kiln_meta *q = &g->values[p->q].meta, *kt = &g->values[g->nodes[p->kt].out[0]].meta,
                    *v = &g->values[p->v].meta;
    int nd = q->ndim;
    kiln_attention_case c = {kiln_shape_numel(nd - 2, q->shape), q->shape[nd - 2], kt->shape[nd - 1], q->shape[nd - 1],
                             v->shape[nd - 1], q->dtype, false, p->maskv >= 0, false, false};
    kiln_attention_choice out;
    kiln_attention_choose(&c, &out);
    return out.fused;
}

KILN_PASS(fuse_attention) {
    (void)opt;
    const kiln_graph *g = in;
    *out = NULL;
    if (kiln_graph_is_symbolic(g)) return KILN_OK;
    bool any = false;
    for (int32_t i = 0; i < g->nnodes && !any; i++) any = g->nodes[i].op == KILN_OP_SOFTMAX;
    if (!any) return KILN_OK;
    int32_t nn = g->nnodes, nv = g->nvalues;
    int32_t *uses = kiln_graph_use_counts(g);
    int32_t *consumer = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    int32_t *root = kiln_malloc(sizeof(int32_t) * (size_t)(nv ? nv : 1));
    int32_t *effects_before = kiln_calloc((size_t)nn + 1, sizeof(int32_t));
    bool *written = kiln_calloc((size_t)(nv ? nv : 1), sizeof(bool));
    int32_t *role = kiln_malloc(sizeof(int32_t) * (size_t)(nn ? nn : 1)); /* -1 copy, -2 drop, else the pattern */
    pattern *pats = kiln_malloc(sizeof(pattern) * (size_t)(nn ? nn : 1));
    kiln_status s = KILN_OK;
    if (!uses || !consumer || !root || !effects_before || !written || !role || !pats) {
        s = kiln_error(KILN_ERR_MEMORY, "out of memory in fuse_attention");
        goto done;
    }
    kiln_value_roots(g, root);
    for (int32_t v = 0; v < nv; v++) consumer[v] = -1;
    for (int32_t i = 0; i < nn; i++) {
        const kiln_node *n = &g->nodes[i];
        for (int k = 0; k < n->nin; k++) {
            consumer[n->in[k]] = i;
            if (kiln_node_writes_buffer(n, k)) written[root[n->in[k]]] = true;
        }
        effects_before[i + 1] = effects_before[i] + kiln_node_has_effects(n);
        role[i] = -1;
    }
    int npats = 0;
    for (int32_t i = 0; i < nn; i++) {
        pattern p;
        if (g->nodes[i].op != KILN_OP_SOFTMAX || !match(g, uses, consumer, written, root, i, &p)) continue;
        if (effects_before[p.pv] != effects_before[p.qk + 1]) continue; /* an effect in between */
        if (!chosen(g, &p)) continue;
        int32_t nodes[4] = {p.qk, p.scale, p.mask, p.softmax};
        for (int k = 0; k < 4; k++)
            if (nodes[k] >= 0) role[nodes[k]] = -2;
        pats[npats] = p;
        role[p.pv] = npats++;
    }
    if (!npats) goto done;
    kiln_rewriter rw;
    if ((s = kiln_rewriter_begin(&rw, g)) != KILN_OK) goto done;
    for (int32_t i = 0; i < nn && s == KILN_OK; i++) {
        if (role[i] >= 0) s = emit(&rw, &pats[role[i]]);
        else if (role[i] == -1) s = kiln_rewriter_copy_node(&rw, i);
    }
    if (s == KILN_OK) s = kiln_rewriter_finish(&rw, out);
    else kiln_rewriter_abort(&rw);
done:
    free(uses), free(consumer), free(root), free(effects_before), free(written), free(role), free(pats);
    return s;
}
