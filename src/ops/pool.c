/* 2-D max and average pooling (NCHW) with kernel, stride, asymmetric padding, dilation,
 * ceil_mode and count_include_pad, and their backward ops. Plain loops, OpenMP over the
 * N*C planes. Max pooling propagates NaN and takes the first maximum; its backward recomputes
 * that argmax from x. Integer dtypes work (average: int64 sum, truncating division, as
 * PyTorch); float16/bfloat16 compute in float32. */
#include "../core/internal.h"

typedef struct {
    int64_t planes, H, W, OH, OW;
    int64_t kh, kw, sh, sw, pt, pb, pl, pr, dh, dw;
    bool include_pad;
} pool_geom;

/* PyTorch's pooling_output_shape_pad: in ceil mode the last window must start inside the
 * input or its leading padding. */
static int64_t pool_out_size(int64_t in, int64_t ek, int64_t pl, int64_t pr, int64_t s, bool ceil) {
    int64_t num = in + pl + pr - ek + (ceil ? s - 1 : 0); /* (pool_geometry checks it cannot overflow) */
    int64_t out = num < 0 ? 0 : num / s + 1;              /* (no window fits: refused) */
    if (ceil && (out - 1) * s >= in + pl) out--;
    return out;
}

/* Validates the 12 pooling attrs for input shape xs (4-D) and fills g. */
static kiln_status pool_geometry(const char *op, const kiln_attrs *a, const kiln_meta *mx, pool_geom *g) {
    char buf[160];
    KILN_TRY(kiln_attrs_expect(op, a, 12, 0));
    if (mx->ndim != 4)
        return kiln_error(KILN_ERR_VALUE, "%s: input must be 4-D (N, C, H, W), got shape %s", op,
                          kiln_shape_str(mx, buf, sizeof buf));
    const int64_t *i = a->i;
    *g = (pool_geom){.planes = mx->shape[0] * mx->shape[1], .H = mx->shape[2], .W = mx->shape[3],
                     .kh = i[0], .kw = i[1], .sh = i[2], .sw = i[3], .pt = i[4], .pb = i[5], .pl = i[6], .pr = i[7],
                     .dh = i[8], .dw = i[9], .include_pad = i[11] != 0};
    if (g->kh < 1 || g->kw < 1 || g->sh < 1 || g->sw < 1 || g->dh < 1 || g->dw < 1)
        return kiln_error(KILN_ERR_VALUE, "%s: kernel (%lld, %lld), stride (%lld, %lld) and dilation (%lld, %lld) must be positive",
                          op, (long long)g->kh, (long long)g->kw, (long long)g->sh, (long long)g->sw, (long long)g->dh,
                          (long long)g->dw);
    /* the dilated kernel, the padded input and, for ceil_mode, a stride more: checked, attributes
     * may be anything */
    int64_t ekh, ekw, ph, pw, spare;
    if (__builtin_mul_overflow(g->kh - 1, g->dh, &ekh) || __builtin_add_overflow(ekh, 1, &ekh) ||
        __builtin_mul_overflow(g->kw - 1, g->dw, &ekw) || __builtin_add_overflow(ekw, 1, &ekw))
        return kiln_error(KILN_ERR_VALUE, "%s: kernel (%lld, %lld) with dilation (%lld, %lld) is too large", op,
                          (long long)g->kh, (long long)g->kw, (long long)g->dh, (long long)g->dw);
    if (g->pt < 0 || g->pb < 0 || g->pl < 0 || g->pr < 0 || g->pt > ekh / 2 || g->pb > ekh / 2 || g->pl > ekw / 2 ||
        g->pr > ekw / 2)
        return kiln_error(KILN_ERR_VALUE, "%s: padding (%lld, %lld, %lld, %lld) must be between 0 and half the (dilated) kernel (%lld, %lld)",
                          op, (long long)g->pt, (long long)g->pb, (long long)g->pl, (long long)g->pr, (long long)ekh,
                          (long long)ekw);
    if (__builtin_add_overflow(g->H, g->pt, &ph) || __builtin_add_overflow(ph, g->pb, &ph) ||
        __builtin_add_overflow(g->W, g->pl, &pw) || __builtin_add_overflow(pw, g->pr, &pw) ||
        (i[10] && (__builtin_add_overflow(ph, g->sh, &spare) || __builtin_add_overflow(pw, g->sw, &spare))))
        return kiln_error(KILN_ERR_VALUE, "%s: padding (%lld, %lld, %lld, %lld) or stride (%lld, %lld) too large for input %s",
                          op, (long long)g->pt, (long long)g->pb, (long long)g->pl, (long long)g->pr, (long long)g->sh,
                          (long long)g->sw, kiln_shape_str(mx, buf, sizeof buf));
    g->OH = pool_out_size(g->H, ekh, g->pt, g->pb, g->sh, i[10] != 0);
    g->OW = pool_out_size(g->W, ekw, g->pl, g->pr, g->sw, i[10] != 0);
    if (g->OH < 1 || g->OW < 1)
        return kiln_error(KILN_ERR_VALUE, "%s: kernel (%lld, %lld) (dilated (%lld, %lld)) is larger than the padded input (%lld, %lld) of shape %s",
                          op, (long long)g->kh, (long long)g->kw, (long long)ekh, (long long)ekw, (long long)ph,
                          (long long)pw, kiln_shape_str(mx, buf, sizeof buf));
    return KILN_OK;
}

