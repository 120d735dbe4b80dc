/* float16 rows (src/core/half.c): the F16C rows give the plain reference rows' bits for every
 * float16 value and for float32 values around every float16 rounding boundary, subnormals,
 * overflow, infinities and NaN; strided rows; and float16 elementwise ops equal the float32 op on
 * the same values, rounded once. */
#include <math.h>

#include "check.h"
#include "core/internal.h"

static void test_every_float16_loads_alike(void) {
    enum { N = 65536 };
    uint16_t *h = malloc(sizeof(uint16_t) * N);
    float *fast = malloc(sizeof(float) * N), *ref = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) h[i] = (uint16_t)i;
    kiln_f16_row(fast, (const char *)h, 2, N - 3); /* a tail shorter than a vector */
    kiln_f16_row(fast + N - 3, (const char *)(h + N - 3), 2, 3);
    kiln_f16_row_ref(ref, (const char *)h, 2, N);
    int bad = 0;
    for (int i = 0; i < N; i++)
        if (memcmp(&fast[i], &ref[i], 4) != 0 && !(isnan(fast[i]) && isnan(ref[i]))) bad++;
    CHECK(bad == 0);
    CHECK(ref[0x3c00] == 1.0f && ref[0xc000] == -2.0f && ref[0x0001] == ldexpf(1, -24) && isinf(ref[0x7c00]));
    free(h), free(fast), free(ref);
}

static void test_stores_round_alike(void) {
    /* every float16 value, the midpoints between neighbours and their float32 neighbours */
    enum { N = 65536 * 4 };
    float *f = malloc(sizeof(float) * N);
    uint16_t *fast = malloc(sizeof(uint16_t) * N), *ref = malloc(sizeof(uint16_t) * N);
    for (int i = 0; i < 65536; i++) {
        float a = kiln_f16_to_f32((uint16_t)i), b = kiln_f16_to_f32((uint16_t)(i + 1));
        float mid = isfinite(a) && isfinite(b) ? a + (b - a) / 2 : a;
        f[4 * i] = a, f[4 * i + 1] = mid, f[4 * i + 2] = nextafterf(mid, INFINITY), f[4 * i + 3] = nextafterf(mid, -INFINITY);
    }
    f[1] = 1e10f, f[2] = -1e10f, f[3] = 65520.0f; /* overflow: infinities (65520 rounds up to inf) */
    kiln_f16_store_row((char *)fast, 2, f, N);
    kiln_f16_store_row_ref((char *)ref, 2, f, N);
    int bad = 0;
    for (int i = 0; i < N; i++)
        if (fast[i] != ref[i] && !(isnan(f[i]))) bad++;
    CHECK(bad == 0);
    CHECK(ref[1] == 0x7c00 && ref[2] == 0xfc00 && ref[3] == 0x7c00);
    /* ties to even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 */
    float tie = 1.0f + ldexpf(1, -11);
    uint16_t t;
    kiln_f16_store_row((char *)&t, 2, &tie, 1);
    CHECK(t == 0x3c00);
    free(f), free(fast), free(ref);
}

static void test_strided_rows(void) {
    uint16_t h[10];
    for (int i = 0; i < 10; i++) h[i] = kiln_f32_to_f16((float)i);
    float f[5];
    kiln_f16_row(f, (const char *)h, 4, 5); /* every other value */
    for (int i = 0; i < 5; i++) CHECK(f[i] == (float)(2 * i));
    uint16_t out[10] = {0};
    kiln_f16_store_row((char *)out, 4, f, 5);
    for (int i = 0; i < 5; i++) CHECK(out[2 * i] == h[2 * i] && out[2 * i + 1] == 0);
}

/* A float16 op equals the float32 op on the float16 values, rounded to float16 once. */
static void check_op(kiln_op op, int nin, int64_t nb) {
    int64_t n = 1000, sb = nb;
    kiln_tensor *a = NULL, *b = NULL, *a32 = NULL, *b32 = NULL, *c = NULL, *c32 = NULL;
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_FLOAT16, 1, &n, &a));
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_FLOAT16, 1, &sb, &b));
    for (int64_t i = 0; i < n; i++) ((uint16_t *)a->data)[i] = kiln_f32_to_f16(sinf((float)i) * 3.0f);
    for (int64_t i = 0; i < nb; i++) ((uint16_t *)b->data)[i] = kiln_f32_to_f16(cosf((float)i * 0.7f) * 2.0f + 0.5f);
    CHECK_OK(kiln_to_contiguous(a, KILN_DTYPE_FLOAT32, &a32));
    CHECK_OK(kiln_to_contiguous(b, KILN_DTYPE_FLOAT32, &b32));
    if (nin == 1) {
        CHECK_OK(kiln_apply1(op, a, NULL, &c));
        CHECK_OK(kiln_apply1(op, a32, NULL, &c32));
    } else {
        CHECK_OK(kiln_apply2(op, a, b, NULL, &c));
        CHECK_OK(kiln_apply2(op, a32, b32, NULL, &c32));
    }
    CHECK(c && c->meta.dtype == (c32->meta.dtype == KILN_DTYPE_BOOL ? KILN_DTYPE_BOOL : KILN_DTYPE_FLOAT16));
    int bad = 0;
    for (int64_t i = 0; c && i < n; i++) {
        if (c->meta.dtype == KILN_DTYPE_BOOL) {
            bad += ((uint8_t *)c->data)[i] != ((uint8_t *)c32->data)[i];
        } else {
            uint16_t want = kiln_f32_to_f16(((float *)c32->data)[i]), got = ((uint16_t *)c->data)[i];
            bad += got != want && !(isnan(kiln_f16_to_f32(got)) && isnan(kiln_f16_to_f32(want)));
        }
    }
    if (bad) fprintf(stderr, "%s (b of %lld): %d of %lld differ\n", kiln_op_table[op].name, (long long)nb, bad, (long long)n);
    CHECK(bad == 0);
    kiln_tensor_release(a), kiln_tensor_release(b), kiln_tensor_release(a32), kiln_tensor_release(b32);
    kiln_tensor_release(c), kiln_tensor_release(c32);
}

static void test_float16_ops(void) {
    check_op(KILN_OP_ADD, 2, 1000);
    check_op(KILN_OP_MUL, 2, 1); /* a broadcast operand */
    check_op(KILN_OP_DIV, 2, 1000);
    check_op(KILN_OP_LT, 2, 1000);
    check_op(KILN_OP_EXP, 1, 1);
    check_op(KILN_OP_RELU, 1, 1);
    check_op(KILN_OP_SILU, 1, 1);
    check_op(KILN_OP_RSQRT, 1, 1);
}

int main(void) {
    test_every_float16_loads_alike();
    test_stores_round_alike();
    test_strided_rows();
    test_float16_ops();
    CHECK_DONE();
}
