/* Gradient rules of the reductions and the softmax family, written with ops only (kiln_emit_*,
 * kiln_apply) so a traced backward is an ordinary graph. */
#include "../core/hooks.h"
#include "grad_scope.h"

static uint64_t grad_mask(const kiln_grad_ctx *ctx) {
    return ctx->in_meta[0].ndim ? (uint64_t)ctx->attrs->i[0] : 0;
}

/* Number of input elements behind each output element. */
static int64_t grad_count(const kiln_grad_ctx *ctx) {
    const kiln_meta *m = &ctx->in_meta[0];
    uint64_t mask = grad_mask(ctx);
    int64_t n = 1;
    for (int d = 0; d < m->ndim; d++)
        if ((mask >> d) & 1u) n *= m->shape[d];
    return n;
}

/* t (an output of the reduction, or its gradient) with the reduced axes kept as size 1, so it
 * broadcasts against the input. New reference. */
static kiln_status to_keepdims(const kiln_grad_ctx *ctx, kiln_tensor *t, kiln_tensor **out) {
    const kiln_meta *m = &ctx->in_meta[0];
    if (ctx->attrs->i[1] || t->meta.ndim == m->ndim) {
        kiln_tensor_retain(t);
        *out = t;
        return KILN_OK;
    }
    uint64_t mask = grad_mask(ctx);
    int64_t shape[KILN_MAX_DIMS];
    for (int d = 0; d < m->ndim; d++) shape[d] = (mask >> d) & 1u ? 1 : m->shape[d];
    return kiln_emit_reshape(t, m->ndim, shape, out);
}

#define RELEASE_TMP() kiln_release_all(tmp, (int)(sizeof tmp / sizeof tmp[0]))

/* A constant for scaling gradients of dtype d: float32 for 16-bit floats, whose range cannot
 * hold large counts (the engine casts the result back to the input's dtype). */
static kiln_status grad_scalar(double v, kiln_dtype d, kiln_tensor **out) {
    bool half = d == KILN_DTYPE_FLOAT16 || d == KILN_DTYPE_BFLOAT16;
    return kiln_emit_scalar(v, half ? KILN_DTYPE_FLOAT32 : d, out);
}

/* The count of input elements behind each output element as a 0-d tensor of dtype d (float32 for
 * 16-bit floats, as grad_scalar), less `minus` and at least 0. A constant, except while a
 * dynamic-shape capture records: then ops count the elements (ones of the input's shape, summed),
 * so a graph rebound to other sizes counts again (its passes fold the count into a constant). */
static kiln_status grad_count_tensor(const kiln_grad_ctx *ctx, kiln_dtype d, double minus, kiln_tensor **out) {
    if (!kiln_thread.trace_symbolic) {
        double n = (double)grad_count(ctx) - minus;
        return grad_scalar(n > 0 ? n : 0.0, d, out);
    }
    bool half = d == KILN_DTYPE_FLOAT16 || d == KILN_DTYPE_BFLOAT16;
    kiln_meta m = ctx->in_meta[0]; /* the reduced axes' sizes, 1 elsewhere */
    m.dtype = half ? KILN_DTYPE_FLOAT32 : d;
    uint64_t mask = grad_mask(ctx);
    for (int k = 0; k < m.ndim; k++)
        if (!((mask >> k) & 1u)) m.shape[k] = 1;
    kiln_tensor *tmp[5] = {NULL}; /* ones, count, minus, count - minus, 0 */
    kiln_status s = kiln_emit_full(&m, 1.0, &tmp[0]);
    if (s == KILN_OK) s = kiln_emit_reduce(KILN_OP_SUM, tmp[0], m.ndim ? (1ull << m.ndim) - 1 : 0, false, &tmp[1]);
    if (s == KILN_OK && minus == 0) {
        *out = tmp[1];
        tmp[1] = NULL;
    } else {
        if (s == KILN_OK) s = grad_scalar(minus, m.dtype, &tmp[2]);
        if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_SUB, tmp[1], tmp[2], &tmp[3]);
        if (s == KILN_OK) s = grad_scalar(0.0, m.dtype, &tmp[4]);
        if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_MAXIMUM, tmp[3], tmp[4], out);
    }
    RELEASE_TMP();
    return s;
}

/* sum: the gradient spread back over the reduced axes */
KILN_GRAD(sum) {
    if (!ctx->needs_grad[0] || !gout[0]) return KILN_OK;
    const kiln_meta *m = &ctx->in_meta[0];
    kiln_tensor *g;
    KILN_TRY(to_keepdims(ctx, gout[0], &g));
    kiln_status s = kiln_emit_expand(g, m->ndim, m->shape, &gin[0]);
    kiln_tensor_release(g);
    return s;
}

