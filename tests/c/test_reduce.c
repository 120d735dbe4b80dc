/* Reductions and the softmax family against plain reference loops (in double), over shapes,
 * axis masks, keepdims, strided inputs and dtypes; gradients by central differences. */
#include "check.h"
#include "core/internal.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static uint64_t rng_state = 12345;
static double rnd(void) { /* uniform [0, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * 0x1.0p-53;
}

static kiln_tensor *tensor_of(kiln_dtype dt, int ndim, const int64_t *shape, double lo, double hi) {
    kiln_tensor *f = NULL, *t = NULL;
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_FLOAT64, ndim, shape, &f));
    for (int64_t i = 0; i < f->numel; i++) ((double *)f->data)[i] = lo + (hi - lo) * rnd();
    if (dt == KILN_DTYPE_FLOAT64) return f;
    CHECK_OK(kiln_tensor_empty(dt, ndim, shape, &t));
    CHECK_OK(kiln_copy_into(t, f));
    kiln_tensor_release(f);
    return t;
}

static kiln_tensor *tensor_vals(kiln_dtype dt, int ndim, const int64_t *shape, const double *v) {
    kiln_tensor *f = NULL, *t = NULL;
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_FLOAT64, ndim, shape, &f));
    memcpy(f->data, v, sizeof(double) * (size_t)f->numel);
    if (dt == KILN_DTYPE_FLOAT64) return f;
    CHECK_OK(kiln_tensor_empty(dt, ndim, shape, &t));
    CHECK_OK(kiln_copy_into(t, f));
    kiln_tensor_release(f);
    return t;
}

static kiln_attrs red_attrs(uint64_t mask, int keep, int ddof) {
    kiln_attrs a;
    kiln_attrs_clear(&a);
    kiln_attrs_push_int(&a, (int64_t)mask);
    kiln_attrs_push_int(&a, keep);
    kiln_attrs_push_int(&a, ddof);
    return a;
}

static kiln_attrs axis_attrs(int axis) {
    kiln_attrs a;
    kiln_attrs_clear(&a);
    kiln_attrs_push_int(&a, axis);
    return a;
}

/* The reference: every op in double over the row-major element order of x. */
static void ref_reduce(kiln_op op, const kiln_tensor *x, uint64_t mask, int ddof, double *out, int64_t nout) {
    const kiln_meta *m = &x->meta;
    int64_t count = 1;
    for (int d = 0; d < m->ndim; d++)
        if ((mask >> d) & 1u) count *= m->shape[d];
    double *acc = calloc((size_t)nout + 1, sizeof(double)), *mean = calloc((size_t)nout + 1, sizeof(double));
    for (int64_t o = 0; o < nout; o++) {
        acc[o] = op == KILN_OP_PROD ? 1 : op == KILN_OP_MAX ? -INFINITY : op == KILN_OP_MIN ? INFINITY : 0;
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t i = 0; i < x->numel; i++) {
            int64_t rest = i, o = 0, mul = 1;
            for (int d = m->ndim - 1; d >= 0; d--) {
                int64_t k = rest % m->shape[d];
                rest /= m->shape[d];
                if (!((mask >> d) & 1u)) {
                    o += k * mul;
                    mul *= m->shape[d];
                }
            }
            double v = kiln_tensor_get_double(x, i);
            if (pass == 1) {
                acc[o] += (v - mean[o]) * (v - mean[o]);
                continue;
            }
            switch (op) {
            case KILN_OP_PROD: acc[o] *= v; break;
            case KILN_OP_MAX: acc[o] = v > acc[o] || v != v ? v : acc[o]; break;
            case KILN_OP_MIN: acc[o] = v < acc[o] || v != v ? v : acc[o]; break;
            default: acc[o] += v; break;
            }
        }
        if (pass == 1 || (op != KILN_OP_VAR && op != KILN_OP_STD)) break;
        for (int64_t o = 0; o < nout; o++) mean[o] = acc[o] / (double)count, acc[o] = 0;
    }
    for (int64_t o = 0; o < nout; o++) {
        double v = acc[o], dof = count - ddof > 0 ? (double)(count - ddof) : 0.0;
        if (op == KILN_OP_MEAN) v /= (double)count;
        if (op == KILN_OP_VAR) v /= dof;
        if (op == KILN_OP_STD) v = sqrt(v / dof);
        out[o] = v;
    }
    free(acc), free(mean);
}

static int failures_reported;

/* Compares t (any dtype and layout) with want; tol relative to 1 + |want|. */
static bool close_to(const kiln_tensor *t, const double *want, int64_t n, double tol, const char *what) {
    if (t->numel != n) {
        fprintf(stderr, "  %s: %lld elements, want %lld\n", what, (long long)t->numel, (long long)n);
        return false;
    }
    for (int64_t i = 0; i < n; i++) {
        double g = kiln_tensor_get_double(t, i), w = want[i];
        bool ok = (g != g && w != w) || g == w || fabs(g - w) <= tol * (1 + fabs(w));
        if (!ok) {
            if (failures_reported++ < 20)
                fprintf(stderr, "  %s: element %lld: got %.17g, want %.17g\n", what, (long long)i, g, w);
            return false;
        }
    }
    return true;
}

static bool shape_is(const kiln_tensor *t, int ndim, const int64_t *shape) {
    if (t->meta.ndim != ndim) return false;
    for (int d = 0; d < ndim; d++)
        if (t->meta.shape[d] != shape[d]) return false;
    return true;
}

static const kiln_op all_reductions[] = {KILN_OP_SUM, KILN_OP_MEAN, KILN_OP_PROD, KILN_OP_MAX,
                                         KILN_OP_MIN, KILN_OP_VAR,  KILN_OP_STD};

