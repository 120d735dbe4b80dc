/* View ops: reshape, permute, expand, slice share their input's storage. slice_assign writes
 * into a slice in place. */
#include "view.h"

/* ---- reshape ---------------------------------------------------------------------------- */

KILN_INFER(reshape) {
    (void)nin;
    const kiln_meta *m = &in[0]->meta;
    if (a->ni > KILN_MAX_DIMS)
        return kiln_error(KILN_ERR_VALUE, "reshape: at most %d dimensions, got %d", KILN_MAX_DIMS, a->ni);
    int64_t n;
    kiln_status s = kiln_shape_numel_checked(a->ni, a->i, &n);
    if (s != KILN_OK) return kiln_error_context(s, "reshape");
    if (n != kiln_meta_numel(m)) {
        char buf[160];
        kiln_meta target;
        kiln_meta_set(&target, m->dtype, a->ni, a->i);
        char buf2[160];
        return kiln_error(KILN_ERR_VALUE, "reshape: cannot reshape a tensor of shape %s (%lld elements) into shape %s",
                          kiln_shape_str(m, buf, sizeof buf), (long long)kiln_meta_numel(m),
                          kiln_shape_str(&target, buf2, sizeof buf2));
    }
    kiln_meta_set(out, m->dtype, a->ni, a->i);
    return KILN_OK;
}

/* Strides that view (in, in_strides) with shape (nd, shape) without copying, if any (as torch's
 * computeStride). */
