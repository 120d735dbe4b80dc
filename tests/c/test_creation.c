/* Creation ops and the random generator: full, arange, linspace, eye against plain loops;
 * rand/randn moments, determinism under kiln_manual_seed and thread-count invariance. */
#include <omp.h>

#include "check.h"
#include "core/internal.h"

static kiln_status make_full(kiln_op op, kiln_dtype dt, int nd, const int64_t *shape, double f0, double f1,
                             kiln_tensor **out) {
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, dt);
    kiln_attrs_push_int(&at, nd);
    for (int d = 0; d < nd; d++) kiln_attrs_push_int(&at, shape[d]);
    kiln_attrs_push_float(&at, f0);
    if (op != KILN_OP_FULL) kiln_attrs_push_float(&at, f1);
    return kiln_apply(op, 0, NULL, &at, out);
}

static kiln_status make_range(kiln_op op, kiln_dtype dt, int64_t count, double f0, double f1, kiln_tensor **out) {
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, dt);
    kiln_attrs_push_int(&at, count);
    kiln_attrs_push_float(&at, f0);
    kiln_attrs_push_float(&at, f1);
    return kiln_apply(op, 0, NULL, &at, out);
}

static bool same_bytes(const kiln_tensor *a, const kiln_tensor *b) {
    return a && b && a->numel == b->numel && a->meta.dtype == b->meta.dtype &&
           memcmp(a->data, b->data, (size_t)a->numel * kiln_dtype_size(a->meta.dtype)) == 0;
}

/* ---- full --------------------------------------------------------------------------------- */

static void test_full(void) {
    kiln_tensor *t = NULL;
    int64_t shape[3] = {2, 3, 4};
    for (int dt = 0; dt < KILN_DTYPE_COUNT; dt++) {
        CHECK_OK(make_full(KILN_OP_FULL, (kiln_dtype)dt, 3, shape, 3.0, 0, &t));
        CHECK(t && (int)t->meta.dtype == dt && t->meta.ndim == 3 && t->numel == 24);
        bool ok = true;
        double want = dt == KILN_DTYPE_BOOL ? 1.0 : 3.0;
        for (int64_t i = 0; t && i < t->numel; i++) ok &= kiln_tensor_get_double(t, i) == want;
        CHECK(ok);
        kiln_tensor_release(t);
        t = NULL;
    }
    /* scalar, fractional values, saturation of integers */
    CHECK_OK(make_full(KILN_OP_FULL, KILN_DTYPE_FLOAT32, 0, NULL, 0.1, 0, &t));
    CHECK(t && t->meta.ndim == 0 && t->numel == 1 && ((float *)t->data)[0] == 0.1f);
    kiln_tensor_release(t);
    CHECK_OK(make_full(KILN_OP_FULL, KILN_DTYPE_INT8, 1, shape, 1000.0, 0, &t));
    CHECK(t && ((int8_t *)t->data)[1] == 127);
    kiln_tensor_release(t);
    CHECK_OK(make_full(KILN_OP_FULL, KILN_DTYPE_INT32, 1, shape, -INFINITY, 0, &t));
    CHECK(t && ((int32_t *)t->data)[0] == INT32_MIN);
    kiln_tensor_release(t);
    CHECK_OK(make_full(KILN_OP_FULL, KILN_DTYPE_FLOAT16, 1, shape, -2.5, 0, &t));
    CHECK(t && kiln_f16_to_f32(((uint16_t *)t->data)[1]) == -2.5f);
    kiln_tensor_release(t);
    /* large: the parallel fill */
    int64_t big[2] = {1000, 777};
    CHECK_OK(make_full(KILN_OP_FULL, KILN_DTYPE_FLOAT64, 2, big, -1.25, 0, &t));
    bool ok = true;
    for (int64_t i = 0; t && i < t->numel; i++) ok &= ((double *)t->data)[i] == -1.25;
    CHECK(ok);
    kiln_tensor_release(t);
    /* empty */
    int64_t empty[2] = {0, 5};
    CHECK_OK(make_full(KILN_OP_FULL, KILN_DTYPE_FLOAT32, 2, empty, 1, 0, &t));
    CHECK(t && t->numel == 0);
    kiln_tensor_release(t);
}