/* One op on x vs the reference: shape, dtype and values. */
static void check_reduction(kiln_op op, kiln_tensor *x, uint64_t mask, int keep, int ddof, double tol, kiln_dtype want_dt) {
    kiln_attrs a = red_attrs(mask, keep, ddof);
    kiln_tensor *y = NULL;
    CHECK_OK(kiln_apply1(op, x, &a, &y));
    if (!y) return;
    int64_t shape[KILN_MAX_DIMS];
    int ond = 0;
    for (int d = 0; d < x->meta.ndim; d++) {
        if (!((mask >> d) & 1u))
            shape[ond++] = x->meta.shape[d];
        else if (keep)
            shape[ond++] = 1;
    }
    char what[128];
    snprintf(what, sizeof what, "%s mask 0x%llx keep %d on %s", kiln_op_get(op)->name, (unsigned long long)mask, keep,
             kiln_dtype_name(x->meta.dtype));
    CHECK(shape_is(y, ond, shape));
    CHECK(y->meta.dtype == want_dt);
    double *want = malloc(sizeof(double) * (size_t)(y->numel + 1));
    ref_reduce(op, x, x->meta.ndim ? mask : 0, ddof, want, y->numel);
    if (!close_to(y, want, y->numel, tol, what)) {
        fprintf(stderr, "  (%s)\n", what);
        check_failures++;
    }
    free(want);
    kiln_tensor_release(y);
}

static kiln_dtype reduced_dtype(kiln_op op, kiln_dtype in) {
    bool fl = kiln_dtype_is_float(in);
    switch (op) {
    case KILN_OP_SUM:
    case KILN_OP_PROD: return fl ? in : KILN_DTYPE_INT64;
    case KILN_OP_MAX:
    case KILN_OP_MIN: return in;
    default: return fl ? in : KILN_DTYPE_FLOAT32;
    }
}

/* Every op, every axis mask, with and without keepdims. */
static void check_all_masks(kiln_tensor *x, kiln_tensor *x_prod, double tol) {
    int nd = x->meta.ndim;
    for (uint64_t mask = 0; mask < (1ull << nd) || (nd == 0 && mask < 2); mask++)
        for (int keep = 0; keep < 2; keep++)
            for (size_t k = 0; k < sizeof all_reductions / sizeof all_reductions[0]; k++) {
                kiln_op op = all_reductions[k];
                kiln_tensor *in = op == KILN_OP_PROD ? x_prod : x;
                check_reduction(op, in, mask, keep, op == KILN_OP_VAR || op == KILN_OP_STD ? (int)(mask & 1) : 0,
                                tol, reduced_dtype(op, in->meta.dtype));
            }
}

/* ---- values ----------------------------------------------------------------------------- */

static void test_shapes_and_masks(void) {
    static const int64_t shapes[][5] = {
        {0}, {1, 7}, {2, 3, 5}, {3, 4, 1, 6}, {4, 2, 3, 4, 5}, {2, 5, 300}, {2, 300, 5}, {2, 33, 1030}, {2, 1, 40},
    };
    kiln_dtype dts[2] = {KILN_DTYPE_FLOAT64, KILN_DTYPE_FLOAT32};
    for (int t = 0; t < 2; t++)
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            int nd = (int)shapes[k][0];
            kiln_tensor *x = tensor_of(dts[t], nd, shapes[k] + 1, -1, 1);
            kiln_tensor *xp = tensor_of(dts[t], nd, shapes[k] + 1, 0.99, 1.01);
            check_all_masks(x, xp, t == 0 ? 1e-12 : 2e-5);
            kiln_tensor_release(x), kiln_tensor_release(xp);
        }
}

static kiln_tensor *slice_of(kiln_tensor *x, const int64_t *start, const int64_t *step, const int64_t *len) {
    kiln_attrs a;
    kiln_attrs_clear(&a);
    for (int k = 0; k < 24; k++) kiln_attrs_push_int(&a, 0);
    for (int d = 0; d < x->meta.ndim; d++) a.i[d] = start[d], a.i[8 + d] = step[d], a.i[16 + d] = len[d];
    kiln_tensor *v = NULL;
    CHECK_OK(kiln_apply1(KILN_OP_SLICE, x, &a, &v));
    return v;
}

static void test_strided_inputs(void) {
    int64_t shape[3] = {4, 5, 6}, perm[3] = {2, 0, 1}, perm2[3] = {1, 2, 0};
    int64_t start[3] = {3, 0, 1}, step[3] = {-1, 2, 2}, len[3] = {4, 3, 3};
    int64_t one[3] = {1, 5, 6};
    for (int t = 0; t < 2; t++) {
        kiln_dtype dt = t ? KILN_DTYPE_FLOAT32 : KILN_DTYPE_FLOAT64;
        double tol = t ? 2e-5 : 1e-12;
        kiln_tensor *x = tensor_of(dt, 3, shape, -1, 1), *xp = tensor_of(dt, 3, shape, 0.9, 1.1);
        kiln_tensor *v = NULL, *vp = NULL;
        CHECK_OK(kiln_emit_permute(x, perm, &v));
        CHECK_OK(kiln_emit_permute(xp, perm, &vp));
        check_all_masks(v, vp, tol);
        kiln_tensor_release(v), kiln_tensor_release(vp);
        CHECK_OK(kiln_emit_permute(x, perm2, &v));
        CHECK_OK(kiln_emit_permute(xp, perm2, &vp));
        check_all_masks(v, vp, tol);
        kiln_tensor_release(v), kiln_tensor_release(vp);
        v = slice_of(x, start, step, len), vp = slice_of(xp, start, step, len);
        check_all_masks(v, vp, tol);
        kiln_tensor_release(v), kiln_tensor_release(vp);
        kiln_tensor *small = tensor_of(dt, 3, one, -1, 1), *smallp = tensor_of(dt, 3, one, 0.9, 1.1);
        CHECK_OK(kiln_emit_expand(small, 3, shape, &v));
        CHECK_OK(kiln_emit_expand(smallp, 3, shape, &vp));
        CHECK(v && v->strides[0] == 0);
        check_all_masks(v, vp, tol);
        kiln_tensor_release(v), kiln_tensor_release(vp), kiln_tensor_release(small), kiln_tensor_release(smallp);
        kiln_tensor_release(x), kiln_tensor_release(xp);
    }
}