static void pool_out_meta(const kiln_meta *mx, const pool_geom *g, kiln_dtype dt, kiln_meta *out) {
    int64_t shape[4] = {mx->shape[0], mx->shape[1], g->OH, g->OW};
    kiln_meta_set(out, dt, 4, shape);
}

static kiln_status pool_check_dtype(const char *op, kiln_dtype dt) {
    if (dt == KILN_DTYPE_BOOL) return kiln_error(KILN_ERR_TYPE, "%s: not supported for bool tensors", op);
    return KILN_OK;
}

/* grad must have the pooled shape of mx. */
static kiln_status pool_check_grad(const char *op, const kiln_meta *gm, const kiln_meta *mx, const pool_geom *g) {
    kiln_meta want;
    pool_out_meta(mx, g, gm->dtype, &want);
    bool ok = gm->ndim == 4;
    for (int d = 0; ok && d < 4; d++) ok = gm->shape[d] == want.shape[d];
    if (!ok) {
        char b1[160], b2[160];
        return kiln_error(KILN_ERR_VALUE, "%s: grad of shape %s does not match the pooled shape %s", op,
                          kiln_shape_str(gm, b1, sizeof b1), kiln_shape_str(&want, b2, sizeof b2));
    }
    return KILN_OK;
}

KILN_INFER(pool2d) {
    const char *op = "pool2d";
    pool_geom g = {0};
    KILN_TRY(pool_check_dtype(op, in[0]->meta.dtype));
    KILN_TRY(pool_geometry(op, a, &in[0]->meta, &g));
    pool_out_meta(&in[0]->meta, &g, in[0]->meta.dtype, out);
    return KILN_OK;
}

KILN_INFER(max_pool2d_backward) {
    const char *op = "max_pool2d_backward";
    pool_geom g = {0};
    const kiln_meta *mx = &in[1]->meta;
    KILN_TRY(pool_check_dtype(op, mx->dtype));
    KILN_TRY(pool_geometry(op, a, mx, &g));
    KILN_TRY(pool_check_grad(op, &in[0]->meta, mx, &g));
    *out = *mx;
    out->dtype = kiln_dtype_promote(in[0]->meta.dtype, mx->dtype);
    return KILN_OK;
}

KILN_INFER(avg_pool2d_backward) {
    const char *op = "avg_pool2d_backward";
    pool_geom g = {0};
    KILN_TRY(kiln_attrs_expect(op, a, 16, 0));
    kiln_meta mx;
    kiln_meta_set(&mx, in[0]->meta.dtype, 4, a->i + 12);
    KILN_TRY(pool_check_dtype(op, mx.dtype));
    KILN_TRY(pool_geometry(op, a, &mx, &g));
    KILN_TRY(pool_check_grad(op, &in[0]->meta, &mx, &g));
    *out = mx;
    return KILN_OK;
}

/* ---- loops: one (H, W) plane at a time ---------------------------------------------------- */

/* One output row (or column) of windows: input index start + k*d for k in [k0, k1) is inside
 * the input; `count` is its share of the average divisor. Tabulated once per call. */
typedef struct {
    int64_t start, k0, k1, count;
} pool_span;

/* (no a + b - 1: a dilation may be anything up to INT64_MAX) */
static inline int64_t ceil_div(int64_t a, int64_t b) { return a <= 0 ? 0 : (a - 1) / b + 1; }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

static void pool_spans(int64_t n_out, int64_t n_in, int64_t k, int64_t s, int64_t pad_lo, int64_t pad_hi, int64_t d,
                       bool include_pad, pool_span *sp) {
    for (int64_t o = 0; o < n_out; o++) {
        int64_t start = o * s - pad_lo;
        sp[o].start = start;
        sp[o].k0 = ceil_div(-start, d);
        sp[o].k1 = min64(k, ceil_div(n_in - start, d));
        sp[o].count = include_pad ? min64(k, ceil_div(n_in + pad_hi - start, d)) : sp[o].k1 - sp[o].k0;
    }
}

