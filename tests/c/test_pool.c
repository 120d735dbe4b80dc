/* max_pool2d / avg_pool2d and their backward ops against direct loops: stride, asymmetric
 * padding, dilation, ceil_mode, count_include_pad, dtypes, strided inputs, NaN, gradients by
 * finite differences and error messages. */
#include "linalg_testutil.h"

typedef struct {
    int64_t N, C, H, W, kh, kw, sh, sw, pt, pb, pl, pr, dh, dw, ceil, include_pad;
} pool_case;

static const pool_case cases[] = {
    {2, 3, 8, 8, 2, 2, 2, 2, 0, 0, 0, 0, 1, 1, 0, 1},
    {1, 2, 7, 9, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1},
    {1, 2, 7, 9, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, 0},
    {2, 2, 10, 11, 3, 2, 1, 2, 1, 0, 0, 1, 2, 2, 0, 0},
    {1, 1, 5, 5, 5, 5, 1, 1, 2, 2, 2, 2, 1, 1, 0, 1},
    {1, 3, 9, 10, 3, 3, 3, 3, 1, 1, 0, 1, 1, 1, 1, 1},
    {2, 2, 6, 6, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1},
    {4, 16, 32, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0, 1},
};

static int64_t out_size(int64_t in, int64_t k, int64_t pl, int64_t pr, int64_t s, int64_t d, int64_t ceil) {
    int64_t span = in + pl + pr - d * (k - 1) - 1;
    int64_t o = (ceil ? (span + s - 1) / s : span / s) + 1;
    if (ceil && (o - 1) * s >= in + pl) o--;
    return o;
}

static kiln_attrs pool_attrs(const pool_case *c, int with_shape) {
    kiln_attrs a;
    kiln_attrs_clear(&a);
    int64_t v[16] = {c->kh, c->kw, c->sh, c->sw, c->pt, c->pb, c->pl, c->pr, c->dh, c->dw, c->ceil, c->include_pad,
                     c->N, c->C, c->H, c->W};
    for (int k = 0; k < (with_shape ? 16 : 12); k++) kiln_attrs_push_int(&a, v[k]);
    return a;
}

/* Direct loops: max and average outputs, and input gradients for gy. `intdiv` truncates the
 * average as integer dtypes do. */
static void ref_pool(const pool_case *c, const double *x, const double *gy, int intdiv, double *ymax, double *yavg,
                     double *gmax, double *gavg) {
    int64_t OH = out_size(c->H, c->kh, c->pt, c->pb, c->sh, c->dh, c->ceil);
    int64_t OW = out_size(c->W, c->kw, c->pl, c->pr, c->sw, c->dw, c->ceil);
    memset(gmax, 0, sizeof(double) * (size_t)(c->N * c->C * c->H * c->W));
    memset(gavg, 0, sizeof(double) * (size_t)(c->N * c->C * c->H * c->W));
    for (int64_t p = 0; p < c->N * c->C; p++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t yi = (p * OH + oh) * OW + ow, best = -1, valid = 0, padded = 0;
                double sum = 0;
                for (int64_t kh = 0; kh < c->kh; kh++)
                    for (int64_t kw = 0; kw < c->kw; kw++) {
                        int64_t ih = oh * c->sh - c->pt + kh * c->dh, iw = ow * c->sw - c->pl + kw * c->dw;
                        if (ih < c->H + c->pb && iw < c->W + c->pr) padded++;
                        if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W) continue;
                        int64_t xi = (p * c->H + ih) * c->W + iw;
                        valid++;
                        sum += x[xi];
                        if (best < 0 || x[xi] > x[best]) best = xi;
                    }
                int64_t count = c->include_pad ? padded : valid;
                ymax[yi] = x[best];
                yavg[yi] = intdiv ? (double)((int64_t)sum / count) : sum / (double)count;
                gmax[best] += gy[yi];
                for (int64_t kh = 0; kh < c->kh; kh++)
                    for (int64_t kw = 0; kw < c->kw; kw++) {
                        int64_t ih = oh * c->sh - c->pt + kh * c->dh, iw = ow * c->sw - c->pl + kw * c->dw;
                        if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W) continue;
                        gavg[(p * c->H + ih) * c->W + iw] += intdiv ? (double)((int64_t)gy[yi] / count) : gy[yi] / (double)count;
                    }
            }
}

static double tol_of(kiln_dtype dt) {
    return dt == KILN_DTYPE_FLOAT64 ? 1e-12 : dt == KILN_DTYPE_FLOAT32 ? 1e-6 : dt == KILN_DTYPE_FLOAT16 ? 2e-3 : 0;
}