/* Large inputs take the parallel and chunked paths; results must not depend on threads. */
static void test_large(void) {
    static const int64_t shapes[][4] = {{2, 1, 200000}, {2, 100000, 3}, {2, 256, 1030}, {3, 64, 3, 1000}, {2, 3, 70000}};
    static const uint64_t masks[][3] = {{2, 3, 1}, {1, 3, 2}, {1, 2, 3}, {5, 2, 6}, {1, 2, 3}};
    static const kiln_op ops[] = {KILN_OP_SUM, KILN_OP_MEAN, KILN_OP_MAX, KILN_OP_MIN, KILN_OP_VAR};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        kiln_tensor *x = tensor_of(KILN_DTYPE_FLOAT32, (int)shapes[k][0], shapes[k] + 1, 0, 1);
        for (int j = 0; j < 3; j++)
            for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
                check_reduction(ops[o], x, masks[k][j], 0, 0, 2e-5, KILN_DTYPE_FLOAT32);
        kiln_tensor_release(x);
    }
    /* integers on the parallel and chunked paths, exactly */
    int64_t si[2] = {3, 70000};
    kiln_tensor *xi = tensor_of(KILN_DTYPE_FLOAT64, 2, si, -100, 100), *xi32 = NULL;
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_INT32, 2, si, &xi32));
    CHECK_OK(kiln_copy_into(xi32, xi));
    for (uint64_t mask = 1; mask < 4; mask++) {
        check_reduction(KILN_OP_SUM, xi32, mask, 0, 0, 0, KILN_DTYPE_INT64);
        check_reduction(KILN_OP_MAX, xi32, mask, 1, 0, 0, KILN_DTYPE_INT32);
        check_reduction(KILN_OP_MEAN, xi32, mask, 0, 0, 1e-6, KILN_DTYPE_FLOAT32);
    }
    kiln_tensor_release(xi), kiln_tensor_release(xi32);

    int64_t n[2] = {3, 300000};
    kiln_tensor *x = tensor_of(KILN_DTYPE_FLOAT32, 2, n, -1, 1), *y1 = NULL, *y2 = NULL, *s1 = NULL, *s2 = NULL;
    kiln_attrs all = red_attrs(3, 0, 0), rows = red_attrs(2, 0, 0);
    int threads = kiln_num_threads();
    kiln_set_num_threads(1);
    CHECK_OK(kiln_apply1(KILN_OP_SUM, x, &all, &y1));
    CHECK_OK(kiln_apply1(KILN_OP_SOFTMAX, x, &(kiln_attrs){.ni = 1, .i = {1}}, &s1));
    kiln_set_num_threads(threads > 1 ? threads : 2);
    CHECK_OK(kiln_apply1(KILN_OP_SUM, x, &all, &y2));
    CHECK_OK(kiln_apply1(KILN_OP_SOFTMAX, x, &(kiln_attrs){.ni = 1, .i = {1}}, &s2));
    kiln_set_num_threads(threads);
    CHECK(y1 && y2 && memcmp(y1->data, y2->data, sizeof(float)) == 0);
    CHECK(s1 && s2 && memcmp(s1->data, s2->data, sizeof(float) * (size_t)x->numel) == 0);
    kiln_tensor_release(y1), kiln_tensor_release(y2), kiln_tensor_release(s1), kiln_tensor_release(s2);
    CHECK_OK(kiln_apply1(KILN_OP_SUM, x, &rows, &y1));
    CHECK_OK(kiln_apply1(KILN_OP_SUM, x, &rows, &y2));
    CHECK(y1 && y2 && memcmp(y1->data, y2->data, sizeof(float) * 3) == 0);
    kiln_tensor_release(y1), kiln_tensor_release(y2), kiln_tensor_release(x);
}

