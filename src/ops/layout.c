/* channels_last: the layout conversions the channels-last pass puts at the edges of conv
 * chains. Direction 0 turns (N, C, H, W) into (N, H, W, C) (a contiguous copy of
 * permute(0, 2, 3, 1)); direction 1 turns it back. A blocked transpose runs near copy speed,
 * where the general strided copy of a permuted view walks memory with a large stride. */
#include <omp.h>

#include "conv_dnnl.h"

#define TILE 32

/* dst[n][c][r] = src[n][r][c] for n < N, r < R, c < C; elements of `size` bytes. */
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

void kiln_transpose_batched(const void *src, void *dst, int64_t N, int64_t R, int64_t C, size_t size) {
    switch (size) {
    case 1: transpose_u8(src, dst, N, R, C); break;
    case 2: transpose_u16(src, dst, N, R, C); break;
    case 4: transpose_u32(src, dst, N, R, C); break;
    default: transpose_u64(src, dst, N, R, C); break;
    }
}

KILN_INFER(channels_last) {
    const char *op = "channels_last";
    KILN_TRY(kiln_attrs_expect(op, a, 1, 0));
    const kiln_meta *m = &in[0]->meta;
    char buf[160];
    if (m->ndim != 4)
        return kiln_error(KILN_ERR_VALUE, "%s: expected a 4-D tensor, got shape %s", op, kiln_shape_str(m, buf, sizeof buf));
    if (a->i[0] != 0 && a->i[0] != 1)
        return kiln_error(KILN_ERR_VALUE, "%s: direction must be 0 (to NHWC) or 1 (to NCHW), got %lld", op,
                          (long long)a->i[0]);
    if (kiln_dtype_size(m->dtype) > 8)
        return kiln_error(KILN_ERR_TYPE, "%s: unsupported dtype %s", op, kiln_dtype_name(m->dtype));
    const int64_t *s = m->shape;
    int64_t nhwc[4] = {s[0], s[2], s[3], s[1]}, nchw[4] = {s[0], s[3], s[1], s[2]};
    kiln_meta_set(out, m->dtype, 4, a->i[0] == 0 ? nhwc : nchw);
    return KILN_OK;
}

KILN_KERNEL(channels_last) {
    kiln_tensor *x;
    KILN_TRY(kiln_to_contiguous(in[0], in[0]->meta.dtype, &x));
    const int64_t *s = x->meta.shape;
    if (a->i[0] == 0) /* (N, C, HW) -> (N, HW, C) */
        kiln_transpose_batched(x->data, out[0]->data, s[0], s[1], s[2] * s[3], kiln_dtype_size(x->meta.dtype));
    else /* (N, HW, C) -> (N, C, HW) */
        kiln_transpose_batched(x->data, out[0]->data, s[0], s[1] * s[2], s[3], kiln_dtype_size(x->meta.dtype));
    kiln_tensor_release(x);
    return KILN_OK;
}

KILN_GRAD(channels_last) {
    if (!gout[0] || !ctx->needs_grad[0]) return KILN_OK;
    kiln_attrs back;
    kiln_attrs_clear(&back);
    kiln_attrs_push_int(&back, 1 - ctx->attrs->i[0]);
    return kiln_apply(KILN_OP_CHANNELS_LAST, 1, gout, &back, &gin[0]);
}
