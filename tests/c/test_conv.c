/* conv2d and its backward ops against direct loops: stride, asymmetric padding, dilation,
 * groups, bias, float32 (oneDNN) / float64 (im2col) / float16, strided inputs, primitive
 * cache reuse, finite-difference gradients and error messages. */
#include "linalg_testutil.h"
#include "ops/conv_dnnl.h"

typedef struct {
    int64_t N, C, H, W, O, KH, KW, sh, sw, pt, pb, pl, pr, dh, dw, g;
    int bias;
} conv_case;

static const conv_case cases[] = {
    {2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {1, 4, 9, 8, 6, 3, 2, 2, 2, 0, 1, 2, 0, 1, 1, 2, 1},
    {2, 4, 10, 9, 4, 3, 3, 1, 2, 2, 2, 1, 1, 2, 2, 4, 0},
    {1, 16, 12, 12, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
    {1, 32, 9, 9, 32, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0},
    {2, 8, 11, 13, 16, 5, 3, 3, 2, 2, 0, 1, 3, 1, 2, 2, 1},
    {1, 3, 5, 5, 2, 5, 5, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1},
    {3, 32, 8, 8, 64, 3, 3, 2, 2, 1, 0, 1, 0, 1, 1, 1, 1},
};

static int64_t out_h(const conv_case *c) { return (c->H + c->pt + c->pb - (c->KH - 1) * c->dh - 1) / c->sh + 1; }
static int64_t out_w(const conv_case *c) { return (c->W + c->pl + c->pr - (c->KW - 1) * c->dw - 1) / c->sw + 1; }

static kiln_attrs conv_attrs(const conv_case *c, const int64_t *shape) {
    kiln_attrs a;
    kiln_attrs_clear(&a);
    int64_t v[9] = {c->sh, c->sw, c->pt, c->pb, c->pl, c->pr, c->dh, c->dw, c->g};
    for (int k = 0; k < 9; k++) kiln_attrs_push_int(&a, v[k]);
    for (int k = 0; shape && k < 4; k++) kiln_attrs_push_int(&a, shape[k]);
    return a;
}

/* Direct loops: y = conv(x, w) + b, and for a given gy: gx, gw. */
static void ref_conv(const conv_case *c, const double *x, const double *w, const double *b, const double *gy,
                     double *y, double *gx, double *gw) {
    int64_t OH = out_h(c), OW = out_w(c), Cg = c->C / c->g, Og = c->O / c->g;
    memset(gx, 0, sizeof(double) * (size_t)(c->N * c->C * c->H * c->W));
    memset(gw, 0, sizeof(double) * (size_t)(c->O * Cg * c->KH * c->KW));
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t o = 0; o < c->O; o++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    int64_t yi = ((n * c->O + o) * OH + oh) * OW + ow;
                    double s = b ? b[o] : 0;
                    for (int64_t ci = 0; ci < Cg; ci++)
                        for (int64_t kh = 0; kh < c->KH; kh++)
                            for (int64_t kw = 0; kw < c->KW; kw++) {
                                int64_t ih = oh * c->sh - c->pt + kh * c->dh, iw = ow * c->sw - c->pl + kw * c->dw;
                                if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W) continue;
                                int64_t xi = ((n * c->C + (o / Og) * Cg + ci) * c->H + ih) * c->W + iw;
                                int64_t wi = ((o * Cg + ci) * c->KH + kh) * c->KW + kw;
                                s += x[xi] * w[wi];
                                gx[xi] += gy[yi] * w[wi];
                                gw[wi] += gy[yi] * x[xi];
                            }
                    y[yi] = s;
                }
}

static double tol_of(kiln_dtype dt) {
    return dt == KILN_DTYPE_FLOAT64 ? 1e-11 : dt == KILN_DTYPE_FLOAT32 ? 1e-4 : 2e-2;
}

