/* kiln's Winograd convolution F(4x4, 3x3) (src/ops/conv_winograd.c), the fast kernel and its
 * plain reference, against a direct convolution in float64 with the same epilogue: odd sizes,
 * padding 0 and 1 (and asymmetric), sizes that are not a multiple of the 4x4 tile, batch > 1,
 * channel counts that are not a multiple of 8, every activation layout, bias, residual, relu,
 * clamp, gelu. Also: the same result with 1 and 2 threads, changed weights of the same shape
 * seen between calls, NaN / infinity / huge operands declined (nothing written), and
 * conv2d_fused choosing it.
 *
 * Tolerance. Each output is checked as |got - want| <= TOL * S, S = sum |x||w| over its 3x3xC
 * window + |bias| + |residual| (the size of the terms summed: a float32 sum of them can be
 * off by a few ulps of S whatever the method). A direct float32 convolution stays within
 * about 1e-7 * S here. Winograd adds the error of its transforms, whose entries reach 5
 * (B), 8 (A) and 1/24 (G): each output is a sum of 36 products of transformed values
 * carrying growth factors of up to |A^T| |B^T| ~ 10 * 10 per dimension pair, so its error is
 * bounded by a constant of order 10^2 times the direct one (Barabasz et al., "Error analysis
 * and improving the accuracy of Winograd convolution for deep neural networks", 2020,
 * measure F(4x4, 3x3) float32 errors ~10-50x a direct convolution's). TOL = 1e-5 allows
 * 100x the direct error; the largest ratio seen on these cases is printed (1.7e-6 on the
 * first machine), a result wrong by one weight changed by 1% fails it (checked below), and
 * so does one coefficient of B^T changed by 1e-4 (tried by hand: 1.9e-5).
 *
 * The fast kernel is compiled per instruction set (src/ops/isa_dispatch.h): the cases run with
 * every variant this CPU can run, each selected in turn (AVX-512's only on CPUs that have it). */
#include <string.h>

#include "linalg_testutil.h"
#include "ops/conv_winograd.h"
#include "ops/isa_dispatch.h"

#define TOL 1e-5

typedef struct {
    int64_t N, C, H, W, O, pt, pb, pl, pr;
    int layout, bias, residual, act;
} wcase;

static const wcase cases[] = {
    {1, 8, 7, 9, 5, 1, 1, 1, 1, KILN_CONV_NCHW, 1, 0, KILN_CONV_ACT_RELU},      /* O not a multiple of 8 */
    {2, 13, 10, 6, 11, 0, 0, 0, 0, KILN_CONV_NHWC, 0, 1, KILN_CONV_ACT_CLAMP},  /* padding 0, batch 2 */
    {3, 16, 9, 9, 16, 1, 1, 1, 1, KILN_CONV_BLOCKED8, 1, 1, KILN_CONV_ACT_RELU}, /* 9 = 2 tiles + 1 */
    {1, 32, 12, 5, 16, 1, 0, 0, 1, KILN_CONV_BLOCKED16, 1, 0, KILN_CONV_ACT_GELU}, /* asymmetric padding */
    {2, 3, 4, 4, 7, 1, 1, 1, 1, KILN_CONV_NCHW, 1, 1, KILN_CONV_ACT_NONE},     /* one tile per image */
    {1, 24, 17, 19, 40, 1, 1, 1, 1, KILN_CONV_BLOCKED8, 0, 1, KILN_CONV_ACT_NONE}, /* several GEMM panels */
    {2, 20, 23, 21, 9, 0, 1, 1, 0, KILN_CONV_NHWC, 1, 0, KILN_CONV_ACT_RELU},   /* blocks of 36 tiles, a partial one */
};

static int64_t oh_of(const wcase *c) { return c->H + c->pt + c->pb - 2; }
static int64_t ow_of(const wcase *c) { return c->W + c->pl + c->pr - 2; }

/* Offset of (n, c, h, w) in a tensor of C channels, H x W, in `layout` (written out per layout,
 * independently of the kernel's own arithmetic). */