/* mean: sum's gradient divided by the count */
KILN_GRAD(mean) {
    if (!ctx->needs_grad[0] || !gout[0]) return KILN_OK;
    const kiln_meta *m = &ctx->in_meta[0];
    kiln_tensor *tmp[3] = {NULL};
    kiln_status s = to_keepdims(ctx, gout[0], &tmp[0]);
    if (s == KILN_OK) s = grad_count_tensor(ctx, gout[0]->meta.dtype, 0, &tmp[1]);
    if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_DIV, tmp[0], tmp[1], &tmp[2]);
    if (s == KILN_OK) s = kiln_emit_expand(tmp[2], m->ndim, m->shape, &gin[0]);
    RELEASE_TMP();
    return s;
}

/* prod: g * prod / x. Assumes x has no zeros (a zero gives inf or nan, not the product of the
 * other elements). */
KILN_GRAD(prod) {
    if (!ctx->needs_grad[0] || !gout[0]) return KILN_OK;
    kiln_tensor *tmp[3] = {NULL};
    kiln_status s = to_keepdims(ctx, gout[0], &tmp[0]);
    if (s == KILN_OK) s = to_keepdims(ctx, ctx->out[0], &tmp[1]);
    if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_MUL, tmp[0], tmp[1], &tmp[2]);
    if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_DIV, tmp[2], ctx->in[0], &gin[0]);
    RELEASE_TMP();
    return s;
}

/* max, min: the gradient goes to the elements equal to the result, split evenly among ties */
static kiln_status grad_extreme(const kiln_grad_ctx *ctx, kiln_tensor *const *gout, kiln_tensor **gin) {
    if (!ctx->needs_grad[0] || !gout[0]) return KILN_OK;
    kiln_tensor *x = ctx->in[0];
    kiln_tensor *tmp[6] = {NULL};
    kiln_status s = to_keepdims(ctx, gout[0], &tmp[0]);
    if (s == KILN_OK) s = to_keepdims(ctx, ctx->out[0], &tmp[1]);
    if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_EQ, x, tmp[1], &tmp[2]);
    if (s == KILN_OK) s = kiln_emit_cast(tmp[2], x->meta.dtype, &tmp[3]);
    if (s == KILN_OK) s = kiln_emit_reduce(KILN_OP_SUM, tmp[3], grad_mask(ctx), true, &tmp[4]);
    if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_DIV, tmp[0], tmp[4], &tmp[5]);
    if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_MUL, tmp[3], tmp[5], &gin[0]);
    RELEASE_TMP();
    return s;
}

KILN_GRAD(max) { return grad_extreme(ctx, gout, gin); }
KILN_GRAD(min) { return grad_extreme(ctx, gout, gin); }

static int64_t grad_ddof(const kiln_grad_ctx *ctx) { return ctx->attrs->ni > 2 ? ctx->attrs->i[2] : 0; }

/* num / (N - ddof), N - ddof at least 0, as a 0-d tensor of dtype d (see grad_count_tensor). */
static kiln_status grad_over_dof(const kiln_grad_ctx *ctx, double num, kiln_dtype d, kiln_tensor **out) {
    if (!kiln_thread.trace_symbolic) {
        int64_t n = grad_count(ctx) - grad_ddof(ctx);
        return grad_scalar(num / (n > 0 ? (double)n : 0.0), d, out);
    }
    kiln_tensor *tmp[2] = {NULL};
    kiln_status s = grad_scalar(num, d, &tmp[0]);
    if (s == KILN_OK) s = grad_count_tensor(ctx, d, (double)grad_ddof(ctx), &tmp[1]);
    if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_DIV, tmp[0], tmp[1], out);
    RELEASE_TMP();
    return s;
}

/* x - mean(x) over the reduced axes (kept as size 1): *mean and *diff, new references. */
static kiln_status centered(const kiln_grad_ctx *ctx, kiln_tensor **mean, kiln_tensor **diff) {
    KILN_TRY(kiln_emit_reduce(KILN_OP_MEAN, ctx->in[0], grad_mask(ctx), true, mean));
    return kiln_emit_binary(KILN_OP_SUB, ctx->in[0], *mean, diff);
}

