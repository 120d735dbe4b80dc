/* relayout: the activation layout conversions the channels_last pass puts at the edges of
 * conv chains (layouts of src/ops/conv_epilogue.h): NCHW <-> NHWC, a contiguous copy of
 * permute(0, 2, 3, 1) and back, and NCHW <-> (N, C/b, H, W, b), oneDNN's blocked nChw16c and
 * nChw8c (b = 16, 8).
 * float32 runs through oneDNN's reorders (2-3x faster here than the batched 2-D transposes
 * the other dtypes get, which in turn beat the general strided copy of a permuted view). */
#include <omp.h>

#include "conv_dnnl.h"

#define TILE 32

/* dst[n][c][r] = src[n][r][c] for n < N, r < R, c < C. */
#define TRANSPOSE(SUFFIX, T)                                                                  \
    static void transpose_##SUFFIX(const T *src, T *dst, int64_t N, int64_t R, int64_t C) {    \
        int64_t rt = (R + TILE - 1) / TILE, ct = (C + TILE - 1) / TILE;                      \
        _Pragma("omp parallel for schedule(static) if (N * R * C >= KILN_PARALLEL_MIN)")      \
        for (int64_t t = 0; t < N * rt * ct; t++) {                                          \
            int64_t n = t / (rt * ct), r0 = t / ct % rt * TILE, c0 = t % ct * TILE;          \
            int64_t r1 = r0 + TILE < R ? r0 + TILE : R, c1 = c0 + TILE < C ? c0 + TILE : C;  \
            const T *s = src + n * R * C;                                                    \
            T *d = dst + n * R * C;                                                          \
            for (int64_t c = c0; c < c1; c++)                                                \
                for (int64_t r = r0; r < r1; r++) d[c * R + r] = s[r * C + c];               \
        }                                                                                    \
    }
TRANSPOSE(u8, uint8_t)
TRANSPOSE(u16, uint16_t)
TRANSPOSE(u32, uint32_t)
TRANSPOSE(u64, uint64_t)

static void transpose_batched(const void *src, void *dst, int64_t N, int64_t R, int64_t C, size_t size) {
    switch (size) {
    case 1: transpose_u8(src, dst, N, R, C); break;
    case 2: transpose_u16(src, dst, N, R, C); break;
    case 4: transpose_u32(src, dst, N, R, C); break;
    default: transpose_u64(src, dst, N, R, C); break;
    }
}

kiln_status kiln_relayout(const kiln_tensor *x, kiln_conv_layout from, kiln_conv_layout to, kiln_tensor *out) {
    size_t size = kiln_dtype_size(x->meta.dtype);
    const kiln_tensor *nchw = from == KILN_CONV_NCHW ? x : out;
    const int64_t *s = nchw->meta.shape;
    int64_t N = s[0], C = s[1], HW = s[2] * s[3];
    kiln_conv_layout other = from == KILN_CONV_NCHW ? to : from;
    bool to_nchw = to == KILN_CONV_NCHW;
    if (from == to) {
        memcpy(out->data, x->data, (size_t)x->numel * size);
        return KILN_OK;
    }
    if (x->meta.dtype == KILN_DTYPE_FLOAT32 && x->numel > 0) {
        kiln_status st = kiln_conv_dnnl_relayout(s, from, to, x->data, out->data);
        if (st != KILN_ERR_RUNTIME) return st;
        kiln_clear_error(); /* the plain transpose below */
    }
    if (other == KILN_CONV_NHWC) { /* (N, C, HW) <-> (N, HW, C) */
        if (to_nchw) transpose_batched(x->data, out->data, N, HW, C, size);
        else transpose_batched(x->data, out->data, N, C, HW, size);
    } else { /* (N * C/b, b, HW) <-> (N * C/b, HW, b) */
        int64_t b = kiln_conv_layout_block(other);
        if (to_nchw) transpose_batched(x->data, out->data, N * (C / b), HW, b, size);
        else transpose_batched(x->data, out->data, N * (C / b), b, HW, size);
    }
    return KILN_OK;
}

KILN_INFER(relayout) {
    const char *op = "relayout";
    KILN_TRY(kiln_attrs_expect(op, a, 2, 0));
    const kiln_meta *m = &in[0]->meta;
    char buf[160];
    int64_t from = a->i[0], to = a->i[1];
    if (from < 0 || from >= KILN_CONV_LAYOUT_COUNT || to < 0 || to >= KILN_CONV_LAYOUT_COUNT ||
        (from != KILN_CONV_NCHW && to != KILN_CONV_NCHW))
        return kiln_error(KILN_ERR_VALUE, "%s: cannot convert layout %lld to %lld (one side must be NCHW, 0)", op,
                          (long long)from, (long long)to);
    if (kiln_dtype_size(m->dtype) > 8)
        return kiln_error(KILN_ERR_TYPE, "%s: unsupported dtype %s", op, kiln_dtype_name(m->dtype));
    int64_t from_block = kiln_conv_layout_block((kiln_conv_layout)from), to_block = kiln_conv_layout_block((kiln_conv_layout)to);
    int rank = from_block ? 5 : 4;
    if (m->ndim != rank || (from_block && m->shape[4] != from_block))
        return kiln_error(KILN_ERR_VALUE, "%s: input of shape %s is not in layout %lld", op,
                          kiln_shape_str(m, buf, sizeof buf), (long long)from);
    int64_t nchw[4], shape[5];
    kiln_conv_layout_nchw((kiln_conv_layout)from, m->shape, nchw);
    if (to_block && nchw[1] % to_block)
        return kiln_error(KILN_ERR_VALUE, "%s: the blocked layout needs channels divisible by %lld, input has shape %s", op,
                          (long long)to_block, kiln_shape_str(m, buf, sizeof buf));
    kiln_meta_set(out, m->dtype, kiln_conv_layout_shape((kiln_conv_layout)to, nchw, shape), shape);
    return KILN_OK;
}

KILN_KERNEL(relayout) {
    kiln_tensor *x;
    KILN_TRY(kiln_to_contiguous(in[0], in[0]->meta.dtype, &x));
    kiln_status s = kiln_relayout(x, (kiln_conv_layout)a->i[0], (kiln_conv_layout)a->i[1], out[0]);
    kiln_tensor_release(x);
    return s;
}

KILN_GRAD(relayout) {
    if (!gout[0] || !ctx->needs_grad[0]) return KILN_OK;
    kiln_attrs back;
    kiln_attrs_clear(&back);
    kiln_attrs_push_int(&back, ctx->attrs->i[1]);
    kiln_attrs_push_int(&back, ctx->attrs->i[0]);
    return kiln_apply(KILN_OP_RELAYOUT, 1, gout, &back, &gin[0]);
}