/* Runs the three ops on (x, w, b, gy) and compares with the loops. */
static void check_case(const conv_case *c, kiln_tensor *x, kiln_tensor *w, kiln_tensor *b, kiln_tensor *gy,
                       const char *what) {
    double *xv = tu_values(x), *wv = tu_values(w), *bv = b ? tu_values(b) : NULL, *gv = tu_values(gy);
    double *y = malloc(sizeof(double) * (size_t)gy->numel), *gx = malloc(sizeof(double) * (size_t)x->numel),
           *gw = malloc(sizeof(double) * (size_t)w->numel);
    ref_conv(c, xv, wv, bv, gv, y, gx, gw);
    kiln_dtype dt = x->meta.dtype;
    double tol = tol_of(dt) * (1 + (double)(c->C / c->g * c->KH * c->KW) / 64);
    kiln_tensor *ins[3] = {x, w, b}, *out = NULL;
    kiln_attrs a = conv_attrs(c, NULL);
    char name[128];
    snprintf(name, sizeof name, "%s: forward", what);
    CHECK_OK(kiln_apply(KILN_OP_CONV2D, b ? 3 : 2, ins, &a, &out));
    CHECK(out && out->meta.dtype == dt && out->meta.shape[2] == out_h(c) && out->meta.shape[3] == out_w(c));
    CHECK(tu_check(out, y, tol, name));
    kiln_tensor_release(out);
    out = NULL;
    a = conv_attrs(c, x->meta.shape);
    kiln_tensor *bi[2] = {gy, w};
    snprintf(name, sizeof name, "%s: backward_input", what);
    CHECK_OK(kiln_apply(KILN_OP_CONV2D_BACKWARD_INPUT, 2, bi, &a, &out));
    double gtol = tol_of(dt) * (1 + (double)(c->O / c->g * c->KH * c->KW) / 64);
    CHECK(tu_check(out, gx, gtol, name));
    kiln_tensor_release(out);
    out = NULL;
    a = conv_attrs(c, w->meta.shape);
    kiln_tensor *bw[2] = {x, gy};
    snprintf(name, sizeof name, "%s: backward_weight", what);
    CHECK_OK(kiln_apply(KILN_OP_CONV2D_BACKWARD_WEIGHT, 2, bw, &a, &out));
    CHECK(tu_check(out, gw, tol_of(dt) * (1 + (double)(c->N * out_h(c) * out_w(c)) / 64), name));
    kiln_tensor_release(out);
    if (dt == KILN_DTYPE_FLOAT32 && kiln_tensor_is_contiguous(x) && kiln_tensor_is_contiguous(w) &&
        kiln_tensor_is_contiguous(gy)) { /* oneDNN itself takes the problem (no silent fallback) */
        kiln_conv_params p = {c->N, c->C, c->H, c->W, c->O, c->KH, c->KW, out_h(c), out_w(c), c->sh, c->sw,
                              c->pt, c->pb, c->pl, c->pr, c->dh, c->dw, c->g};
        float *buf = malloc(sizeof(float) * (size_t)(x->numel + w->numel + gy->numel));
        CHECK_OK(kiln_conv_dnnl_run(KILN_CONV_FORWARD, &p, NULL, x->data, w->data, b ? b->data : NULL, NULL, buf));
        CHECK_OK(kiln_conv_dnnl_run(KILN_CONV_BACKWARD_INPUT, &p, NULL, gy->data, w->data, NULL, NULL, buf));
        CHECK_OK(kiln_conv_dnnl_run(KILN_CONV_BACKWARD_WEIGHT, &p, NULL, x->data, gy->data, NULL, NULL, buf));
        free(buf);
    }
    free(xv), free(wv), free(bv), free(gv), free(y), free(gx), free(gw);
}

static void test_values(void) {
    const kiln_dtype dts[] = {KILN_DTYPE_FLOAT32, KILN_DTYPE_FLOAT64, KILN_DTYPE_FLOAT16};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
            const conv_case *c = &cases[i];
            int64_t xs[4] = {c->N, c->C, c->H, c->W}, ws[4] = {c->O, c->C / c->g, c->KH, c->KW}, bs[1] = {c->O};
            int64_t ys[4] = {c->N, c->O, out_h(c), out_w(c)};
            kiln_tensor *x = tu_tensor(dts[k], 4, xs), *w = tu_tensor(dts[k], 4, ws), *gy = tu_tensor(dts[k], 4, ys);
            kiln_tensor *b = c->bias ? tu_tensor(dts[k], 1, bs) : NULL;
            char what[96];
            snprintf(what, sizeof what, "conv case %zu %s", i, kiln_dtype_name(dts[k]));
            check_case(c, x, w, b, gy, what);
            if (dts[k] != KILN_DTYPE_FLOAT16) {
                check_case(c, x, w, b, gy, what); /* again: the cached primitives */
                for (int how = 0; how < 3; how++) {
                    kiln_tensor *xn = tu_noncontig(x, how), *wn = tu_noncontig(w, 2 - how), *gn = tu_noncontig(gy, how);
                    snprintf(what, sizeof what, "conv case %zu %s, strided layout %d", i, kiln_dtype_name(dts[k]), how);
                    check_case(c, xn, wn, b, gn, what);
                    kiln_tensor_release(xn), kiln_tensor_release(wn), kiln_tensor_release(gn);
                }
            }
            kiln_tensor_release(x), kiln_tensor_release(w), kiln_tensor_release(gy), kiln_tensor_release(b);
        }
}

