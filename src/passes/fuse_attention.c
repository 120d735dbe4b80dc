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
 * masked) must have this chain as its only user and be no graph output. The probabilities P may
 * also be read by the backward the gradient rules recorded in a training graph — gP = gO @ vᵀ,
 * gV = Pᵀ @ gO, softmax_backward(gP, P), where(b, ·, 0) for a bool mask, the same scaling, gq =
 * gS @ k and g(kᵀ) = qᵀ @ gS (each transpose maybe composed with other permutes by simplify) —
 * which then becomes attention_backward, placed at the backward's first node (the forward's
 * result may then be unused: the fused op goes where the softmax was). Any other reader (a mask
 * that needs a gradient, probabilities returned) keeps the ops. No op between the first product
 * and the last node replaced may write q, k, v or the mask (the fused ops read them later than
 * the chain did), and the scale must be a value no op writes. Symbolic graphs are left alone. */
#include <math.h>

#include "../ops/attention_cost.h"
#include "passes_internal.h"

typedef struct {
    int32_t qk, scale, mask, softmax, pv, kt; /* forward nodes (-1: absent) */
    int32_t q, k, v, maskv;                   /* values (maskv -1: none) */
    double c;
    bool divide;
    /* the backward of a training graph (smb -1: none): gP = gO @ vᵀ, gV = Pᵀ @ gO (pt: Pᵀ),
     * gX = softmax_backward(gP, P), gS = gX scaled as the scores were (gs), gq = gS @ (kᵀ)ᵀ,
     * g(kᵀ) = qᵀ @ gS; gv, gq and gkt may be absent (that operand gets no gradient) */
    int32_t smb, gp, pt, gv, gw, gs, gq, gkt, go; /* gw: where(b, gX, 0), a bool mask's step */
    int32_t first_bwd, last_bwd;
    /* set when the forward is emitted: the rewritten graph's values */
    int32_t d_q, d_k, d_v, d_mask, d_out, d_lse;
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

/* The nodes reading value v (up to max; a node reading it twice counts twice); their count */
static int consumers_of(const kiln_graph *g, int32_t v, int32_t *out, int max) {
    int n = 0;
    for (int32_t i = 0; i < g->nnodes; i++)
        for (int k = 0; k < g->nodes[i].nin; k++)
            if (g->nodes[i].in[k] == v) {
                if (n < max) out[n] = i;
                n++;
            }
    return n;
}

/* Whether node i is a permute swapping the last two of its nd axes, of value from (-1: any) */
static bool swaps_last(const kiln_graph *g, int32_t i, int nd, int32_t from) {
    const kiln_node *n = &g->nodes[i];
    if (n->op != KILN_OP_PERMUTE || n->attrs.ni != nd || (from >= 0 && n->in[0] != from)) return false;
    for (int d = 0; d < nd; d++)
        if (n->attrs.i[KILN_A_PERMUTE_PERM + d] != (d < nd - 2 ? d : (d == nd - 2 ? nd - 1 : nd - 2))) return false;
    return true;
}

/* Value v as (base, perm): the input and permutation of the permute making it, else itself */
static int32_t as_permute(const kiln_graph *g, int32_t v, int nd, int64_t *perm) {
    int32_t n = producer(g, v);
    bool permuted = n >= 0 && g->nodes[n].op == KILN_OP_PERMUTE && g->nodes[n].attrs.ni == nd;
    for (int d = 0; d < nd; d++) perm[d] = permuted ? g->nodes[n].attrs.i[KILN_A_PERMUTE_PERM + d] : d;
    return permuted ? g->nodes[n].in[0] : v;
}

/* Whether value t is x with its last two axes swapped, as views of one base (simplify composes
 * a gradient rule's transpose with the permutes before it, or cancels it) */
static bool is_swap_of(const kiln_graph *g, int32_t t, int32_t x, int nd) {
    int64_t sx[KILN_MAX_DIMS], st[KILN_MAX_DIMS];
    if (as_permute(g, x, nd, sx) != as_permute(g, t, nd, st)) return false;
    for (int d = 0; d < nd; d++)
        if (st[d] != sx[d < nd - 2 ? d : (d == nd - 2 ? nd - 1 : nd - 2)]) return false;
    return true;
}

/* Matches the backward of pattern p's forward: P's other readers are softmax_backward and maybe
 * the permute giving Pᵀ for v's gradient, each intermediate read only by the chain. cons: P's
 * readers. */
static bool match_backward(const kiln_graph *g, const int32_t *uses, const int32_t *consumer, const bool *written,
                           const int32_t *root, pattern *p, const int32_t *cons, int nc) {
    int32_t P = g->nodes[p->softmax].out[0];
    int nd = g->values[P].meta.ndim;
    kiln_meta O = g->values[p->q].meta; /* the forward's result: (..., Lq, Dv) */
    O.shape[nd - 1] = g->values[p->v].meta.shape[nd - 1];
    for (int k = 0; k < nc; k++) {
        const kiln_node *n = &g->nodes[cons[k]];
        if (cons[k] == p->pv) continue;
        if (n->op == KILN_OP_SOFTMAX_BACKWARD && p->smb < 0 && n->in[1] == P && n->in[0] != P &&
            n->attrs.ni > KILN_A_SOFTMAX_AXIS && n->attrs.i[KILN_A_SOFTMAX_AXIS] == nd - 1)
            p->smb = cons[k];
        else if (p->pt < 0 && swaps_last(g, cons[k], nd, P))
            p->pt = cons[k];
        else
            return false;
    }
    if (p->smb < 0) return false;
    /* gP = gO @ vᵀ */
    int32_t gP = g->nodes[p->smb].in[0], gpn = producer(g, gP);
    if (gpn < 0 || uses[gP] != 1 || g->nodes[gpn].op != KILN_OP_MATMUL) return false;
    if (!is_swap_of(g, g->nodes[gpn].in[1], p->v, nd)) return false;
    p->gp = gpn, p->go = g->nodes[gpn].in[0];
    if (!kiln_meta_equal(&g->values[p->go].meta, &O)) return false;
    /* gV = Pᵀ @ gO */
    if (p->pt >= 0) {
        int32_t Pt = g->nodes[p->pt].out[0], m = consumer[Pt];
        if (uses[Pt] != 1 || m < 0 || g->nodes[m].op != KILN_OP_MATMUL || g->nodes[m].in[0] != Pt ||
            g->nodes[m].in[1] != p->go)
            return false;
        p->gv = m;
    }
    /* a bool mask's where: zeros where the mask hides a key (where softmax_backward's are zero) */
    int32_t gX = g->nodes[p->smb].out[0];
    if (p->mask >= 0 && g->nodes[p->mask].op == KILN_OP_WHERE) {
        int32_t m = consumer[gX];
        double zero = 1;
        if (uses[gX] != 1 || m < 0 || g->nodes[m].op != KILN_OP_WHERE || g->nodes[m].in[0] != p->maskv ||
            g->nodes[m].in[1] != gX || !scalar_constant(g, written, root, g->nodes[m].in[2], &zero) || zero != 0 ||
            !kiln_meta_equal(&g->values[g->nodes[m].out[0]].meta, &g->values[gX].meta))
            return false;
        p->gw = m, gX = g->nodes[m].out[0];
    }
    /* gS: gX scaled by the forward's constant */
    int32_t gS = gX;
    if (p->scale >= 0) {
        int32_t m = consumer[gX];
        if (uses[gX] != 1 || m < 0) return false;
        const kiln_node *n = &g->nodes[m];
        double c2 = 0;
        bool ok = p->divide ? n->op == KILN_OP_DIV && n->in[0] == gX && scalar_constant(g, written, root, n->in[1], &c2)
                            : n->op == KILN_OP_MUL && n->in[0] != n->in[1] &&
                                  scalar_constant(g, written, root, n->in[n->in[0] == gX ? 1 : 0], &c2);
        if (!ok || c2 != p->c || !kiln_meta_equal(&g->values[n->out[0]].meta, &g->values[gX].meta)) return false;
        p->gs = m, gS = n->out[0];
    }
    /* gq = gS @ (kᵀ)ᵀ and g(kᵀ) = qᵀ @ gS */
    int32_t gcons[2], kt = g->nodes[p->kt].out[0];
    int ng = consumers_of(g, gS, gcons, 2);
    if (ng < 1 || ng > 2 || ng != uses[gS]) return false;
    for (int k = 0; k < ng; k++) {
        const kiln_node *n = &g->nodes[gcons[k]];
        if (n->op != KILN_OP_MATMUL || n->in[0] == n->in[1]) return false;
        int32_t other = n->in[n->in[0] == gS ? 1 : 0];
        if (n->in[0] == gS && p->gq < 0 && is_swap_of(g, other, kt, nd)) p->gq = gcons[k];
        else if (n->in[1] == gS && p->gkt < 0 && is_swap_of(g, other, p->q, nd)) p->gkt = gcons[k];
        else return false;
    }
    int32_t bwd[8] = {p->smb, p->gp, p->pt, p->gv, p->gw, p->gs, p->gq, p->gkt};
    p->first_bwd = INT32_MAX, p->last_bwd = -1;
    for (int k = 0; k < 8; k++)
        if (bwd[k] >= 0) {
            p->first_bwd = bwd[k] < p->first_bwd ? bwd[k] : p->first_bwd;
            p->last_bwd = bwd[k] > p->last_bwd ? bwd[k] : p->last_bwd;
        }
    int32_t gon = producer(g, p->go);
    return p->first_bwd > (p->pv >= 0 ? p->pv : p->softmax) && gon < p->first_bwd;
}

/* Whether a node after the first product and up to node `end` may change what the fused ops
 * read (q, k's source, v, the mask): it writes one of their buffers, or writes anything or has
 * an effect of its own. */
static bool written_between(const kiln_graph *g, const int32_t *root, const pattern *p, int32_t end) {
    int32_t vals[4] = {p->q, p->k, p->v, p->maskv};
    for (int32_t i = p->qk + 1; i <= end; i++) {
        const kiln_node *n = &g->nodes[i];
        if (kiln_op_table[n->op].flags & (KILN_OPF_WRITES_ANY | KILN_OPF_EFFECT)) return true;
        for (int k = 0; k < n->nin; k++)
            for (int w = 0; w < 4; w++)
                if (vals[w] >= 0 && kiln_node_writes_buffer(n, k) && root[n->in[k]] == root[vals[w]]) return true;
    }
    return false;
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
    /* the product with v (and, in a training graph, the backward's readers of P) */
    int32_t P = s->out[0], cons[3];
    int nc = consumers_of(g, P, cons, 3);
    if (nc > 3 || nc != uses[P]) return false; /* a graph output, or other readers */
    for (int k = 0; k < nc && p->pv < 0; k++)
        if (g->nodes[cons[k]].op == KILN_OP_MATMUL && g->nodes[cons[k]].in[0] == P && g->nodes[cons[k]].in[1] != P)
            p->pv = cons[k];
    if (p->pv >= 0) p->v = g->nodes[p->pv].in[1];
    else /* the forward's result unused (a gradient alone): v from the backward's gO @ vᵀ */
        for (int k = 0; k < nc && p->v < 0; k++) {
            const kiln_node *b = &g->nodes[cons[k]];
            int32_t gpn = b->op == KILN_OP_SOFTMAX_BACKWARD && b->in[1] == P ? producer(g, b->in[0]) : -1;
            int32_t vtn = gpn >= 0 && g->nodes[gpn].op == KILN_OP_MATMUL ? producer(g, g->nodes[gpn].in[1]) : -1;
            if (vtn >= 0 && swaps_last(g, vtn, nd, -1) && producer(g, g->nodes[vtn].in[0]) < sm)
                p->v = g->nodes[vtn].in[0]; /* (v a permute itself: its swap composed by simplify, not found) */
        }
    if (p->v < 0) return false;
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
    if (k->shape[nd - 2] != v->shape[nd - 2] || k->shape[nd - 1] != q->shape[nd - 1] || p->c == 0 || !isfinite(p->c))
        return false;
    return (nc == 1 && p->pv >= 0) || match_backward(g, uses, consumer, written, root, p, cons, nc);
}

static kiln_status emit(kiln_rewriter *rw, pattern *p) {
    const kiln_graph *g = rw->src;
    int32_t at = p->pv >= 0 ? p->pv : p->softmax; /* where the fused op goes */
    const kiln_node *last = &g->nodes[at];
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
    if (p->pv >= 0) rw->map[last->out[0]] = outs[0];
    p->d_q = in[0], p->d_k = in[1], p->d_v = in[2], p->d_mask = nin == 4 ? in[3] : -1;
    p->d_out = outs[0], p->d_lse = outs[1];
    return kiln_rewriter_stands_for(rw, at);
}

/* attention_backward at the place of the backward's first node; its gradients stand for the
 * chain's (the one of kᵀ swapped back from k's). */
static kiln_status emit_backward(kiln_rewriter *rw, pattern *p) {
    const kiln_graph *g = rw->src;
    const kiln_node *first = &g->nodes[p->first_bwd];
    int nd = g->values[p->q].meta.ndim;
    int32_t in[8] = {rw->map[p->go], p->d_q, p->d_k, p->d_v, p->d_out, p->d_lse, -1, -1};
    int nin = 6;
    if (in[0] < 0) return kiln_error(KILN_ERR_VALUE, "fuse_attention: an operand is not defined before its node");
    if (p->d_mask >= 0) { /* the mask follows glse: zeros, lse gets no gradient here */
        const kiln_meta *lm = &rw->dst->values[p->d_lse].meta;
        kiln_attrs fa = {0};
        kiln_attrs_push_int(&fa, lm->dtype);
        kiln_attrs_push_int(&fa, lm->ndim);
        for (int d = 0; d < lm->ndim; d++) kiln_attrs_push_int(&fa, lm->shape[d]);
        kiln_attrs_push_float(&fa, 0.0);
        KILN_TRY(kiln_graph_add_node(rw->dst, KILN_OP_FULL, 0, NULL, &fa, first->loc, &in[6]));
        in[7] = p->d_mask, nin = 8;
    }
    kiln_attrs a = {0};
    kiln_attrs_push_float(&a, p->divide ? 1.0 / p->c : p->c);
    kiln_attrs_push_int(&a, 0);
    int32_t outs[3];
    KILN_TRY(kiln_keep_recompute_mark(
        kiln_graph_add_node(rw->dst, KILN_OP_ATTENTION_BACKWARD, nin, in, &a, first->loc, outs), rw->dst,
        first->recompute));
    if (p->gq >= 0) rw->map[g->nodes[p->gq].out[0]] = outs[0];
    if (p->gv >= 0) rw->map[g->nodes[p->gv].out[0]] = outs[2];
    if (p->gkt >= 0) {
        kiln_attrs pa = {0};
        for (int d = 0; d < nd; d++) kiln_attrs_push_int(&pa, d < nd - 2 ? d : (d == nd - 2 ? nd - 1 : nd - 2));
        KILN_TRY(kiln_graph_add_node(rw->dst, KILN_OP_PERMUTE, 1, &outs[1], &pa, first->loc,
                                     &rw->map[g->nodes[p->gkt].out[0]]));
    }
    return KILN_OK;
}

static bool chosen(const kiln_graph *g, const pattern *p) {
    const kiln_meta *q = &g->values[p->q].meta, *kt = &g->values[g->nodes[p->kt].out[0]].meta,
                    *v = &g->values[p->v].meta;
    int nd = q->ndim;
    kiln_attention_case c = {kiln_shape_numel(nd - 2, q->shape), q->shape[nd - 2], kt->shape[nd - 1], q->shape[nd - 1],
                             v->shape[nd - 1], q->dtype, false, p->maskv >= 0, false, p->smb >= 0};
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
    bool *written = kiln_calloc((size_t)(nv ? nv : 1), sizeof(bool));
    /* per node: -1 copy, -2 drop, k >= 0 pattern k's forward, -3 - k its backward */
    int32_t *role = kiln_malloc(sizeof(int32_t) * (size_t)(nn ? nn : 1));
    pattern *pats = kiln_malloc(sizeof(pattern) * (size_t)(nn ? nn : 1));
    kiln_status s = KILN_OK;
    if (!uses || !consumer || !root || !written || !role || !pats) {
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
        role[i] = -1;
    }
    int npats = 0;
    for (int32_t i = 0; i < nn; i++) {
        pattern p;
        if (g->nodes[i].op != KILN_OP_SOFTMAX || !match(g, uses, consumer, written, root, i, &p)) continue;
        /* a write in between: the fused ops would read q, k, v and the mask later than the chain */
        if (written_between(g, root, &p, p.smb >= 0 ? p.last_bwd : p.pv)) continue;
        if (!chosen(g, &p)) continue;
        int32_t nodes[13] = {p.qk, p.scale, p.mask, p.softmax, p.pv, p.smb, p.gp, p.pt, p.gv, p.gw, p.gs, p.gq, p.gkt};
        for (int k = 0; k < 13; k++)
            if (nodes[k] >= 0) role[nodes[k]] = -2;
        if (p.smb >= 0) role[p.first_bwd] = -3 - npats;
        pats[npats] = p;
        role[p.pv >= 0 ? p.pv : p.softmax] = npats++;
    }
    if (!npats) goto done;
    kiln_rewriter rw;
    if ((s = kiln_rewriter_begin(&rw, g)) != KILN_OK) goto done;
    for (int32_t i = 0; i < nn && s == KILN_OK; i++) {
        if (role[i] >= 0) s = emit(&rw, &pats[role[i]]);
        else if (role[i] <= -3) s = emit_backward(&rw, &pats[-3 - role[i]]);
        else if (role[i] == -1) s = kiln_rewriter_copy_node(&rw, i);
    }
    if (s == KILN_OK) s = kiln_rewriter_finish(&rw, out);
    else kiln_rewriter_abort(&rw);
done:
    free(uses), free(consumer), free(root), free(written), free(role), free(pats);
    return s;
}
