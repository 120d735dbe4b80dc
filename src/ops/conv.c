/* conv2d (NCHW), its two backward ops, and conv2d_fused (a convolution with an epilogue, in
 * NCHW or NHWC, made by the graph passes). float32 runs through oneDNN (conv_dnnl.c), or
 * kiln's Winograd (conv_winograd.c) for the 3x3 convolutions it is chosen for (inference graphs;
 * training graphs, forward and both backward ops, where the O1 pass conv_algorithm chose it);
 * float64 — which oneDNN lacks — and any problem oneDNN refuses run through im2col + GEMM
 * followed by the epilogue's own kernels. bfloat16 runs oneDNN's bf16 primitives (float32
 * accumulation) where the CPU has bf16 arithmetic (dnnl_lowp.h); elsewhere, and for float16
 * (oneDNN 2.x has no f16 convolution), 16-bit operands are converted to float32, computed as
 * float32 and the result rounded once (the fp32-compute fallback). */
#include <cblas.h>
#include <omp.h>

#include "conv_winograd.h"
#include "dnnl_lowp.h"
#include "lowp_pass.h"
#include "gemm_select.h"

/* ---- geometry and inference ------------------------------------------------------------- */

/* Checks the attrs (i[0..8]) against the input shape xs and weight shape ws (both 4-D) and
 * fills p. Errors name `op` and the shapes. */
static kiln_status conv_params(const char *op, const kiln_attrs *a, const int64_t *xs, const int64_t *ws,
                               kiln_conv_params *p) {
    char bx[160], bw[160];
    kiln_meta mx = {.ndim = 4}, mw = {.ndim = 4};
    memcpy(mx.shape, xs, sizeof(int64_t) * 4);
    memcpy(mw.shape, ws, sizeof(int64_t) * 4);
    kiln_shape_str(&mx, bx, sizeof bx);
    kiln_shape_str(&mw, bw, sizeof bw);
    const int64_t *i = a->i;
    if (i[0] < 1 || i[1] < 1 || i[6] < 1 || i[7] < 1 || i[8] < 1)
        return kiln_error(KILN_ERR_VALUE, "%s: stride (%lld, %lld), dilation (%lld, %lld) and groups %lld must be positive",
                          op, (long long)i[0], (long long)i[1], (long long)i[6], (long long)i[7], (long long)i[8]);
    if (i[2] < 0 || i[3] < 0 || i[4] < 0 || i[5] < 0)
        return kiln_error(KILN_ERR_VALUE, "%s: padding (%lld, %lld, %lld, %lld) must not be negative", op,
                          (long long)i[2], (long long)i[3], (long long)i[4], (long long)i[5]);
    for (int d = 0; d < 4; d++)
        if (xs[d] < 0 || ws[d] < 0) return kiln_error(KILN_ERR_VALUE, "%s: negative dimension in %s or %s", op, bx, bw);
    int64_t g = i[8];
    if (xs[1] % g)
        return kiln_error(KILN_ERR_VALUE, "%s: groups=%lld does not divide the %lld input channels of input shape %s",
                          op, (long long)g, (long long)xs[1], bx);
    if (ws[0] % g)
        return kiln_error(KILN_ERR_VALUE, "%s: groups=%lld does not divide the %lld output channels of weight shape %s",
                          op, (long long)g, (long long)ws[0], bw);
    if (ws[1] * g != xs[1])
        return kiln_error(KILN_ERR_VALUE, "%s: input of shape %s has %lld channels, but weight of shape %s expects %lld (groups=%lld)",
                          op, bx, (long long)xs[1], bw, (long long)(ws[1] * g), (long long)g);
    *p = (kiln_conv_params){.N = xs[0], .C = xs[1], .H = xs[2], .W = xs[3], .O = ws[0], .KH = ws[2], .KW = ws[3],
                            .sh = i[0], .sw = i[1], .pt = i[2], .pb = i[3], .pl = i[4], .pr = i[5],
                            .dh = i[6], .dw = i[7], .groups = g};
    int64_t ekh, ekw, ph, pw; /* dilated kernel and padded input: checked, attributes may be anything */
    if (__builtin_mul_overflow(p->KH - 1, p->dh, &ekh) || __builtin_add_overflow(ekh, 1, &ekh) ||
        __builtin_mul_overflow(p->KW - 1, p->dw, &ekw) || __builtin_add_overflow(ekw, 1, &ekw) ||
        __builtin_add_overflow(p->H, p->pt, &ph) || __builtin_add_overflow(ph, p->pb, &ph) ||
        __builtin_add_overflow(p->W, p->pl, &pw) || __builtin_add_overflow(pw, p->pr, &pw))
        return kiln_error(KILN_ERR_VALUE, "%s: padding (%lld, %lld, %lld, %lld) or dilation (%lld, %lld) too large: the "
                          "padded input or the dilated kernel overflows; input %s, weight %s", op, (long long)p->pt,
                          (long long)p->pb, (long long)p->pl, (long long)p->pr, (long long)p->dh, (long long)p->dw, bx, bw);
    if (p->KH < 1 || p->KW < 1 || ekh > ph || ekw > pw)
        return kiln_error(KILN_ERR_VALUE, "%s: kernel (%lld, %lld) (dilated (%lld, %lld)) does not fit the padded input (%lld, %lld); input %s, weight %s",
                          op, (long long)p->KH, (long long)p->KW, (long long)ekh, (long long)ekw, (long long)ph,
                          (long long)pw, bx, bw);
    p->OH = (ph - ekh) / p->sh + 1;
    p->OW = (pw - ekw) / p->sw + 1;
    return KILN_OK;
}