static bool pool_parallel(const pool_geom *g) {
    return g->planes > 1 && g->planes * g->OH * g->OW * g->kh * g->kw >= KILN_PARALLEL_MIN;
}

/* Offset (in the plane) of the first maximum of window (hs, ws), which is never empty (the
 * padding is at most half the kernel); NaN wins. */
#define POOL_ARGMAX(T, x, g, hs, ws, best_off)                                               \
    do {                                                                                     \
        best_off = ((hs)->start + (hs)->k0 * (g)->dh) * (g)->W + (ws)->start + (ws)->k0 * (g)->dw; \
        T best_ = (x)[best_off];                                                             \
        if (best_ != best_) break;                                                           \
        for (int64_t kh = (hs)->k0; kh < (hs)->k1; kh++) {                                   \
            const T *row_ = (x) + ((hs)->start + kh * (g)->dh) * (g)->W + (ws)->start;       \
            for (int64_t kw = (ws)->k0; kw < (ws)->k1; kw++) {                               \
                T v_ = row_[kw * (g)->dw];                                                   \
                if (v_ > best_ || v_ != v_) {                                                \
                    best_ = v_, best_off = row_ - (x) + kw * (g)->dw;                        \
                    if (v_ != v_) goto argmax_done_;                                         \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    argmax_done_:;                                                                           \
    } while (0)

/* Loops over planes p (running PRE first in each) and outputs (oh, ow), with hs/ws the spans
 * of the window. */
#define POOL_FOR_EACH_WINDOW(g, HS, WS, PRE, BODY)                                           \
    _Pragma("omp parallel for schedule(static) if (pool_parallel(g))")                       \
    for (int64_t p = 0; p < (g)->planes; p++) {                                              \
        PRE                                                                                  \
        for (int64_t oh = 0; oh < (g)->OH; oh++)                                             \
            for (int64_t ow = 0; ow < (g)->OW; ow++) {                                       \
                const pool_span *hs = &(HS)[oh], *ws = &(WS)[ow];                            \
                const int64_t yi = (p * (g)->OH + oh) * (g)->OW + ow;                        \
                BODY                                                                         \
            }                                                                                \
    }

#define POOL_LOOPS(SUF, T, ACC)                                                               \
    static void max_fwd_##SUF(const pool_geom *g, const pool_span *HS, const pool_span *WS, const T *X, T *Y) { \
        POOL_FOR_EACH_WINDOW(g, HS, WS, {}, {                                                 \
            const T *x = X + p * g->H * g->W;                                                 \
            int64_t off = 0;                                                                  \
            POOL_ARGMAX(T, x, g, hs, ws, off);                                                \
            Y[yi] = x[off];                                                                   \
        })                                                                                    \
    }                                                                                         \
    static void avg_fwd_##SUF(const pool_geom *g, const pool_span *HS, const pool_span *WS, const T *X, T *Y) { \
        POOL_FOR_EACH_WINDOW(g, HS, WS, {}, {                                                 \
            const T *x = X + p * g->H * g->W;                                                 \
            ACC s = 0;                                                                        \
            for (int64_t kh = hs->k0; kh < hs->k1; kh++) {                                    \
                const T *row = x + (hs->start + kh * g->dh) * g->W + ws->start;               \
                for (int64_t kw = ws->k0; kw < ws->k1; kw++) s += (ACC)row[kw * g->dw];       \
            }                                                                                 \
            Y[yi] = (T)(s / (ACC)(hs->count * ws->count));                                    \
        })                                                                                    \
    }                                                                                         \
    /* backward: one plane per thread, so the scattered sums need no atomics */               \
    static void max_bwd_##SUF(const pool_geom *g, const pool_span *HS, const pool_span *WS, const T *GY, \
                              const T *X, T *GX) {                                            \
        POOL_FOR_EACH_WINDOW(g, HS, WS, memset(GX + p * g->H * g->W, 0, sizeof(T) * (size_t)(g->H * g->W));, { \
            const T *x = X + p * g->H * g->W;                                                 \
            int64_t off = 0;                                                                  \
            POOL_ARGMAX(T, x, g, hs, ws, off);                                                \
            GX[p * g->H * g->W + off] += GY[yi];                                              \
        })                                                                                    \
    }                                                                                         \
    static void avg_bwd_##SUF(const pool_geom *g, const pool_span *HS, const pool_span *WS, const T *GY, T *GX) { \
        POOL_FOR_EACH_WINDOW(g, HS, WS, memset(GX + p * g->H * g->W, 0, sizeof(T) * (size_t)(g->H * g->W));, { \
            T *gx = GX + p * g->H * g->W;                                                     \
            T v = (T)(GY[yi] / (ACC)(hs->count * ws->count));                                 \
            for (int64_t kh = hs->k0; kh < hs->k1; kh++) {                                    \
                T *row = gx + (hs->start + kh * g->dh) * g->W + ws->start;                    \
                for (int64_t kw = ws->k0; kw < ws->k1; kw++) row[kw * g->dw] += v;            \
            }                                                                                 \
        })                                                                                    \
    }
