/* attention's rules written with differentiable ops: the forward-mode rule of attention, and the
 * reverse and forward-mode rules of attention_backward, so gradients of gradients (a gradient
 * penalty on a transformer, MAML, Hessians, jvp of a gradient) go through the fused op, with masks,
 * the causal flag and grouped queries. They make each head's whole score matrix (Lq x Lk), which
 * the fused kernels never do: the price of those transforms, paid only there.
 *
 * Per query head (K and V's heads repeated for grouped queries, what flows back to them summed over
 * each group), with S = s Q Kᵀ + mask (a bool mask as 0 / -inf; causal: -inf above the diagonal)
 * and P = exp(S - lse) where S > -inf, else 0 (a row masked whole gives no NaN):
 *   attention:           out = P V,  lse = log rowsum(exp S)
 *   attention_backward:  T = gO Vᵀ - rowsum(gO ∘ O) + glse,  dS = P ∘ T,
 *                        gQ = s dS K,  gK = s dSᵀ Q,  gV = Pᵀ gO
 * attention_backward is that function of its inputs as given: O and lse are inputs of their own
 * (as the fast kernel reads them), so the rules give their partial derivatives and attention's own
 * rules carry them on to Q, K and V.
 *
 * Forward mode of attention, tangents tQ, tK, tV (the mask has none):
 *   tS = s (tQ Kᵀ + Q tKᵀ),  tlse = rowsum(P ∘ tS),  tP = P ∘ (tS - tlse),  tout = tP V + P tV
 * Reverse of attention_backward, cotangents (Aq, Ak, Av) of (gQ, gK, gV):
 *   G = s (Aq Kᵀ + Q Akᵀ),  H = G ∘ P,  R = rowsum(H),  E = P ∘ (G ∘ T + gO Avᵀ)
 *   d gO = P Av + H V - R ∘ O,  d O = -R ∘ gO,  d glse = R,  d lse = -rowsum(E),
 *   d Q = s (dS Ak + E K),  d K = s (dSᵀ Aq + Eᵀ Q),  d V = Hᵀ gO
 * Forward mode of attention_backward, tangents t* of its inputs:
 *   tS as above,  tP = P ∘ (tS - tlse),  tT = tgO Vᵀ + gO tVᵀ - rowsum(tgO ∘ O + gO ∘ tO) + tglse,
 *   tdS = tP ∘ T + P ∘ tT,  tgQ = s (tdS K + dS tK),  tgK = s (tdSᵀ Q + dSᵀ tQ),  tgV = tPᵀ gO + Pᵀ tgO
 * Everything is computed in lse's dtype (float32 for 16-bit inputs, as the kernels compute). */
#include <math.h>

#include "grad_scope.h"

#define KILN_OP(...)
#define KILN_JVP(ENUM, rule) kiln_status kiln_jvp_##rule(const kiln_grad_ctx *, kiln_tensor *const *, kiln_tensor **);
#include "ops.def"
#undef KILN_JVP
#undef KILN_OP

#define JVP(name)                                                                           \
    kiln_status kiln_jvp_##name(const kiln_grad_ctx *ctx, kiln_tensor *const *tin, kiln_tensor **tout)

/* ---- small op helpers (NULL propagates; see grad_scope.h) ---------------------------------- */

static kiln_tensor *mm(grad_scope *sc, kiln_tensor *a, kiln_tensor *b) { return bin(sc, KILN_OP_MATMUL, a, b); }

static kiln_tensor *mul(grad_scope *sc, kiln_tensor *a, kiln_tensor *b) { return bin(sc, KILN_OP_MUL, a, b); }

static kiln_tensor *tr(grad_scope *sc, kiln_tensor *a) {
    if (!a || sc->status != KILN_OK) return NULL;
    kiln_tensor *t = NULL;
    kiln_status s = kiln_emit_transpose_last(a, &t);
    return keep(sc, s, t);
}

/* the sum over the last axis, kept as size 1 or dropped */
static kiln_tensor *row_sum(grad_scope *sc, kiln_tensor *a, bool kept) {
    if (!a || sc->status != KILN_OK) return NULL;
    kiln_tensor *t = NULL;
    kiln_status s = kiln_emit_reduce(KILN_OP_SUM, a, 1ull << (a->meta.ndim - 1), kept, &t);
    return keep(sc, s, t);
}