static void test_int_inputs(void) {
    int64_t shape[2] = {3, 4};
    double v[12] = {-5, 3, 7, 0, 12, -9, 4, 4, 1, 2, 3, -1};
    kiln_dtype dts[4] = {KILN_DTYPE_INT32, KILN_DTYPE_INT64, KILN_DTYPE_INT8, KILN_DTYPE_BOOL};
    for (int t = 0; t < 4; t++) {
        kiln_tensor *x = tensor_vals(dts[t], 2, shape, v);
        check_all_masks(x, x, 1e-6);
        kiln_tensor_release(x);
    }
    /* a known answer: int32 sum over rows gives int64 */
    kiln_tensor *x = tensor_vals(KILN_DTYPE_INT32, 2, shape, v), *y = NULL;
    kiln_attrs a = red_attrs(2, 0, 0);
    CHECK_OK(kiln_apply1(KILN_OP_SUM, x, &a, &y));
    CHECK(y && y->meta.dtype == KILN_DTYPE_INT64 && ((int64_t *)y->data)[0] == 5 && ((int64_t *)y->data)[1] == 11 &&
          ((int64_t *)y->data)[2] == 5);
    kiln_tensor_release(y);
    CHECK_OK(kiln_apply1(KILN_OP_MAX, x, &a, &y));
    CHECK(y && y->meta.dtype == KILN_DTYPE_INT32 && ((int32_t *)y->data)[1] == 12);
    kiln_tensor_release(y), kiln_tensor_release(x);
    /* large int64 values stay exact */
    int64_t n = 3;
    kiln_tensor *big = NULL;
    CHECK_OK(kiln_tensor_empty(KILN_DTYPE_INT64, 1, &n, &big));
    int64_t *pb = big->data;
    pb[0] = (1ll << 60) + 1, pb[1] = 5, pb[2] = -(1ll << 58);
    a = red_attrs(1, 0, 0);
    CHECK_OK(kiln_apply1(KILN_OP_SUM, big, &a, &y));
    CHECK(y && *(int64_t *)y->data == (1ll << 60) + 6 - (1ll << 58));
    kiln_tensor_release(y), kiln_tensor_release(big);
}

static void test_half_inputs(void) {
    int64_t shape[2] = {8, 50};
    kiln_dtype dts[2] = {KILN_DTYPE_FLOAT16, KILN_DTYPE_BFLOAT16};
    for (int t = 0; t < 2; t++) {
        kiln_tensor *x = tensor_of(dts[t], 2, shape, 0, 1);
        for (uint64_t mask = 1; mask < 4; mask++) {
            check_reduction(KILN_OP_SUM, x, mask, 0, 0, t ? 8e-3 : 1e-3, dts[t]);
            check_reduction(KILN_OP_MEAN, x, mask, 1, 0, t ? 8e-3 : 1e-3, dts[t]);
            check_reduction(KILN_OP_MAX, x, mask, 0, 0, 0, dts[t]);
            check_reduction(KILN_OP_STD, x, mask, 0, 1, t ? 8e-3 : 1e-3, dts[t]);
        }
        kiln_tensor_release(x);
    }
}

static void test_empty_and_scalar(void) {
    int64_t s30[2] = {3, 0}, s03[2] = {0, 3};
    kiln_tensor *a = tensor_of(KILN_DTYPE_FLOAT32, 2, s30, 0, 1), *b = tensor_of(KILN_DTYPE_FLOAT32, 2, s03, 0, 1);
    kiln_tensor *y = NULL;
    kiln_attrs m2 = red_attrs(2, 0, 0), m1 = red_attrs(1, 0, 0);
    double zeros[3] = {0, 0, 0}, ones[3] = {1, 1, 1}, nans[3] = {NAN, NAN, NAN};
    CHECK_OK(kiln_apply1(KILN_OP_SUM, a, &m2, &y));
    CHECK(y && close_to(y, zeros, 3, 0, "empty sum"));
    kiln_tensor_release(y);
    CHECK_OK(kiln_apply1(KILN_OP_PROD, a, &m2, &y));
    CHECK(y && close_to(y, ones, 3, 0, "empty prod"));
    kiln_tensor_release(y);
    CHECK_OK(kiln_apply1(KILN_OP_MEAN, a, &m2, &y));
    CHECK(y && close_to(y, nans, 3, 0, "empty mean"));
    kiln_tensor_release(y);
    CHECK_OK(kiln_apply1(KILN_OP_SUM, b, &m1, &y));
    CHECK(y && y->meta.ndim == 1 && y->meta.shape[0] == 3 && close_to(y, zeros, 3, 0, "empty column sum"));
    kiln_tensor_release(y);
    CHECK_OK(kiln_apply1(KILN_OP_MAX, b, &m2, &y)); /* nothing to reduce per output, no outputs */
    CHECK(y && y->meta.ndim == 1 && y->meta.shape[0] == 0);
    kiln_tensor_release(y);
    CHECK_STATUS(kiln_apply1(KILN_OP_MAX, a, &m2, &y), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "max") && strstr(kiln_last_error(), "(3, 0)"));
    CHECK_STATUS(kiln_apply1(KILN_OP_ARGMIN, b, &m1, &y), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "argmin") && strstr(kiln_last_error(), "(0, 3)"));
    kiln_tensor_release(a), kiln_tensor_release(b);

    /* 0-d tensors: mask 0 or 1, the value itself */
    double v = 2.5;
    kiln_tensor *s = tensor_vals(KILN_DTYPE_FLOAT64, 0, NULL, &v);
    for (uint64_t mask = 0; mask < 2; mask++) {
        kiln_attrs at = red_attrs(mask, 1, 0);
        for (size_t k = 0; k < sizeof all_reductions / sizeof all_reductions[0]; k++) {
            CHECK_OK(kiln_apply1(all_reductions[k], s, &at, &y));
            double want = all_reductions[k] == KILN_OP_VAR || all_reductions[k] == KILN_OP_STD ? 0 : 2.5;
            CHECK(y && y->meta.ndim == 0 && close_to(y, &want, 1, 0, "0-d reduction"));
            kiln_tensor_release(y);
        }
        CHECK_OK(kiln_apply1(KILN_OP_ARGMAX, s, &at, &y));
        CHECK(y && y->meta.ndim == 0 && *(int64_t *)y->data == 0);
        kiln_tensor_release(y);
    }
    kiln_tensor_release(s);
}