static void test_full_errors(void) {
    kiln_tensor *t = NULL;
    int64_t bad[2] = {2, -3};
    CHECK_STATUS(make_full(KILN_OP_FULL, KILN_DTYPE_FLOAT32, 2, bad, 1, 0, &t), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "negative") && strstr(kiln_last_error(), "(2, -3)"));
    CHECK_STATUS(make_full(KILN_OP_FULL, (kiln_dtype)42, 1, bad, 1, 0, &t), KILN_ERR_TYPE);
    CHECK(strstr(kiln_last_error(), "dtype"));
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, KILN_DTYPE_FLOAT32);
    kiln_attrs_push_int(&at, 3); /* ndim 3 but no shape */
    kiln_attrs_push_float(&at, 1);
    CHECK_STATUS(kiln_apply(KILN_OP_FULL, 0, NULL, &at, &t), KILN_ERR_VALUE);
    CHECK(t == NULL);
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, KILN_DTYPE_FLOAT32);
    kiln_attrs_push_int(&at, 9);
    kiln_attrs_push_float(&at, 1);
    CHECK_STATUS(kiln_apply(KILN_OP_FULL, 0, NULL, &at, &t), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "ndim"));
}

/* ---- arange, linspace, eye ------------------------------------------------------------------ */

static void test_arange(void) {
    kiln_tensor *t = NULL;
    CHECK_OK(make_range(KILN_OP_ARANGE, KILN_DTYPE_FLOAT32, 7, -1.0, 0.5, &t));
    bool ok = t && t->meta.ndim == 1 && t->meta.shape[0] == 7;
    for (int i = 0; ok && i < 7; i++) ok = ((float *)t->data)[i] == (float)(-1.0 + 0.5 * i);
    CHECK(ok);
    kiln_tensor_release(t);
    /* int64 beyond 2^53 stays exact */
    CHECK_OK(make_range(KILN_OP_ARANGE, KILN_DTYPE_INT64, 5, 0x1.0p60, 3, &t));
    ok = t != NULL;
    for (int i = 0; ok && i < 5; i++) ok = ((int64_t *)t->data)[i] == ((int64_t)1 << 60) + 3 * i;
    CHECK(ok);
    kiln_tensor_release(t);
    CHECK_OK(make_range(KILN_OP_ARANGE, KILN_DTYPE_INT32, 4, 10, -3, &t));
    CHECK(t && ((int32_t *)t->data)[3] == 1);
    kiln_tensor_release(t);
    CHECK_OK(make_range(KILN_OP_ARANGE, KILN_DTYPE_FLOAT64, 0, 0, 1, &t));
    CHECK(t && t->numel == 0);
    kiln_tensor_release(t);
    /* large: parallel */
    CHECK_OK(make_range(KILN_OP_ARANGE, KILN_DTYPE_FLOAT64, 100000, 2, 0.25, &t));
    ok = t != NULL;
    for (int64_t i = 0; ok && i < 100000; i++) ok = ((double *)t->data)[i] == 2 + 0.25 * (double)i;
    CHECK(ok);
    kiln_tensor_release(t);
    CHECK_OK(make_range(KILN_OP_ARANGE, KILN_DTYPE_BFLOAT16, 3, 1, 1, &t));
    CHECK(t && kiln_bf16_to_f32(((uint16_t *)t->data)[2]) == 3.0f);
    kiln_tensor_release(t);
}