static kiln_status conv_check_float(const char *op, kiln_dtype dt) {
    if (!kiln_dtype_is_float(dt))
        return kiln_error(KILN_ERR_TYPE, "%s: expected floating-point tensors, got %s", op, kiln_dtype_name(dt));
    return KILN_OK;
}

static kiln_status conv_check_4d(const char *op, const char *what, const kiln_meta *m) {
    char buf[160];
    if (m->ndim != 4)
        return kiln_error(KILN_ERR_VALUE, "%s: %s must be 4-D, got shape %s", op, what, kiln_shape_str(m, buf, sizeof buf));
    return KILN_OK;
}

/* gy must be (N, O, OH, OW) for the problem p. */
static kiln_status conv_check_gy(const char *op, const kiln_meta *gy, const kiln_conv_params *p) {
    KILN_TRY(conv_check_4d(op, "grad", gy));
    int64_t want[4] = {p->N, p->O, p->OH, p->OW};
    for (int d = 0; d < 4; d++)
        if (gy->shape[d] != want[d]) {
            char b1[160], b2[160];
            kiln_meta mw = {.ndim = 4};
            memcpy(mw.shape, want, sizeof want);
            return kiln_error(KILN_ERR_VALUE, "%s: grad of shape %s does not match the convolution output shape %s", op,
                              kiln_shape_str(gy, b1, sizeof b1), kiln_shape_str(&mw, b2, sizeof b2));
        }
    return KILN_OK;
}

KILN_INFER(conv2d) {
    const char *op = "conv2d";
    if (nin != 2 && nin != 3)
        return kiln_error(KILN_ERR_TYPE, "conv2d: expected 2 or 3 tensor inputs (x, w[, b]), got %d", nin);
    KILN_TRY(kiln_attrs_expect(op, a, 9, 0));
    const kiln_meta *mx = &in[0]->meta, *mw = &in[1]->meta;
    KILN_TRY(conv_check_4d(op, "input", mx));
    KILN_TRY(conv_check_4d(op, "weight", mw));
    kiln_conv_params p;
    KILN_TRY(conv_params(op, a, mx->shape, mw->shape, &p));
    kiln_dtype dt = kiln_dtype_promote(mx->dtype, mw->dtype);
    if (nin == 3) {
        const kiln_meta *mb = &in[2]->meta;
        if (mb->ndim != 1 || mb->shape[0] != p.O) {
            char b1[160], b2[160];
            return kiln_error(KILN_ERR_VALUE, "conv2d: bias of shape %s does not match weight of shape %s",
                              kiln_shape_str(mb, b1, sizeof b1), kiln_shape_str(mw, b2, sizeof b2));
        }
        dt = kiln_dtype_promote(dt, mb->dtype);
    }
    KILN_TRY(conv_check_float(op, dt));
    int64_t shape[4] = {p.N, p.O, p.OH, p.OW};
    kiln_meta_set(out, dt, 4, shape);
    return KILN_OK;
}

/* conv2d_fused: the epilogue attrs i[9..13] (see ops.def), checked against the input shape
 * xs (its rank in mx); nchw gets x's shape as NCHW. */