static void test_nan_propagation(void) {
    int64_t n = 40;
    kiln_tensor *x = tensor_of(KILN_DTYPE_FLOAT32, 1, &n, 0, 1), *y = NULL;
    ((float *)x->data)[37] = NAN;
    kiln_attrs a = red_attrs(1, 0, 0);
    CHECK_OK(kiln_apply1(KILN_OP_MAX, x, &a, &y));
    CHECK(y && isnan(*(float *)y->data));
    kiln_tensor_release(y);
    CHECK_OK(kiln_apply1(KILN_OP_MIN, x, &a, &y));
    CHECK(y && isnan(*(float *)y->data));
    kiln_tensor_release(y);
    CHECK_OK(kiln_apply1(KILN_OP_ARGMAX, x, &a, &y));
    CHECK(y && *(int64_t *)y->data == 37);
    kiln_tensor_release(y), kiln_tensor_release(x);
}

/* ---- argmax / argmin -------------------------------------------------------------------- */

static void ref_arg(const kiln_tensor *x, int axis, bool is_max, int64_t *out) {
    const kiln_meta *m = &x->meta;
    int64_t O = 1, R = x->numel, I = 1;
    if (axis >= 0) {
        R = m->shape[axis];
        for (int d = 0; d < m->ndim; d++)
            if (d < axis) O *= m->shape[d];
            else if (d > axis) I *= m->shape[d];
    }
    for (int64_t o = 0; o < O; o++)
        for (int64_t i = 0; i < I; i++) {
            int64_t at = 0;
            double best = kiln_tensor_get_double(x, o * R * I + i);
            for (int64_t r = 1; r < R; r++) {
                double v = kiln_tensor_get_double(x, (o * R + r) * I + i);
                if ((is_max ? v > best : v < best) || (v != v && best == best)) best = v, at = r;
            }
            out[o * I + i] = at;
        }
}

static void check_arg(kiln_tensor *x) {
    int nd = x->meta.ndim;
    for (int axis = -1; axis < nd; axis++)
        for (int keep = 0; keep < 2; keep++)
            for (int is_max = 0; is_max < 2; is_max++) {
                uint64_t mask = axis < 0 ? (1ull << nd) - 1 : 1ull << axis;
                kiln_attrs a = red_attrs(mask, keep, 0);
                kiln_tensor *y = NULL;
                CHECK_OK(kiln_apply1(is_max ? KILN_OP_ARGMAX : KILN_OP_ARGMIN, x, &a, &y));
                if (!y) continue;
                CHECK(y->meta.dtype == KILN_DTYPE_INT64);
                CHECK(y->meta.ndim == (keep ? nd : axis < 0 ? 0 : nd - 1));
                int64_t *want = malloc(sizeof(int64_t) * (size_t)(y->numel + 1));
                ref_arg(x, axis < 0 ? -1 : axis, is_max, want);
                bool ok = memcmp(y->data, want, sizeof(int64_t) * (size_t)y->numel) == 0;
                if (!ok) fprintf(stderr, "  arg%s axis %d keep %d on %s\n", is_max ? "max" : "min", axis, keep,
                                 kiln_dtype_name(x->meta.dtype));
                CHECK(ok);
                free(want);
                kiln_tensor_release(y);
            }
}

static void test_argmax(void) {
    int64_t shape[3] = {3, 4, 300}, perm[3] = {2, 0, 1};
    kiln_tensor *x = tensor_of(KILN_DTYPE_FLOAT32, 3, shape, -1, 1), *v = NULL;
    check_arg(x);
    CHECK_OK(kiln_emit_permute(x, perm, &v));
    check_arg(v);
    kiln_tensor_release(v), kiln_tensor_release(x);
    x = tensor_of(KILN_DTYPE_FLOAT64, 3, shape, -1, 1);
    check_arg(x);
    kiln_tensor_release(x);
    int64_t s2[2] = {5, 6};
    double vals[30];
    for (int i = 0; i < 30; i++) vals[i] = (i * 7) % 5; /* many ties: the first index wins */
    x = tensor_vals(KILN_DTYPE_INT32, 2, s2, vals);
    check_arg(x);
    kiln_tensor_release(x);
    double with_nan[6] = {1, NAN, 3, NAN, 0, 3};
    int64_t s6 = 6;
    x = tensor_vals(KILN_DTYPE_FLOAT32, 1, &s6, with_nan);
    check_arg(x);
    kiln_tensor_release(x);
}

/* NaN, +inf and -inf sprinkled over x (about one element in `every`), and rows (last axis) of
 * only -inf, only +inf and only NaN: every reduction and arg reduction over every axis mask
 * against the reference (NaN propagates through max and min; the first NaN is the argmax). */
static void sprinkle_specials(kiln_tensor *x, int64_t every) {
    static const double sp[3] = {NAN, INFINITY, -INFINITY};
    int64_t row = x->meta.ndim ? x->meta.shape[x->meta.ndim - 1] : 1;
    for (int64_t i = 0; i < x->numel; i++) {
        int64_t r = i / row;
        double v = r % 7 == 1 ? -INFINITY : r % 7 == 3 ? INFINITY : r % 11 == 5 ? NAN : 0;
        if (v == 0 && (int64_t)(rnd() * (double)every) == 0) v = sp[(int)(rnd() * 3)];
        if (v == 0) continue;
        if (x->meta.dtype == KILN_DTYPE_FLOAT32) ((float *)x->data)[i] = (float)v;
        else ((double *)x->data)[i] = v;
    }
}

