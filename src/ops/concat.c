/* concat: joins tensors along an existing axis (numpy.concatenate), promoting their dtypes. */
#include "../core/internal.h"

static int axis_of(const kiln_attrs *a, int ndim) {
    int64_t axis = a->i[0];
    return (int)(axis < 0 ? axis + ndim : axis);
}

KILN_INFER(concat) {
    if (nin < 1) return kiln_error(KILN_ERR_VALUE, "concat: expected at least one tensor, got none");
    KILN_TRY(kiln_attrs_expect("concat", a, 1, 0));
    const kiln_meta *m0 = &in[0]->meta;
    if (m0->ndim == 0) return kiln_error(KILN_ERR_VALUE, "concat: zero-dimensional tensors cannot be concatenated");
    int64_t axis = a->i[0];
    KILN_TRY(kiln_normalize_axis("concat", &axis, m0));
    kiln_dtype dtype = m0->dtype;
    int64_t total = 0;
    for (int k = 0; k < nin; k++) {
        const kiln_meta *m = &in[k]->meta;
        bool ok = m->ndim == m0->ndim;
        for (int d = 0; ok && d < m->ndim; d++) ok = d == axis || m->shape[d] == m0->shape[d];
        if (!ok) {
            char buf[1024];
            return kiln_error(KILN_ERR_VALUE, "concat: all shapes must match except along axis %lld, got %s",
                              (long long)axis, kiln_shapes_str(in, nin, buf, sizeof buf));
        }
        dtype = kiln_dtype_promote(dtype, m->dtype);
        total += m->shape[axis];
    }
    *out = *m0;
    out->dtype = dtype;
    out->shape[axis] = total;
    return KILN_OK;
}

KILN_KERNEL(concat) {
    kiln_tensor *o = out[0];
    if (o->numel == 0) return KILN_OK;
    int nd = o->meta.ndim, axis = axis_of(a, nd);
    int64_t outer = kiln_shape_numel(axis, o->meta.shape);
    int64_t inner = kiln_shape_numel(nd - axis - 1, o->meta.shape + axis + 1);
    size_t isz = kiln_dtype_size(o->meta.dtype), out_row = (size_t)(o->meta.shape[axis] * inner) * isz;
    int64_t at = 0;
    for (int k = 0; k < nin; k++) {
        kiln_tensor *x = in[k];
        int64_t len = x->meta.shape[axis];
        if (len == 0) continue;
        if (x->meta.dtype == o->meta.dtype && kiln_tensor_is_contiguous(x)) {
            /* each outer row of x is one block of the output row */
            size_t block = (size_t)(len * inner) * isz;
            char *dst = (char *)o->data + (size_t)(at * inner) * isz;
            const char *src = x->data;
            bool par = outer > 1 && x->numel >= KILN_PARALLEL_MIN;
#pragma omp parallel for if (par) schedule(static)
            for (int64_t r = 0; r < outer; r++) memcpy(dst + (size_t)r * out_row, src + (size_t)r * block, block);
        } else {
            kiln_tensor *part;
            KILN_TRY(kiln_tensor_view(o, nd, x->meta.shape, o->strides, o->offset + at * o->strides[axis], &part));
            kiln_status s = kiln_copy_into(part, x);
            kiln_tensor_release(part);
            KILN_TRY(s);
        }
        at += len;
    }
    return KILN_OK;
}

/* Each input's gradient is its slice of gout. */
KILN_GRAD(concat) {
    if (!gout[0]) return KILN_OK;
    int nd = ctx->in_meta[0].ndim, axis = axis_of(ctx->attrs, nd);
    int64_t at = 0;
    for (int j = 0; j < ctx->nin; j++) {
        const kiln_meta *m = &ctx->in_meta[j];
        if (ctx->needs_grad[j]) {
            kiln_attrs sa;
            kiln_attrs_clear(&sa);
            for (int d = 0; d < 8; d++) sa.i[d] = d == axis ? at : 0;
            for (int d = 0; d < 8; d++) sa.i[8 + d] = 1;
            for (int d = 0; d < 8; d++) sa.i[16 + d] = d < nd ? m->shape[d] : 0;
            sa.ni = 24;
            KILN_TRY(kiln_apply(KILN_OP_SLICE, 1, &gout[0], &sa, &gin[j]));
        }
        at += m->shape[axis];
    }
    return KILN_OK;
}
