/* float32 exp, erf, tanh and log in plain branch-free arithmetic, so loops over them vectorize
 * (glibc's expf, tanhf, logf, erff do not). The eager float32 kernels (src/ops/elementwise.c) and
 * generated C (src/codegen/emit_c.c embeds this file) both compute with them: the same
 * expression gives the same bits in either; the softmax family, attention and the recurrent cells
 * use its exp (src/ops/exp_f32.h). With KILN_APPROX_F32_NAMES defined, including this file makes
 * exp, erf, tanh and log of a float argument these, as <tgmath.h> picks expf for one (include
 * it after <math.h> or <tgmath.h>).
 *
 * Max errors against float64 libm, in float32 ulps of the result, over a sweep of every 257th
 * float32 (tests/python/test_transcendental_kernels.py asserts them): exp 0.97, log 0.75,
 * tanh 1.3, erf 6.5 (near |x| = 3.9, where erf is within 4e-8 of 1).
 * exp: Cody-Waite reduction and Cephes' polynomial, scaled in two steps so results that underflow
 * to subnormals round once. erf: the rational approximation on [-4, 4] of XLA and Eigen. tanh
 * and log: Cephes. IEEE cases: nan stays nan; exp(inf) = inf, exp(-inf) = 0; tanh(+-inf) = +-1,
 * tanh(+-0) = +-0; log(0) = -inf, log(inf) = inf, log(x < 0) = nan; erf(+-inf) = +-1.
 *
 * KF_FMA is always fused (one instruction where the target has FMA, as every build of kiln for
 * x86-64 does; libm's exact fmaf elsewhere): the results do not depend on the instruction set a
 * kernel variant or generated object was compiled for. The rest must not be contracted into
 * fused multiply-adds (-ffp-contract=off in both). */
#ifndef KILN_APPROX_F32_H
#define KILN_APPROX_F32_H
#include <stdint.h>

#define KF_FMA(a, b, c) __builtin_fmaf(a, b, c)

typedef union {
    float f;
    int32_t i;
    uint32_t u;
} kf_bits;

/* Defines P##expf, P##erff, P##tanhf and P##logf. Files compiling kernel variants for several
 * instruction sets (src/ops/isa_dispatch.h) define a set per variant, as a function of one
 * target cannot be inlined into another's. */
#define KILN_APPROX_F32_DEFINE(P)                                                                   \
static inline __attribute__((always_inline, unused)) float P##expf(float x) {                             \
    float c = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);                                      \
    c = x == x ? c : 0.0f;                                                                          \
    float fn = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;                              \
    float r = c - fn * 0.693359375f;                                                                \
    r = r - fn * -2.12194440e-4f;                                                                   \
    float z = r * r, p = 1.9875691500e-4f;                                                          \
    p = KF_FMA(p, r, 1.3981999507e-3f);                                                             \
    p = KF_FMA(p, r, 8.3334519073e-3f);                                                             \
    p = KF_FMA(p, r, 4.1665795894e-2f);                                                             \
    p = KF_FMA(p, r, 1.6666665459e-1f);                                                             \
    p = KF_FMA(p, r, 5.0000001201e-1f);                                                             \
    p = p * z + r + 1.0f;                                                                           \
    int32_t n = (int32_t)fn, n1 = n >> 1, n2 = n - n1;                                              \
    kf_bits s1, s2;                                                                                 \
    s1.i = (n1 + 127) << 23;                                                                        \
    s2.i = (n2 + 127) << 23;                                                                        \
    float y = p * s1.f * s2.f;                                                                      \
    return x == x ? y : x;                                                                          \
}                                                                                                   \
                                                                                                    \
static inline __attribute__((always_inline, unused)) float P##erff(float x) {                             \
    float c = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);                                            \
    float z = c * c, p = -2.72614225801306e-10f, q = -1.45660718464996e-05f;                        \
    p = KF_FMA(p, z, 2.77068142495902e-08f);                                                        \
    p = KF_FMA(p, z, -2.10102402082508e-06f);                                                       \
    p = KF_FMA(p, z, -5.69250639462346e-05f);                                                       \
    p = KF_FMA(p, z, -7.34990630326855e-04f);                                                       \
    p = KF_FMA(p, z, -2.95459980854025e-03f);                                                       \
    p = KF_FMA(p, z, -1.60960333262415e-02f);                                                       \
    q = KF_FMA(q, z, -2.13374055278905e-04f);                                                       \
    q = KF_FMA(q, z, -1.68282697438203e-03f);                                                       \
    q = KF_FMA(q, z, -7.37332916720468e-03f);                                                       \
    q = KF_FMA(q, z, -1.42647390514189e-02f);                                                       \
    float y = c * (p / q);                                                                          \
    return y > 1.0f ? 1.0f : (y < -1.0f ? -1.0f : y);                                               \
}                                                                                                   \
                                                                                                    \