/* More problems than the primitive cache holds: entries get evicted and recreated. */
static void test_cache_eviction(void) {
    for (int round = 0; round < 2; round++)
        for (int64_t h = 3; h < 3 + 70; h++) {
            conv_case c = {1, 2, h, 5, 3, 2, 2, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1};
            int64_t xs[4] = {1, 2, h, 5}, ws[4] = {3, 2, 2, 2}, bs[1] = {3}, ys[4] = {1, 3, out_h(&c), out_w(&c)};
            kiln_tensor *x = tu_tensor(KILN_DTYPE_FLOAT32, 4, xs), *w = tu_tensor(KILN_DTYPE_FLOAT32, 4, ws),
                        *b = tu_tensor(KILN_DTYPE_FLOAT32, 1, bs), *gy = tu_tensor(KILN_DTYPE_FLOAT32, 4, ys);
            check_case(&c, x, w, b, gy, "conv cache eviction");
            kiln_tensor_release(x), kiln_tensor_release(w), kiln_tensor_release(b), kiln_tensor_release(gy);
        }
}

static void test_mixed_dtypes(void) {
    const conv_case *c = &cases[1];
    int64_t xs[4] = {c->N, c->C, c->H, c->W}, ws[4] = {c->O, c->C / c->g, c->KH, c->KW}, bs[1] = {c->O};
    kiln_tensor *x = tu_tensor(KILN_DTYPE_BFLOAT16, 4, xs), *w = tu_tensor(KILN_DTYPE_FLOAT32, 4, ws),
                *b = tu_tensor(KILN_DTYPE_FLOAT64, 1, bs), *y = NULL, *ins[3] = {x, w, b};
    kiln_attrs a = conv_attrs(c, NULL);
    CHECK_OK(kiln_apply(KILN_OP_CONV2D, 3, ins, &a, &y));
    CHECK(y && y->meta.dtype == KILN_DTYPE_FLOAT64);
    kiln_tensor_release(x), kiln_tensor_release(w), kiln_tensor_release(b), kiln_tensor_release(y);
}

static void test_grads(void) {
    static const conv_case gc[] = {
        {2, 2, 5, 4, 3, 3, 2, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1},
        {1, 4, 6, 7, 2, 2, 3, 2, 1, 0, 1, 2, 1, 1, 2, 2, 1},
        {1, 3, 7, 6, 3, 3, 2, 2, 2, 1, 2, 1, 0, 2, 1, 3, 1},
    };
    for (size_t i = 0; i < sizeof gc / sizeof gc[0]; i++) {
        const conv_case *c = &gc[i];
        int64_t xs[4] = {c->N, c->C, c->H, c->W}, ws[4] = {c->O, c->C / c->g, c->KH, c->KW}, bs[1] = {c->O};
        kiln_tensor *ins[3] = {tu_tensor(KILN_DTYPE_FLOAT64, 4, xs), tu_tensor(KILN_DTYPE_FLOAT64, 4, ws),
                               tu_tensor(KILN_DTYPE_FLOAT64, 1, bs)};
        kiln_attrs a = conv_attrs(c, NULL);
        char what[64];
        snprintf(what, sizeof what, "conv2d grad case %zu", i);
        CHECK(tu_gradcheck(KILN_OP_CONV2D, 3, ins, &a, 7, what));
        CHECK(tu_gradcheck(KILN_OP_CONV2D, 2, ins, &a, 2, what));
        kiln_release_all(ins, 3);
    }
}

static void expect_error(kiln_op op, int nin, kiln_tensor **ins, const kiln_attrs *a, kiln_status want,
                         const char *s1, const char *s2, const char *s3) {
    kiln_tensor *y = NULL;
    CHECK_STATUS(kiln_apply(op, nin, ins, a, &y), want);
    CHECK(y == NULL);
    const char *m = kiln_last_error();
    if (!(strstr(m, s1) && (!s2 || strstr(m, s2)) && (!s3 || strstr(m, s3))))
        fprintf(stderr, "  unexpected message: %s\n", m), check_failures++;
    kiln_tensor_release(y);
}

