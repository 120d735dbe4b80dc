/* Strided copies with dtype conversion: the building block of cast, contiguous, expand
 * materialization and slice assignment. */
#include "internal.h"

static inline double load_double(const char *p, kiln_dtype d) {
    switch (d) {
    case KILN_DTYPE_BOOL: return *(const uint8_t *)p ? 1.0 : 0.0;
    case KILN_DTYPE_INT8: return *(const int8_t *)p;
    case KILN_DTYPE_INT32: return *(const int32_t *)p;
    case KILN_DTYPE_INT64: return (double)*(const int64_t *)p;
    case KILN_DTYPE_FLOAT16: return kiln_f16_to_f32(*(const uint16_t *)p);
    case KILN_DTYPE_BFLOAT16: return kiln_bf16_to_f32(*(const uint16_t *)p);
    case KILN_DTYPE_FLOAT32: return *(const float *)p;
    case KILN_DTYPE_FLOAT64: return *(const double *)p;
    default: return 0;
    }
}

static inline int64_t load_int(const char *p, kiln_dtype d) {
    switch (d) {
    case KILN_DTYPE_BOOL: return *(const uint8_t *)p != 0;
    case KILN_DTYPE_INT8: return *(const int8_t *)p;
    case KILN_DTYPE_INT32: return *(const int32_t *)p;
    case KILN_DTYPE_INT64: return *(const int64_t *)p;
    default: return 0;
    }
}

/* Float to integer conversion that is defined for every input (NaN -> 0, saturating). */
static inline int64_t double_to_int(double v, double lo, double hi) {
    if (v != v) return 0;
    if (v <= lo) return (int64_t)lo;
    if (v >= hi) return (int64_t)hi;
    return (int64_t)v;
}

static inline void store_double(char *p, kiln_dtype d, double v) {
    switch (d) {
    case KILN_DTYPE_BOOL: *(uint8_t *)p = v != 0; break;
    case KILN_DTYPE_INT8: *(int8_t *)p = (int8_t)double_to_int(v, -128, 127); break;
    case KILN_DTYPE_INT32: *(int32_t *)p = (int32_t)double_to_int(v, -2147483648.0, 2147483647.0); break;
    case KILN_DTYPE_INT64: *(int64_t *)p = double_to_int(v, -9223372036854775808.0, 9223372036854774784.0); break;
    case KILN_DTYPE_FLOAT16: *(uint16_t *)p = kiln_f32_to_f16((float)v); break;
    case KILN_DTYPE_BFLOAT16: *(uint16_t *)p = kiln_f32_to_bf16((float)v); break;
    case KILN_DTYPE_FLOAT32: *(float *)p = (float)v; break;
    case KILN_DTYPE_FLOAT64: *(double *)p = v; break;
    default: break;
    }
}

static inline void store_int(char *p, kiln_dtype d, int64_t v) {
    switch (d) {
    case KILN_DTYPE_BOOL: *(uint8_t *)p = v != 0; break;
    case KILN_DTYPE_INT8: *(int8_t *)p = (int8_t)v; break;
    case KILN_DTYPE_INT32: *(int32_t *)p = (int32_t)v; break;
    case KILN_DTYPE_INT64: *(int64_t *)p = v; break;
    default: break;
    }
}

double kiln_tensor_get_double(const kiln_tensor *t, int64_t index) {
    const char *p = t->data;
    for (int d = t->meta.ndim - 1; d >= 0; d--) {
        int64_t i = index % t->meta.shape[d];
        index /= t->meta.shape[d];
        p += i * t->strides[d] * (int64_t)kiln_dtype_size(t->meta.dtype);
    }
    return load_double(p, t->meta.dtype);
}

typedef struct {
    kiln_dtype dst, src;
} convert_ctx;

#define DEFINE_SAME_COPY(T)                                                                  \
    static void copy_##T(void *ctx, int64_t n, char **p, const int64_t *s) {                 \
        (void)ctx;                                                                           \
        T *dst = (T *)p[0];                                                                  \
        const T *src = (const T *)p[1];                                                      \
        int64_t ds = s[0] / (int64_t)sizeof(T), ss = s[1] / (int64_t)sizeof(T);              \
        if (ds == 1 && ss == 1) {                                                            \
            memcpy(dst, src, (size_t)n * sizeof(T));                                         \
        } else if (ds == 1 && ss == 0) {                                                     \
            T v = *src;                                                                      \
            for (int64_t i = 0; i < n; i++) dst[i] = v;                                      \
        } else {                                                                             \
            for (int64_t i = 0; i < n; i++) dst[i * ds] = src[i * ss];                       \
        }                                                                                    \
    }
DEFINE_SAME_COPY(uint8_t)
DEFINE_SAME_COPY(uint16_t)
DEFINE_SAME_COPY(uint32_t)
DEFINE_SAME_COPY(uint64_t)