static kiln_status conv_fused_epilogue(const kiln_attrs *a, int nin, const kiln_meta *mx, int64_t *nchw,
                                       kiln_conv_epilogue *ep) {
    const char *op = "conv2d_fused";
    KILN_TRY(kiln_attrs_expect(op, a, 14, 0));
    for (int k = 9; k <= 13; k++)
        if ((k == 9 || k == 10 || k == 13) && a->i[k] != 0 && a->i[k] != 1)
            return kiln_error(KILN_ERR_VALUE, "%s: attribute i[%d] must be 0 or 1, got %lld", op, k, (long long)a->i[k]);
    if (a->i[11] < 0 || a->i[11] >= KILN_CONV_ACT_COUNT)
        return kiln_error(KILN_ERR_VALUE, "%s: unknown activation code %lld", op, (long long)a->i[11]);
    if (a->i[12] < 0 || a->i[12] >= KILN_CONV_LAYOUT_COUNT)
        return kiln_error(KILN_ERR_VALUE, "%s: unknown layout code %lld", op, (long long)a->i[12]);
    if (a->i[11] == KILN_CONV_ACT_CLAMP) KILN_TRY(kiln_attrs_expect(op, a, 14, 2));
    int want = 2 + (int)a->i[9] + (int)a->i[10];
    if (nin != want)
        return kiln_error(KILN_ERR_TYPE, "%s: expected %d tensor inputs (x, w%s%s), got %d", op, want,
                          a->i[9] ? ", b" : "", a->i[10] ? ", residual" : "", nin);
    *ep = (kiln_conv_epilogue){.layout = a->i[12], .winograd = a->i[13], .residual = a->i[10],
                               .activation = a->i[11], .alpha = a->nf > 0 ? a->f[0] : 0, .beta = a->nf > 1 ? a->f[1] : 0};
    int64_t block = kiln_conv_layout_block((kiln_conv_layout)ep->layout);
    int rank = block ? 5 : 4;
    char buf[160], shape_want[64];
    if (block) snprintf(shape_want, sizeof shape_want, "(N, C/%lld, H, W, %lld)", (long long)block, (long long)block);
    else snprintf(shape_want, sizeof shape_want, "%s", ep->layout == KILN_CONV_NHWC ? "(N, H, W, C)" : "(N, C, H, W)");
    if (mx->ndim != rank || (block && mx->shape[4] != block))
        return kiln_error(KILN_ERR_VALUE, "%s: input of shape %s does not have layout %lld %s", op,
                          kiln_shape_str(mx, buf, sizeof buf), (long long)ep->layout, shape_want);
    kiln_conv_layout_nchw((kiln_conv_layout)ep->layout, mx->shape, nchw);
    return KILN_OK;
}

KILN_INFER(conv2d_fused) {
    const char *op = "conv2d_fused";
    kiln_conv_epilogue ep = {0};
    int64_t xs[4];
    if (nin < 2) return kiln_error(KILN_ERR_TYPE, "%s: expected at least 2 tensor inputs (x, w), got %d", op, nin);
    const kiln_meta *mx = &in[0]->meta, *mw = &in[1]->meta;
    KILN_TRY(conv_check_4d(op, "weight", mw));
    KILN_TRY(conv_fused_epilogue(a, nin, mx, xs, &ep));
    kiln_conv_params p;
    KILN_TRY(conv_params(op, a, xs, mw->shape, &p));
    kiln_dtype dt = kiln_dtype_promote(mx->dtype, mw->dtype);
    char b1[160], b2[160];
    if (a->i[9]) {
        const kiln_meta *mb = &in[2]->meta;
        if (mb->ndim != 1 || mb->shape[0] != p.O)
            return kiln_error(KILN_ERR_VALUE, "%s: bias of shape %s does not match weight of shape %s", op,
                              kiln_shape_str(mb, b1, sizeof b1), kiln_shape_str(mw, b2, sizeof b2));
        dt = kiln_dtype_promote(dt, mb->dtype);
    }
    KILN_TRY(conv_check_float(op, dt));
    int64_t block = kiln_conv_layout_block((kiln_conv_layout)ep.layout);
    if (block && p.O % block)
        return kiln_error(KILN_ERR_VALUE, "%s: blocked layout needs output channels divisible by %lld, weight has shape %s",
                          op, (long long)block, kiln_shape_str(mw, b1, sizeof b1));
    int64_t nchw[4] = {p.N, p.O, p.OH, p.OW}, shape[5];
    kiln_meta_set(out, dt, kiln_conv_layout_shape((kiln_conv_layout)ep.layout, nchw, shape), shape);
    if (ep.residual) {
        const kiln_meta *mr = &in[nin - 1]->meta;
        bool same = mr->ndim == out->ndim && mr->dtype == dt;
        for (int d = 0; d < out->ndim && same; d++) same = mr->shape[d] == out->shape[d];
        if (!same)
            return kiln_error(KILN_ERR_VALUE, "%s: residual %s %s does not match the output %s %s", op,
                              kiln_dtype_name(mr->dtype), kiln_shape_str(mr, b1, sizeof b1), kiln_dtype_name(dt),
                              kiln_shape_str(out, b2, sizeof b2));
    }
    return KILN_OK;
}

