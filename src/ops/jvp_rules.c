/* Forward-mode rules (ops.def KILN_JVP): each gives the tangents of an op's outputs from the
 * tangents of its inputs, with ops (kiln_apply), so a traced run records them as graph nodes
 * (src/ir/jvp.c walks a recorded graph and calls them). Generic rules first:
 *   self       the op is linear in its float inputs: the op itself over their tangents (zeros for
 *              the inputs without one; integer and bool inputs, such as indices, as they are)
 *   self_in_place  the same for ops that write input 0 in place, on a fresh copy of its tangent
 *   diag       an elementwise op: its Jacobian per input is diagonal, so the reverse rule given the
 *              input's tangent (broadcast to the output) as the output's gradient is the JVP term
 *   reduce     a reduction whose reverse rule is the gradient broadcast times a per-element weight
 *              w(x): transposed, sum(t * w) over the reduced axes
 *   bilinear   op(a, b[, bias]) linear in a and in b (and the bias): op(ta, b[, tbias]) + op(a, tb)
 * then the rules of single ops. */
#include <math.h>

#include "../core/internal.h"
#include "grad_scope.h"

/* the rules' prototypes, from ops.def */
#define KILN_OP(...)
#define KILN_JVP(ENUM, rule) kiln_status kiln_jvp_##rule(const kiln_grad_ctx *, kiln_tensor *const *, kiln_tensor **);
#include "ops.def"
#undef KILN_JVP
#undef KILN_OP

/* the most inputs an elementwise op has (where: 3) */
#define DIAG_MAX_INPUTS 4

#define JVP(name)                                                                           \
    kiln_status kiln_jvp_##name(const kiln_grad_ctx *ctx KILN_UNUSED, kiln_tensor *const *tin, \
                                kiln_tensor **tout)

/* ---- generic rules ----------------------------------------------------------------------- */

/* zeros of m (new reference) */
static kiln_status zeros_of(const kiln_meta *m, kiln_tensor **out) { return kiln_emit_full(m, 0.0, out); }

static kiln_status apply_over_tangents(const kiln_grad_ctx *ctx, kiln_tensor *const *tin, bool copy_first,
                                       kiln_tensor **tout) {
    kiln_tensor **ins = kiln_calloc((size_t)ctx->nin, sizeof *ins);
    bool *owned = kiln_calloc((size_t)ctx->nin, sizeof *owned);
    kiln_status s = ins && owned ? KILN_OK : kiln_error(KILN_ERR_MEMORY, "out of memory in a JVP rule");
    for (int j = 0; j < ctx->nin && s == KILN_OK; j++) {
        if (!kiln_dtype_is_float(ctx->in_meta[j].dtype)) {
            ins[j] = ctx->in[j];
        } else if (tin[j] && !(copy_first && j == 0)) {
            ins[j] = tin[j];
        } else if (tin[j]) { /* the op writes it: a private copy */
            s = kiln_emit_unary(KILN_OP_CONTIGUOUS, tin[j], &ins[j]);
            owned[j] = true;
        } else {
            s = zeros_of(&ctx->in_meta[j], &ins[j]);
            owned[j] = true;
        }
    }
    kiln_tensor *outs[KILN_MAX_OUTPUTS] = {0};
    if (s == KILN_OK) s = kiln_apply(ctx->op, ctx->nin, ins, ctx->attrs, outs);
    if (s == KILN_OK) {
        tout[0] = outs[0];
        for (int k = 1; k < ctx->nout; k++) kiln_tensor_release(outs[k]);
    }
    for (int j = 0; ins && owned && j < ctx->nin; j++)
        if (owned[j]) kiln_tensor_release(ins[j]);
    free(ins), free(owned);
    return s;
}

JVP(self) { return apply_over_tangents(ctx, tin, false, tout); }
JVP(self_in_place) { return apply_over_tangents(ctx, tin, true, tout); }

/* a + b into *acc (a new reference replacing it); b released */
static kiln_status accumulate(kiln_tensor **acc, kiln_tensor *b) {
    if (!*acc) {
        *acc = b;
        return KILN_OK;
    }
    kiln_tensor *sum = NULL;
    kiln_status s = kiln_emit_binary(KILN_OP_ADD, *acc, b, &sum);
    kiln_tensor_release(*acc), kiln_tensor_release(b);
    *acc = sum;
    return s;
}