/* var: g * 2 (x - mean) / (N - ddof) */
KILN_GRAD(var) {
    if (!ctx->needs_grad[0] || !gout[0]) return KILN_OK;
    kiln_tensor *tmp[5] = {NULL};
    kiln_status s = centered(ctx, &tmp[0], &tmp[1]);
    if (s == KILN_OK) s = to_keepdims(ctx, gout[0], &tmp[2]);
    if (s == KILN_OK) s = grad_over_dof(ctx, 2.0, gout[0]->meta.dtype, &tmp[3]);
    if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_MUL, tmp[2], tmp[3], &tmp[4]);
    if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_MUL, tmp[1], tmp[4], &gin[0]);
    RELEASE_TMP();
    return s;
}

/* std: g * (x - mean) / ((N - ddof) std) */
KILN_GRAD(std) {
    if (!ctx->needs_grad[0] || !gout[0]) return KILN_OK;
    kiln_tensor *tmp[7] = {NULL};
    kiln_status s = centered(ctx, &tmp[0], &tmp[1]);
    if (s == KILN_OK) s = to_keepdims(ctx, gout[0], &tmp[2]);
    if (s == KILN_OK) s = to_keepdims(ctx, ctx->out[0], &tmp[3]);
    if (s == KILN_OK) s = grad_count_tensor(ctx, ctx->out[0]->meta.dtype, (double)grad_ddof(ctx), &tmp[4]);
    if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_MUL, tmp[3], tmp[4], &tmp[5]);
    if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_DIV, tmp[2], tmp[5], &tmp[6]);
    if (s == KILN_OK) s = kiln_emit_binary(KILN_OP_MUL, tmp[1], tmp[6], &gin[0]);
    RELEASE_TMP();
    return s;
}

/* softmax, log_softmax: their backward ops over (grad, y), same axis attribute */
static kiln_status grad_softmax(kiln_op backward, const kiln_grad_ctx *ctx, kiln_tensor *const *gout,
                                kiln_tensor **gin) {
    if (!ctx->needs_grad[0] || !gout[0]) return KILN_OK;
    kiln_tensor *ins[2] = {gout[0], ctx->out[0]};
    return kiln_apply(backward, 2, ins, ctx->attrs, &gin[0]);
}

KILN_GRAD(softmax) { return grad_softmax(KILN_OP_SOFTMAX_BACKWARD, ctx, gout, gin); }
KILN_GRAD(log_softmax) { return grad_softmax(KILN_OP_LOG_SOFTMAX_BACKWARD, ctx, gout, gin); }

/* z = softmax_backward(g, y) = y (g - s), s = sum(g y) along the axis. Its Jacobian in g is
 * softmax's (symmetric): dg = softmax_backward(c, y); in y: dy = c (g - s) - g sum(c y). */
KILN_GRAD(softmax_backward) {
    grad_scope sc = {0};
    kiln_tensor *g = ctx->in[0], *y = ctx->in[1], *c = gout[0], *v[2] = {NULL, NULL};
    if (ctx->needs_grad[0]) {
        kiln_tensor *in[2] = {c, y}, *t = NULL;
        kiln_status st = kiln_apply(KILN_OP_SOFTMAX_BACKWARD, 2, in, ctx->attrs, &t);
        v[0] = keep(&sc, st, t);
    }
    if (ctx->needs_grad[1]) {
        kiln_tensor *s = softmax_row_sum(&sc, ctx, bin(&sc, KILN_OP_MUL, g, y));
        v[1] = bin(&sc, KILN_OP_SUB, bin(&sc, KILN_OP_MUL, c, bin(&sc, KILN_OP_SUB, g, s)),
                   bin(&sc, KILN_OP_MUL, g, softmax_row_sum(&sc, ctx, bin(&sc, KILN_OP_MUL, c, y))));
    }
    return finish(&sc, ctx, gin, v);
}

/* z = log_softmax_backward(g, y) = g - exp(y) sum(g): dg = c - sum(c exp(y)), dy = -c exp(y) sum(g) */
KILN_GRAD(log_softmax_backward) {
    grad_scope sc = {0};
    kiln_tensor *g = ctx->in[0], *y = ctx->in[1], *c = gout[0], *v[2] = {NULL, NULL};
    kiln_tensor *e = un(&sc, KILN_OP_EXP, y);
    if (ctx->needs_grad[0]) v[0] = bin(&sc, KILN_OP_SUB, c, softmax_row_sum(&sc, ctx, bin(&sc, KILN_OP_MUL, c, e)));
    if (ctx->needs_grad[1])
        v[1] = un(&sc, KILN_OP_NEG, bin(&sc, KILN_OP_MUL, bin(&sc, KILN_OP_MUL, c, e), softmax_row_sum(&sc, ctx, g)));
    return finish(&sc, ctx, gin, v);
}