static void test_special_values(void) {
    static const int64_t shapes[][4] = {{2, 5, 12}, {3, 4, 3, 7}, {2, 3, 300}, {2, 300, 3}, {2, 64, 1030}};
    for (int t = 0; t < 2; t++)
        for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
            kiln_dtype dt = t ? KILN_DTYPE_FLOAT32 : KILN_DTYPE_FLOAT64;
            int nd = (int)shapes[k][0];
            kiln_tensor *x = tensor_of(dt, nd, shapes[k] + 1, -1, 1);
            sprinkle_specials(x, 50);
            check_all_masks(x, x, t ? 2e-5 : 1e-12);
            check_arg(x);
            kiln_tensor_release(x);
        }
}

/* ---- softmax family --------------------------------------------------------------------- */

/* kind 0 softmax, 1 log_softmax, 2 softmax_backward(a=g, b=y), 3 log_softmax_backward */
static void ref_softmax(int kind, const kiln_tensor *a, const kiln_tensor *b, int axis, double *out) {
    const kiln_meta *m = &a->meta;
    int64_t O = 1, R = 1, I = 1;
    for (int d = 0; d < m->ndim; d++) *(d < axis ? &O : d == axis ? &R : &I) *= m->shape[d];
    for (int64_t o = 0; o < O; o++)
        for (int64_t i = 0; i < I; i++) {
            double mx = -INFINITY, sum = 0;
            for (int64_t r = 0; r < R; r++) {
                int64_t k = (o * R + r) * I + i;
                double va = kiln_tensor_get_double(a, k), vb = b ? kiln_tensor_get_double(b, k) : 0;
                if (va > mx) mx = va;
                sum += kind == 2 ? va * vb : va;
            }
            if (kind < 2) {
                sum = 0;
                for (int64_t r = 0; r < R; r++) sum += exp(kiln_tensor_get_double(a, (o * R + r) * I + i) - mx);
            }
            for (int64_t r = 0; r < R; r++) {
                int64_t k = (o * R + r) * I + i;
                double va = kiln_tensor_get_double(a, k), vb = b ? kiln_tensor_get_double(b, k) : 0;
                out[k] = kind == 0 ? exp(va - mx) / sum
                         : kind == 1 ? va - mx - log(sum)
                         : kind == 2 ? vb * (va - sum)
                                     : va - exp(vb) * sum;
            }
        }
}

static void check_softmax(kiln_tensor *x, double tol) {
    static const kiln_op fwd[2] = {KILN_OP_SOFTMAX, KILN_OP_LOG_SOFTMAX};
    static const kiln_op bwd[2] = {KILN_OP_SOFTMAX_BACKWARD, KILN_OP_LOG_SOFTMAX_BACKWARD};
    int nd = x->meta.ndim;
    double *want = malloc(sizeof(double) * (size_t)(x->numel + 1));
    for (int axis = 0; axis < (nd ? nd : 1); axis++)
        for (int k = 0; k < 2; k++) {
            kiln_attrs a = axis_attrs(axis);
            kiln_tensor *y = NULL, *gx = NULL;
            CHECK_OK(kiln_apply1(fwd[k], x, &a, &y));
            if (!y) continue;
            CHECK(shape_is(y, nd, x->meta.shape));
            CHECK(y->meta.dtype == (kiln_dtype_is_float(x->meta.dtype) ? x->meta.dtype : KILN_DTYPE_FLOAT32));
            ref_softmax(k, x, NULL, axis, want);
            char what[96];
            snprintf(what, sizeof what, "%s axis %d on %s", kiln_op_get(fwd[k])->name, axis, kiln_dtype_name(x->meta.dtype));
            if (!close_to(y, want, x->numel, tol, what)) check_failures++;
            /* the backward op with a random incoming gradient, against y as computed */
            kiln_tensor *g = tensor_of(y->meta.dtype, nd, x->meta.shape, -1, 1);
            CHECK_OK(kiln_apply2(bwd[k], g, y, &a, &gx));
            ref_softmax(2 + k, g, y, axis, want);
            snprintf(what, sizeof what, "%s axis %d on %s", kiln_op_get(bwd[k])->name, axis, kiln_dtype_name(x->meta.dtype));
            if (gx && !close_to(gx, want, x->numel, tol, what)) check_failures++;
            kiln_tensor_release(g), kiln_tensor_release(gx), kiln_tensor_release(y);
        }
    free(want);
}

static void test_softmax(void) {
    int64_t shape[3] = {3, 4, 300}, perm[3] = {1, 2, 0}, small[2] = {5, 7};
    kiln_tensor *x = tensor_of(KILN_DTYPE_FLOAT32, 3, shape, -5, 5), *v = NULL;
    check_softmax(x, 1e-5);
    CHECK_OK(kiln_emit_permute(x, perm, &v));
    check_softmax(v, 1e-5);
    kiln_tensor_release(v), kiln_tensor_release(x);
    x = tensor_of(KILN_DTYPE_FLOAT64, 2, small, -5, 5);
    check_softmax(x, 1e-12);
    kiln_tensor_release(x);
    x = tensor_of(KILN_DTYPE_FLOAT16, 2, small, -3, 3);
    check_softmax(x, 3e-3);
    kiln_tensor_release(x);
    x = tensor_of(KILN_DTYPE_INT32, 2, small, -3, 3);
    check_softmax(x, 1e-5);
    kiln_tensor_release(x);
    double one = 4.0;
    x = tensor_vals(KILN_DTYPE_FLOAT64, 0, NULL, &one);
    check_softmax(x, 0);
    kiln_tensor_release(x);

    /* large logits do not overflow; -inf entries get probability 0 */
    double big[4] = {1000, 1001, 1002, -INFINITY};
    int64_t n4 = 4;
    x = tensor_vals(KILN_DTYPE_FLOAT32, 1, &n4, big);
    kiln_attrs a = axis_attrs(0);
    kiln_tensor *y = NULL;
    CHECK_OK(kiln_apply1(KILN_OP_SOFTMAX, x, &a, &y));
    double e0 = exp(-2.0), e1 = exp(-1.0), sum = e0 + e1 + 1;
    double want[4] = {e0 / sum, e1 / sum, 1 / sum, 0};
    CHECK(y && close_to(y, want, 4, 1e-6, "softmax of large logits"));
    kiln_tensor_release(y);
    CHECK_OK(kiln_apply1(KILN_OP_LOG_SOFTMAX, x, &a, &y));
    double lwant[4] = {-2 - log(sum), -1 - log(sum), -log(sum), -INFINITY};
    CHECK(y && close_to(y, lwant, 4, 1e-6, "log_softmax of large logits"));
    kiln_tensor_release(y), kiln_tensor_release(x);
}