/* t broadcast to m's shape (a new reference; t itself when it has it) */
static kiln_status broadcast_to(kiln_tensor *t, const kiln_meta *m, kiln_tensor **out) {
    bool same = t->meta.ndim == m->ndim;
    for (int d = 0; same && d < m->ndim; d++) same = t->meta.shape[d] == m->shape[d];
    if (same) {
        kiln_tensor_retain(t);
        *out = t;
        return KILN_OK;
    }
    return kiln_emit_expand(t, m->ndim, m->shape, out);
}

JVP(diag) {
    const kiln_op_info *info = kiln_op_get(ctx->op);
    kiln_meta in_meta[DIAG_MAX_INPUTS];
    bool want[DIAG_MAX_INPUTS];
    if (ctx->nin > DIAG_MAX_INPUTS) return kiln_error(KILN_ERR_RUNTIME, "jvp: %s is not elementwise (%d inputs)", info->name, ctx->nin);
    kiln_status s = KILN_OK;
    kiln_tensor *acc = NULL;
    for (int j = 0; j < ctx->nin && s == KILN_OK; j++) {
        if (!ctx->needs_grad[j]) continue;
        /* input j seen as having the output's shape: the rule's sum_to over broadcast axes is then
         * the identity, and its result the diagonal of the Jacobian times the tangent */
        for (int k = 0; k < ctx->nin; k++) {
            in_meta[k] = ctx->in_meta[k];
            want[k] = k == j;
        }
        in_meta[j] = ctx->out_meta[0];
        in_meta[j].dtype = ctx->in_meta[j].dtype;
        kiln_grad_ctx c = *ctx;
        c.in_meta = in_meta;
        c.needs_grad = want;
        kiln_tensor *g = NULL, *gin[DIAG_MAX_INPUTS] = {0};
        s = broadcast_to(tin[j], &ctx->out_meta[0], &g);
        if (s == KILN_OK) s = info->grad(&c, &g, gin);
        kiln_tensor_release(g);
        if (s == KILN_OK) s = accumulate(&acc, gin[j]);
        else kiln_release_all(gin, ctx->nin);
    }
    if (s == KILN_OK) *tout = acc;
    else kiln_tensor_release(acc);
    return s;
}

JVP(reduce) {
    if (!tin[0]) return KILN_OK;
    const kiln_op_info *info = kiln_op_get(ctx->op);
    kiln_tensor *ones = NULL, *w = NULL, *tw = NULL;
    kiln_status s = kiln_emit_full(&ctx->out_meta[0], 1.0, &ones);
    if (s == KILN_OK) s = info->grad(ctx, &ones, &w); /* the per-element weight of the reverse rule */
    if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_MUL, tin[0], w, &tw);
    uint64_t mask = ctx->in_meta[0].ndim ? (uint64_t)ctx->attrs->i[KILN_A_REDUCE_AXES] : 0;
    if (s == KILN_OK) s = kiln_emit_reduce(KILN_OP_SUM, tw, mask, ctx->attrs->i[KILN_A_REDUCE_KEEPDIMS] != 0, tout);
    kiln_tensor_release(ones), kiln_tensor_release(w), kiln_tensor_release(tw);
    return s;
}

JVP(bilinear) {
    kiln_tensor *acc = NULL;
    kiln_status s = KILN_OK;
    bool bias = ctx->nin > 2 && tin[2];
    if (tin[0] || bias) { /* op(ta, b[, tbias]) */
        kiln_tensor *a = tin[0], *zero = NULL, *t = NULL;
        if (!a) s = zeros_of(&ctx->in_meta[0], &zero), a = zero;
        kiln_tensor *ins[3] = {a, ctx->in[1], bias ? tin[2] : NULL};
        if (s == KILN_OK) s = kiln_apply(ctx->op, bias ? 3 : 2, ins, ctx->attrs, &t);
        kiln_tensor_release(zero);
        if (s == KILN_OK) s = accumulate(&acc, t);
    }
    if (s == KILN_OK && tin[1]) { /* op(a, tb) */
        kiln_tensor *ins[2] = {ctx->in[0], tin[1]}, *t = NULL;
        s = kiln_apply(ctx->op, 2, ins, ctx->attrs, &t);
        if (s == KILN_OK) s = accumulate(&acc, t);
    }
    if (s == KILN_OK) *tout = acc;
    else kiln_tensor_release(acc);
    return s;
}

