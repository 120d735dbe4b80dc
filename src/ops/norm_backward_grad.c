/* Second-order rules of the normalizations' backward ops: the reverse rules (KILN_GRAD) and the
 * forward-mode rules (KILN_JVP) of layer_norm_backward, rms_norm_backward and batch_norm_backward,
 * written with differentiable ops, so gradients of gradients (and forward over reverse:
 * kiln.hessian) go through layer_norm, rms_norm and batch_norm.
 *
 * The three backward ops compute one function of (gy, x, w, m, s), m and s the statistics the
 * forward returned (the mean, absent for rms_norm, and the inverse deviation), w the weight
 * broadcast against x (batch_norm's gamma as (C, 1, ..., 1)):
 *   xh = (x - m) s,  g = gy w
 *   gx = s (g - mean_S(g) - xh mean_S(g xh))    (batch statistics; rms_norm: no mean_S(g) term)
 *   gx = s g                                     (batch_norm in inference: given statistics)
 *   gw = sum_P(gy xh),  gb = sum_P(gy)
 * S the axes of the statistics (layer_norm's trailing ones; batch_norm's all but the channels), P
 * the axes the weight is broadcast over. m and s are inputs of their own: their gradients here are
 * the partial derivatives, and the forward rules (norm.c's stats_grad) carry them on to x, so the
 * total derivative in x is exact without these rules recomputing the statistics.
 *
 * Reverse, cotangents (A, Bw, Bb) of (gx, gw, gb), batch statistics:
 *   dg  = s (A - mean_S(A) - xh mean_S(A xh))
 *   dxh = -s (A mean_S(g xh) + g mean_S(A xh)) + Bw gy
 *   d gy = dg w + Bw xh + Bb,  d w = sum_P(dg gy),  d x = dxh s,  d m = -sum_S(dxh s),
 *   d s = sum_S(dxh (x - m) + A (g - mean_S(g) - xh mean_S(g xh)))
 * (given statistics: dg = s A, dxh = Bw gy, d s = sum_S(dxh (x - m) + A g)).
 * Forward, tangents t*: txh = (tx - tm) s + (x - m) ts, tg = tgy w + gy tw,
 *   tgx = ts (g - mean_S(g) - xh mean_S(g xh)) + s (tg - mean_S(tg) - txh mean_S(g xh)
 *         - xh mean_S(tg xh + g txh))
 *   tgw = sum_P(tgy xh + gy txh), tgb = sum_P(tgy). */
#include "../core/internal.h"
#include "grad_scope.h"

#define KILN_OP(...)
#define KILN_JVP(ENUM, rule) kiln_status kiln_jvp_##rule(const kiln_grad_ctx *, kiln_tensor *const *, kiln_tensor **);
#include "ops.def"
#undef KILN_JVP
#undef KILN_OP

/* How one backward op's operands broadcast against x. */
typedef struct {
    kiln_meta w_view, m_view, s_view; /* w, m and s as broadcast against x (gradients are summed to them) */
    uint64_t stat_mask;               /* S */
    bool batch;                       /* batch statistics: gx has the mean_S terms */
} nb_ops;

static kiln_tensor *mean_over(grad_scope *sc, kiln_tensor *t, uint64_t mask) {
    if (!t || sc->status != KILN_OK) return NULL;
    kiln_tensor *r = NULL;
    kiln_status s = kiln_emit_reduce(KILN_OP_MEAN, t, mask, true, &r);
    return keep(sc, s, r);
}

static kiln_tensor *reshaped(grad_scope *sc, kiln_tensor *t, int ndim, const int64_t *shape) {
    if (!t || sc->status != KILN_OK) return NULL;
    kiln_tensor *r = NULL;
    kiln_status s = kiln_emit_reshape(t, ndim, shape, &r);
    return keep(sc, s, r);
}

static kiln_tensor *sum_over(grad_scope *sc, kiln_tensor *t, uint64_t mask) {
    if (!t || sc->status != KILN_OK) return NULL;
    kiln_tensor *r = NULL;
    kiln_status s = kiln_emit_reduce(KILN_OP_SUM, t, mask, true, &r);
    return keep(sc, s, r);
}

/* t summed down to the view `view` (undoing its broadcast against x) */
static kiln_tensor *sum_view(grad_scope *sc, kiln_tensor *t, const kiln_meta *view) {
    if (!t || sc->status != KILN_OK) return NULL;
    kiln_tensor *r = NULL;
    kiln_status s = kiln_emit_sum_to(t, view, &r);
    return keep(sc, s, r);
}