POOL_LOOPS(f32, float, float)
POOL_LOOPS(f64, double, double)
POOL_LOOPS(i8, int8_t, int64_t)
POOL_LOOPS(i32, int32_t, int64_t)
POOL_LOOPS(i64, int64_t, int64_t)

/* ---- kernels ------------------------------------------------------------------------------ */

typedef enum { POOL_MAX_FWD, POOL_MAX_BWD, POOL_AVG_FWD, POOL_AVG_BWD } pool_kind;

static kiln_dtype pool_compute_dtype(kiln_dtype d) {
    return d == KILN_DTYPE_FLOAT16 || d == KILN_DTYPE_BFLOAT16 ? KILN_DTYPE_FLOAT32 : d;
}

#define POOL_CALL(SUF, T)                                                                     \
    switch (kind) {                                                                           \
    case POOL_MAX_FWD: max_fwd_##SUF(g, hs, ws, (const T *)a, (T *)y); break;                 \
    case POOL_MAX_BWD: max_bwd_##SUF(g, hs, ws, (const T *)a, (const T *)b, (T *)y); break;   \
    case POOL_AVG_FWD: avg_fwd_##SUF(g, hs, ws, (const T *)a, (T *)y); break;                 \
    case POOL_AVG_BWD: avg_bwd_##SUF(g, hs, ws, (const T *)a, (T *)y); break;                 \
    }

static void pool_dispatch(pool_kind kind, kiln_dtype ct, const pool_geom *g, const pool_span *hs, const pool_span *ws,
                          const void *a, const void *b, void *y) {
    switch (ct) {
    case KILN_DTYPE_FLOAT64: POOL_CALL(f64, double) break;
    case KILN_DTYPE_INT8: POOL_CALL(i8, int8_t) break;
    case KILN_DTYPE_INT32: POOL_CALL(i32, int32_t) break;
    case KILN_DTYPE_INT64: POOL_CALL(i64, int64_t) break;
    default: POOL_CALL(f32, float) break;
    }
}

/* Runs `kind` on a (and b) into out, through contiguous buffers of the compute dtype. */
static kiln_status pool_run(pool_kind kind, const pool_geom *g, kiln_tensor *a, kiln_tensor *b, kiln_tensor *out) {
    kiln_dtype ct = pool_compute_dtype(out->meta.dtype);
    kiln_tensor *x[2] = {NULL, NULL}, *res = NULL;
    kiln_status s = kiln_to_contiguous(a, ct, &x[0]);
    if (s == KILN_OK && b) s = kiln_to_contiguous(b, ct, &x[1]);
    if (s == KILN_OK) {
        if (out->meta.dtype == ct) kiln_tensor_retain(out), res = out;
        else s = kiln_tensor_empty(ct, out->meta.ndim, out->meta.shape, &res);
    }
    pool_span *hs = NULL;
    if (s == KILN_OK && !(hs = kiln_malloc(sizeof(pool_span) * (size_t)(g->OH + g->OW))))
        s = kiln_error(KILN_ERR_MEMORY, "pooling: out of memory");
    if (s == KILN_OK) {
        pool_spans(g->OH, g->H, g->kh, g->sh, g->pt, g->pb, g->dh, g->include_pad, hs);
        pool_spans(g->OW, g->W, g->kw, g->sw, g->pl, g->pr, g->dw, g->include_pad, hs + g->OH);
        pool_dispatch(kind, ct, g, hs, hs + g->OH, x[0]->data, x[1] ? x[1]->data : NULL, res->data);
    }
    free(hs);
    if (s == KILN_OK && res != out) s = kiln_copy_into(out, res);
    kiln_tensor_release(res);
    kiln_release_all(x, 2);
    return s;
}