/* ---- single ops ------------------------------------------------------------------------------ */

#define X (ctx->in[0])
#define Y (ctx->out[0])

/* the tangent of a float result is the input's, cast */
JVP(cast) {
    if (!tin[0] || !kiln_dtype_is_float(ctx->out_meta[0].dtype)) return KILN_OK;
    return kiln_emit_cast(tin[0], ctx->out_meta[0].dtype, tout);
}

static kiln_status along(kiln_op op, kiln_tensor *t, const kiln_grad_ctx *ctx, kiln_tensor **out) {
    kiln_attrs a;
    kiln_attrs_clear(&a);
    kiln_attrs_push_int(&a, ctx->attrs->i[KILN_A_SOFTMAX_AXIS]);
    kiln_tensor *in[2] = {t, Y};
    return kiln_apply(op, 2, in, &a, out);
}


/* softmax's Jacobian is symmetric: its JVP is its reverse rule, softmax_backward(t, y) */
JVP(softmax) {
    if (!tin[0]) return KILN_OK;
    return along(KILN_OP_SOFTMAX_BACKWARD, tin[0], ctx, tout);
}

/* Ends a single-output rule: *tout = v (retained) when all went well; temps released. */
static kiln_status done(grad_scope *sc, kiln_tensor *v, kiln_tensor **tout) {
    if (sc->status == KILN_OK && v) kiln_tensor_retain(v), *tout = v;
    for (int k = 0; k < sc->ntemps; k++) kiln_tensor_release(sc->temps[k]);
    return sc->status;
}

/* y = x - logsumexp(x): t - sum(exp(y) t) */
JVP(log_softmax) {
    if (!tin[0]) return KILN_OK;
    grad_scope sc = {0};
    kiln_tensor *v = bin(&sc, KILN_OP_SUB, tin[0], softmax_row_sum(&sc, ctx, bin(&sc, KILN_OP_MUL, un(&sc, KILN_OP_EXP, Y), tin[0])));
    return done(&sc, v, tout);
}


/* z = y (g - s), s = sum(g y): tz = softmax_backward(tg, y) + ty (g - s) - y sum(g ty) */
JVP(softmax_backward) {
    grad_scope sc = {0};
    kiln_tensor *g = ctx->in[0], *y = ctx->in[1], *acc = NULL;
    if (tin[0]) {
        kiln_tensor *in[2] = {tin[0], y}, *t = NULL;
        kiln_status st = kiln_apply(KILN_OP_SOFTMAX_BACKWARD, 2, in, ctx->attrs, &t);
        acc = keep(&sc, st, t);
    }
    if (tin[1]) {
        kiln_tensor *s = softmax_row_sum(&sc, ctx, bin(&sc, KILN_OP_MUL, g, y));
        kiln_tensor *term = bin(&sc, KILN_OP_SUB, bin(&sc, KILN_OP_MUL, tin[1], bin(&sc, KILN_OP_SUB, g, s)),
                                bin(&sc, KILN_OP_MUL, y, softmax_row_sum(&sc, ctx, bin(&sc, KILN_OP_MUL, g, tin[1]))));
        acc = acc ? bin(&sc, KILN_OP_ADD, acc, term) : term;
    }
    return done(&sc, acc, tout);
}

/* z = g - exp(y) sum(g): tz = log_softmax_backward(tg, y) - exp(y) ty sum(g) */
JVP(log_softmax_backward) {
    grad_scope sc = {0};
    kiln_tensor *g = ctx->in[0], *y = ctx->in[1], *acc = NULL;
    if (tin[0]) {
        kiln_tensor *in[2] = {tin[0], y}, *t = NULL;
        kiln_status st = kiln_apply(KILN_OP_LOG_SOFTMAX_BACKWARD, 2, in, ctx->attrs, &t);
        acc = keep(&sc, st, t);
    }
    if (tin[1]) {
        kiln_tensor *term = bin(&sc, KILN_OP_MUL, bin(&sc, KILN_OP_MUL, un(&sc, KILN_OP_EXP, y), tin[1]), softmax_row_sum(&sc, ctx, g));
        acc = acc ? bin(&sc, KILN_OP_SUB, acc, term) : un(&sc, KILN_OP_NEG, term);
    }
    return done(&sc, acc, tout);
}