/* t (of m's element count) given the shape and dtype of `m` (an input's or output's) */
static kiln_tensor *as_meta(grad_scope *sc, kiln_tensor *t, const kiln_meta *m) {
    kiln_tensor *r = reshaped(sc, t, m->ndim, m->shape);
    if (r && sc->status == KILN_OK && r->meta.dtype != m->dtype) {
        kiln_tensor *c = NULL;
        kiln_status s = kiln_emit_cast(r, m->dtype, &c);
        r = keep(sc, s, c);
    }
    return r;
}

static kiln_tensor *summed_to(grad_scope *sc, kiln_tensor *t, const kiln_meta *view, const kiln_meta *m) {
    return as_meta(sc, sum_view(sc, t, view), m);
}

/* layer_norm_backward / rms_norm_backward: the statistics kept with the normalized axes as 1;
 * batch_norm_backward: gamma and the statistics as (C, 1, ..., 1). Views of the op's inputs (or of
 * tensors of their shapes: tangents, in the order gy, x, w, [m,] s). */
static void nb_views(const kiln_grad_ctx *ctx, nb_ops *o) {
    const kiln_meta *xm = &ctx->in_meta[1];
    bool bn = ctx->op == KILN_OP_BATCH_NORM_BACKWARD;
    int nstat = ctx->op == KILN_OP_RMS_NORM_BACKWARD ? 1 : 2;
    o->stat_mask = 0;
    if (bn) {
        int64_t shape[KILN_MAX_DIMS];
        shape[0] = xm->shape[1];
        for (int d = 1; d < xm->ndim - 1; d++) shape[d] = 1;
        kiln_meta_set(&o->w_view, ctx->in_meta[2].dtype, xm->ndim - 1, shape);
        for (int d = 0; d < xm->ndim; d++)
            if (d != 1) o->stat_mask |= 1ull << d;
        o->batch = ctx->attrs->i[KILN_A_BATCH_NORM_TRAINING] != 0;
    } else {
        int64_t k = ctx->attrs->i[KILN_A_NORM_NAXES];
        int64_t shape[KILN_MAX_DIMS];
        for (int d = 0; d < xm->ndim; d++) {
            bool stat = d >= xm->ndim - k;
            shape[d] = stat ? 1 : xm->shape[d];
            if (stat) o->stat_mask |= 1ull << d;
        }
        kiln_meta_set(&o->w_view, ctx->in_meta[2].dtype, (int)k, xm->shape + xm->ndim - k);
        kiln_meta_set(&o->s_view, ctx->in_meta[3].dtype, xm->ndim, shape);
        o->batch = true;
    }
    if (bn) o->s_view = o->w_view;
    o->m_view = o->s_view;
    o->m_view.dtype = ctx->in_meta[3].dtype;
    o->s_view.dtype = ctx->in_meta[2 + nstat].dtype;
}

/* v[0..] = gy, x, w, m, s (m NULL for rms_norm) from src, in the op's input order, reshaped to
 * their views (NULL entries stay NULL) */
static void nb_take(grad_scope *sc, const kiln_grad_ctx *ctx, const nb_ops *o, kiln_tensor *const *src, kiln_tensor **v) {
    bool rms = ctx->op == KILN_OP_RMS_NORM_BACKWARD;
    v[0] = src[0], v[1] = src[1];
    v[2] = reshaped(sc, src[2], o->w_view.ndim, o->w_view.shape);
    v[3] = rms ? NULL : reshaped(sc, src[3], o->m_view.ndim, o->m_view.shape);
    v[4] = reshaped(sc, src[rms ? 3 : 4], o->s_view.ndim, o->s_view.shape);
}

static int nb_nout(const kiln_grad_ctx *ctx) { return ctx->op == KILN_OP_RMS_NORM_BACKWARD ? 2 : 3; }

/* With dxh = -s q + Bw gy, q = A mean_S(g xh) + g mean_S(A xh) (the header's formulas), the
 * full-size work is folded: d x = -s^2 q + s Bw gy, and sum_S(dxh (x - m)) = sum_S(-q xh + Bw gy (x - m)),
 * with -mean_S(g) sum_S(A) of d s computed on the statistics' size. Only what an input that needs a
 * gradient reads is emitted. */