static int64_t at(int layout, int64_t C, int64_t H, int64_t W, int64_t n, int64_t c, int64_t h, int64_t w) {
    switch (layout) {
    case KILN_CONV_NHWC: return ((n * H + h) * W + w) * C + c;
    case KILN_CONV_BLOCKED16: return (((n * (C / 16) + c / 16) * H + h) * W + w) * 16 + c % 16;
    case KILN_CONV_BLOCKED8: return (((n * (C / 8) + c / 8) * H + h) * W + w) * 8 + c % 8;
    default: return ((n * C + c) * H + h) * W + w;
    }
}

static kiln_conv_params params_of(const wcase *c) {
    return (kiln_conv_params){.N = c->N, .C = c->C, .H = c->H, .W = c->W, .O = c->O, .KH = 3, .KW = 3,
                              .OH = oh_of(c), .OW = ow_of(c), .sh = 1, .sw = 1, .pt = c->pt, .pb = c->pb,
                              .pl = c->pl, .pr = c->pr, .dh = 1, .dw = 1, .groups = 1};
}

static kiln_conv_epilogue epilogue_of(const wcase *c) {
    return (kiln_conv_epilogue){.layout = c->layout, .winograd = 1, .residual = c->residual, .activation = c->act,
                                .alpha = -0.5, .beta = 0.75};
}

static float *random_floats(int64_t n, double scale) {
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = (float)(tu_rand() * scale);
    return v;
}

static double activate(int act, double v) {
    switch (act) {
    case KILN_CONV_ACT_RELU: return v < 0 ? 0 : v;
    case KILN_CONV_ACT_CLAMP: return v > 0.75 ? 0.75 : v < -0.5 ? -0.5 : v;
    case KILN_CONV_ACT_GELU: return 0.5 * v * (1 + erf(v / sqrt(2.0)));
    default: return v;
    }
}

/* want = act(conv(x, w) + b + r) in float64 (out in c's layout), scale = S of each output. */
static void direct(const wcase *c, const float *x, const float *w, const float *b, const float *r, double *want,
                   double *scale) {
    int64_t OH = oh_of(c), OW = ow_of(c);
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t o = 0; o < c->O; o++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    int64_t yi = at(c->layout, c->O, OH, OW, n, o, oh, ow);
                    double s = 0, mag = 0;
                    for (int64_t ci = 0; ci < c->C; ci++)
                        for (int kh = 0; kh < 3; kh++)
                            for (int kw = 0; kw < 3; kw++) {
                                int64_t ih = oh - c->pt + kh, iw = ow - c->pl + kw;
                                if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W) continue;
                                double xv = x[at(c->layout, c->C, c->H, c->W, n, ci, ih, iw)];
                                double wv = w[((o * c->C + ci) * 3 + kh) * 3 + kw];
                                s += xv * wv, mag += fabs(xv * wv);
                            }
                    if (b) s += b[o], mag += fabs(b[o]);
                    if (r) s += r[yi], mag += fabs(r[yi]);
                    want[yi] = activate(c->act, s);
                    scale[yi] = mag;
                }
}

/* The largest |got - want| / S; 1e30 for a NaN. */
static double worst(const float *got, const double *want, const double *scale, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(got[i] - want[i]) / (scale[i] > 0 ? scale[i] : 1e-30);
        if (!(e <= 1e30)) e = 1e30;
        if (e > m) m = e;
    }
    return m;
}

static double largest_seen;