/* (y, mask) = dropout(x): ty = t mask, the same draw */
JVP(dropout) {
    if (!tin[0]) return KILN_OK;
    return kiln_emit_binary(KILN_OP_MUL, tin[0], ctx->out[1], tout);
}

/* sorted values: the tangent picked by the sort's indices */
JVP(sort) {
    if (!tin[0]) return KILN_OK;
    kiln_attrs a;
    kiln_attrs_clear(&a);
    kiln_attrs_push_int(&a, ctx->attrs->i[KILN_A_SORT_AXIS]);
    kiln_tensor *in[2] = {tin[0], ctx->out[1]};
    return kiln_apply(KILN_OP_GATHER_ELEMENTS, 2, in, &a, tout);
}

/* gelu_backward(a, x) = a gelu'(x): d/da its own, d/dx = a gelu''(x), gelu'' = phi(x) (2 - x^2) */
JVP(gelu_backward) {
    grad_scope sc = {0};
    kiln_tensor *a = ctx->in[0], *x = ctx->in[1], *acc = NULL;
    if (tin[0]) acc = bin(&sc, KILN_OP_GELU_BACKWARD, tin[0], x);
    if (tin[1]) {
        kiln_tensor *x2 = bin(&sc, KILN_OP_MUL, x, x);
        kiln_tensor *phi = bin(&sc, KILN_OP_MUL, un(&sc, KILN_OP_EXP, bin(&sc, KILN_OP_MUL, x2, scalar(&sc, -0.5, x))),
                               scalar(&sc, 0.39894228040143268, x));
        kiln_tensor *d2 = bin(&sc, KILN_OP_MUL, phi, bin(&sc, KILN_OP_SUB, scalar(&sc, 2.0, x), x2));
        kiln_tensor *term = bin(&sc, KILN_OP_MUL, bin(&sc, KILN_OP_MUL, a, d2), tin[1]);
        acc = acc ? bin(&sc, KILN_OP_ADD, acc, term) : term;
    }
    return done(&sc, acc, tout);
}

/* silu_backward(a, x) = a silu'(x): d/dx = a s (1 - s) (2 + x (1 - 2 s)), s = sigmoid(x) */
JVP(silu_backward) {
    grad_scope sc = {0};
    kiln_tensor *a = ctx->in[0], *x = ctx->in[1], *acc = NULL;
    if (tin[0]) acc = bin(&sc, KILN_OP_SILU_BACKWARD, tin[0], x);
    if (tin[1]) {
        kiln_tensor *sg = un(&sc, KILN_OP_SIGMOID, x), *one = scalar(&sc, 1.0, x);
        kiln_tensor *ds = bin(&sc, KILN_OP_MUL, sg, bin(&sc, KILN_OP_SUB, one, sg));
        kiln_tensor *inner = bin(&sc, KILN_OP_ADD, scalar(&sc, 2.0, x),
                                 bin(&sc, KILN_OP_MUL, x, bin(&sc, KILN_OP_SUB, one, bin(&sc, KILN_OP_MUL, scalar(&sc, 2.0, x), sg))));
        kiln_tensor *term = bin(&sc, KILN_OP_MUL, bin(&sc, KILN_OP_MUL, a, bin(&sc, KILN_OP_MUL, ds, inner)), tin[1]);
        acc = acc ? bin(&sc, KILN_OP_ADD, acc, term) : term;
    }
    return done(&sc, acc, tout);
}


/* ---- normalization ----------------------------------------------------------------------------
 * y = (x - m) s w + b with m, s the mean and inverse deviation over the axes in `mask` (batch
 * statistics) or given (batch_norm's running ones: no tangent). With batch statistics tm =
 * mean(tx), ts = -s^3 mean((x - m) tx); then ty = ((tx - tm) s + (x - m) ts) w + (x - m) s tw + tb. */

typedef struct {
    kiln_tensor *x, *m, *s, *w, *tx, *tw, *tb; /* m, s, w, tw, tb broadcastable against x; w, tw, tb may be NULL */
    uint64_t mask;
    bool batch, centered;
} norm_jvp;