static void test_errors(void) {
    conv_case c = {1, 3, 5, 5, 4, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0};
    kiln_attrs a = conv_attrs(&c, NULL);
    int64_t xs[4] = {1, 3, 5, 5}, ws[4] = {4, 2, 3, 3};
    kiln_tensor *x = tu_tensor(KILN_DTYPE_FLOAT32, 4, xs), *w = tu_tensor(KILN_DTYPE_FLOAT32, 4, ws), *ins[3] = {x, w, NULL};
    expect_error(KILN_OP_CONV2D, 2, ins, &a, KILN_ERR_VALUE, "conv2d", "(1, 3, 5, 5)", "(4, 2, 3, 3)");
    kiln_tensor_release(x), kiln_tensor_release(w);

    int64_t xs2[4] = {1, 4, 5, 5}, ws2[4] = {6, 1, 3, 3};
    x = tu_tensor(KILN_DTYPE_FLOAT32, 4, xs2), w = tu_tensor(KILN_DTYPE_FLOAT32, 4, ws2), ins[0] = x, ins[1] = w;
    c.g = 3, a = conv_attrs(&c, NULL);
    expect_error(KILN_OP_CONV2D, 2, ins, &a, KILN_ERR_VALUE, "conv2d", "groups=3", "(1, 4, 5, 5)");
    c.g = 4, a = conv_attrs(&c, NULL); /* 4 divides C = 4 but not O = 6 */
    expect_error(KILN_OP_CONV2D, 2, ins, &a, KILN_ERR_VALUE, "conv2d", "groups=4", "(6, 1, 3, 3)");
    kiln_tensor_release(x), kiln_tensor_release(w);

    int64_t xs3[4] = {1, 1, 2, 2}, ws3[4] = {1, 1, 3, 3};
    x = tu_tensor(KILN_DTYPE_FLOAT32, 4, xs3), w = tu_tensor(KILN_DTYPE_FLOAT32, 4, ws3), ins[0] = x, ins[1] = w;
    c.g = 1, a = conv_attrs(&c, NULL);
    expect_error(KILN_OP_CONV2D, 2, ins, &a, KILN_ERR_VALUE, "conv2d", "(1, 1, 2, 2)", "does not fit");
    c.pt = c.pb = c.pl = c.pr = 1, a = conv_attrs(&c, NULL); /* padded to 4x4: fits */
    kiln_tensor *y = NULL;
    CHECK_OK(kiln_apply(KILN_OP_CONV2D, 2, ins, &a, &y));
    CHECK(y && y->meta.shape[2] == 2 && y->meta.shape[3] == 2);
    kiln_tensor_release(y);
    c.dh = 2, a = conv_attrs(&c, NULL); /* dilated kernel 5 > 4 */
    expect_error(KILN_OP_CONV2D, 2, ins, &a, KILN_ERR_VALUE, "conv2d", "dilated (5, 3)", NULL);
    c.dh = 1, c.sh = 0, a = conv_attrs(&c, NULL);
    expect_error(KILN_OP_CONV2D, 2, ins, &a, KILN_ERR_VALUE, "conv2d", "stride", NULL);
    c.sh = 1, a = conv_attrs(&c, NULL);
    int64_t bs[1] = {2};
    kiln_tensor *b = tu_tensor(KILN_DTYPE_FLOAT32, 1, bs);
    ins[2] = b;
    expect_error(KILN_OP_CONV2D, 3, ins, &a, KILN_ERR_VALUE, "conv2d", "bias", "(2,)");
    kiln_tensor *xi = tu_tensor(KILN_DTYPE_INT32, 4, xs3), *wi = tu_tensor(KILN_DTYPE_INT32, 4, ws3), *iins[2] = {xi, wi};
    expect_error(KILN_OP_CONV2D, 2, iins, &a, KILN_ERR_TYPE, "conv2d", "int32", NULL);
    kiln_tensor *x3 = tu_tensor(KILN_DTYPE_FLOAT32, 3, xs3 + 1), *e3[2] = {x3, w};
    expect_error(KILN_OP_CONV2D, 2, e3, &a, KILN_ERR_VALUE, "conv2d", "4-D", "(1, 2, 2)");
    kiln_attrs short_attrs;
    kiln_attrs_clear(&short_attrs);
    expect_error(KILN_OP_CONV2D, 2, ins, &short_attrs, KILN_ERR_VALUE, "conv2d", NULL, NULL);
    /* backward ops check the grad against the geometry */
    kiln_attrs ab = conv_attrs(&c, xs3);
    int64_t gs[4] = {1, 1, 3, 2};
    kiln_tensor *gy = tu_tensor(KILN_DTYPE_FLOAT32, 4, gs), *bins[2] = {gy, w};
    expect_error(KILN_OP_CONV2D_BACKWARD_INPUT, 2, bins, &ab, KILN_ERR_VALUE, "conv2d_backward_input", "(1, 1, 3, 2)",
                 "(1, 1, 2, 2)");
    kiln_release_all(ins, 3);
    kiln_tensor_release(xi), kiln_tensor_release(wi), kiln_tensor_release(x3), kiln_tensor_release(gy);
}

int main(void) {
    test_values();
    test_mixed_dtypes();
    test_cache_eviction();
    test_grads();
    test_errors();
    CHECK_DONE();
}
