/* A float32 exp whose loops vectorize, for kernels outside the elementwise table: the softmax
 * family (reduce.c), attention (attention.c) and the recurrent cells (rnn.c) instantiate it, once
 * per instruction-set variant where they are dispatched (a function of one target cannot be
 * inlined into another's). It is src/core/approx_f32.h's exp, the one of the elementwise kernels
 * and generated C: within 1 ulp, subnormal results rounded once, exp(-inf) = 0, overflow to inf,
 * nan kept. */
#ifndef KILN_OPS_EXP_F32_H
#define KILN_OPS_EXP_F32_H

#include "../core/approx_f32.h"

#define DEFINE_EXP_F32(NAME)                                                   \
    KILN_APPROX_F32_DEFINE(NAME##_approx_)                                     \
    static inline __attribute__((always_inline)) float NAME(float x) { return NAME##_approx_expf(x); }
#endif