/* ts and (centered) tm, or NULL when x has no tangent or the statistics are given */
static kiln_status norm_stats_tangents(const norm_jvp *n, kiln_tensor **tm, kiln_tensor **ts) {
    *tm = *ts = NULL;
    if (!n->tx || !n->batch) return KILN_OK;
    grad_scope sc = {0};
    kiln_tensor *xc = n->centered ? bin(&sc, KILN_OP_SUB, n->x, n->m) : n->x, *mean = NULL, *m2 = NULL;
    kiln_tensor *prod = bin(&sc, KILN_OP_MUL, xc, n->tx);
    if (prod && sc.status == KILN_OK) sc.status = kiln_emit_reduce(KILN_OP_MEAN, prod, n->mask, true, &mean), keep(&sc, sc.status, mean);
    kiln_tensor *s3 = bin(&sc, KILN_OP_MUL, bin(&sc, KILN_OP_MUL, n->s, n->s), n->s);
    kiln_tensor *t = un(&sc, KILN_OP_NEG, bin(&sc, KILN_OP_MUL, s3, mean));
    if (n->centered && sc.status == KILN_OK) sc.status = kiln_emit_reduce(KILN_OP_MEAN, n->tx, n->mask, true, &m2), keep(&sc, sc.status, m2);
    if (sc.status == KILN_OK) {
        kiln_tensor_retain(t), *ts = t;
        if (m2) kiln_tensor_retain(m2), *tm = m2;
    }
    for (int k = 0; k < sc.ntemps; k++) kiln_tensor_release(sc.temps[k]);
    return sc.status;
}

/* ty from the statistics' tangents (tm, ts may be NULL) */
static kiln_status norm_out_tangent(const norm_jvp *n, kiln_tensor *tm, kiln_tensor *ts, kiln_tensor **ty) {
    grad_scope sc = {0};
    kiln_tensor *xc = n->centered ? bin(&sc, KILN_OP_SUB, n->x, n->m) : n->x, *acc = NULL;
    if (n->tx) {
        kiln_tensor *dx = tm ? bin(&sc, KILN_OP_SUB, n->tx, tm) : n->tx;
        kiln_tensor *txhat = bin(&sc, KILN_OP_MUL, dx, n->s);
        if (ts) txhat = bin(&sc, KILN_OP_ADD, txhat, bin(&sc, KILN_OP_MUL, xc, ts));
        acc = n->w ? bin(&sc, KILN_OP_MUL, txhat, n->w) : txhat;
    }
    if (n->tw) {
        kiln_tensor *term = bin(&sc, KILN_OP_MUL, bin(&sc, KILN_OP_MUL, xc, n->s), n->tw);
        acc = acc ? bin(&sc, KILN_OP_ADD, acc, term) : term;
    }
    if (n->tb) acc = acc ? bin(&sc, KILN_OP_ADD, acc, n->tb) : n->tb;
    return done(&sc, acc, ty);
}

/* t cast to dtype d and reshaped to m's shape (new reference; NULL stays NULL) */
static kiln_status to_meta(kiln_tensor *t, const kiln_meta *m, kiln_tensor **out) {
    *out = NULL;
    if (!t) return KILN_OK;
    kiln_tensor *c = NULL;
    if (t->meta.dtype != m->dtype) KILN_TRY(kiln_emit_cast(t, m->dtype, &c));
    else kiln_tensor_retain(t), c = t;
    kiln_status s = kiln_emit_reshape(c, m->ndim, m->shape, out);
    kiln_tensor_release(c);
    return s;
}

/* the three (or two) outputs' tangents of a normalization set up in n; stats: the output index of
 * the mean (-1: none) and of the inverse deviation */
static kiln_status norm_finish(const kiln_grad_ctx *ctx, const norm_jvp *n, int mean_out, int s_out, kiln_tensor **tout) {
    kiln_tensor *tm = NULL, *ts = NULL;
    kiln_status s = norm_stats_tangents(n, &tm, &ts);
    if (s == KILN_OK) s = norm_out_tangent(n, tm, ts, &tout[0]);
    if (s == KILN_OK && mean_out >= 0) s = to_meta(tm, &ctx->out_meta[mean_out], &tout[mean_out]);
    if (s == KILN_OK) s = to_meta(ts, &ctx->out_meta[s_out], &tout[s_out]);
    kiln_tensor_release(tm), kiln_tensor_release(ts);
    return s;
}