static void test_linspace(void) {
    kiln_tensor *t = NULL;
    CHECK_OK(make_range(KILN_OP_LINSPACE, KILN_DTYPE_FLOAT64, 11, 0, 1, &t));
    bool ok = t && t->numel == 11;
    for (int i = 0; ok && i < 11; i++) ok = fabs(((double *)t->data)[i] - i / 10.0) < 1e-15;
    CHECK(ok);
    CHECK(t && ((double *)t->data)[0] == 0.0 && ((double *)t->data)[10] == 1.0);
    kiln_tensor_release(t);
    CHECK_OK(make_range(KILN_OP_LINSPACE, KILN_DTYPE_FLOAT32, 7, 3.3, -1.7, &t));
    CHECK(t && ((float *)t->data)[0] == 3.3f && ((float *)t->data)[6] == -1.7f);
    kiln_tensor_release(t);
    CHECK_OK(make_range(KILN_OP_LINSPACE, KILN_DTYPE_FLOAT32, 1, 5, 9, &t));
    CHECK(t && t->numel == 1 && ((float *)t->data)[0] == 5.0f);
    kiln_tensor_release(t);
    CHECK_OK(make_range(KILN_OP_LINSPACE, KILN_DTYPE_INT32, 5, 0, 10, &t));
    int32_t want[5] = {0, 2, 5, 7, 10};
    CHECK(t && memcmp(t->data, want, sizeof want) == 0);
    kiln_tensor_release(t);
}

static void test_eye(void) {
    kiln_tensor *t = NULL;
    kiln_attrs at;
    int64_t dims[3][2] = {{3, 3}, {2, 5}, {4, 1}};
    for (int c = 0; c < 3; c++) {
        kiln_attrs_clear(&at);
        kiln_attrs_push_int(&at, KILN_DTYPE_INT64);
        kiln_attrs_push_int(&at, dims[c][0]);
        kiln_attrs_push_int(&at, dims[c][1]);
        CHECK_OK(kiln_apply(KILN_OP_EYE, 0, NULL, &at, &t));
        bool ok = t && t->meta.ndim == 2 && t->meta.shape[0] == dims[c][0] && t->meta.shape[1] == dims[c][1];
        for (int64_t i = 0; ok && i < dims[c][0]; i++)
            for (int64_t j = 0; ok && j < dims[c][1]; j++) ok = ((int64_t *)t->data)[i * dims[c][1] + j] == (i == j);
        CHECK(ok);
        kiln_tensor_release(t);
    }
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, KILN_DTYPE_FLOAT16);
    kiln_attrs_push_int(&at, 2);
    kiln_attrs_push_int(&at, 2);
    CHECK_OK(kiln_apply(KILN_OP_EYE, 0, NULL, &at, &t));
    CHECK(t && kiln_f16_to_f32(((uint16_t *)t->data)[3]) == 1.0f && ((uint16_t *)t->data)[1] == 0);
    kiln_tensor_release(t);
}

static void test_range_errors(void) {
    kiln_tensor *t = NULL;
    CHECK_STATUS(make_range(KILN_OP_ARANGE, KILN_DTYPE_FLOAT32, -1, 0, 1, &t), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "count") && strstr(kiln_last_error(), "-1"));
    CHECK_STATUS(make_range(KILN_OP_LINSPACE, (kiln_dtype)-2, 3, 0, 1, &t), KILN_ERR_TYPE);
    CHECK_STATUS(make_range(KILN_OP_ARANGE, KILN_DTYPE_FLOAT32, 3, NAN, 1, &t), KILN_ERR_VALUE);
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, KILN_DTYPE_FLOAT32);
    kiln_attrs_push_int(&at, 2);
    kiln_attrs_push_int(&at, -4);
    CHECK_STATUS(kiln_apply(KILN_OP_EYE, 0, NULL, &at, &t), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "eye") && strstr(kiln_last_error(), "-4"));
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, KILN_DTYPE_FLOAT32);
    CHECK_STATUS(kiln_apply(KILN_OP_EYE, 0, NULL, &at, &t), KILN_ERR_VALUE);
    CHECK(t == NULL);
}

/* ---- random ------------------------------------------------------------------------------- */

