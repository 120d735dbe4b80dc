/* Small wrappers that emit ops through kiln_apply; gradient rules are written with these. */
#include "../core/internal.h"

kiln_status kiln_emit_unary(kiln_op op, kiln_tensor *a, kiln_tensor **out) {
    return kiln_apply(op, 1, &a, NULL, out);
}

kiln_status kiln_emit_binary(kiln_op op, kiln_tensor *a, kiln_tensor *b, kiln_tensor **out) {
    kiln_tensor *in[2] = {a, b};
    return kiln_apply(op, 2, in, NULL, out);
}

kiln_status kiln_emit_cast(kiln_tensor *a, kiln_dtype dtype, kiln_tensor **out) {
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, dtype);
    return kiln_apply(KILN_OP_CAST, 1, &a, &at, out);
}

kiln_status kiln_emit_full(const kiln_meta *m, double value, kiln_tensor **out) {
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, m->dtype);
    kiln_attrs_push_int(&at, m->ndim);
    for (int d = 0; d < m->ndim; d++) kiln_attrs_push_int(&at, m->shape[d]);
    kiln_attrs_push_float(&at, value);
    return kiln_apply(KILN_OP_FULL, 0, NULL, &at, out);
}

kiln_status kiln_emit_scalar(double value, kiln_dtype dtype, kiln_tensor **out) {
    kiln_meta m = {.dtype = dtype, .ndim = 0};
    return kiln_emit_full(&m, value, out);
}

kiln_status kiln_emit_reshape(kiln_tensor *a, int ndim, const int64_t *shape, kiln_tensor **out) {
    kiln_attrs at;
    kiln_attrs_clear(&at);
    for (int d = 0; d < ndim; d++) kiln_attrs_push_int(&at, shape[d]);
    return kiln_apply(KILN_OP_RESHAPE, 1, &a, &at, out);
}

kiln_status kiln_emit_permute(kiln_tensor *a, const int64_t *perm, kiln_tensor **out) {
    kiln_attrs at;
    kiln_attrs_clear(&at);
    for (int d = 0; d < a->meta.ndim; d++) kiln_attrs_push_int(&at, perm[d]);
    return kiln_apply(KILN_OP_PERMUTE, 1, &a, &at, out);
}

kiln_status kiln_emit_expand(kiln_tensor *a, int ndim, const int64_t *shape, kiln_tensor **out) {
    kiln_attrs at;
    kiln_attrs_clear(&at);
    for (int d = 0; d < ndim; d++) kiln_attrs_push_int(&at, shape[d]);
    return kiln_apply(KILN_OP_EXPAND, 1, &a, &at, out);
}

kiln_status kiln_emit_reduce(kiln_op op, kiln_tensor *a, uint64_t mask, bool keepdims, kiln_tensor **out) {
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, (int64_t)mask);
    kiln_attrs_push_int(&at, keepdims);
    return kiln_apply(op, 1, &a, &at, out);
}

kiln_status kiln_emit_sum_to(kiln_tensor *g, const kiln_meta *target, kiln_tensor **out) {
    int lead = g->meta.ndim - target->ndim;
    uint64_t mask = 0;
    for (int d = 0; d < g->meta.ndim; d++) {
        int td = d - lead;
        if (td < 0 || (target->shape[td] == 1 && g->meta.shape[d] != 1)) mask |= 1ull << d;
    }
    if (!mask && lead == 0) {
        kiln_tensor_retain(g);
        *out = g;
        return KILN_OK;
    }
    kiln_tensor *summed;
    KILN_TRY(kiln_emit_reduce(KILN_OP_SUM, g, mask, true, &summed));
    kiln_status s = kiln_emit_reshape(summed, target->ndim, target->shape, out);
    kiln_tensor_release(summed);
    return s;
}

kiln_status kiln_emit_transpose_last(kiln_tensor *a, kiln_tensor **out) {
    int64_t perm[KILN_MAX_DIMS];
    int nd = a->meta.ndim;
    for (int d = 0; d < nd; d++) perm[d] = d;
    if (nd >= 2) {
        perm[nd - 2] = nd - 1;
        perm[nd - 1] = nd - 2;
    }
    return kiln_emit_permute(a, perm, out);
}