/* ---- gradients -------------------------------------------------------------------------- */

typedef struct {
    kiln_op op;
    kiln_attrs attrs;
    const int64_t *perm; /* permute x first when set */
} fwd_spec;

static kiln_status forward(const fwd_spec *f, kiln_tensor *x, kiln_tensor **y) {
    kiln_tensor *in = x, *p = NULL;
    if (f->perm) {
        KILN_TRY(kiln_emit_permute(x, f->perm, &p));
        in = p;
    }
    kiln_status s = kiln_apply1(f->op, in, &f->attrs, y);
    kiln_tensor_release(p);
    return s;
}

/* loss = sum(f(x) * w) for fixed random weights w */
static kiln_status loss_of(const fwd_spec *f, kiln_tensor *x, kiln_tensor *w, kiln_tensor **loss) {
    kiln_tensor *y = NULL, *yw = NULL;
    KILN_TRY(forward(f, x, &y));
    kiln_status s = kiln_emit_binary(KILN_OP_MUL, y, w, &yw);
    if (s == KILN_OK) {
        uint64_t all = yw->meta.ndim ? (1ull << yw->meta.ndim) - 1 : 0;
        s = kiln_emit_reduce(KILN_OP_SUM, yw, all, false, loss);
    }
    kiln_tensor_release(y), kiln_tensor_release(yw);
    return s;
}

static void grad_check(const char *what, kiln_tensor *x, const fwd_spec *f) {
    kiln_tensor *y = NULL, *loss = NULL, *g = NULL;
    CHECK_OK(forward(f, x, &y));
    if (!y) return;
    kiln_tensor *w = tensor_of(KILN_DTYPE_FLOAT64, y->meta.ndim, y->meta.shape, 0.5, 1.5);
    kiln_tensor_release(y);
    CHECK_OK(kiln_tensor_set_requires_grad(x, true));
    CHECK_OK(loss_of(f, x, w, &loss));
    if (loss) CHECK_OK(kiln_autograd_grad(1, &loss, NULL, 1, &x, false, &g));
    CHECK(g && shape_is(g, x->meta.ndim, x->meta.shape));
    bool prev = kiln_set_grad_enabled(false);
    double *px = x->data, h = 1e-6;
    for (int64_t i = 0; g && i < x->numel; i++) {
        kiln_tensor *lp = NULL, *lm = NULL;
        double keep = px[i];
        px[i] = keep + h;
        CHECK_OK(loss_of(f, x, w, &lp));
        px[i] = keep - h;
        CHECK_OK(loss_of(f, x, w, &lm));
        px[i] = keep;
        if (!lp || !lm) break;
        double fd = (*(double *)lp->data - *(double *)lm->data) / (2 * h), got = kiln_tensor_get_double(g, i);
        if (!(fabs(fd - got) <= 1e-6 * (1 + fabs(fd)))) {
            fprintf(stderr, "  gradient of %s: element %lld: got %.12g, finite difference %.12g\n", what, (long long)i,
                    got, fd);
            check_failures++;
            kiln_tensor_release(lp), kiln_tensor_release(lm);
            break;
        }
        kiln_tensor_release(lp), kiln_tensor_release(lm);
    }
    kiln_set_grad_enabled(prev);
    CHECK_OK(kiln_tensor_set_requires_grad(x, false));
    kiln_tensor_release(loss), kiln_tensor_release(g), kiln_tensor_release(w);
}