static void moments(const kiln_tensor *t, double *mean, double *var, double *kurt) {
    double s = 0, q = 0, f = 0;
    int64_t n = t->numel;
    for (int64_t i = 0; i < n; i++) s += kiln_tensor_get_double(t, i);
    double m = s / (double)n;
    for (int64_t i = 0; i < n; i++) {
        double d = kiln_tensor_get_double(t, i) - m;
        q += d * d;
        f += d * d * d * d;
    }
    *mean = m;
    *var = q / (double)n;
    *kurt = f / (double)n / (*var * *var);
}

static void test_rand(void) {
    int64_t shape[2] = {1000, 1001};
    kiln_tensor *t = NULL;
    const kiln_dtype dts[4] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64, KILN_DTYPE_FLOAT16, KILN_DTYPE_BFLOAT16};
    for (int k = 0; k < 4; k++) {
        CHECK_OK(make_full(KILN_OP_RAND, dts[k], 2, shape, 0, 1, &t));
        if (!t) continue;
        double mean, var, kurt, lo = 1, hi = 0;
        moments(t, &mean, &var, &kurt);
        for (int64_t i = 0; i < t->numel; i++) {
            double v = kiln_tensor_get_double(t, i);
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        CHECK(fabs(mean - 0.5) < 0.003 && fabs(var - 1.0 / 12) < 0.002);
        CHECK(lo >= 0 && hi < 1 && lo < 0.01 && hi > 0.99);
        kiln_tensor_release(t);
    }
    CHECK_OK(make_full(KILN_OP_RAND, KILN_DTYPE_FLOAT32, 2, shape, -3, 5, &t));
    double mean, var, kurt;
    if (t) {
        moments(t, &mean, &var, &kurt);
        CHECK(fabs(mean - 1) < 0.02 && fabs(var - 64.0 / 12) < 0.05);
        bool in = true;
        for (int64_t i = 0; i < t->numel; i++) in &= ((float *)t->data)[i] >= -3 && ((float *)t->data)[i] < 5;
        CHECK(in);
    }
    kiln_tensor_release(t);
    /* integers: randint on [low, high), every value reached */
    int64_t n = 100000;
    CHECK_OK(make_full(KILN_OP_RAND, KILN_DTYPE_INT32, 1, &n, -2, 5, &t));
    int counts[7] = {0};
    bool in = t != NULL;
    for (int64_t i = 0; in && i < n; i++) {
        int32_t v = ((int32_t *)t->data)[i];
        in = v >= -2 && v < 5;
        if (in) counts[v + 2]++;
    }
    CHECK(in);
    for (int k = 0; k < 7; k++) CHECK(abs(counts[k] - (int)(n / 7)) < 600);
    kiln_tensor_release(t);
}

static void test_randn(void) {
    int64_t shape[1] = {1000001}; /* odd: the last pair is half used */
    kiln_tensor *t = NULL;
    const kiln_dtype dts[3] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64, KILN_DTYPE_FLOAT16};
    for (int k = 0; k < 3; k++) {
        CHECK_OK(make_full(KILN_OP_RANDN, dts[k], 1, shape, 0, 1, &t));
        if (!t) continue;
        double mean, var, kurt;
        moments(t, &mean, &var, &kurt);
        CHECK(fabs(mean) < 0.005 && fabs(var - 1) < 0.01 && fabs(kurt - 3) < 0.05);
        /* fraction within one sigma */
        int64_t within = 0;
        for (int64_t i = 0; i < t->numel; i++) within += fabs(kiln_tensor_get_double(t, i)) < 1;
        CHECK(fabs((double)within / (double)t->numel - 0.6827) < 0.003);
        kiln_tensor_release(t);
    }
    CHECK_OK(make_full(KILN_OP_RANDN, KILN_DTYPE_FLOAT32, 1, shape, 10, 0.5, &t));
    if (t) {
        double mean, var, kurt;
        moments(t, &mean, &var, &kurt);
        CHECK(fabs(mean - 10) < 0.003 && fabs(var - 0.25) < 0.003);
    }
    kiln_tensor_release(t);
}