static kiln_tensor *reshaped(grad_scope *sc, kiln_tensor *a, int nd, const int64_t *shape) {
    if (!a || sc->status != KILN_OK) return NULL;
    if (nd > KILN_MAX_DIMS) {
        sc->status = kiln_error(KILN_ERR_VALUE, "attention: %d dimensions with grouped heads are too many", nd - 1);
        return NULL;
    }
    kiln_tensor *t = NULL;
    kiln_status s = kiln_emit_reshape(a, nd, shape, &t);
    return keep(sc, s, t);
}

/* a (..., L) as (..., L, 1) */
static kiln_tensor *column(grad_scope *sc, kiln_tensor *a) {
    if (!a || sc->status != KILN_OK) return NULL;
    int64_t shape[KILN_MAX_DIMS + 1];
    int nd = a->meta.ndim;
    for (int d = 0; d < nd; d++) shape[d] = a->meta.shape[d];
    shape[nd] = 1;
    return reshaped(sc, a, nd + 1, shape);
}

static kiln_tensor *cast_to(grad_scope *sc, kiln_tensor *a, kiln_dtype dtype) {
    if (!a || sc->status != KILN_OK) return NULL;
    if (a->meta.dtype == dtype) return a;
    kiln_tensor *t = NULL;
    kiln_status s = kiln_emit_cast(a, dtype, &t);
    return keep(sc, s, t);
}

/* k (..., Hk, L, E) with each head repeated hq / Hk times: (..., hq, L, E) */
static kiln_tensor *repeat_heads(grad_scope *sc, kiln_tensor *k, int64_t hq) {
    if (!k || sc->status != KILN_OK) return NULL;
    const kiln_meta *m = &k->meta;
    int nd = m->ndim;
    int64_t hk = m->shape[nd - 3];
    if (hk == hq) return k;
    int64_t s5[KILN_MAX_DIMS + 1], e5[KILN_MAX_DIMS + 1], fin[KILN_MAX_DIMS];
    for (int d = 0; d < nd - 3; d++) s5[d] = e5[d] = fin[d] = m->shape[d];
    s5[nd - 3] = e5[nd - 3] = hk, s5[nd - 2] = 1, e5[nd - 2] = hq / hk;
    s5[nd - 1] = e5[nd - 1] = m->shape[nd - 2], s5[nd] = e5[nd] = m->shape[nd - 1];
    fin[nd - 3] = hq, fin[nd - 2] = m->shape[nd - 2], fin[nd - 1] = m->shape[nd - 1];
    kiln_tensor *a = reshaped(sc, k, nd + 1, s5), *b = NULL;
    if (a && sc->status == KILN_OK) sc->status = kiln_emit_expand(a, nd + 1, e5, &b), keep(sc, sc->status, b);
    return reshaped(sc, b, nd, fin);
}

/* t (..., Hq, L, E) summed over each group of Hq / hk query heads: (..., hk, L, E) */
static kiln_tensor *group_sum(grad_scope *sc, kiln_tensor *t, int64_t hk) {
    if (!t || sc->status != KILN_OK) return NULL;
    const kiln_meta *m = &t->meta;
    int nd = m->ndim;
    int64_t hq = m->shape[nd - 3];
    if (hq == hk) return t;
    int64_t s5[KILN_MAX_DIMS + 1], fin[KILN_MAX_DIMS];
    for (int d = 0; d < nd - 3; d++) s5[d] = fin[d] = m->shape[d];
    s5[nd - 3] = hk, s5[nd - 2] = hq / hk, s5[nd - 1] = m->shape[nd - 2], s5[nd] = m->shape[nd - 1];
    fin[nd - 3] = hk, fin[nd - 2] = m->shape[nd - 2], fin[nd - 1] = m->shape[nd - 1];
    kiln_tensor *a = reshaped(sc, t, nd + 1, s5), *b = NULL;
    if (a && sc->status == KILN_OK)
        sc->status = kiln_emit_reduce(KILN_OP_SUM, a, 1ull << (nd - 2), false, &b), keep(sc, sc->status, b);
    return reshaped(sc, b, nd, fin);
}

static kiln_tensor *arange(grad_scope *sc, int64_t n) {
    if (sc->status != KILN_OK) return NULL;
    kiln_attrs a;
    kiln_attrs_clear(&a);
    kiln_attrs_push_int(&a, KILN_DTYPE_INT64);
    kiln_attrs_push_int(&a, n);
    kiln_attrs_push_float(&a, 0.0);
    kiln_attrs_push_float(&a, 1.0);
    kiln_tensor *t = NULL;
    kiln_status s = kiln_apply(KILN_OP_ARANGE, 0, NULL, &a, &t);
    return keep(sc, s, t);
}