KILN_INFER(conv2d_backward_input) {
    const char *op = "conv2d_backward_input";
    KILN_TRY(kiln_attrs_expect(op, a, 13, 0));
    const kiln_meta *gy = &in[0]->meta, *mw = &in[1]->meta;
    KILN_TRY(conv_check_4d(op, "weight", mw));
    kiln_conv_params p;
    KILN_TRY(conv_params(op, a, a->i + 9, mw->shape, &p));
    KILN_TRY(conv_check_gy(op, gy, &p));
    kiln_dtype dt = kiln_dtype_promote(gy->dtype, mw->dtype);
    KILN_TRY(conv_check_float(op, dt));
    kiln_meta_set(out, dt, 4, a->i + 9);
    return KILN_OK;
}

KILN_INFER(conv2d_backward_weight) {
    const char *op = "conv2d_backward_weight";
    KILN_TRY(kiln_attrs_expect(op, a, 13, 0));
    const kiln_meta *mx = &in[0]->meta, *gy = &in[1]->meta;
    KILN_TRY(conv_check_4d(op, "input", mx));
    kiln_conv_params p;
    KILN_TRY(conv_params(op, a, mx->shape, a->i + 9, &p));
    KILN_TRY(conv_check_gy(op, gy, &p));
    kiln_dtype dt = kiln_dtype_promote(mx->dtype, gy->dtype);
    KILN_TRY(conv_check_float(op, dt));
    kiln_meta_set(out, dt, 4, a->i + 9);
    return KILN_OK;
}

/* ---- im2col + GEMM path (float64, and float32 when oneDNN declines) ---------------------- */

/* col (Cg*KH*KW, OH*OW) of one image's channel group x (Cg, H, W); col2im adds it back. */
#define CONV_IM2COL(SUFFIX, T)                                                               \
    static void im2col_##SUFFIX(const kiln_conv_params *p, int64_t Cg, const T *x, T *col) {  \
        int64_t rows = Cg * p->KH * p->KW, ohw = p->OH * p->OW;                              \
        _Pragma("omp parallel for schedule(static) if (rows * ohw >= KILN_PARALLEL_MIN)")     \
        for (int64_t r = 0; r < rows; r++) {                                                 \
            int64_t c = r / (p->KH * p->KW), kh = r / p->KW % p->KH, kw = r % p->KW;          \
            T *out = col + r * ohw;                                                          \
            for (int64_t oh = 0; oh < p->OH; oh++) {                                         \
                int64_t ih = oh * p->sh - p->pt + kh * p->dh;                                \
                const T *row = x + (c * p->H + ih) * p->W;                                   \
                for (int64_t ow = 0; ow < p->OW; ow++) {                                     \
                    int64_t iw = ow * p->sw - p->pl + kw * p->dw;                            \
                    out[oh * p->OW + ow] = (ih >= 0 && ih < p->H && iw >= 0 && iw < p->W) ? row[iw] : 0; \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    }                                                                                        \
    static void col2im_##SUFFIX(const kiln_conv_params *p, int64_t Cg, const T *col, T *x) { \
        int64_t ohw = p->OH * p->OW;                                                         \
        _Pragma("omp parallel for schedule(static) if (Cg * p->H * p->W >= KILN_PARALLEL_MIN)") \
        for (int64_t c = 0; c < Cg; c++)                                                     \
            for (int64_t kh = 0; kh < p->KH; kh++)                                           \
                for (int64_t kw = 0; kw < p->KW; kw++) {                                     \
                    const T *in = col + ((c * p->KH + kh) * p->KW + kw) * ohw;               \
                    for (int64_t oh = 0; oh < p->OH; oh++) {                                 \
                        int64_t ih = oh * p->sh - p->pt + kh * p->dh;                        \
                        if (ih < 0 || ih >= p->H) continue;                                  \
                        T *row = x + (c * p->H + ih) * p->W;                                 \
                        for (int64_t ow = 0; ow < p->OW; ow++) {                             \
                            int64_t iw = ow * p->sw - p->pl + kw * p->dw;                    \
                            if (iw >= 0 && iw < p->W) row[iw] += in[oh * p->OW + ow];        \
                        }                                                                    \
                    }                                                                        \
                }                                                                            \
    }
CONV_IM2COL(f32, float)
CONV_IM2COL(f64, double)

/* One direct-conv problem per kind, per (image, group): GEMMs over im2col columns. */
#define CONV_REF(SUFFIX, T, GEMM)                                                            \
    static kiln_status conv_ref_##SUFFIX(kiln_conv_kind kind, const kiln_conv_params *p, const T *A, \
                                         const T *B, const T *bias, T *out) {                \
        int64_t g = p->groups, Cg = p->C / g, Og = p->O / g, kk = Cg * p->KH * p->KW;         \
        int64_t hw = p->H * p->W, ohw = p->OH * p->OW;                                       \
        int64_t out_n = kind == KILN_CONV_BACKWARD_WEIGHT ? p->O * kk : 0;                   \
        if (kind == KILN_CONV_BACKWARD_WEIGHT || kind == KILN_CONV_BACKWARD_INPUT)           \
            memset(out, 0, sizeof(T) * (size_t)(kind == KILN_CONV_BACKWARD_WEIGHT ? out_n : p->N * p->C * hw)); \
        T *col = kiln_alloc(sizeof(T) * (size_t)(kk * ohw > 0 ? kk * ohw : 1));               \
        if (!col) return KILN_ERR_MEMORY;                                                    \
        for (int64_t n = 0; n < p->N; n++)                                                   \
            for (int64_t gi = 0; gi < g; gi++) {                                             \
                if (kind == KILN_CONV_FORWARD) { /* y = W_g @ col(x) + b */                  \
                    const T *x = A + (n * p->C + gi * Cg) * hw, *w = B + gi * Og * kk;         \
                    T *y = out + (n * p->O + gi * Og) * ohw;                                 \
                    for (int64_t o = 0; o < Og; o++)                                         \
                        for (int64_t j = 0; j < ohw; j++) y[o * ohw + j] = bias ? bias[gi * Og + o] : 0; \
                    if (kk == 0 || Og == 0 || ohw == 0) continue;                            \
                    im2col_##SUFFIX(p, Cg, x, col);                                          \
                    GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)Og, (int)ohw, (int)kk, 1, w, (int)kk, \
                         col, (int)ohw, 1, y, (int)ohw);                                     \
                } else if (kind == KILN_CONV_BACKWARD_INPUT) { /* col = W_g^T @ gy, added back */ \
                    const T *gy = A + (n * p->O + gi * Og) * ohw, *w = B + gi * Og * kk;       \
                    if (kk == 0 || Og == 0 || ohw == 0) continue;                            \
                    GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, (int)kk, (int)ohw, (int)Og, 1, w, (int)kk, \
                         gy, (int)ohw, 0, col, (int)ohw);                                    \
                    col2im_##SUFFIX(p, Cg, col, out + (n * p->C + gi * Cg) * hw);             \
                } else { /* gW_g += gy @ col(x)^T */                                         \
                    const T *x = A + (n * p->C + gi * Cg) * hw, *gy = B + (n * p->O + gi * Og) * ohw; \
                    if (kk == 0 || Og == 0 || ohw == 0) continue;                            \
                    im2col_##SUFFIX(p, Cg, x, col);                                          \
                    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, (int)Og, (int)kk, (int)ohw, 1, gy, (int)ohw, \
                         col, (int)ohw, 1, out + gi * Og * kk, (int)kk);                     \
                }                                                                            \
            }                                                                                \
        kiln_free(col);                                                                      \
        return KILN_OK;                                                                      \
    }