static kiln_status nb_reverse(const kiln_grad_ctx *ctx, kiln_tensor *const *gout, kiln_tensor **gin) {
    nb_ops o;
    nb_views(ctx, &o);
    grad_scope sc = {0};
    kiln_tensor *v[5];
    nb_take(&sc, ctx, &o, ctx->in, v);
    kiln_tensor *gy = v[0], *x = v[1], *w = v[2], *m = v[3], *s = v[4];
    kiln_tensor *A = gout[0], *Bw = gout[1], *Bb = nb_nout(ctx) > 2 ? gout[2] : NULL;
    if (Bw) Bw = reshaped(&sc, Bw, o.w_view.ndim, o.w_view.shape);
    if (Bb) Bb = reshaped(&sc, Bb, o.w_view.ndim, o.w_view.shape);
    int si = m ? 4 : 3;
    bool need_x = ctx->needs_grad[1] || (m && ctx->needs_grad[3]), need_s = ctx->needs_grad[si];
    bool need_g = ctx->needs_grad[0] || ctx->needs_grad[2];
    kiln_tensor *xc = m ? bin(&sc, KILN_OP_SUB, x, m) : x, *xh = bin(&sc, KILN_OP_MUL, xc, s);
    kiln_tensor *g = A && (need_x || need_s) ? bin(&sc, KILN_OP_MUL, gy, w) : NULL;
    kiln_tensor *dg = NULL, *dx = NULL, *ds = NULL, *ds_small = NULL;
    if (A && o.batch) {
        kiln_tensor *mAx = mean_over(&sc, bin(&sc, KILN_OP_MUL, A, xh), o.stat_mask);
        kiln_tensor *mA = m && need_g ? mean_over(&sc, A, o.stat_mask) : NULL;
        if (need_g) dg = bin(&sc, KILN_OP_MUL, s, opt_sub(&sc, opt_sub(&sc, A, mA), bin(&sc, KILN_OP_MUL, xh, mAx)));
        if (need_x || need_s) {
            kiln_tensor *sb = mean_over(&sc, bin(&sc, KILN_OP_MUL, g, xh), o.stat_mask);
            kiln_tensor *q = bin(&sc, KILN_OP_ADD, bin(&sc, KILN_OP_MUL, A, sb), bin(&sc, KILN_OP_MUL, g, mAx));
            if (need_x) dx = bin(&sc, KILN_OP_MUL, un(&sc, KILN_OP_NEG, bin(&sc, KILN_OP_MUL, s, s)), q);
            if (need_s) {
                ds = bin(&sc, KILN_OP_SUB, bin(&sc, KILN_OP_MUL, A, bin(&sc, KILN_OP_SUB, g, bin(&sc, KILN_OP_MUL, xh, sb))),
                         bin(&sc, KILN_OP_MUL, q, xh));
                if (m)
                    ds_small = un(&sc, KILN_OP_NEG, bin(&sc, KILN_OP_MUL, mean_over(&sc, g, o.stat_mask),
                                                        sum_over(&sc, A, o.stat_mask)));
            }
        }
    } else if (A) {
        if (need_g) dg = bin(&sc, KILN_OP_MUL, s, A);
        if (need_s) ds = bin(&sc, KILN_OP_MUL, A, g);
    }
    if (Bw && (need_x || need_s)) {
        kiln_tensor *bg = bin(&sc, KILN_OP_MUL, Bw, gy);
        if (need_x) dx = opt_add(&sc, dx, bin(&sc, KILN_OP_MUL, bg, s));
        if (need_s) ds = opt_add(&sc, ds, bin(&sc, KILN_OP_MUL, bg, xc));
    }
    kiln_tensor *d[5] = {NULL};
    if (ctx->needs_grad[0]) d[0] = opt_add(&sc, opt_add(&sc, bin(&sc, KILN_OP_MUL, dg, w), bin(&sc, KILN_OP_MUL, Bw, xh)), Bb);
    if (ctx->needs_grad[1]) d[1] = dx;
    if (ctx->needs_grad[2]) d[2] = summed_to(&sc, bin(&sc, KILN_OP_MUL, dg, gy), &o.w_view, &ctx->in_meta[2]);
    if (m && ctx->needs_grad[3]) d[3] = as_meta(&sc, un(&sc, KILN_OP_NEG, sum_view(&sc, dx, &o.m_view)), &ctx->in_meta[3]);
    if (need_s) d[si] = as_meta(&sc, opt_add(&sc, sum_view(&sc, ds, &o.s_view), ds_small), &ctx->in_meta[si]);
    /* inputs nothing reached (no cotangent on the outputs that depend on them): zeros */
    for (int j = 0; j < ctx->nin && sc.status == KILN_OK; j++) {
        if (!ctx->needs_grad[j] || d[j]) continue;
        kiln_tensor *z = NULL;
        sc.status = kiln_emit_full(&ctx->in_meta[j], 0.0, &z);
        d[j] = keep(&sc, sc.status, z);
    }
    return hand_out(&sc, d, ctx->nin, gin);
}

