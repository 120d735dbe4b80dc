/* Rows of float16 <-> float32 conversions, the loads and stores of kiln's float16 arithmetic
 * (src/ops/elementwise.c) and of its float16 copies (and, at the end, the bfloat16 rows of the
 * float32-computing kernels' conversions, src/ops/lowp_pass.c). The vector path uses F16C (vcvtph2ps /
 * vcvtps2ph, eight values at a time), chosen at run time from CPUID, so a build for a baseline
 * without F16C still uses it where the CPU has it; the plain reference rows (kiln_f16_row_ref,
 * kiln_f16_store_row_ref) convert one value at a time with internal.h's conversions, and run
 * where F16C is absent and for strided rows. Both round to nearest even and give the same bits
 * (tests/c/test_half.c checks every float16 and a sweep of floats). */
#include "internal.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>

__attribute__((target("avx,f16c"))) static void load_f16c(float *dst, const uint16_t *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = kiln_f16_to_f32(src[i]);
}

__attribute__((target("avx,f16c"))) static void store_f16c(uint16_t *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = kiln_f32_to_f16(src[i]);
}

/* 1: the CPU has AVX and F16C (CPUID.1:ECX bits 28, 29, the OS saving ymm: bit 27 and XCR0; clang 14's __builtin_cpu_supports has no
 * "f16c"), 0: not, -1: not asked yet (a race only asks twice). */
static _Atomic int has_f16c = -1;

static bool f16c(void) {
    int h = atomic_load_explicit(&has_f16c, memory_order_relaxed);
    if (h < 0) {
        unsigned a, b, c, d;
        h = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 28)) && (c & (1u << 29)) && (c & (1u << 27));
        if (h) { /* OSXSAVE: the OS saves the ymm registers (XCR0 bits 1, 2) */
            unsigned lo, hi;
            __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            (void)hi;
            h = (lo & 6u) == 6u;
        }
        atomic_store_explicit(&has_f16c, h, memory_order_relaxed);
    }
    return h;
}
#else
static bool f16c(void) { return false; }
#define load_f16c(d, s, n) ((void)0)
#define store_f16c(d, s, n) ((void)0)
#endif

void kiln_f16_row_ref(float *dst, const char *src, int64_t stride, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = kiln_f16_to_f32(*(const uint16_t *)(src + i * stride));
}

void kiln_f16_store_row_ref(char *dst, int64_t stride, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) *(uint16_t *)(dst + i * stride) = kiln_f32_to_f16(src[i]);
}

void kiln_f16_row(float *dst, const char *src, int64_t stride, int64_t n) {
    if (stride == 2 && f16c())
        load_f16c(dst, (const uint16_t *)src, n);
    else
        kiln_f16_row_ref(dst, src, stride, n);
}

void kiln_f16_store_row(char *dst, int64_t stride, const float *src, int64_t n) {
    if (stride == 2 && f16c())
        store_f16c((uint16_t *)dst, src, n);
    else
        kiln_f16_store_row_ref(dst, stride, src, n);
}

/* bfloat16 rows: widening is exact (the 16 bits become the high half); the rounding is
 * kiln_f32_to_bf16's written without branches, so contiguous rows vectorize (NaN quieted the same
 * way). The plain per-element loops serve strided rows and are the reference. */
void kiln_bf16_row(float *dst, const char *src, int64_t stride, int64_t n) {
    if (stride == (int64_t)sizeof(uint16_t)) {
        uint32_t *restrict d = (uint32_t *)dst;
        const uint16_t *restrict s = (const uint16_t *)src;
        for (int64_t i = 0; i < n; i++) d[i] = (uint32_t)s[i] << 16;
        return;
    }
    for (int64_t i = 0; i < n; i++) dst[i] = kiln_bf16_to_f32(*(const uint16_t *)(src + i * stride));
}

void kiln_bf16_store_row(char *dst, int64_t stride, const float *src, int64_t n) {
    if (stride == (int64_t)sizeof(uint16_t)) {
        uint16_t *restrict d = (uint16_t *)dst;
        const uint32_t *restrict s = (const uint32_t *)src;
        for (int64_t i = 0; i < n; i++) {
            uint32_t u = s[i];
            uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
            d[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
        }
        return;
    }
    for (int64_t i = 0; i < n; i++) *(uint16_t *)(dst + i * stride) = kiln_f32_to_bf16(src[i]);
}