/* ---- what the rules share -------------------------------------------------------------------- */

/* One call's operands in the compute dtype, K and V with the query heads, and its probabilities. */
typedef struct {
    kiln_dtype ct;
    double s;
    int64_t hq, hk;
    kiln_tensor *q, *kr, *vr, *sv, *P;
} att_ops;

/* P from q, kr, lse (compute dtype) and the mask (NULL: none) */
static kiln_tensor *probabilities(grad_scope *sc, const kiln_attrs *a, kiln_tensor *mask, att_ops *o, kiln_tensor *lse) {
    kiln_tensor *S = mul(sc, mm(sc, o->q, tr(sc, o->kr)), o->sv);
    kiln_tensor *ninf = scalar(sc, -INFINITY, S);
    if (mask && mask->meta.dtype == KILN_DTYPE_BOOL) S = where3(sc, mask, S, ninf);
    else if (mask) S = bin(sc, KILN_OP_ADD, S, cast_to(sc, mask, o->ct));
    if (S && a->ni > KILN_A_ATTENTION_CAUSAL && a->i[KILN_A_ATTENTION_CAUSAL]) {
        int nd = S->meta.ndim;
        kiln_tensor *rows = column(sc, arange(sc, S->meta.shape[nd - 2])), *cols = arange(sc, S->meta.shape[nd - 1]);
        S = where3(sc, bin(sc, KILN_OP_GE, rows, cols), S, ninf);
    }
    /* no NaN in either branch of the wheres: a derivative of this rule goes through both */
    kiln_tensor *seen = bin(sc, KILN_OP_GT, S, ninf), *zero = scalar(sc, 0.0, S);
    kiln_tensor *shifted = where3(sc, seen, bin(sc, KILN_OP_SUB, S, column(sc, lse)), zero);
    return where3(sc, seen, un(sc, KILN_OP_EXP, shifted), zero);
}

static void take(grad_scope *sc, const kiln_grad_ctx *ctx, kiln_tensor *q, kiln_tensor *k, kiln_tensor *v,
                 kiln_tensor *mask, kiln_tensor *lse, att_ops *o) {
    const kiln_meta *qm = &ctx->in_meta[ctx->op == KILN_OP_ATTENTION ? 0 : 1];
    const kiln_meta *km = &ctx->in_meta[ctx->op == KILN_OP_ATTENTION ? 1 : 2];
    int nd = qm->ndim;
    o->ct = lse->meta.dtype;
    o->s = ctx->attrs->f[KILN_A_ATTENTION_SCALE];
    o->hq = qm->shape[nd - 3], o->hk = km->shape[nd - 3];
    o->q = cast_to(sc, q, o->ct);
    o->kr = repeat_heads(sc, cast_to(sc, k, o->ct), o->hq);
    o->vr = repeat_heads(sc, cast_to(sc, v, o->ct), o->hq);
    o->sv = scalar(sc, o->s, o->q);
    o->P = probabilities(sc, ctx->attrs, mask, o, lse);
}

/* s (a Qᵀ-side product + its partner), either term absent */
static kiln_tensor *scores_tangent(grad_scope *sc, const att_ops *o, kiln_tensor *tq, kiln_tensor *tkr) {
    kiln_tensor *t = opt_add(sc, tq ? mm(sc, tq, tr(sc, o->kr)) : NULL, tkr ? mm(sc, o->q, tr(sc, tkr)) : NULL);
    return t ? mul(sc, t, o->sv) : NULL;
}

/* Sets out[k] = v[k] (cast to out_meta[k]'s dtype) for the n outputs; releases the scope's temps. */
static kiln_status settle(grad_scope *sc, const kiln_meta *metas, kiln_tensor **v, int n, kiln_tensor **out) {
    for (int k = 0; k < n; k++) v[k] = cast_to(sc, v[k], metas[k].dtype);
    return hand_out(sc, v, n, out);
}

static kiln_status no_mask_tangent(const char *op) {
    return kiln_error(KILN_ERR_VALUE, "jvp: %s has no forward-mode rule with respect to its mask", op);
}

/* ---- attention, forward mode ------------------------------------------------------------------- */