CONV_REF(f32, float, kiln_sgemm_cblas)
CONV_REF(f64, double, cblas_dgemm)

/* ---- kernels ---------------------------------------------------------------------------- */

/* The plain-loop path: convolution (and bias) in NCHW into res, then the epilogue through the
 * add and activation kernels, in place. x[0..3] are contiguous: a, b, bias, residual; a and
 * res in ep's layout. */
static kiln_status conv_reference(kiln_conv_kind kind, const kiln_conv_params *p, const kiln_conv_epilogue *ep,
                                  const kiln_attrs *act_attrs, kiln_tensor *const *x, kiln_tensor *res) {
    const void *pb = x[2] ? x[2]->data : NULL;
    kiln_conv_layout layout = ep ? (kiln_conv_layout)ep->layout : KILN_CONV_NCHW;
    kiln_tensor *xin = x[0], *y = res;
    kiln_status s = KILN_OK;
    if (layout != KILN_CONV_NCHW) {
        int64_t xs[4] = {p->N, p->C, p->H, p->W}, ys[4] = {p->N, p->O, p->OH, p->OW};
        s = kiln_tensor_empty(res->meta.dtype, 4, xs, &xin);
        if (s == KILN_OK) s = kiln_relayout(x[0], layout, KILN_CONV_NCHW, xin);
        if (s == KILN_OK) s = kiln_tensor_empty(res->meta.dtype, 4, ys, &y);
        if (s != KILN_OK) {
            if (xin != x[0]) kiln_tensor_release(xin);
            return s;
        }
    }
    if (res->meta.dtype == KILN_DTYPE_FLOAT64) s = conv_ref_f64(kind, p, xin->data, x[1]->data, pb, y->data);
    else s = conv_ref_f32(kind, p, xin->data, x[1]->data, pb, y->data);
    if (layout != KILN_CONV_NCHW) {
        if (s == KILN_OK) s = kiln_relayout(y, KILN_CONV_NCHW, layout, res);
        kiln_tensor_release(xin);
        kiln_tensor_release(y);
    }
    if (s != KILN_OK || !ep) return s;
    kiln_attrs none = {0};
    if (ep->residual) {
        kiln_tensor *pair[2] = {res, x[3]};
        s = kiln_kernel_add(pair, 2, &none, &res);
    }
    if (s == KILN_OK && ep->activation != KILN_CONV_ACT_NONE)
        s = kiln_op_table[kiln_conv_activation_ops[ep->activation]].kernel(&res, 1, act_attrs, &res);
    return s;
}