KILN_KERNEL(max_pool2d) {
    pool_geom g = {0};
    KILN_TRY(pool_geometry("max_pool2d", a, &in[0]->meta, &g));
    return pool_run(POOL_MAX_FWD, &g, in[0], NULL, out[0]);
}

KILN_KERNEL(avg_pool2d) {
    pool_geom g = {0};
    KILN_TRY(pool_geometry("avg_pool2d", a, &in[0]->meta, &g));
    return pool_run(POOL_AVG_FWD, &g, in[0], NULL, out[0]);
}

KILN_KERNEL(max_pool2d_backward) {
    pool_geom g = {0};
    KILN_TRY(pool_geometry("max_pool2d_backward", a, &in[1]->meta, &g));
    return pool_run(POOL_MAX_BWD, &g, in[0], in[1], out[0]);
}

KILN_KERNEL(avg_pool2d_backward) {
    pool_geom g = {0};
    kiln_meta mx = out[0]->meta;
    KILN_TRY(pool_geometry("avg_pool2d_backward", a, &mx, &g));
    return pool_run(POOL_AVG_BWD, &g, in[0], NULL, out[0]);
}

/* ---- gradients ---------------------------------------------------------------------------- */

KILN_GRAD(max_pool2d) {
    if (!gout[0]) return KILN_OK;
    kiln_attrs at;
    kiln_attrs_clear(&at);
    for (int k = 0; k < 12; k++) kiln_attrs_push_int(&at, ctx->attrs->i[k]);
    kiln_tensor *ins[2] = {gout[0], ctx->in[0]};
    return kiln_apply(KILN_OP_MAX_POOL2D_BACKWARD, 2, ins, &at, &gin[0]);
}

KILN_GRAD(avg_pool2d) {
    if (!gout[0]) return KILN_OK;
    kiln_attrs at;
    kiln_attrs_clear(&at);
    for (int k = 0; k < 12; k++) kiln_attrs_push_int(&at, ctx->attrs->i[k]);
    for (int d = 0; d < 4; d++) kiln_attrs_push_int(&at, ctx->in_meta[0].shape[d]);
    return kiln_apply(KILN_OP_AVG_POOL2D_BACKWARD, 1, (kiln_tensor *const *)&gout[0], &at, &gin[0]);
}

/* max_pool2d_backward(grad, x) puts each output's gradient at its window's first maximum: linear
 * in grad, piecewise constant in x (its derivative there 0, as max_pool2d's second derivative).
 * Its adjoint in grad picks, per window, the incoming gradient at that maximum: max_pool2d's
 * forward-mode rule (src/ops/jvp_rules.c), which picks a tangent the same way. */
kiln_status kiln_jvp_max_pool2d(const kiln_grad_ctx *, kiln_tensor *const *, kiln_tensor **);

KILN_GRAD(max_pool2d_backward) {
    kiln_tensor *g = gout[0];
    if (!g) return KILN_OK;
    kiln_status s = KILN_OK;
    if (ctx->needs_grad[0]) {
        kiln_tensor *x = ctx->in[1], *y = NULL;
        kiln_attrs at;
        kiln_attrs_clear(&at);
        for (int k = 0; k < 12; k++) kiln_attrs_push_int(&at, ctx->attrs->i[k]);
        s = kiln_apply(KILN_OP_MAX_POOL2D, 1, &x, &at, &y);
        if (s == KILN_OK) {
            bool has[1] = {true};
            kiln_tensor *ins[1] = {x}, *outs[1] = {y};
            kiln_grad_ctx c = {KILN_OP_MAX_POOL2D, 1, 1, ins, outs, &x->meta, &y->meta, &at, has};
            s = kiln_jvp_max_pool2d(&c, &g, &gin[0]);
        }
        kiln_tensor_release(y);
    }
    if (s == KILN_OK && ctx->needs_grad[1]) {
        kiln_tensor *z = NULL;
        s = kiln_emit_full(&ctx->in_meta[1], 0.0, &z);
        if (s == KILN_OK) gin[1] = z;
    }
    if (s != KILN_OK) kiln_release_all(gin, 2);
    return s;
}

/* avg_pool2d_backward(grad) spreads each window's gradient evenly: linear, its adjoint the average
 * pool itself (the same windows and divisors) */
KILN_GRAD(avg_pool2d_backward) {
    if (!gout[0]) return KILN_OK;
    kiln_attrs at;
    kiln_attrs_clear(&at);
    for (int k = 0; k < 12; k++) kiln_attrs_push_int(&at, ctx->attrs->i[k]);
    return kiln_apply(KILN_OP_AVG_POOL2D, 1, (kiln_tensor *const *)&gout[0], &at, &gin[0]);
}