KILN_GRAD(layer_norm_backward) { return nb_reverse(ctx, gout, gin); }
KILN_GRAD(rms_norm_backward) { return nb_reverse(ctx, gout, gin); }
KILN_GRAD(batch_norm_backward) { return nb_reverse(ctx, gout, gin); }

static kiln_status nb_forward(const kiln_grad_ctx *ctx, kiln_tensor *const *tin, kiln_tensor **tout) {
    nb_ops o;
    nb_views(ctx, &o);
    grad_scope sc = {0};
    kiln_tensor *v[5], *t[5];
    nb_take(&sc, ctx, &o, ctx->in, v);
    nb_take(&sc, ctx, &o, tin, t);
    kiln_tensor *gy = v[0], *x = v[1], *w = v[2], *m = v[3], *s = v[4];
    kiln_tensor *tgy = t[0], *tx = t[1], *tw = t[2], *tm = t[3], *ts = t[4];
    kiln_tensor *xc = m ? bin(&sc, KILN_OP_SUB, x, m) : x, *xh = bin(&sc, KILN_OP_MUL, xc, s);
    kiln_tensor *g = bin(&sc, KILN_OP_MUL, gy, w);
    kiln_tensor *txh = opt_add(&sc, bin(&sc, KILN_OP_MUL, opt_sub(&sc, tx, tm), s), bin(&sc, KILN_OP_MUL, xc, ts));
    kiln_tensor *tg = opt_add(&sc, bin(&sc, KILN_OP_MUL, tgy, w), bin(&sc, KILN_OP_MUL, gy, tw));
    kiln_tensor *r[3] = {NULL, NULL, NULL};
    if (o.batch) {
        kiln_tensor *sb = mean_over(&sc, bin(&sc, KILN_OP_MUL, g, xh), o.stat_mask);
        kiln_tensor *sa = m ? mean_over(&sc, g, o.stat_mask) : NULL;
        if (ts) r[0] = bin(&sc, KILN_OP_MUL, ts, opt_sub(&sc, opt_sub(&sc, g, sa), bin(&sc, KILN_OP_MUL, xh, sb)));
        kiln_tensor *tsa = m ? mean_over(&sc, tg, o.stat_mask) : NULL;
        kiln_tensor *tsb = mean_over(&sc, opt_add(&sc, bin(&sc, KILN_OP_MUL, tg, xh), bin(&sc, KILN_OP_MUL, g, txh)),
                                     o.stat_mask);
        kiln_tensor *inner = opt_sub(&sc, opt_sub(&sc, opt_sub(&sc, tg, tsa), bin(&sc, KILN_OP_MUL, txh, sb)),
                                     bin(&sc, KILN_OP_MUL, xh, tsb));
        r[0] = opt_add(&sc, r[0], bin(&sc, KILN_OP_MUL, s, inner));
    } else {
        r[0] = opt_add(&sc, bin(&sc, KILN_OP_MUL, ts, g), bin(&sc, KILN_OP_MUL, s, tg));
    }
    if (r[0] && sc.status == KILN_OK && r[0]->meta.dtype != ctx->out_meta[0].dtype) {
        kiln_tensor *c = NULL;
        sc.status = kiln_emit_cast(r[0], ctx->out_meta[0].dtype, &c);
        r[0] = keep(&sc, sc.status, c);
    }
    r[1] = summed_to(&sc, opt_add(&sc, bin(&sc, KILN_OP_MUL, tgy, xh), bin(&sc, KILN_OP_MUL, gy, txh)), &o.w_view,
                     &ctx->out_meta[1]);
    if (nb_nout(ctx) > 2) r[2] = summed_to(&sc, tgy, &o.w_view, &ctx->out_meta[2]);
    return hand_out(&sc, r, nb_nout(ctx), tout);
}

kiln_status kiln_jvp_layer_norm_backward(const kiln_grad_ctx *ctx, kiln_tensor *const *tin, kiln_tensor **tout) {
    return nb_forward(ctx, tin, tout);
}
kiln_status kiln_jvp_rms_norm_backward(const kiln_grad_ctx *ctx, kiln_tensor *const *tin, kiln_tensor **tout) {
    return nb_forward(ctx, tin, tout);
}
kiln_status kiln_jvp_batch_norm_backward(const kiln_grad_ctx *ctx, kiln_tensor *const *tin, kiln_tensor **tout) {
    return nb_forward(ctx, tin, tout);
}