static void test_against_direct(void) {
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const wcase *c = &cases[k];
        kiln_conv_params p = params_of(c);
        kiln_conv_epilogue ep = epilogue_of(c);
        int64_t nx = c->N * c->C * c->H * c->W, ny = c->N * c->O * p.OH * p.OW;
        float *x = random_floats(nx, 1), *w = random_floats(c->O * c->C * 9, 0.5), *b = random_floats(c->O, 0.5);
        float *r = random_floats(ny, 1), *fast = random_floats(ny, 1), *ref = random_floats(ny, 1);
        double *want = malloc(sizeof(double) * (size_t)ny), *scale = malloc(sizeof(double) * (size_t)ny);
        const float *bias = c->bias ? b : NULL, *res = c->residual ? r : NULL;
        direct(c, x, w, bias, res, want, scale);
        bool ran = false;
        CHECK(kiln_conv_winograd_fits(&p, &ep));
        CHECK_OK(kiln_conv_winograd_run(&p, &ep, x, w, bias, res, fast, &ran));
        CHECK(ran);
        CHECK_OK(kiln_conv_winograd_reference(&p, &ep, x, w, bias, res, ref));
        double ef = worst(fast, want, scale, ny), er = worst(ref, want, scale, ny);
        if (ef > largest_seen) largest_seen = ef;
        if (er > largest_seen) largest_seen = er;
        if (!(ef <= TOL && er <= TOL))
            fprintf(stderr, "case %zu: error / S fast %g, reference %g (tolerance %g)\n", k, ef, er, TOL),
                check_failures++;
        /* one weight changed by 1% of the largest: a wrong result the tolerance must catch */
        w[4] += 0.005f;
        direct(c, x, w, bias, res, want, scale);
        CHECK(worst(fast, want, scale, ny) > TOL);
        free(x), free(w), free(b), free(r), free(fast), free(ref), free(want), free(scale);
    }
    printf("largest error / S over the cases: %g (tolerance %g)\n", largest_seen, TOL);
}

/* The cases again with each variant of the fast kernel that this CPU runs. */
static void test_every_variant(void) {
    const kiln_isa_kernel *wino = NULL;
    for (int k = 0; k < kiln_isa_kernel_count(); k++)
        if (!strcmp(kiln_isa_kernel_at(k)->name, "winograd")) wino = kiln_isa_kernel_at(k);
    CHECK(wino != NULL);
    if (!wino) return;
    /* at start-up: the variant of the level kiln uses */
    CHECK(kiln_isa_kernel_chosen(wino) == kiln_variant_for(kiln_isa_level()));
    for (int v = 0; v < KILN_VARIANT_COUNT; v++) {
        if (!kiln_variant_runs((kiln_variant)v)) {
            CHECK(kiln_isa_select((kiln_variant)v) == KILN_ERR_VALUE);
            printf("variant %s: not run (not compiled, or this CPU lacks it)\n", kiln_variant_name((kiln_variant)v));
            continue;
        }
        CHECK_OK(kiln_isa_select((kiln_variant)v));
        CHECK(kiln_isa_kernel_chosen(wino) == (kiln_variant)v);
        printf("variant %s: ", kiln_variant_name((kiln_variant)v));
        test_against_direct();
    }
    kiln_isa_select_default();
    CHECK(kiln_isa_kernel_chosen(wino) == kiln_variant_for(kiln_isa_level()));
}

/* 1 and 2 threads compute each tile alike; new weights of the same shape are transformed anew. */
static void test_threads_and_weights(void) {
    const wcase *c = &cases[5];
    kiln_conv_params p = params_of(c);
    kiln_conv_epilogue ep = epilogue_of(c);
    int64_t nx = c->N * c->C * c->H * c->W, ny = c->N * c->O * p.OH * p.OW, nw = c->O * c->C * 9;
    float *x = random_floats(nx, 1), *w1 = random_floats(nw, 0.5), *w2 = random_floats(nw, 0.5);
    float *r = random_floats(ny, 1), *y1 = random_floats(ny, 1), *y2 = random_floats(ny, 1);
    double *want = malloc(sizeof(double) * (size_t)ny), *scale = malloc(sizeof(double) * (size_t)ny);
    bool ran = false;
    CHECK_OK(kiln_set_num_threads(1));
    CHECK_OK(kiln_conv_winograd_run(&p, &ep, x, w1, NULL, r, y1, &ran));
    CHECK_OK(kiln_set_num_threads(2));
    CHECK_OK(kiln_conv_winograd_run(&p, &ep, x, w1, NULL, r, y2, &ran));
    CHECK(!memcmp(y1, y2, sizeof(float) * (size_t)ny));
    CHECK_OK(kiln_conv_winograd_run(&p, &ep, x, w2, NULL, r, y2, &ran));
    direct(c, x, w2, NULL, r, want, scale);
    CHECK(ran && worst(y2, want, scale, ny) <= TOL);
    /* back to w1, changed in place in one value: not the kept transform of w1 */
    w1[nw - 1] = -w1[nw - 1];
    CHECK_OK(kiln_conv_winograd_run(&p, &ep, x, w1, NULL, r, y1, &ran));
    direct(c, x, w1, NULL, r, want, scale);
    CHECK(ran && worst(y1, want, scale, ny) <= TOL);
    free(x), free(w1), free(w2), free(r), free(y1), free(y2), free(want), free(scale);
}

