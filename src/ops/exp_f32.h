/* A float32 exp whose loops vectorize: the softmax family (reduce.c) and attention
 * (attention.c) instantiate it, once per instruction-set variant where they are dispatched. */
#ifndef KILN_OPS_EXP_F32_H
#define KILN_OPS_EXP_F32_H

#include <math.h>
#include <stdint.h>

/* exp for float32: Cephes-style range reduction and polynomial (within 1 ulp), in
 * plain arithmetic so loops over it vectorize (glibc's expf does not); explicit fmaf (one
 * instruction each) and rintf (one rounding instruction). Inputs below -86.5 give 0 (true
 * values there are under 3e-38). */
#define DEFINE_EXP_F32(NAME)                                                             \
    static inline float NAME(float x) {                                                  \
        const float hi = 88.72283935546875f, lo = -86.5f;                                \
        float xc = x > hi ? hi : (x < lo ? lo : x);                                      \
        float n = rintf(xc * 1.44269504088896341f);                                      \
        n = n == n ? n : 0.0f; /* NaN: keep the int conversion defined */                \
        float r = fmaf(n, 2.12194440e-4f, fmaf(n, -0.693359375f, xc));                   \
        float p = 1.9875691500e-4f;                                                      \
        p = fmaf(p, r, 1.3981999507e-3f);                                                \
        p = fmaf(p, r, 8.3334519073e-3f);                                                \
        p = fmaf(p, r, 4.1665795894e-2f);                                                \
        p = fmaf(p, r, 1.6666665459e-1f);                                                \
        p = fmaf(p, r, 5.0000001201e-1f);                                                \
        p = fmaf(p, r * r, r) + 1.0f;                                                    \
        union {                                                                          \
            int32_t i;                                                                   \
            float f;                                                                     \
        } scale;                                                                         \
        scale.i = ((int32_t)n + 126) << 23; /* 2^(n-1): n - 1 >= -126 stays normal */    \
        float y = p * scale.f * 2.0f;                                                    \
        return x < lo ? 0.0f : (x > hi ? (float)INFINITY : y);                           \
    }
#endif