/* Whether `kind` on a, b (and residual) into out runs oneDNN's bf16 primitive: all bfloat16, the
 * CPU with bf16 arithmetic, nothing empty. */
static bool conv_bf16_native(const kiln_tensor *a, const kiln_tensor *b, const kiln_tensor *residual,
                             const kiln_tensor *out) {
    const kiln_dtype bf = KILN_DTYPE_BFLOAT16;
    return out->meta.dtype == bf && a->meta.dtype == bf && b->meta.dtype == bf && (!residual || residual->meta.dtype == bf) &&
           a->numel > 0 && b->numel > 0 && out->numel > 0 && kiln_dnnl_bf16_native();
}

/* conv_run_fused on bfloat16 through oneDNN's bf16 primitive (bias as float32). KILN_ERR_RUNTIME
 * (error set) when oneDNN declines: the caller takes the float32 path. */
static kiln_status conv_run_bf16(kiln_conv_kind kind, const kiln_conv_params *p, const kiln_conv_epilogue *ep,
                                 const kiln_attrs *act_attrs, kiln_tensor *a, kiln_tensor *b, kiln_tensor *bias,
                                 kiln_tensor *residual, kiln_tensor *out) {
    const kiln_dtype bf = KILN_DTYPE_BFLOAT16;
    kiln_tensor *x[4] = {NULL, NULL, NULL, NULL}, *res = out;
    kiln_status s = kiln_to_contiguous(a, bf, &x[0]);
    if (s == KILN_OK) s = kiln_to_contiguous(b, bf, &x[1]);
    if (s == KILN_OK && bias) s = kiln_to_contiguous(bias, KILN_DTYPE_FLOAT32, &x[2]);
    if (s == KILN_OK && residual) s = kiln_to_contiguous(residual, bf, &x[3]);
    if (s == KILN_OK)
        s = kiln_conv_dnnl_run_bf16(kind, p, ep, x[0]->data, x[1]->data, x[2] ? x[2]->data : NULL,
                                    x[3] ? x[3]->data : NULL, out->data);
    /* relu and clamp through kiln's kernel (oneDNN's drop NaN), on the rounded result: rounding
     * is monotone, so clamping after it stores what rounding the clamped value would */
    if (s == KILN_OK && ep && ep->activation != KILN_CONV_ACT_NONE && !kiln_conv_dnnl_applies(ep->activation))
        s = kiln_op_table[kiln_conv_activation_ops[ep->activation]].kernel(&res, 1, act_attrs, &res);
    kiln_release_all(x, 4);
    return s;
}

/* Runs `kind` on inputs a, b (and bias) into out, converting to the compute dtype; forward
 * convolutions may carry an epilogue ep (activation attrs in act_attrs) and its residual. */
/* Operand t of the float32 (or float64) computation, contiguous and read only: a 16-bit operand
 * widened by the parallel pass (lowp_pass.h; a kept weight cast's float32 copy where there is one,
 * the same values), others converted by kiln_to_contiguous. */
static kiln_status compute_operand(kiln_tensor *t, kiln_dtype ct, kiln_tensor **res) {
    if (ct == KILN_DTYPE_FLOAT32 && kiln_lowp_dtype(t->meta.dtype) && kiln_tensor_is_contiguous(t))
        return kiln_lowp_widen(t, false, res);
    return kiln_to_contiguous(t, ct, res);
}