/* a tensor of x's dtype (a statistic kept in float32 for 16-bit x): new reference */
static kiln_status in_dtype(kiln_tensor *t, kiln_dtype d, kiln_tensor **out) {
    if (t->meta.dtype == d) return kiln_tensor_retain(t), *out = t, KILN_OK;
    return kiln_emit_cast(t, d, out);
}

/* layer_norm(x, w, b) -> (y, mean, rstd); rms_norm(x, w) -> (y, rstd): over the i[0] trailing axes */
static kiln_status trailing_norm(const kiln_grad_ctx *ctx, kiln_tensor *const *tin, kiln_tensor **tout, bool centered) {
    const kiln_meta *xm = &ctx->in_meta[0];
    int naxes = (int)ctx->attrs->i[KILN_A_NORM_NAXES];
    norm_jvp n = {.x = ctx->in[0], .w = ctx->in[1], .tx = tin[0], .tw = tin[1], .tb = centered ? tin[2] : NULL,
                  .batch = true, .centered = centered};
    for (int d = xm->ndim - naxes; d < xm->ndim; d++) n.mask |= 1ull << d;
    kiln_tensor *m = NULL, *sd = NULL;
    kiln_status s = centered ? in_dtype(ctx->out[1], xm->dtype, &m) : KILN_OK;
    if (s == KILN_OK) s = in_dtype(ctx->out[centered ? 2 : 1], xm->dtype, &sd);
    n.m = m, n.s = sd;
    if (s == KILN_OK) s = norm_finish(ctx, &n, centered ? 1 : -1, centered ? 2 : 1, tout);
    kiln_tensor_release(m), kiln_tensor_release(sd);
    return s;
}

JVP(layer_norm) { return trailing_norm(ctx, tin, tout, true); }
JVP(rms_norm) { return trailing_norm(ctx, tin, tout, false); }

/* batch_norm(x, gamma, beta, running_mean, running_var) -> (y, mean, invstd): per channel (axis 1);
 * batch statistics in training (or without running ones), else the running ones (constants) */
JVP(batch_norm) {
    const kiln_meta *xm = &ctx->in_meta[0];
    bool batch = ctx->attrs->i[KILN_A_BATCH_NORM_TRAINING] != 0 || kiln_meta_numel(&ctx->in_meta[3]) == 0;
    int64_t shape[KILN_MAX_DIMS];
    for (int d = 0; d < xm->ndim; d++) shape[d] = d == 1 ? xm->shape[1] : 1;
    kiln_meta cm;
    kiln_meta_set(&cm, xm->dtype, xm->ndim, shape);
    kiln_tensor *v[5] = {NULL}; /* m, s, w, tw, tb as (1, C, 1, ...) */
    kiln_tensor *src[5] = {ctx->out[1], ctx->out[2], ctx->in[1], tin[1], tin[2]};
    kiln_status s = KILN_OK;
    for (int k = 0; k < 5 && s == KILN_OK; k++) s = to_meta(src[k], &cm, &v[k]);
    norm_jvp n = {.x = ctx->in[0], .m = v[0], .s = v[1], .w = v[2], .tx = tin[0], .tw = v[3], .tb = v[4],
                  .batch = batch, .centered = true};
    for (int d = 0; d < xm->ndim; d++)
        if (d != 1) n.mask |= 1ull << d;
    if (s == KILN_OK) s = norm_finish(ctx, &n, 1, 2, tout);
    kiln_release_all(v, 5);
    return s;
}

/* ---- max pooling ----------------------------------------------------------------------------------
 * Each output takes the tangent at its window's first maximum in row-major order (the element the
 * reverse rule gives the gradient to): over the window offsets (a, b), the strided slices of x and
 * t at that offset (x padded with -inf, t with 0), the first offset whose x equals the output. */