/* NaN, infinities and huge values in x or w: declined, nothing written. */
static void test_declines_wild_values(void) {
    const wcase *c = &cases[2];
    kiln_conv_params p = params_of(c);
    kiln_conv_epilogue ep = epilogue_of(c);
    int64_t nx = c->N * c->C * c->H * c->W, ny = c->N * c->O * p.OH * p.OW, nw = c->O * c->C * 9;
    const float wild[3] = {NAN, -INFINITY, 0x1p70f};
    for (int k = 0; k < 3; k++)
        for (int which = 0; which < 2; which++) {
            float *x = random_floats(nx, 1), *w = random_floats(nw, 0.5), *y = random_floats(ny, 1);
            float *before = malloc(sizeof(float) * (size_t)ny);
            memcpy(before, y, sizeof(float) * (size_t)ny);
            (which ? w : x)[which ? nw / 2 : nx / 3] = wild[k];
            bool ran = true;
            CHECK_OK(kiln_conv_winograd_run(&p, &ep, x, w, NULL, NULL, y, &ran));
            CHECK(!ran);
            CHECK(!memcmp(before, y, sizeof(float) * (size_t)ny));
            free(x), free(w), free(y), free(before);
        }
}

/* conv2d_fused with Winograd allowed takes it where chosen (128 channels, 16 x 16: the
 * benchmark's block, small) and agrees with the direct convolution; on an AVX-512 CPU oneDNN's
 * Winograd serves instead, with the same result. */
static void test_through_the_op(void) {
    wcase c = {1, 128, 16, 16, 128, 1, 1, 1, 1, KILN_CONV_NCHW, 1, 1, KILN_CONV_ACT_RELU};
    kiln_conv_params p = params_of(&c);
    kiln_conv_epilogue ep = epilogue_of(&c);
    CHECK(kiln_conv_winograd_chosen(&p, &ep) == (kiln_conv_block_size() != 16));
    ep.winograd = 0;
    CHECK(!kiln_conv_winograd_chosen(&p, &ep));
    int64_t xs[4] = {c.N, c.C, c.H, c.W}, ws[4] = {c.O, c.C, 3, 3}, bs[1] = {c.O}, ys[4] = {c.N, c.O, p.OH, p.OW};
    float *xv = random_floats(xs[0] * xs[1] * xs[2] * xs[3], 1), *wv = random_floats(c.O * c.C * 9, 0.1);
    float *bv = random_floats(c.O, 0.5), *rv = random_floats(ys[0] * ys[1] * ys[2] * ys[3], 1);
    kiln_tensor *ins[4] = {tensor_f32(4, xs, xv), tensor_f32(4, ws, wv), tensor_f32(1, bs, bv), tensor_f32(4, ys, rv)};
    kiln_attrs a = {0};
    int64_t attrs[14] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, KILN_CONV_ACT_RELU, KILN_CONV_NCHW, 1};
    for (int k = 0; k < 14; k++) kiln_attrs_push_int(&a, attrs[k]);
    kiln_tensor *y = NULL;
    int64_t runs = kiln_conv_winograd_count();
    CHECK_OK(kiln_apply(KILN_OP_CONV2D_FUSED, 4, ins, &a, &y));
    CHECK(kiln_conv_winograd_count() == runs + (kiln_conv_block_size() != 16));
    int64_t ny = ys[0] * ys[1] * ys[2] * ys[3];
    double *want = malloc(sizeof(double) * (size_t)ny), *scale = malloc(sizeof(double) * (size_t)ny);
    direct(&c, xv, wv, bv, rv, want, scale);
    CHECK(y && worst(y->data, want, scale, ny) <= TOL);
    kiln_tensor_release(y);
    kiln_release_all(ins, 4);
    free(xv), free(wv), free(bv), free(rv), free(want), free(scale);
}

int main(void) {
    test_every_variant();
    test_threads_and_weights();
    test_declines_wild_values();
    test_through_the_op();
    if (check_failures) {
        fprintf(stderr, "%d check(s) failed\n", check_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