static inline __attribute__((always_inline, unused)) float P##tanhf(float x) {                            \
    float ax = x < 0.0f ? -x : x, z = x * x, p = -5.70498872745e-3f;                                \
    p = KF_FMA(p, z, 2.06390887954e-2f);                                                            \
    p = KF_FMA(p, z, -5.37397155531e-2f);                                                           \
    p = KF_FMA(p, z, 1.33314422036e-1f);                                                            \
    p = KF_FMA(p, z, -3.33332819422e-1f);                                                           \
    float small = p * z * x + x;                                                                    \
    small = x == 0.0f ? x : small;                                                                  \
    float big = 1.0f - 2.0f / (P##expf(ax + ax) + 1.0f);                                            \
    big = x < 0.0f ? -big : big;                                                                    \
    return ax < 0.625f ? small : big;                                                               \
}                                                                                                   \
                                                                                                    \
static inline __attribute__((always_inline, unused)) float P##logf(float x) {                             \
    int tiny = x < 1.17549435e-38f;                                                                 \
    kf_bits v;                                                                                      \
    v.f = tiny ? x * 8388608.0f : x;                                                                \
    int32_t e = (int32_t)((v.u >> 23) & 0xffu) - (tiny ? 149 : 126);                                \
    v.u = (v.u & 0x807fffffu) | 0x3f000000u;                                                        \
    float m = v.f;                                                                                  \
    int lo = m < 0.707106781186547524f;                                                             \
    e = lo ? e - 1 : e;                                                                             \
    m = lo ? m + m - 1.0f : m - 1.0f;                                                               \
    float z = m * m, p = 7.0376836292e-2f;                                                          \
    p = KF_FMA(p, m, -1.1514610310e-1f);                                                            \
    p = KF_FMA(p, m, 1.1676998740e-1f);                                                             \
    p = KF_FMA(p, m, -1.2420140846e-1f);                                                            \
    p = KF_FMA(p, m, 1.4249322787e-1f);                                                             \
    p = KF_FMA(p, m, -1.6668057665e-1f);                                                            \
    p = KF_FMA(p, m, 2.0000714765e-1f);                                                             \
    p = KF_FMA(p, m, -2.4999993993e-1f);                                                            \
    p = KF_FMA(p, m, 3.3333331174e-1f);                                                             \
    float fe = (float)e, y = p * m * z;                                                             \
    y = y + fe * -2.12194440e-4f;                                                                   \
    y = y + -0.5f * z;                                                                              \
    float r = m + y;                                                                                \
    r = r + fe * 0.693359375f;                                                                      \
    r = x == __builtin_inff() ? x : r;                                                              \
    r = x == 0.0f ? -__builtin_inff() : r;                                                          \
    return (x < 0.0f || x != x) ? __builtin_nanf("") : r;                                           \
}

/* The set exp, erf, tanh and log below call: kf_expf..., or a variant's (its own prefix, set
 * where the variant's kernels begin). */
#define KILN_APPROX_F32 kf_
KILN_APPROX_F32_DEFINE(kf_)
#define KF_CAT_(a, b) a##b
#define KF_CAT(a, b) KF_CAT_(a, b)

#endif

/* With KILN_APPROX_F32_NAMES defined before the include (the elementwise kernels, generated C):
 * exp, erf, tanh and log of a float are the functions above; of anything else, libm's (double). */
#if defined(KILN_APPROX_F32_NAMES) && !defined(KILN_APPROX_F32_NAMES_SET)
#define KILN_APPROX_F32_NAMES_SET
#undef exp
#undef erf
#undef tanh
#undef log
#define exp(x) _Generic((x), float: KF_CAT(KILN_APPROX_F32, expf), default: exp)(x)
#define erf(x) _Generic((x), float: KF_CAT(KILN_APPROX_F32, erff), default: erf)(x)
#define tanh(x) _Generic((x), float: KF_CAT(KILN_APPROX_F32, tanhf), default: tanh)(x)
#define log(x) _Generic((x), float: KF_CAT(KILN_APPROX_F32, logf), default: log)(x)
#endif