static kiln_status slice_nchw(kiln_tensor *x, const int64_t *start, const int64_t *step, const int64_t *len,
                              kiln_op op, kiln_tensor *value, kiln_tensor **out) {
    kiln_attrs a;
    kiln_attrs_clear(&a);
    for (int d = 0; d < 8; d++) a.i[KILN_A_SLICE_START + d] = d < 4 ? start[d] : 0;
    for (int d = 0; d < 8; d++) a.i[KILN_A_SLICE_STEP + d] = d < 4 ? step[d] : 1;
    for (int d = 0; d < 8; d++) a.i[KILN_A_SLICE_LENGTH + d] = d < 4 ? len[d] : 0;
    a.ni = 24;
    kiln_tensor *in[2] = {x, value};
    return kiln_apply(op, value ? 2 : 1, in, &a, out);
}

/* x written at (top, left) of a fresh tensor of padded's meta filled with fill (new reference) */
static kiln_status padded(kiln_tensor *x, const kiln_meta *m, double fill, int64_t top, int64_t left, kiln_tensor **out) {
    kiln_tensor *base = NULL;
    KILN_TRY(kiln_emit_full(m, fill, &base));
    const int64_t *sh = x->meta.shape;
    int64_t start[4] = {0, 0, top, left}, step[4] = {1, 1, 1, 1}, len[4] = {sh[0], sh[1], sh[2], sh[3]};
    kiln_status s = slice_nchw(base, start, step, len, KILN_OP_SLICE_ASSIGN, x, out);
    kiln_tensor_release(base);
    return s;
}

JVP(max_pool2d) {
    if (!tin[0]) return KILN_OK;
    const kiln_meta *xm = &ctx->in_meta[0], *ym = &ctx->out_meta[0];
    const int64_t *ai = ctx->attrs->i;
    int64_t kh = ai[KILN_A_POOL_KERNEL], kw = ai[KILN_A_POOL_KERNEL + 1], sh = ai[KILN_A_POOL_STRIDE],
            sw = ai[KILN_A_POOL_STRIDE + 1], top = ai[KILN_A_POOL_PAD], left = ai[KILN_A_POOL_PAD + 2],
            dh = ai[KILN_A_POOL_DILATION], dw = ai[KILN_A_POOL_DILATION + 1];
    if (xm->ndim != 4) return kiln_error(KILN_ERR_VALUE, "jvp: max_pool2d of a %d-d input", xm->ndim);
    int64_t oh = ym->shape[2], ow = ym->shape[3];
    int64_t hp = (oh - 1) * sh + (kh - 1) * dh + 1, wp = (ow - 1) * sw + (kw - 1) * dw + 1;
    if (hp < top + xm->shape[2]) hp = top + xm->shape[2];
    if (wp < left + xm->shape[3]) wp = left + xm->shape[3];
    kiln_meta pm = *xm;
    pm.shape[2] = hp, pm.shape[3] = wp;
    kiln_tensor *xp = NULL, *tp = NULL, *taken = NULL, *acc = NULL;
    kiln_status s = padded(ctx->in[0], &pm, -INFINITY, top, left, &xp);
    if (s == KILN_OK) s = padded(tin[0], &pm, 0.0, top, left, &tp);
    kiln_meta bm = *ym;
    bm.dtype = KILN_DTYPE_BOOL;
    if (s == KILN_OK) s = kiln_emit_full(&bm, 0.0, &taken);
    if (s == KILN_OK) s = kiln_emit_full(ym, 0.0, &acc);
    int64_t step[4] = {1, 1, sh, sw}, len[4] = {ym->shape[0], ym->shape[1], oh, ow};
    for (int64_t a = 0; a < kh && s == KILN_OK; a++)
        for (int64_t b = 0; b < kw && s == KILN_OK; b++) {
            grad_scope sc = {0};
            int64_t start[4] = {0, 0, a * dh, b * dw};
            kiln_tensor *xs = NULL, *ts = NULL;
            sc.status = slice_nchw(xp, start, step, len, KILN_OP_SLICE, NULL, &xs);
            keep(&sc, sc.status, xs);
            if (sc.status == KILN_OK) sc.status = slice_nchw(tp, start, step, len, KILN_OP_SLICE, NULL, &ts), keep(&sc, sc.status, ts);
            kiln_tensor *hit = bin(&sc, KILN_OP_LOGICAL_AND, bin(&sc, KILN_OP_EQ, xs, ctx->out[0]), un(&sc, KILN_OP_LOGICAL_NOT, taken));
            kiln_tensor *next_acc = where3(&sc, hit, ts, acc), *next_taken = bin(&sc, KILN_OP_LOGICAL_OR, taken, hit);
            if (sc.status == KILN_OK) {
                kiln_tensor_retain(next_acc), kiln_tensor_retain(next_taken);
                kiln_tensor_release(acc), kiln_tensor_release(taken);
                acc = next_acc, taken = next_taken;
            }
            for (int k = 0; k < sc.ntemps; k++) kiln_tensor_release(sc.temps[k]);
            s = sc.status;
        }
    if (s == KILN_OK) *tout = acc, acc = NULL;
    kiln_tensor_release(xp), kiln_tensor_release(tp), kiln_tensor_release(taken), kiln_tensor_release(acc);
    return s;
}