JVP(attention) {
    if (ctx->nin == 4 && tin[3]) return no_mask_tangent("attention");
    grad_scope sc = {0};
    att_ops o;
    take(&sc, ctx, ctx->in[0], ctx->in[1], ctx->in[2], ctx->nin == 4 ? ctx->in[3] : NULL, ctx->out[1], &o);
    kiln_tensor *tq = cast_to(&sc, tin[0], o.ct), *tkr = repeat_heads(&sc, cast_to(&sc, tin[1], o.ct), o.hq);
    kiln_tensor *tvr = repeat_heads(&sc, cast_to(&sc, tin[2], o.ct), o.hq);
    kiln_tensor *tS = scores_tangent(&sc, &o, tq, tkr);
    kiln_tensor *tlse = tS ? row_sum(&sc, mul(&sc, o.P, tS), false) : NULL;
    kiln_tensor *tP = tS ? mul(&sc, o.P, bin(&sc, KILN_OP_SUB, tS, column(&sc, tlse))) : NULL;
    kiln_tensor *v[2] = {opt_add(&sc, tP ? mm(&sc, tP, o.vr) : NULL, tvr ? mm(&sc, o.P, tvr) : NULL), tlse};
    return settle(&sc, ctx->out_meta, v, 2, tout);
}

/* ---- attention_backward(gO, Q, K, V, O, lse[, glse[, mask]]) -> (gQ, gK, gV) ------------------- */

typedef struct {
    att_ops a;
    kiln_tensor *go, *o, *T, *dS;
} bwd_ops;

static void take_backward(grad_scope *sc, const kiln_grad_ctx *ctx, bwd_ops *b) {
    kiln_tensor *lse = ctx->in[5];
    take(sc, ctx, ctx->in[1], ctx->in[2], ctx->in[3], ctx->nin == 8 ? ctx->in[7] : NULL, lse, &b->a);
    b->go = cast_to(sc, ctx->in[0], b->a.ct);
    b->o = cast_to(sc, ctx->in[4], b->a.ct);
    kiln_tensor *glse = ctx->nin >= 7 ? cast_to(sc, ctx->in[6], b->a.ct) : NULL;
    kiln_tensor *T = bin(sc, KILN_OP_SUB, mm(sc, b->go, tr(sc, b->a.vr)), row_sum(sc, mul(sc, b->go, b->o), true));
    b->T = glse ? bin(sc, KILN_OP_ADD, T, column(sc, glse)) : T;
    b->dS = mul(sc, b->a.P, b->T);
}

KILN_GRAD(attention_backward) {
    if (ctx->nin == 8 && ctx->needs_grad[7])
        return kiln_error(KILN_ERR_VALUE, "attention_backward: no gradient with respect to the mask; use the unfused "
                                          "ops (matmul, softmax, matmul) for a mask that needs one");
    grad_scope sc = {0};
    bwd_ops b;
    take_backward(&sc, ctx, &b);
    const att_ops *o = &b.a;
    kiln_tensor *aq = cast_to(&sc, gout[0], o->ct), *akr = repeat_heads(&sc, cast_to(&sc, gout[1], o->ct), o->hq);
    kiln_tensor *avr = repeat_heads(&sc, cast_to(&sc, gout[2], o->ct), o->hq);
    kiln_tensor *G = opt_add(&sc, aq ? mm(&sc, aq, tr(&sc, o->kr)) : NULL, akr ? mm(&sc, o->q, tr(&sc, akr)) : NULL);
    G = G ? mul(&sc, G, o->sv) : NULL;
    kiln_tensor *H = G ? mul(&sc, G, o->P) : NULL, *R = H ? row_sum(&sc, H, true) : NULL;
    kiln_tensor *E = opt_add(&sc, G ? mul(&sc, G, b.T) : NULL, avr ? mm(&sc, b.go, tr(&sc, avr)) : NULL);
    E = E ? mul(&sc, E, o->P) : NULL;

    kiln_tensor *g[8] = {NULL};
    if (ctx->needs_grad[0])
        g[0] = opt_add(&sc, avr ? mm(&sc, o->P, avr) : NULL,
                       H ? bin(&sc, KILN_OP_SUB, mm(&sc, H, o->vr), mul(&sc, R, b.o)) : NULL);
    if (ctx->needs_grad[1]) {
        kiln_tensor *t = opt_add(&sc, akr ? mm(&sc, b.dS, akr) : NULL, E ? mm(&sc, E, o->kr) : NULL);
        g[1] = t ? mul(&sc, t, o->sv) : NULL;
    }
    if (ctx->needs_grad[2]) {
        kiln_tensor *t = opt_add(&sc, aq ? mm(&sc, tr(&sc, b.dS), aq) : NULL, E ? mm(&sc, tr(&sc, E), o->q) : NULL);
        g[2] = t ? group_sum(&sc, mul(&sc, t, o->sv), o->hk) : NULL;
    }
    if (ctx->needs_grad[3] && H) g[3] = group_sum(&sc, mm(&sc, tr(&sc, H), b.go), o->hk);
    if (ctx->needs_grad[4] && R) g[4] = un(&sc, KILN_OP_NEG, mul(&sc, R, b.go));
    if (ctx->needs_grad[5] && E) g[5] = un(&sc, KILN_OP_NEG, row_sum(&sc, E, false));
    if (ctx->nin >= 7 && ctx->needs_grad[6] && H) g[6] = row_sum(&sc, H, false);
    for (int j = 0; j < ctx->nin && j < 7 && sc.status == KILN_OK; j++) {
        if (!ctx->needs_grad[j]) continue;
        if (g[j]) { /* in the input's dtype */
            g[j] = cast_to(&sc, g[j], ctx->in_meta[j].dtype);
        } else { /* no cotangent reaches it: zeros */
            kiln_tensor *z = NULL;
            sc.status = kiln_emit_full(&ctx->in_meta[j], 0.0, &z);
            g[j] = keep(&sc, sc.status, z);
        }
    }
    return finish(&sc, ctx, gin, g);
}