static void run_check(kiln_op op, int nin, kiln_tensor **ins, const kiln_attrs *a, const double *want, double tol,
                      const kiln_meta *shape_of, const char *what) {
    kiln_tensor *y = NULL;
    CHECK_OK(kiln_apply(op, nin, ins, a, &y));
    int ok = y && y->meta.ndim == 4;
    for (int d = 0; ok && d < 4; d++) ok = y->meta.shape[d] == shape_of->shape[d];
    if (!ok) fprintf(stderr, "  %s: wrong output shape\n", what);
    CHECK(ok && tu_check(y, want, tol, what));
    kiln_tensor_release(y);
}

static void check_case(const pool_case *c, kiln_tensor *x, kiln_tensor *gy, const char *what) {
    kiln_dtype dt = x->meta.dtype;
    double *xv = tu_values(x), *gv = tu_values(gy);
    size_t ny = (size_t)gy->numel, nx = (size_t)x->numel;
    double *ymax = malloc(sizeof(double) * ny), *yavg = malloc(sizeof(double) * ny);
    double *gmax = malloc(sizeof(double) * nx), *gavg = malloc(sizeof(double) * nx);
    ref_pool(c, xv, gv, !kiln_dtype_is_float(dt), ymax, yavg, gmax, gavg);
    double tol = tol_of(dt) * (dt == KILN_DTYPE_FLOAT32 ? 4 : 1);
    kiln_attrs a = pool_attrs(c, 0), ab = pool_attrs(c, 1);
    char name[160];
    kiln_tensor *bins[2] = {gy, x};
    snprintf(name, sizeof name, "%s: max_pool2d", what);
    run_check(KILN_OP_MAX_POOL2D, 1, &x, &a, ymax, tol, &gy->meta, name);
    snprintf(name, sizeof name, "%s: avg_pool2d", what);
    run_check(KILN_OP_AVG_POOL2D, 1, &x, &a, yavg, tol, &gy->meta, name);
    snprintf(name, sizeof name, "%s: max_pool2d_backward", what);
    run_check(KILN_OP_MAX_POOL2D_BACKWARD, 2, bins, &a, gmax, tol * 4, &x->meta, name);
    snprintf(name, sizeof name, "%s: avg_pool2d_backward", what);
    run_check(KILN_OP_AVG_POOL2D_BACKWARD, 1, &gy, &ab, gavg, tol * 4, &x->meta, name);
    free(xv), free(gv), free(ymax), free(yavg), free(gmax), free(gavg);
}

static void test_values(void) {
    const kiln_dtype dts[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64, KILN_DTYPE_FLOAT16, KILN_DTYPE_INT32,
                              KILN_DTYPE_INT64, KILN_DTYPE_INT8};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
            const pool_case *c = &cases[i];
            int64_t xs[4] = {c->N, c->C, c->H, c->W};
            int64_t ys[4] = {c->N, c->C, out_size(c->H, c->kh, c->pt, c->pb, c->sh, c->dh, c->ceil),
                             out_size(c->W, c->kw, c->pl, c->pr, c->sw, c->dw, c->ceil)};
            kiln_tensor *x = tu_tensor(dts[k], 4, xs), *gy = tu_tensor(dts[k], 4, ys);
            char what[96];
            snprintf(what, sizeof what, "pool case %zu %s", i, kiln_dtype_name(dts[k]));
            check_case(c, x, gy, what);
            if (dts[k] == KILN_DTYPE_FLOAT32 || dts[k] == KILN_DTYPE_FLOAT64)
                for (int how = 0; how < 3; how++) {
                    kiln_tensor *xn = tu_noncontig(x, how), *gn = tu_noncontig(gy, 2 - how);
                    snprintf(what, sizeof what, "pool case %zu %s, strided layout %d", i, kiln_dtype_name(dts[k]), how);
                    check_case(c, xn, gn, what);
                    kiln_tensor_release(xn), kiln_tensor_release(gn);
                }
            kiln_tensor_release(x), kiln_tensor_release(gy);
        }
}

static void test_nan_propagates(void) {
    pool_case c = {1, 1, 2, 2, 2, 2, 1, 1, 0, 0, 0, 0, 1, 1, 0, 1};
    int64_t xs[4] = {1, 1, 2, 2}, ys[4] = {1, 1, 1, 1};
    for (int at = 0; at < 4; at++) {
        float v[4] = {1, 4, 3, 2}, one = 1;
        v[at] = NAN;
        kiln_tensor *x = tensor_f32(4, xs, v), *gy = tensor_f32(4, ys, &one), *y = NULL, *gx = NULL, *ins[2] = {gy, x};
        kiln_attrs a = pool_attrs(&c, 0);
        CHECK_OK(kiln_apply(KILN_OP_MAX_POOL2D, 1, &x, &a, &y));
        CHECK(y && isnan(((float *)y->data)[0]));
        CHECK_OK(kiln_apply(KILN_OP_MAX_POOL2D_BACKWARD, 2, ins, &a, &gx));
        CHECK(gx && ((float *)gx->data)[at] == 1);
        kiln_tensor_release(x), kiln_tensor_release(gy), kiln_tensor_release(y), kiln_tensor_release(gx);
    }
}