/* max_pool2d_backward(grad, x): linear in grad, piecewise constant in x (no tangent term) */
JVP(max_pool2d_backward) {
    if (!tin[0]) return KILN_OK;
    kiln_tensor *in[2] = {tin[0], ctx->in[1]};
    return kiln_apply(KILN_OP_MAX_POOL2D_BACKWARD, 2, in, ctx->attrs, tout);
}

/* cumsum or cumprod of t along axis (from the end when reverse) */
static kiln_tensor *scan(grad_scope *sc, kiln_op op, kiln_tensor *t, int64_t axis, bool reverse) {
    if (!t || sc->status != KILN_OK) return NULL;
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, axis);
    kiln_attrs_push_int(&at, reverse);
    kiln_tensor *r = NULL;
    kiln_status s = kiln_apply(op, 1, &t, &at, &r);
    return keep(sc, s, r);
}

/* y_j = prod of x_i for i up to j: ty_j = sum over k <= j of t_k prod_{i <= j, i != k} x_i, exact
 * with zeros. Before a line's first zero z that is y_j cumsum(t / x)_j; from z on only k = z
 * leaves no zero factor: t_z times the running product with x_z taken as 1. */
JVP(cumprod) {
    if (!tin[0]) return KILN_OK;
    grad_scope sc = {0};
    int64_t axis = ctx->attrs->i[KILN_A_SCAN_AXIS];
    bool rev = ctx->attrs->i[KILN_A_SCAN_REVERSE] != 0;
    kiln_tensor *t = tin[0], *zero = scalar(&sc, 0.0, X), *one = scalar(&sc, 1.0, X);
    kiln_tensor *is_zero = bin(&sc, KILN_OP_EQ, X, zero);
    kiln_tensor *zeros_so_far = scan(&sc, KILN_OP_CUMSUM, is_zero, axis, rev); /* int64 */
    kiln_tensor *before = bin(&sc, KILN_OP_EQ, zeros_so_far, scalar(&sc, 0.0, zeros_so_far));
    kiln_tensor *first = bin(&sc, KILN_OP_LOGICAL_AND, is_zero,
                             bin(&sc, KILN_OP_EQ, zeros_so_far, scalar(&sc, 1.0, zeros_so_far)));
    kiln_tensor *plain = bin(&sc, KILN_OP_MUL, Y, scan(&sc, KILN_OP_CUMSUM, bin(&sc, KILN_OP_DIV, t, where3(&sc, before, X, one)), axis, rev));
    kiln_tensor *skipping = scan(&sc, KILN_OP_CUMPROD, where3(&sc, first, one, X), axis, rev);
    kiln_tensor *t_first = scan(&sc, KILN_OP_CUMSUM, where3(&sc, first, t, zero), axis, rev);
    return done(&sc, where3(&sc, before, plain, bin(&sc, KILN_OP_MUL, t_first, skipping)), tout);
}

#undef X
#undef Y

/* ---- the table ------------------------------------------------------------------------------- */


static const kiln_jvp_fn jvp_table[KILN_OP_COUNT] = {
#define KILN_OP(...)
#define KILN_JVP(ENUM, rule) [KILN_OP_##ENUM] = kiln_jvp_##rule,
#include "ops.def"
#undef KILN_JVP
#undef KILN_OP
};

kiln_jvp_fn kiln_op_jvp(kiln_op op) { return (unsigned)op < KILN_OP_COUNT ? jvp_table[op] : NULL; }