static kiln_status conv_run_fused(kiln_conv_kind kind, const kiln_conv_params *p, const kiln_conv_epilogue *ep,
                                  const kiln_attrs *act_attrs, kiln_tensor *a, kiln_tensor *b, kiln_tensor *bias,
                                  kiln_tensor *residual, kiln_tensor *out) {
    if (conv_bf16_native(a, b, residual, out)) {
        kiln_status s = conv_run_bf16(kind, p, ep, act_attrs, a, b, bias, residual, out);
        if (s != KILN_ERR_RUNTIME) return s;
        kiln_clear_error(); /* oneDNN declined: float32 compute */
    }
    kiln_dtype ct = out->meta.dtype == KILN_DTYPE_FLOAT64 ? KILN_DTYPE_FLOAT64 : KILN_DTYPE_FLOAT32;
    kiln_tensor *x[4] = {NULL, NULL, NULL, NULL}, *res = NULL;
    kiln_status s = compute_operand(a, ct, &x[0]);
    if (s == KILN_OK) s = compute_operand(b, ct, &x[1]);
    if (s == KILN_OK && bias) s = kiln_to_contiguous(bias, ct, &x[2]);
    if (s == KILN_OK && residual) s = compute_operand(residual, ct, &x[3]);
    if (s == KILN_OK) {
        if (out->meta.dtype == ct) kiln_tensor_retain(out), res = out;
        else s = kiln_tensor_empty(ct, out->meta.ndim, out->meta.shape, &res);
    }
    if (s == KILN_OK) {
        bool empty = x[0]->numel == 0 || x[1]->numel == 0 || res->numel == 0;
        s = KILN_ERR_RUNTIME;
        /* kiln's Winograd applies the whole epilogue itself; it declines NaN and infinities */
        bool winograd = ct == KILN_DTYPE_FLOAT32 && !empty && kiln_conv_winograd_chosen_for(kind, p, ep);
        if (winograd && kind == KILN_CONV_FORWARD)
            s = kiln_conv_winograd_run(p, ep, x[0]->data, x[1]->data, x[2] ? x[2]->data : NULL,
                                       x[3] ? x[3]->data : NULL, res->data, &winograd);
        else if (winograd && kind == KILN_CONV_BACKWARD_INPUT)
            s = kiln_conv_winograd_backward_input(p, x[0]->data, x[1]->data, res->data, &winograd);
        else if (winograd)
            s = kiln_conv_winograd_backward_weight(p, x[0]->data, x[1]->data, res->data, &winograd);
        if (!winograd && ct == KILN_DTYPE_FLOAT32 && !empty)
            s = kiln_conv_dnnl_run(kind, p, ep, x[0]->data, x[1]->data, x[2] ? x[2]->data : NULL,
                                   x[3] ? x[3]->data : NULL, res->data);
        /* relu and clamp through kiln's kernel: oneDNN's drop NaN */
        if (s == KILN_OK && !winograd && ep && ep->activation != KILN_CONV_ACT_NONE &&
            !kiln_conv_dnnl_applies(ep->activation))
            s = kiln_op_table[kiln_conv_activation_ops[ep->activation]].kernel(&res, 1, act_attrs, &res);
        if (s == KILN_ERR_RUNTIME) {
            kiln_clear_error();
            /* the im2col GEMMs (float64 only) use all threads; matmul sets OpenBLAS back to one */
            if (openblas_get_num_threads() != omp_get_max_threads()) openblas_set_num_threads(omp_get_max_threads());
            s = conv_reference(kind, p, ep, act_attrs, x, res);
        }
    }
    if (s == KILN_OK && res != out) s = kiln_copy_into(out, res);
    kiln_tensor_release(res);
    kiln_release_all(x, 4);
    return s;
}

static kiln_status conv_run(kiln_conv_kind kind, const kiln_conv_params *p, kiln_tensor *a, kiln_tensor *b,
                            kiln_tensor *bias, kiln_tensor *out) {
    return conv_run_fused(kind, p, NULL, NULL, a, b, bias, NULL, out);
}

KILN_KERNEL(conv2d) {
    kiln_conv_params p;
    KILN_TRY(conv_params("conv2d", a, in[0]->meta.shape, in[1]->meta.shape, &p));
    return conv_run(KILN_CONV_FORWARD, &p, in[0], in[1], nin == 3 ? in[2] : NULL, out[0]);
}

KILN_KERNEL(conv2d_fused) {
    kiln_conv_epilogue ep = {0};
    int64_t xs[4];
    KILN_TRY(conv_fused_epilogue(a, nin, &in[0]->meta, xs, &ep));
    kiln_conv_params p;
    KILN_TRY(conv_params("conv2d_fused", a, xs, in[1]->meta.shape, &p));
    return conv_run_fused(KILN_CONV_FORWARD, &p, &ep, a, in[0], in[1], a->i[9] ? in[2] : NULL,
                          ep.residual ? in[nin - 1] : NULL, out[0]);
}

/* A backward op's algorithm as an epilogue: Winograd allowed where its optional attribute
 * (set by the O1 pass conv_algorithm) says so, else direct. */
static kiln_status conv_backward_epilogue(const char *op, const kiln_attrs *a, kiln_conv_epilogue *ep) {
    int64_t w = kiln_attr_int(a, KILN_A_CONV_WINOGRAD, 0);
    if (w != 0 && w != 1)
        return kiln_error(KILN_ERR_VALUE, "%s: the Winograd attribute must be 0 or 1, got %lld", op, (long long)w);
    *ep = (kiln_conv_epilogue){.layout = KILN_CONV_NCHW, .winograd = w, .activation = KILN_CONV_ACT_NONE};
    return KILN_OK;
}

