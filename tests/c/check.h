/* A tiny assertion harness for the C tests: CHECK fails loudly, the test exits non-zero. */
#ifndef KILN_TEST_CHECK_H
#define KILN_TEST_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln/kiln.h"

static int check_failures;

#define CHECK(cond)                                                                         \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);        \
            check_failures++;                                                               \
        }                                                                                   \
    } while (0)

#define CHECK_OK(expr)                                                                      \
    do {                                                                                    \
        kiln_status check_s_ = (expr);                                                      \
        if (check_s_ != KILN_OK) {                                                          \
            fprintf(stderr, "%s:%d: %s failed with status %d: %s\n", __FILE__, __LINE__,    \
                    #expr, (int)check_s_, kiln_last_error());                               \
            check_failures++;                                                               \
        }                                                                                   \
    } while (0)

#define CHECK_STATUS(expr, want)                                                            \
    do {                                                                                    \
        kiln_status check_s_ = (expr);                                                      \
        if (check_s_ != (want)) {                                                           \
            fprintf(stderr, "%s:%d: %s gave status %d, expected %d (%s)\n", __FILE__,       \
                    __LINE__, #expr, (int)check_s_, (int)(want), kiln_last_error());        \
            check_failures++;                                                               \
        }                                                                                   \
    } while (0)

/* float32 tensor from values (contiguous). */
static inline kiln_tensor *tensor_f32(int ndim, const int64_t *shape, const float *values) {
    kiln_tensor *t = NULL;
    if (kiln_tensor_empty(KILN_DTYPE_FLOAT32, ndim, shape, &t) != KILN_OK) {
        fprintf(stderr, "tensor_f32: %s\n", kiln_last_error());
        exit(2);
    }
    for (int64_t i = 0; i < t->numel; i++) ((float *)t->data)[i] = values ? values[i] : 0.0f;
    return t;
}

static inline int close_f32(const float *got, const float *want, int64_t n, float tol) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabsf(got[i] - want[i]) <= tol * (1.0f + fabsf(want[i])))) {
            fprintf(stderr, "  element %lld: got %g, want %g\n", (long long)i, got[i], want[i]);
            return 0;
        }
    return 1;
}

/* Both float32 of one shape, values within tol (relative, see close_f32). */
static inline bool same_values_f32(const kiln_tensor *a, const kiln_tensor *b, float tol) {
    if (!a || !b || a->meta.dtype != KILN_DTYPE_FLOAT32 || b->meta.dtype != KILN_DTYPE_FLOAT32 ||
        a->meta.ndim != b->meta.ndim)
        return false;
    for (int d = 0; d < a->meta.ndim; d++)
        if (a->meta.shape[d] != b->meta.shape[d]) return false;
    return close_f32(a->data, b->data, a->numel, tol);
}

#define CHECK_DONE()                                                                        \
    do {                                                                                    \
        if (check_failures) {                                                               \
            fprintf(stderr, "%d check(s) failed\n", check_failures);                        \
            return 1;                                                                       \
        }                                                                                   \
        printf("ok\n");                                                                     \
        return 0;                                                                           \
    } while (0)

#endif