JVP(attention_backward) {
    if (ctx->nin == 8 && tin[7]) return no_mask_tangent("attention_backward");
    grad_scope sc = {0};
    bwd_ops b;
    take_backward(&sc, ctx, &b);
    const att_ops *o = &b.a;
    kiln_tensor *tgo = cast_to(&sc, tin[0], o->ct), *tq = cast_to(&sc, tin[1], o->ct);
    kiln_tensor *tkr = repeat_heads(&sc, cast_to(&sc, tin[2], o->ct), o->hq);
    kiln_tensor *tvr = repeat_heads(&sc, cast_to(&sc, tin[3], o->ct), o->hq);
    kiln_tensor *to = cast_to(&sc, tin[4], o->ct), *tlse = cast_to(&sc, tin[5], o->ct);
    kiln_tensor *tglse = ctx->nin >= 7 ? cast_to(&sc, tin[6], o->ct) : NULL;
    kiln_tensor *shift = opt_sub(&sc, scores_tangent(&sc, o, tq, tkr), tlse ? column(&sc, tlse) : NULL);
    kiln_tensor *tP = shift ? mul(&sc, o->P, shift) : NULL;
    kiln_tensor *tD = opt_add(&sc, tgo ? mul(&sc, tgo, b.o) : NULL, to ? mul(&sc, b.go, to) : NULL);
    kiln_tensor *tT = opt_add(&sc, tgo ? mm(&sc, tgo, tr(&sc, o->vr)) : NULL, tvr ? mm(&sc, b.go, tr(&sc, tvr)) : NULL);
    tT = opt_sub(&sc, tT, tD ? row_sum(&sc, tD, true) : NULL);
    tT = opt_add(&sc, tT, tglse ? column(&sc, tglse) : NULL);
    kiln_tensor *tdS = opt_add(&sc, tP ? mul(&sc, tP, b.T) : NULL, tT ? mul(&sc, o->P, tT) : NULL);
    kiln_tensor *v[3] = {NULL, NULL, NULL};
    kiln_tensor *gq = opt_add(&sc, tdS ? mm(&sc, tdS, o->kr) : NULL, tkr ? mm(&sc, b.dS, tkr) : NULL);
    kiln_tensor *gk = opt_add(&sc, tdS ? mm(&sc, tr(&sc, tdS), o->q) : NULL, tq ? mm(&sc, tr(&sc, b.dS), tq) : NULL);
    v[0] = gq ? mul(&sc, gq, o->sv) : NULL;
    v[1] = gk ? group_sum(&sc, mul(&sc, gk, o->sv), o->hk) : NULL;
    v[2] = group_sum(&sc, opt_add(&sc, tP ? mm(&sc, tr(&sc, tP), b.go) : NULL, tgo ? mm(&sc, tr(&sc, o->P), tgo) : NULL),
                     o->hk);
    return settle(&sc, ctx->out_meta, v, 3, tout);
}
