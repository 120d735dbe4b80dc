/* Gradient rules of cumsum, cumprod and sort, written with ops (so a traced backward is an
 * ordinary graph). */
#include "grad_scope.h"

#define X (ctx->in[0])
#define Y (ctx->out[0])
#define G (gout[0])

/* cumsum or cumprod of t along the rule's axis, from the end when reverse */
static kiln_tensor *scan_op(grad_scope *sc, kiln_op op, kiln_tensor *t, int64_t axis, bool reverse) {
    if (!t || sc->status != KILN_OK) return NULL;
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, axis);
    kiln_attrs_push_int(&at, reverse);
    kiln_tensor *r = NULL;
    kiln_status s = kiln_apply(op, 1, &t, &at, &r);
    return keep(sc, s, r);
}

/* y_j = sum of x_k for k up to j (or from j, reverse): dx_k = the sum of g_j over the j that
 * include k, a scan the other way */
KILN_GRAD(cumsum) {
    if (!ctx->needs_grad[0] || !G) return KILN_OK;
    grad_scope sc = {0};
    kiln_tensor *v[1] = {scan_op(&sc, KILN_OP_CUMSUM, G, ctx->attrs->i[0], !ctx->attrs->i[1])};
    return finish(&sc, ctx, gin, v);
}

/* y_j = prod of x_i for i <= j (forward; reverse mirrors it): dx_k = sum over j >= k of g_j *
 * prod_{i <= j, i != k} x_i, exact with zeros. Before a line's first zero z that is
 * rcumsum(g y)_k / x_k; at z it is rcumsum(g P)_z, P the running product with x_z taken as 1;
 * after z every term holds x_z = 0. rcumsum: the scan the other way. */
KILN_GRAD(cumprod) {
    if (!ctx->needs_grad[0] || !G) return KILN_OK;
    grad_scope sc = {0};
    int64_t axis = ctx->attrs->i[0];
    bool rev = ctx->attrs->i[1] != 0;
    kiln_tensor *zero = scalar(&sc, 0.0, X), *one = scalar(&sc, 1.0, X);
    kiln_tensor *is_zero = bin(&sc, KILN_OP_EQ, X, zero);
    kiln_tensor *zeros_so_far = scan_op(&sc, KILN_OP_CUMSUM, is_zero, axis, rev); /* int64 */
    kiln_tensor *before = bin(&sc, KILN_OP_EQ, zeros_so_far, scalar(&sc, 0.0, zeros_so_far));
    kiln_tensor *first = bin(&sc, KILN_OP_LOGICAL_AND, is_zero,
                             bin(&sc, KILN_OP_EQ, zeros_so_far, scalar(&sc, 1.0, zeros_so_far)));
    kiln_tensor *plain = bin(&sc, KILN_OP_DIV, scan_op(&sc, KILN_OP_CUMSUM, bin(&sc, KILN_OP_MUL, G, Y), axis, !rev),
                             where3(&sc, before, X, one));
    kiln_tensor *skipping = scan_op(&sc, KILN_OP_CUMPROD, where3(&sc, first, one, X), axis, rev);
    kiln_tensor *at_zero = scan_op(&sc, KILN_OP_CUMSUM, bin(&sc, KILN_OP_MUL, G, skipping), axis, !rev);
    kiln_tensor *v[1] = {where3(&sc, before, plain, where3(&sc, first, at_zero, zero))};
    return finish(&sc, ctx, gin, v);
}

/* values = x at the sorted positions: each gradient goes back to the position it came from
 * (indices have none) */
KILN_GRAD(sort) {
    if (!ctx->needs_grad[0] || !G) return KILN_OK;
    grad_scope sc = {0};
    kiln_tensor *v[1] = {NULL};
    kiln_tensor *zeros = zeros_like(&sc, G);
    if (zeros) {
        kiln_attrs at;
        kiln_attrs_clear(&at);
        kiln_attrs_push_int(&at, ctx->attrs->i[0]);
        kiln_tensor *in[3] = {zeros, ctx->out[1], G}, *r = NULL;
        kiln_status s = kiln_apply(KILN_OP_SCATTER_ADD_ELEMENTS, 3, in, &at, &r);
        v[0] = keep(&sc, s, r);
    }
    return finish(&sc, ctx, gin, v);
}