static void test_gradients(void) {
    static const int64_t shapes[][4] = {{2, 3, 4}, {3, 2, 3, 4}, {1, 5}};
    static const kiln_op ops[] = {KILN_OP_SUM, KILN_OP_MEAN, KILN_OP_PROD, KILN_OP_MAX,
                                  KILN_OP_MIN, KILN_OP_VAR,  KILN_OP_STD};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int nd = (int)shapes[k][0];
        for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
            /* prod: positive values away from zero */
            kiln_tensor *x = tensor_of(KILN_DTYPE_FLOAT64, nd, shapes[k] + 1, ops[o] == KILN_OP_PROD ? 0.5 : -2, 2);
            for (uint64_t mask = 1; mask < (1ull << nd); mask++)
                for (int keep = 0; keep < 2; keep++) {
                    fwd_spec f = {ops[o], red_attrs(mask, keep, (int)(mask & 1)), NULL};
                    char what[96];
                    snprintf(what, sizeof what, "%s mask 0x%llx keep %d", kiln_op_get(ops[o])->name,
                             (unsigned long long)mask, keep);
                    grad_check(what, x, &f);
                }
            kiln_tensor_release(x);
        }
        kiln_tensor *x = tensor_of(KILN_DTYPE_FLOAT64, nd, shapes[k] + 1, -2, 2);
        for (int axis = 0; axis < nd; axis++) {
            fwd_spec f = {KILN_OP_SOFTMAX, axis_attrs(axis), NULL};
            grad_check("softmax", x, &f);
            f.op = KILN_OP_LOG_SOFTMAX;
            grad_check("log_softmax", x, &f);
        }
        kiln_tensor_release(x);
    }
    /* through a transposed view */
    int64_t shape[3] = {2, 3, 4}, perm[3] = {2, 0, 1};
    kiln_tensor *x = tensor_of(KILN_DTYPE_FLOAT64, 3, shape, -2, 2);
    fwd_spec f = {KILN_OP_SUM, red_attrs(5, 0, 0), perm};
    grad_check("sum of a transposed view", x, &f);
    f = (fwd_spec){KILN_OP_STD, red_attrs(2, 1, 1), perm};
    grad_check("std of a transposed view", x, &f);
    f = (fwd_spec){KILN_OP_SOFTMAX, axis_attrs(1), perm};
    grad_check("softmax of a transposed view", x, &f);
    kiln_tensor_release(x);

    /* float16: the gradient of a mean over more elements than float16 can count */
    int64_t big = 70000;
    x = tensor_of(KILN_DTYPE_FLOAT16, 1, &big, 0, 1);
    CHECK_OK(kiln_tensor_set_requires_grad(x, true));
    kiln_attrs all1 = red_attrs(1, 0, 0);
    kiln_tensor *m = NULL, *gm = NULL;
    CHECK_OK(kiln_apply1(KILN_OP_MEAN, x, &all1, &m));
    if (m) CHECK_OK(kiln_autograd_grad(1, &m, NULL, 1, &x, false, &gm));
    CHECK(gm && gm->meta.dtype == KILN_DTYPE_FLOAT16 && gm->numel == big);
    CHECK(gm && fabs(kiln_tensor_get_double(gm, 12345) * big - 1) < 0.05);
    kiln_tensor_release(m), kiln_tensor_release(gm), kiln_tensor_release(x);

    /* ties split the gradient of max evenly */
    double v[4] = {1, 3, 3, 2}, want[4] = {0, 0.5, 0.5, 0};
    int64_t n = 4;
    x = tensor_vals(KILN_DTYPE_FLOAT64, 1, &n, v);
    CHECK_OK(kiln_tensor_set_requires_grad(x, true));
    kiln_attrs a = red_attrs(1, 0, 0);
    kiln_tensor *y = NULL, *g = NULL;
    CHECK_OK(kiln_apply1(KILN_OP_MAX, x, &a, &y));
    if (y) CHECK_OK(kiln_autograd_grad(1, &y, NULL, 1, &x, false, &g));
    CHECK(g && close_to(g, want, 4, 0, "max gradient with ties"));
    kiln_tensor_release(y), kiln_tensor_release(g), kiln_tensor_release(x);
}

/* ---- errors ----------------------------------------------------------------------------- */

static void test_errors(void) {
    int64_t shape[2] = {2, 3}, s3[3] = {2, 3, 4}, n4 = 4;
    kiln_tensor *x = tensor_of(KILN_DTYPE_FLOAT32, 2, shape, 0, 1), *x3 = tensor_of(KILN_DTYPE_FLOAT32, 3, s3, 0, 1);
    kiln_tensor *v4 = tensor_of(KILN_DTYPE_FLOAT32, 1, &n4, 0, 1), *y = NULL;
    kiln_attrs a = red_attrs(4, 0, 0);
    CHECK_STATUS(kiln_apply1(KILN_OP_SUM, x, &a, &y), KILN_ERR_VALUE);
    CHECK(y == NULL && strstr(kiln_last_error(), "sum") && strstr(kiln_last_error(), "(2, 3)"));
    a = red_attrs((uint64_t)-1, 0, 0);
    CHECK_STATUS(kiln_apply1(KILN_OP_MEAN, x, &a, &y), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "mean"));
    kiln_attrs none;
    kiln_attrs_clear(&none);
    CHECK_STATUS(kiln_apply1(KILN_OP_MAX, x, &none, &y), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "max"));
    a = red_attrs(3, 0, 0);
    CHECK_STATUS(kiln_apply1(KILN_OP_ARGMAX, x3, &a, &y), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "argmax") && strstr(kiln_last_error(), "(2, 3, 4)"));
    a = red_attrs(0, 0, 0);
    CHECK_STATUS(kiln_apply1(KILN_OP_ARGMIN, x, &a, &y), KILN_ERR_VALUE);
    a = axis_attrs(2);
    CHECK_STATUS(kiln_apply1(KILN_OP_SOFTMAX, x, &a, &y), KILN_ERR_INDEX);
    CHECK(y == NULL && strstr(kiln_last_error(), "softmax") && strstr(kiln_last_error(), "(2, 3)"));
    CHECK_STATUS(kiln_apply1(KILN_OP_LOG_SOFTMAX, x, &none, &y), KILN_ERR_VALUE);
    CHECK_STATUS(kiln_apply2(KILN_OP_SOFTMAX_BACKWARD, x, v4, &a, &y), KILN_ERR_VALUE);
    CHECK(strstr(kiln_last_error(), "(2, 3)") && strstr(kiln_last_error(), "(4,)"));
    kiln_tensor_release(x), kiln_tensor_release(x3), kiln_tensor_release(v4);
}

int main(void) {
    test_shapes_and_masks();
    test_strided_inputs();
    test_large();
    test_int_inputs();
    test_half_inputs();
    test_empty_and_scalar();
    test_nan_propagation();
    test_special_values();
    test_argmax();
    test_softmax();
    test_gradients();
    test_errors();
    CHECK_DONE();
}
