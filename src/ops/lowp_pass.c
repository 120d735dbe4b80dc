/* Whole-tensor 16-bit <-> float32 conversions of the float32-computing kernels (lowp_pass.h). A
 * product of 16-bit operands off the hardware path multiplies float32 copies of them with kiln's
 * sgemm and rounds the result once; what it costs over float32 is these copies. Each is one pass over memory, split
 * over the threads in blocks of whole cache lines, through the vectorized rows of src/core/half.c
 * (kiln_f16_row / kiln_bf16_row and their stores); the plain loops below are their reference. */
#include <omp.h>

#include "lowp_pass.h"

/* Split points of a pass over n elements: multiples of 64 (whole cache lines of both widths). */
enum { LOWP_ALIGN = 64 };

static int lowp_threads(int64_t n) {
    if (n < KILN_PARALLEL_MIN || omp_in_parallel()) return 1;
    int t = omp_get_max_threads();
    int64_t most = n / LOWP_ALIGN;
    return t > most ? (int)(most > 0 ? most : 1) : t;
}

static void lowp_span(int64_t n, int threads, int t, int64_t *lo, int64_t *hi) {
    *lo = t == 0 ? 0 : (n * t / threads) & ~(int64_t)(LOWP_ALIGN - 1);
    *hi = t == threads - 1 ? n : (n * (t + 1) / threads) & ~(int64_t)(LOWP_ALIGN - 1);
}

void kiln_lowp_widen_row(kiln_dtype half, float *dst, const void *src, int64_t n) {
    if (half == KILN_DTYPE_FLOAT16) kiln_f16_row(dst, src, 2, n);
    else kiln_bf16_row(dst, src, 2, n);
}

void kiln_lowp_round_row(kiln_dtype half, void *dst, const float *src, int64_t n) {
    if (half == KILN_DTYPE_FLOAT16) kiln_f16_store_row(dst, 2, src, n);
    else kiln_bf16_store_row(dst, 2, src, n);
}

void kiln_lowp_widen_ref(kiln_dtype half, float *dst, const void *src, int64_t n) {
    const uint16_t *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = half == KILN_DTYPE_FLOAT16 ? kiln_f16_to_f32(s[i]) : kiln_bf16_to_f32(s[i]);
}

void kiln_lowp_round_ref(kiln_dtype half, void *dst, const float *src, int64_t n) {
    uint16_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = half == KILN_DTYPE_FLOAT16 ? kiln_f32_to_f16(src[i]) : kiln_f32_to_bf16(src[i]);
}

static void widen_pass(kiln_dtype half, float *dst, const char *src, int64_t n) {
    int threads = lowp_threads(n);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int t = 0; t < threads; t++) {
        int64_t lo, hi;
        lowp_span(n, threads, t, &lo, &hi);
        if (hi > lo) kiln_lowp_widen_row(half, dst + lo, src + lo * 2, hi - lo);
    }
}

static void round_pass(kiln_dtype half, char *dst, const float *src, int64_t n) {
    int threads = lowp_threads(n);
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
    for (int t = 0; t < threads; t++) {
        int64_t lo, hi;
        lowp_span(n, threads, t, &lo, &hi);
        if (hi > lo) kiln_lowp_round_row(half, dst + lo * 2, src + lo, hi - lo);
    }
}

/* Whether t's elements fill one block of memory starting at t->data: its strides, over the axes
 * longer than 1, a permutation of a contiguous layout's (none zero or negative). */
static bool dense_block(const kiln_tensor *t) {
    int64_t st[KILN_MAX_DIMS], sh[KILN_MAX_DIMS];
    int n = 0;
    if (t->numel == 0) return false;
    for (int d = 0; d < t->meta.ndim; d++) {
        if (t->meta.shape[d] == 1) continue;
        if (t->strides[d] <= 0) return false;
        int i = n++;
        for (; i > 0 && st[i - 1] > t->strides[d]; i--) st[i] = st[i - 1], sh[i] = sh[i - 1];
        st[i] = t->strides[d], sh[i] = t->meta.shape[d];
    }
    int64_t expect = 1;
    for (int i = 0; i < n; i++) {
        if (st[i] != expect) return false;
        expect *= sh[i];
    }
    return true;
}

bool kiln_lowp_dtype(kiln_dtype d) { return d == KILN_DTYPE_FLOAT16 || d == KILN_DTYPE_BFLOAT16; }

kiln_status kiln_lowp_widen(kiln_tensor *t, bool keep_layout, kiln_tensor **res) {
    bool pass = kiln_lowp_dtype(t->meta.dtype) && t->numel > 0 &&
                (keep_layout ? dense_block(t) : kiln_tensor_is_contiguous(t));
    if (!pass) return kiln_to_contiguous(t, KILN_DTYPE_FLOAT32, res);
    /* a kept weight cast's float32 copy, made by this same pass at its version: the same memory */
    kiln_tensor *kept = kiln_tensor_widened(t);
    if (kept) return kiln_tensor_view(kept, t->meta.ndim, t->meta.shape, t->strides, 0, res);
    kiln_tensor *buf;
    int64_t n = t->numel;
    KILN_TRY(kiln_tensor_empty(KILN_DTYPE_FLOAT32, 1, &n, &buf));
    widen_pass(t->meta.dtype, buf->data, t->data, n);
    if (kiln_tensor_keeps_widened(t)) kiln_tensor_set_widened(t, buf);
    kiln_status s = kiln_tensor_view(buf, t->meta.ndim, t->meta.shape, t->strides, 0, res);
    kiln_tensor_release(buf);
    return s;
}

static bool same_shape(const kiln_tensor *a, const kiln_tensor *b) {
    if (a->meta.ndim != b->meta.ndim) return false;
    for (int d = 0; d < a->meta.ndim; d++)
        if (a->meta.shape[d] != b->meta.shape[d]) return false;
    return true;
}

kiln_status kiln_lowp_copy_into(kiln_tensor *out, const kiln_tensor *src) {
    kiln_dtype od = out->meta.dtype, sd = src->meta.dtype;
    bool round = kiln_lowp_dtype(od) && sd == KILN_DTYPE_FLOAT32, widen = od == KILN_DTYPE_FLOAT32 && kiln_lowp_dtype(sd);
    if (!(round || widen) || !same_shape(out, src) || !kiln_tensor_is_contiguous(out) || !kiln_tensor_is_contiguous(src))
        return kiln_copy_into(out, src);
    if (round) round_pass(od, out->data, src->data, out->numel);
    else widen_pass(sd, out->data, src->data, out->numel);
    return KILN_OK;
}