static bool reshape_strides(const kiln_meta *m, const int64_t *in_strides, int nd, const int64_t *shape,
                            int64_t *strides) {
    if (kiln_meta_numel(m) == 0 || m->ndim == 0) {
        kiln_contiguous_strides(nd, shape, strides);
        return true;
    }
    int view_d = nd - 1;
    int64_t chunk_base_stride = in_strides[m->ndim - 1], tensor_numel = 1, view_numel = 1;
    for (int td = m->ndim - 1; td >= 0; td--) {
        tensor_numel *= m->shape[td];
        if (td == 0 || (m->shape[td - 1] != 1 && in_strides[td - 1] != tensor_numel * chunk_base_stride)) {
            while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
                strides[view_d] = view_numel * chunk_base_stride;
                view_numel *= shape[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return false;
            if (td > 0) {
                chunk_base_stride = in_strides[td - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    return view_d == -1;
}

bool kiln_view_strides(kiln_op op, const kiln_attrs *a, const kiln_meta *in, const int64_t *in_strides,
                       int64_t *strides) {
    switch (op) {
    case KILN_OP_RESHAPE: return reshape_strides(in, in_strides, a->ni, a->i, strides);
    case KILN_OP_PERMUTE:
        for (int d = 0; d < in->ndim; d++) strides[d] = in_strides[a->i[d]];
        return true;
    case KILN_OP_EXPAND: { /* broadcast axes get stride 0 */
        int lead = a->ni - in->ndim;
        for (int d = 0; d < a->ni; d++) {
            int sd = d - lead;
            strides[d] = (sd < 0 || (in->shape[sd] == 1 && a->i[d] != 1)) ? 0 : in_strides[sd];
        }
        return true;
    }
    case KILN_OP_SLICE:
        for (int d = 0; d < in->ndim; d++) strides[d] = in_strides[d] * a->i[8 + d];
        return true;
    default:
        if (!(kiln_op_table[op].flags & KILN_OPF_MUTATES)) return false;
        for (int d = 0; d < in->ndim; d++) strides[d] = in_strides[d];
        return true;
    }
}

KILN_KERNEL(reshape) {
    (void)nin;
    kiln_tensor *x = in[0];
    {
        int64_t strides[KILN_MAX_DIMS];
        if (kiln_view_strides(KILN_OP_RESHAPE, a, &x->meta, x->strides, strides))
            return kiln_tensor_view(x, a->ni, a->i, strides, x->offset, &out[0]);
    }
    /* a copy: x's elements in row-major order, written once through a view of the new buffer
     * with x's shape */
    KILN_TRY(kiln_tensor_empty(x->meta.dtype, a->ni, a->i, &out[0]));
    int64_t strides[KILN_MAX_DIMS];
    kiln_contiguous_strides(x->meta.ndim, x->meta.shape, strides);
    kiln_tensor *dst = NULL;
    kiln_status s = kiln_tensor_view(out[0], x->meta.ndim, x->meta.shape, strides, out[0]->offset, &dst);
    if (s == KILN_OK) s = kiln_copy_into(dst, x);
    kiln_tensor_release(dst);
    if (s != KILN_OK) {
        kiln_tensor_release(out[0]);
        out[0] = NULL;
    }
    return s;
}

KILN_GRAD(reshape) {
    return kiln_emit_reshape(gout[0], ctx->in_meta[0].ndim, ctx->in_meta[0].shape, &gin[0]);
}

/* ---- permute ---------------------------------------------------------------------------- */

KILN_INFER(permute) {
    (void)nin;
    const kiln_meta *m = &in[0]->meta;
    if (a->ni != m->ndim) {
        char buf[160];
        return kiln_error(KILN_ERR_VALUE, "permute: got %d axes for a tensor of shape %s", a->ni,
                          kiln_shape_str(m, buf, sizeof buf));
    }
    unsigned seen = 0;
    for (int d = 0; d < m->ndim; d++) {
        int64_t p = a->i[d];
        if (p < 0 || p >= m->ndim || (seen >> p) & 1u)
            return kiln_error(KILN_ERR_VALUE, "permute: axes must be a permutation of 0..%d", m->ndim - 1);
        seen |= 1u << p;
        out->shape[d] = m->shape[p];
    }
    out->dtype = m->dtype;
    out->ndim = m->ndim;
    return KILN_OK;
}

KILN_KERNEL(permute) {
    (void)nin;
    kiln_tensor *x = in[0];
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS];
    for (int d = 0; d < x->meta.ndim; d++) shape[d] = x->meta.shape[a->i[d]];
    kiln_view_strides(KILN_OP_PERMUTE, a, &x->meta, x->strides, strides);
    return kiln_tensor_view(x, x->meta.ndim, shape, strides, x->offset, &out[0]);
}

KILN_GRAD(permute) {
    int64_t inverse[KILN_MAX_DIMS];
    for (int d = 0; d < ctx->attrs->ni; d++) inverse[ctx->attrs->i[d]] = d;
    return kiln_emit_permute(gout[0], inverse, &gin[0]);
}

/* ---- expand (broadcast_to) -------------------------------------------------------------- */

KILN_INFER(expand) {
    (void)nin;
    const kiln_meta *m = &in[0]->meta;
    int lead = a->ni - m->ndim;
    bool ok = a->ni <= KILN_MAX_DIMS && lead >= 0;
    for (int d = 0; ok && d < m->ndim; d++) ok = m->shape[d] == a->i[lead + d] || m->shape[d] == 1;
    for (int d = 0; ok && d < a->ni; d++) ok = a->i[d] >= 0;
    int64_t n;
    if (ok && kiln_shape_numel_checked(a->ni, a->i, &n) != KILN_OK) return kiln_error_context(KILN_ERR_VALUE, "broadcast_to");
    if (!ok) {
        char buf[160], buf2[160];
        kiln_meta target;
        kiln_meta_set(&target, m->dtype, a->ni <= KILN_MAX_DIMS ? a->ni : 0, a->i);
        return kiln_error(KILN_ERR_VALUE, "broadcast_to: cannot broadcast a tensor of shape %s to shape %s",
                          kiln_shape_str(m, buf, sizeof buf), kiln_shape_str(&target, buf2, sizeof buf2));
    }
    kiln_meta_set(out, m->dtype, a->ni, a->i);
    return KILN_OK;
}

KILN_KERNEL(expand) {
    (void)nin;
    int64_t strides[KILN_MAX_DIMS];
    kiln_view_strides(KILN_OP_EXPAND, a, &in[0]->meta, in[0]->strides, strides);
    return kiln_tensor_view(in[0], a->ni, a->i, strides, in[0]->offset, &out[0]);
}

KILN_GRAD(expand) { return kiln_emit_sum_to(gout[0], &ctx->in_meta[0], &gin[0]); }

/* ---- slice ------------------------------------------------------------------------------ */

static kiln_status check_slice(const char *op, const kiln_meta *m, const kiln_attrs *a) {
    char buf[160];
    if (a->ni < 24) return kiln_error(KILN_ERR_VALUE, "%s: expected 24 int attributes, got %d", op, a->ni);
    for (int d = 0; d < m->ndim; d++) {
        int64_t start = a->i[d], step = a->i[8 + d], len = a->i[16 + d];
        int64_t last = start + (len - 1) * step;
        if (step == 0 || len < 0 || (len > 0 && (start < 0 || start >= m->shape[d] || last < 0 || last >= m->shape[d])))
            return kiln_error(KILN_ERR_INDEX, "%s: slice start %lld, step %lld, length %lld is out of range for axis %d of a tensor of shape %s",
                              op, (long long)start, (long long)step, (long long)len, d, kiln_shape_str(m, buf, sizeof buf));
    }
    return KILN_OK;
}

KILN_INFER(slice) {
    (void)nin;
    const kiln_meta *m = &in[0]->meta;
    KILN_TRY(check_slice("slice", m, a));
    out->dtype = m->dtype;
    out->ndim = m->ndim;
    for (int d = 0; d < m->ndim; d++) out->shape[d] = a->i[16 + d];
    return KILN_OK;
}

static kiln_status slice_view(kiln_tensor *x, const kiln_attrs *a, kiln_tensor **out) {
    int64_t shape[KILN_MAX_DIMS], strides[KILN_MAX_DIMS], offset = x->offset;
    kiln_view_strides(KILN_OP_SLICE, a, &x->meta, x->strides, strides);
    for (int d = 0; d < x->meta.ndim; d++) {
        shape[d] = a->i[16 + d];
        if (shape[d] > 0) offset += a->i[d] * x->strides[d];
    }
    return kiln_tensor_view(x, x->meta.ndim, shape, strides, offset, out);
}

KILN_KERNEL(slice) {
    (void)nin;
    return slice_view(in[0], a, &out[0]);
}

KILN_GRAD(slice) {
    kiln_tensor *zeros, *ins[2];
    KILN_TRY(kiln_emit_full(&ctx->in_meta[0], 0.0, &zeros));
    ins[0] = zeros;
    ins[1] = gout[0];
    kiln_status s = kiln_apply(KILN_OP_SLICE_ASSIGN, 2, ins, ctx->attrs, &gin[0]);
    kiln_tensor_release(zeros);
    return s;
}

KILN_INFER(slice_assign) {
    (void)nin;
    const kiln_meta *m = &in[0]->meta, *v = &in[1]->meta;
    KILN_TRY(check_slice("index assignment", m, a));
    int lead = m->ndim - v->ndim;
    bool ok = lead >= 0;
    for (int d = 0; ok && d < v->ndim; d++) ok = v->shape[d] == 1 || v->shape[d] == a->i[16 + lead + d];
    if (!ok) {
        char buf[160], buf2[160];
        kiln_meta target = *m;
        for (int d = 0; d < m->ndim; d++) target.shape[d] = a->i[16 + d];
        return kiln_error(KILN_ERR_VALUE, "index assignment: cannot assign a value of shape %s to a selection of shape %s",
                          kiln_shape_str(v, buf, sizeof buf), kiln_shape_str(&target, buf2, sizeof buf2));
    }
    *out = *m;
    return KILN_OK;
}

KILN_KERNEL(slice_assign) {
    (void)nin;
    KILN_TRY(kiln_check_writable("index assignment", "the tensor", in[0]));
    kiln_tensor *view;
    KILN_TRY(slice_view(in[0], a, &view));
    kiln_status s = kiln_copy_into(view, in[1]);
    kiln_tensor_release(view);
    if (s != KILN_OK) return s;
    kiln_tensor_retain(in[0]);
    out[0] = in[0];
    return KILN_OK;
}

KILN_GRAD(slice_assign) {
    kiln_status s = KILN_OK;
    if (ctx->needs_grad[0]) { /* the overwritten region gets no gradient */
        kiln_tensor *zero, *copy, *ins[2];
        KILN_TRY(kiln_emit_scalar(0.0, gout[0]->meta.dtype, &zero));
        s = kiln_emit_unary(KILN_OP_CONTIGUOUS, gout[0], &copy);
        if (s == KILN_OK) {
            ins[0] = copy;
            ins[1] = zero;
            s = kiln_apply(KILN_OP_SLICE_ASSIGN, 2, ins, ctx->attrs, &gin[0]);
            kiln_tensor_release(copy);
        }
        kiln_tensor_release(zero);
    }
    if (s == KILN_OK && ctx->needs_grad[1]) {
        kiln_tensor *part;
        s = kiln_apply(KILN_OP_SLICE, 1, (kiln_tensor *const *)&gout[0], ctx->attrs, &part);
        if (s == KILN_OK) {
            s = kiln_emit_sum_to(part, &ctx->in_meta[1], &gin[1]);
            kiln_tensor_release(part);
        }
    }
    return s;
}

/* ---- contiguous ------------------------------------------------------------------------ */

KILN_GRAD(contiguous) {
    kiln_tensor_retain(gout[0]);
    gin[0] = gout[0];
    return KILN_OK;
}