KILN_KERNEL(conv2d_backward_input) {
    kiln_conv_params p;
    kiln_conv_epilogue ep;
    KILN_TRY(conv_params("conv2d_backward_input", a, a->i + KILN_A_CONV_SHAPE, in[1]->meta.shape, &p));
    KILN_TRY(conv_backward_epilogue("conv2d_backward_input", a, &ep));
    return conv_run_fused(KILN_CONV_BACKWARD_INPUT, &p, &ep, NULL, in[0], in[1], NULL, NULL, out[0]);
}

KILN_KERNEL(conv2d_backward_weight) {
    kiln_conv_params p;
    kiln_conv_epilogue ep;
    KILN_TRY(conv_params("conv2d_backward_weight", a, in[0]->meta.shape, a->i + KILN_A_CONV_SHAPE, &p));
    KILN_TRY(conv_backward_epilogue("conv2d_backward_weight", a, &ep));
    return conv_run_fused(KILN_CONV_BACKWARD_WEIGHT, &p, &ep, NULL, in[0], in[1], NULL, NULL, out[0]);
}

/* ---- gradient ----------------------------------------------------------------------------- */

static kiln_status conv_backward(kiln_op op, const kiln_attrs *fwd, const kiln_meta *target, kiln_tensor *a,
                                 kiln_tensor *b, kiln_tensor **out) {
    kiln_attrs at;
    kiln_attrs_clear(&at);
    for (int k = 0; k < 9; k++) kiln_attrs_push_int(&at, fwd->i[k]);
    for (int d = 0; d < 4; d++) kiln_attrs_push_int(&at, target->shape[d]);
    kiln_tensor *ins[2] = {a, b};
    return kiln_apply(op, 2, ins, &at, out);
}

KILN_GRAD(conv2d) {
    kiln_tensor *gy = gout[0];
    if (!gy) return KILN_OK;
    kiln_status s = KILN_OK;
    if (ctx->needs_grad[0])
        s = conv_backward(KILN_OP_CONV2D_BACKWARD_INPUT, ctx->attrs, &ctx->in_meta[0], gy, ctx->in[1], &gin[0]);
    if (s == KILN_OK && ctx->needs_grad[1])
        s = conv_backward(KILN_OP_CONV2D_BACKWARD_WEIGHT, ctx->attrs, &ctx->in_meta[1], ctx->in[0], gy, &gin[1]);
    if (s == KILN_OK && ctx->nin == 3 && ctx->needs_grad[2])
        s = kiln_emit_reduce(KILN_OP_SUM, gy, 0xD /* axes 0, 2, 3 */, false, &gin[2]);
    return s;
}

/* conv2d_backward_input(gy, w) is linear in each input: the transposed convolution (what
 * ops.conv_transpose2d computes with it). Its adjoint in gy is the forward convolution of the
 * incoming gradient g (of the input's shape) by w; in w, conv2d_backward_weight(g, gy). */
KILN_GRAD(conv2d_backward_input) {
    kiln_tensor *g = gout[0];
    if (!g) return KILN_OK;
    kiln_status s = KILN_OK;
    if (ctx->needs_grad[0]) {
        kiln_attrs at;
        kiln_attrs_clear(&at);
        for (int k = 0; k < 9; k++) kiln_attrs_push_int(&at, ctx->attrs->i[k]);
        kiln_tensor *ins[2] = {g, ctx->in[1]};
        s = kiln_apply(KILN_OP_CONV2D, 2, ins, &at, &gin[0]);
    }
    if (s == KILN_OK && ctx->needs_grad[1])
        s = conv_backward(KILN_OP_CONV2D_BACKWARD_WEIGHT, ctx->attrs, &ctx->in_meta[1], g, ctx->in[0], &gin[1]);
    return s;
}

/* conv2d_backward_weight(x, gy) = the weight gradient of conv2d(x, w) (bilinear: <gw, W> =
 * <gy, conv2d(x, W)> for any W). Its adjoint for an incoming gradient W of the weight's shape: in
 * gy the forward convolution conv2d(x, W); in x the transposed one, conv2d_backward_input(gy, W).
 * (Gradient penalties and Hessians of convolutional networks reach it.) */
KILN_GRAD(conv2d_backward_weight) {
    kiln_tensor *g = gout[0];
    if (!g) return KILN_OK;
    kiln_status s = KILN_OK;
    if (ctx->needs_grad[0])
        s = conv_backward(KILN_OP_CONV2D_BACKWARD_INPUT, ctx->attrs, &ctx->in_meta[0], ctx->in[1], g, &gin[0]);
    if (s == KILN_OK && ctx->needs_grad[1]) {
        kiln_attrs at;
        kiln_attrs_clear(&at);
        for (int k = 0; k < 9; k++) kiln_attrs_push_int(&at, ctx->attrs->i[k]);
        kiln_tensor *ins[2] = {ctx->in[0], g};
        s = kiln_apply(KILN_OP_CONV2D, 2, ins, &at, &gin[1]);
    }
    return s;
}