static void test_random_determinism(void) {
    int64_t shape[2] = {300, 257};
    const kiln_op ops[2] = {KILN_OP_RAND, KILN_OP_RANDN};
    const kiln_dtype dts[2] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64};
    int threads = omp_get_max_threads();
    for (int o = 0; o < 2; o++)
        for (int d = 0; d < 2; d++) {
            kiln_tensor *a = NULL, *b = NULL, *c = NULL, *e = NULL;
            kiln_manual_seed(1234);
            CHECK_OK(make_full(ops[o], dts[d], 2, shape, 0, 1, &a));
            CHECK_OK(make_full(ops[o], dts[d], 2, shape, 0, 1, &c)); /* the stream moves on */
            kiln_manual_seed(1234);
            omp_set_num_threads(1);
            CHECK_OK(make_full(ops[o], dts[d], 2, shape, 0, 1, &b));
            omp_set_num_threads(threads > 1 ? threads : 2);
            CHECK_OK(make_full(ops[o], dts[d], 2, shape, 0, 1, &e));
            omp_set_num_threads(threads);
            CHECK(same_bytes(a, b)); /* same seed, 1 thread vs many */
            CHECK(same_bytes(c, e));
            CHECK(!same_bytes(a, c));
            kiln_manual_seed(99);
            kiln_tensor_release(b);
            CHECK_OK(make_full(ops[o], dts[d], 2, shape, 0, 1, &b));
            CHECK(!same_bytes(a, b)); /* another seed, another stream */
            kiln_tensor_release(a), kiln_tensor_release(b), kiln_tensor_release(c), kiln_tensor_release(e);
        }
    /* the scalar draws */
    kiln_manual_seed(7);
    double u = kiln_random_uniform(), z = kiln_random_normal();
    uint64_t bits = kiln_random_next();
    kiln_manual_seed(7);
    CHECK(kiln_random_uniform() == u && kiln_random_normal() == z && kiln_random_next() == bits);
    CHECK(u >= 0 && u < 1 && isfinite(z));
    double s = 0, q = 0;
    for (int i = 0; i < 100000; i++) {
        double v = kiln_random_normal();
        s += v;
        q += v * v;
    }
    CHECK(fabs(s / 1e5) < 0.02 && fabs(q / 1e5 - 1) < 0.03);
}

static void test_random_errors(void) {
    kiln_tensor *t = NULL;
    int64_t n = 4;
    CHECK_STATUS(make_full(KILN_OP_RANDN, KILN_DTYPE_INT32, 1, &n, 0, 1, &t), KILN_ERR_TYPE);
    CHECK(strstr(kiln_last_error(), "randn") && strstr(kiln_last_error(), "int32"));
    CHECK_STATUS(make_full(KILN_OP_RANDN, KILN_DTYPE_FLOAT32, 1, &n, 0, -1, &t), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "std"));
    CHECK_STATUS(make_full(KILN_OP_RAND, KILN_DTYPE_FLOAT32, 1, &n, 2, 1, &t), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "rand") && strstr(kiln_last_error(), "low <= high"));
    CHECK_STATUS(make_full(KILN_OP_RAND, KILN_DTYPE_INT64, 1, &n, 0.5, 3, &t), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "integer bounds"));
    CHECK(t == NULL);
    /* a missing float attribute */
    kiln_attrs at;
    kiln_attrs_clear(&at);
    kiln_attrs_push_int(&at, KILN_DTYPE_FLOAT32);
    kiln_attrs_push_int(&at, 1);
    kiln_attrs_push_int(&at, 3);
    kiln_attrs_push_float(&at, 0);
    CHECK_STATUS(kiln_apply(KILN_OP_RAND, 0, NULL, &at, &t), KILN_ERR_VALUE);
    CHECK(t == NULL);
}

int main(void) {
    test_full();
    test_full_errors();
    test_arange();
    test_linspace();
    test_eye();
    test_range_errors();
    test_rand();
    test_randn();
    test_random_determinism();
    test_random_errors();
    CHECK_DONE();
}