/* float16 <-> float32 rows: F16C where the float32 side is contiguous (src/core/half.c) */
static void copy_f32_from_f16(void *ctx, int64_t n, char **p, const int64_t *s) {
    (void)ctx;
    if (s[0] == sizeof(float)) {
        kiln_f16_row((float *)p[0], p[1], s[1], n);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        *(float *)(p[0] + i * s[0]) = kiln_f16_to_f32(*(const uint16_t *)(p[1] + i * s[1]));
}
static void copy_f16_from_f32(void *ctx, int64_t n, char **p, const int64_t *s) {
    (void)ctx;
    if (s[1] == sizeof(float)) {
        kiln_f16_store_row(p[0], s[0], (const float *)p[1], n);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        *(uint16_t *)(p[0] + i * s[0]) = kiln_f32_to_f16(*(const float *)(p[1] + i * s[1]));
}
/* bfloat16 <-> float32 rows: contiguous rows as loops the compiler vectorizes (the rounding
 * written without branches: kiln_f32_to_bf16's, NaN quieted the same way) */
static void copy_f32_from_bf16(void *ctx, int64_t n, char **p, const int64_t *s) {
    (void)ctx;
    if (s[0] == sizeof(float) && s[1] == sizeof(uint16_t)) {
        uint32_t *restrict dst = (uint32_t *)p[0];
        const uint16_t *restrict src = (const uint16_t *)p[1];
        for (int64_t i = 0; i < n; i++) dst[i] = (uint32_t)src[i] << 16;
        return;
    }
    for (int64_t i = 0; i < n; i++)
        *(float *)(p[0] + i * s[0]) = kiln_bf16_to_f32(*(const uint16_t *)(p[1] + i * s[1]));
}
static void copy_bf16_from_f32(void *ctx, int64_t n, char **p, const int64_t *s) {
    (void)ctx;
    if (s[0] == sizeof(uint16_t) && s[1] == sizeof(float)) {
        uint16_t *restrict dst = (uint16_t *)p[0];
        const uint32_t *restrict src = (const uint32_t *)p[1];
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = src[i];
            uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
            dst[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
        }
        return;
    }
    for (int64_t i = 0; i < n; i++)
        *(uint16_t *)(p[0] + i * s[0]) = kiln_f32_to_bf16(*(const float *)(p[1] + i * s[1]));
}

static void copy_convert(void *vctx, int64_t n, char **p, const int64_t *s) {
    const convert_ctx *c = vctx;
    bool ints = !kiln_dtype_is_float(c->dst) && !kiln_dtype_is_float(c->src);
    for (int64_t i = 0; i < n; i++) {
        if (ints)
            store_int(p[0] + i * s[0], c->dst, load_int(p[1] + i * s[1], c->src));
        else
            store_double(p[0] + i * s[0], c->dst, load_double(p[1] + i * s[1], c->src));
    }
}

kiln_status kiln_copy_into(kiln_tensor *dst, const kiln_tensor *src) {
    int64_t strides[2][KILN_MAX_DIMS];
    if (src->meta.ndim > dst->meta.ndim) goto bad_shape;
    for (int d = 0; d < src->meta.ndim; d++) {
        int64_t s = src->meta.shape[d], o = dst->meta.shape[dst->meta.ndim - src->meta.ndim + d];
        if (s != o && s != 1) goto bad_shape;
    }
    memcpy(strides[0], dst->strides, sizeof(int64_t) * (size_t)dst->meta.ndim);
    kiln_broadcast_strides(src, dst->meta.ndim, dst->meta.shape, strides[1]);
    kiln_dtype dd = dst->meta.dtype, sd = src->meta.dtype;
    char *base[2] = {dst->data, src->data};
    size_t isz[2] = {kiln_dtype_size(dd), kiln_dtype_size(sd)};
    kiln_inner_fn fn;
    convert_ctx ctx = {dd, sd};
    if (dd == sd || (kiln_dtype_size(dd) == 1 && kiln_dtype_size(sd) == 1 && dd != KILN_DTYPE_BOOL && sd != KILN_DTYPE_BOOL)) {
        switch (isz[0]) {
        case 1: fn = copy_uint8_t; break;
        case 2: fn = copy_uint16_t; break;
        case 4: fn = copy_uint32_t; break;
        default: fn = copy_uint64_t; break;
        }
        if (dd != sd) fn = copy_convert; /* int8 <-> bool needs normalization */
    } else if (dd == KILN_DTYPE_FLOAT32 && sd == KILN_DTYPE_FLOAT16) {
        fn = copy_f32_from_f16;
    } else if (dd == KILN_DTYPE_FLOAT16 && sd == KILN_DTYPE_FLOAT32) {
        fn = copy_f16_from_f32;
    } else if (dd == KILN_DTYPE_FLOAT32 && sd == KILN_DTYPE_BFLOAT16) {
        fn = copy_f32_from_bf16;
    } else if (dd == KILN_DTYPE_BFLOAT16 && sd == KILN_DTYPE_FLOAT32) {
        fn = copy_bf16_from_f32;
    } else {
        fn = copy_convert;
    }
    kiln_iterate(2, base, isz, (const int64_t(*)[KILN_MAX_DIMS])strides, dst->meta.ndim, dst->meta.shape, fn, &ctx);
    return KILN_OK;
bad_shape:;
    char a[160], b[160];
    return kiln_error(KILN_ERR_VALUE, "copy: cannot broadcast a tensor of shape %s to shape %s",
                      kiln_shape_str(&src->meta, a, sizeof a), kiln_shape_str(&dst->meta, b, sizeof b));
}

kiln_status kiln_to_contiguous(kiln_tensor *t, kiln_dtype dtype, kiln_tensor **out) {
    if (t->meta.dtype == dtype && kiln_tensor_is_contiguous(t)) {
        kiln_tensor_retain(t);
        *out = t;
        return KILN_OK;
    }
    KILN_TRY(kiln_tensor_empty(dtype, t->meta.ndim, t->meta.shape, out));
    kiln_status s = kiln_copy_into(*out, t);
    if (s != KILN_OK) {
        kiln_tensor_release(*out);
        *out = NULL;
    }
    return s;
}