static void test_grads(void) {
    static const pool_case gc[] = {
        {1, 2, 5, 6, 3, 2, 2, 1, 1, 0, 0, 1, 1, 1, 1, 1},
        {2, 1, 7, 6, 2, 3, 2, 2, 1, 1, 1, 0, 2, 1, 0, 0},
        {1, 1, 6, 6, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, 0},
    };
    for (size_t i = 0; i < sizeof gc / sizeof gc[0]; i++) {
        int64_t xs[4] = {gc[i].N, gc[i].C, gc[i].H, gc[i].W};
        kiln_tensor *x = tu_tensor(KILN_DTYPE_FLOAT64, 4, xs);
        kiln_attrs a = pool_attrs(&gc[i], 0);
        char what[64];
        snprintf(what, sizeof what, "max_pool2d grad case %zu", i);
        CHECK(tu_gradcheck(KILN_OP_MAX_POOL2D, 1, &x, &a, 1, what));
        snprintf(what, sizeof what, "avg_pool2d grad case %zu", i);
        CHECK(tu_gradcheck(KILN_OP_AVG_POOL2D, 1, &x, &a, 1, what));
        kiln_tensor_release(x);
    }
}

static void expect_error(kiln_op op, int nin, kiln_tensor **ins, const kiln_attrs *a, kiln_status want,
                         const char *s1, const char *s2) {
    kiln_tensor *y = NULL;
    CHECK_STATUS(kiln_apply(op, nin, ins, a, &y), want);
    CHECK(y == NULL);
    const char *m = kiln_last_error();
    if (!(strstr(m, s1) && (!s2 || strstr(m, s2)))) fprintf(stderr, "  unexpected message: %s\n", m), check_failures++;
}

static void test_errors(void) {
    pool_case c = {1, 1, 2, 2, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 0, 1};
    int64_t xs[4] = {1, 1, 2, 2};
    kiln_tensor *x = tu_tensor(KILN_DTYPE_FLOAT32, 4, xs);
    kiln_attrs a = pool_attrs(&c, 0);
    expect_error(KILN_OP_MAX_POOL2D, 1, &x, &a, KILN_ERR_VALUE, "larger than the padded input", "(1, 1, 2, 2)");
    expect_error(KILN_OP_AVG_POOL2D, 1, &x, &a, KILN_ERR_VALUE, "larger than the padded input", "(1, 1, 2, 2)");
    c.pt = c.pb = c.pl = c.pr = 1, a = pool_attrs(&c, 0); /* padded to 4x4: fits */
    kiln_tensor *y = NULL;
    CHECK_OK(kiln_apply(KILN_OP_MAX_POOL2D, 1, &x, &a, &y));
    CHECK(y && y->meta.shape[2] == 2 && y->meta.shape[3] == 2);
    kiln_tensor_release(y);
    c.pt = 2, a = pool_attrs(&c, 0);
    expect_error(KILN_OP_MAX_POOL2D, 1, &x, &a, KILN_ERR_VALUE, "padding", "half");
    c.pt = 1, c.sw = 0, a = pool_attrs(&c, 0);
    expect_error(KILN_OP_MAX_POOL2D, 1, &x, &a, KILN_ERR_VALUE, "stride", NULL);
    c.sw = 1, a = pool_attrs(&c, 0);
    kiln_tensor *x3 = tu_tensor(KILN_DTYPE_FLOAT32, 3, xs + 1);
    expect_error(KILN_OP_MAX_POOL2D, 1, &x3, &a, KILN_ERR_VALUE, "4-D", "(1, 2, 2)");
    kiln_tensor *xb = NULL;
    CHECK_OK(kiln_tensor_zeros(KILN_DTYPE_BOOL, 4, xs, &xb));
    expect_error(KILN_OP_AVG_POOL2D, 1, &xb, &a, KILN_ERR_TYPE, "bool", NULL);
    kiln_attrs few;
    kiln_attrs_clear(&few);
    expect_error(KILN_OP_MAX_POOL2D, 1, &x, &few, KILN_ERR_VALUE, "attributes", NULL);
    kiln_tensor *bins[2] = {x, x}; /* a (1, 1, 2, 2) grad for a (1, 1, 1, 1) pooled output */
    c.kh = c.kw = 2, c.pt = c.pb = c.pl = c.pr = 0, a = pool_attrs(&c, 0); /* pooled: (1, 1, 1, 1) */
    expect_error(KILN_OP_MAX_POOL2D_BACKWARD, 2, bins, &a, KILN_ERR_VALUE, "max_pool2d_backward", "(1, 1, 1, 1)");
    kiln_tensor_release(x), kiln_tensor_release(x3), kiln_tensor_release(xb);
}

int main(void) {
    test_values();
    test_nan_propagates();
    test_grads();
    test_errors();
    CHECK_DONE();
}
