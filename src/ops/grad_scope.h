/* Small op-emitting helpers for gradient rules written with ops (elementwise_grad.c,
 * scan_sort_grad.c); each returns a new reference or NULL with the error set. A NULL argument
 * propagates, so expressions can be chained and checked once. */
#ifndef KILN_GRAD_SCOPE_H
#define KILN_GRAD_SCOPE_H
#include "../core/internal.h"

typedef struct {
    kiln_status status;
    kiln_tensor *temps[128]; /* released at the end of a rule */
    int ntemps;
} grad_scope;

static inline kiln_tensor *keep(grad_scope *sc, kiln_status s, kiln_tensor *t) {
    if (s != KILN_OK) {
        if (sc->status == KILN_OK) sc->status = s;
        return NULL;
    }
    KILN_ASSERT(sc->ntemps < 128);
    sc->temps[sc->ntemps++] = t;
    return t;
}

static inline kiln_tensor *bin(grad_scope *sc, kiln_op op, kiln_tensor *a, kiln_tensor *b) {
    if (!a || !b || sc->status != KILN_OK) return NULL;
    kiln_tensor *t = NULL;
    kiln_status s = kiln_emit_binary(op, a, b, &t);
    return keep(sc, s, t);
}

static inline kiln_tensor *un(grad_scope *sc, kiln_op op, kiln_tensor *a) {
    if (!a || sc->status != KILN_OK) return NULL;
    kiln_tensor *t = NULL;
    kiln_status s = kiln_emit_unary(op, a, &t);
    return keep(sc, s, t);
}

/* a + b, a - b where either may be absent (a zero) */
static inline kiln_tensor *opt_add(grad_scope *sc, kiln_tensor *a, kiln_tensor *b) {
    if (!a) return b;
    if (!b) return a;
    return bin(sc, KILN_OP_ADD, a, b);
}

static inline kiln_tensor *opt_sub(grad_scope *sc, kiln_tensor *a, kiln_tensor *b) {
    if (!b) return a;
    if (!a) return un(sc, KILN_OP_NEG, b);
    return bin(sc, KILN_OP_SUB, a, b);
}

static inline kiln_tensor *scalar(grad_scope *sc, double v, const kiln_tensor *like) {
    if (!like || sc->status != KILN_OK) return NULL;
    kiln_tensor *t = NULL;
    kiln_status s = kiln_emit_scalar(v, like->meta.dtype, &t);
    return keep(sc, s, t);
}

static inline kiln_tensor *where3(grad_scope *sc, kiln_tensor *c, kiln_tensor *x, kiln_tensor *y) {
    if (!c || !x || !y || sc->status != KILN_OK) return NULL;
    kiln_tensor *in[3] = {c, x, y}, *t = NULL;
    kiln_status s = kiln_apply(KILN_OP_WHERE, 3, in, NULL, &t);
    return keep(sc, s, t);
}

/* Zeros of g's shape and dtype as where(false, g, 0): no size attribute, so the sizes follow g's
 * (symbolic ones included), and a NaN or infinite g still gives 0. */
static inline kiln_tensor *zeros_like(grad_scope *sc, kiln_tensor *g) {
    if (!g || sc->status != KILN_OK) return NULL;
    kiln_tensor *no = NULL;
    kiln_status s = kiln_emit_scalar(0.0, KILN_DTYPE_BOOL, &no);
    return where3(sc, keep(sc, s, no), g, scalar(sc, 0.0, g));
}

/* t summed along a softmax op's axis, kept as size 1 (softmax_backward's s = sum(g y)). */
static inline kiln_tensor *softmax_row_sum(grad_scope *sc, const kiln_grad_ctx *ctx, kiln_tensor *t) {
    if (!t || sc->status != KILN_OK) return NULL;
    kiln_tensor *r = NULL;
    kiln_status s = kiln_emit_reduce(KILN_OP_SUM, t, 1ull << ctx->attrs->i[KILN_A_SOFTMAX_AXIS], true, &r);
    return keep(sc, s, r);
}

/* Ends a rule written with the scope: releases its temps; on success hands out[k] = v[k] (retained)
 * for k < n, where v[k] is not NULL. */
static inline kiln_status hand_out(grad_scope *sc, kiln_tensor **v, int n, kiln_tensor **out) {
    if (sc->status == KILN_OK)
        for (int k = 0; k < n; k++)
            if (v[k]) kiln_tensor_retain(v[k]), out[k] = v[k];
    for (int k = 0; k < sc->ntemps; k++) kiln_tensor_release(sc->temps[k]);
    if (sc->status != KILN_OK) kiln_release_all(out, n);
    return sc->status;
}

/* Finishes a rule: gin[j] = sum_to(value, input j's shape) when needed; releases temps. */
static inline kiln_status finish(grad_scope *sc, const kiln_grad_ctx *ctx, kiln_tensor **gin, kiln_tensor *const *values) {
    for (int j = 0; j < ctx->nin && sc->status == KILN_OK; j++) {
        if (!ctx->needs_grad[j]) continue;
        if (!values[j]) {
            if (sc->status == KILN_OK) sc->status = kiln_error(KILN_ERR_RUNTIME, "gradient of input %d missing", j);
            break;
        }
        sc->status = kiln_emit_sum_to(values[j], &ctx->in_meta[j], &gin[j]);
    }
    for (int k = 0; k < sc->ntemps; k++) kiln_tensor_release(sc->temps[k]);
    if (sc->status != KILN_OK) kiln_release_all(gin, ctx->nin);
    return sc->status;
}

#endif
