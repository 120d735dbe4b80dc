/* kiln's Winograd F(4x4, 3x3) for the backward ops of training graphs (src/ops/conv_winograd.c):
 * backward-input (the forward kernel on the turned, channel-swapped filter) and backward-weight
 * (both operands' tiles transformed, one GEMM per transformed position over the tiles), the
 * fast kernels and their plain-loop references, against the direct gradients in float64: odd
 * sizes (1, 2, 3, 5, 7, 9), batch 1 and 3, channels 1, 3, 17, paddings 0, 1, 2 and asymmetric.
 * Tolerance as tests/c/test_conv_winograd.c: |got - want| <= TOL * S, S the sum of the
 * magnitudes of the terms an output adds up (for the weight gradient, the terms of its whole
 * 3x3 filter: the inverse transform G^T M G mixes the nine positions). Also: a wrong result (one operand changed) fails
 * the bound, NaN operands are declined (nothing written), paddings over 2 refused by the
 * backward-input kernel. */
#include <string.h>

#include "linalg_testutil.h"
#include "ops/conv_winograd.h"

#define TOL 1e-5

typedef struct {
    int64_t N, C, H, W, O, pt, pb, pl, pr;
} gcase;

static const gcase cases[] = {
    {1, 1, 1, 1, 1, 1, 1, 1, 1},   {1, 3, 2, 3, 17, 1, 1, 1, 1}, {1, 17, 5, 7, 3, 1, 1, 1, 1},
    {3, 17, 9, 9, 17, 1, 1, 1, 1}, {1, 3, 7, 5, 1, 0, 0, 0, 0},  {2, 17, 9, 7, 3, 2, 2, 2, 2},
    {1, 16, 13, 11, 24, 1, 0, 2, 1}, {1, 32, 20, 20, 32, 1, 1, 1, 1},
};

static kiln_conv_params params_of(const gcase *c) {
    return (kiln_conv_params){.N = c->N, .C = c->C, .H = c->H, .W = c->W, .O = c->O, .KH = 3, .KW = 3,
                              .OH = c->H + c->pt + c->pb - 2, .OW = c->W + c->pl + c->pr - 2, .sh = 1, .sw = 1,
                              .pt = c->pt, .pb = c->pb, .pl = c->pl, .pr = c->pr, .dh = 1, .dw = 1, .groups = 1};
}

static float *random_floats(int64_t n) {
    float *v = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = (float)tu_rand();
    return v;
}

/* gx and gw of the convolution p in float64, with S of each of their elements. */
static void direct(const kiln_conv_params *p, const float *x, const float *w, const float *gy, double *gx,
                   double *sx, double *gw, double *sw) {
    memset(gx, 0, sizeof(double) * (size_t)(p->N * p->C * p->H * p->W));
    memset(sx, 0, sizeof(double) * (size_t)(p->N * p->C * p->H * p->W));
    memset(gw, 0, sizeof(double) * (size_t)(p->O * p->C * 9));
    memset(sw, 0, sizeof(double) * (size_t)(p->O * p->C * 9));
    for (int64_t n = 0; n < p->N; n++)
        for (int64_t o = 0; o < p->O; o++)
            for (int64_t oh = 0; oh < p->OH; oh++)
                for (int64_t ow = 0; ow < p->OW; ow++) {
                    double g = gy[((n * p->O + o) * p->OH + oh) * p->OW + ow];
                    for (int64_t c = 0; c < p->C; c++)
                        for (int kh = 0; kh < 3; kh++)
                            for (int kw = 0; kw < 3; kw++) {
                                int64_t ih = oh - p->pt + kh, iw = ow - p->pl + kw;
                                if (ih < 0 || ih >= p->H || iw < 0 || iw >= p->W) continue;
                                int64_t xi = ((n * p->C + c) * p->H + ih) * p->W + iw, wi = ((o * p->C + c) * 3 + kh) * 3 + kw;
                                gx[xi] += g * w[wi], sx[xi] += fabs(g * w[wi]);
                                gw[wi] += g * x[xi], sw[wi] += fabs(g * x[xi]);
                            }
                }
    for (int64_t f = 0; f < p->O * p->C; f++) { /* the whole filter's terms: the transform mixes them */
        double total = 0;
        for (int k = 0; k < 9; k++) total += sw[f * 9 + k];
        for (int k = 0; k < 9; k++) sw[f * 9 + k] = total;
    }
}

static double worst(const float *got, const double *want, const double *scale, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(got[i] - want[i]) / (scale[i] > 0 ? scale[i] : 1e-30);
        if (!(e <= 1e30)) e = 1e30;
        if (e > m) m = e;
    }
    return m;
}

static void test_against_direct(void) {
    double largest = 0;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        kiln_conv_params p = params_of(&cases[k]);
        int64_t nx = p.N * p.C * p.H * p.W, nw = p.O * p.C * 9, ny = p.N * p.O * p.OH * p.OW;
        float *x = random_floats(nx), *w = random_floats(nw), *gy = random_floats(ny);
        float *gx = malloc(sizeof(float) * (size_t)nx), *gxr = malloc(sizeof(float) * (size_t)nx);
        float *gw = malloc(sizeof(float) * (size_t)nw), *gwr = malloc(sizeof(float) * (size_t)nw);
        double *wx = malloc(sizeof(double) * (size_t)nx), *sx = malloc(sizeof(double) * (size_t)nx);
        double *ww = malloc(sizeof(double) * (size_t)nw), *sw = malloc(sizeof(double) * (size_t)nw);
        direct(&p, x, w, gy, wx, sx, ww, sw);
        bool ran = false;
        CHECK_OK(kiln_conv_winograd_backward_input(&p, gy, w, gx, &ran));
        CHECK(ran);
        CHECK_OK(kiln_conv_winograd_backward_input_reference(&p, gy, w, gxr));
        CHECK_OK(kiln_conv_winograd_backward_weight(&p, x, gy, gw, &ran));
        CHECK(ran);
        CHECK_OK(kiln_conv_winograd_backward_weight_reference(&p, x, gy, gwr));
        double e[4] = {worst(gx, wx, sx, nx), worst(gxr, wx, sx, nx), worst(gw, ww, sw, nw), worst(gwr, ww, sw, nw)};
        for (int i = 0; i < 4; i++) {
            if (!(e[i] <= TOL))
                fprintf(stderr, "case %zu: %s error / S %g over %g\n", k,
                        (const char *[]){"backward-input", "backward-input reference", "backward-weight",
                                         "backward-weight reference"}[i], e[i], TOL);
            CHECK(e[i] <= TOL);
            if (e[i] > largest) largest = e[i];
        }
        /* the bound sees a wrong result: one output-gradient value off by half its size */
        gy[ny / 2] *= 1.5f;
        CHECK_OK(kiln_conv_winograd_backward_weight(&p, x, gy, gw, &ran));
        CHECK(!(worst(gw, ww, sw, nw) <= TOL));
        free(x), free(w), free(gy), free(gx), free(gxr), free(gw), free(gwr), free(wx), free(sx), free(ww), free(sw);
    }
    printf("largest error / S: %g (tolerance %g)\n", largest, TOL);
}

static void test_declines_and_refuses(void) {
    gcase c = {1, 4, 6, 6, 4, 1, 1, 1, 1};
    kiln_conv_params p = params_of(&c);
    float x[144], gy[144], gw[144], gx[144], w[144];
    for (int i = 0; i < 144; i++) x[i] = gy[i] = w[i] = 0.5f, gw[i] = gx[i] = 7;
    x[5] = NAN;
    bool ran = true;
    CHECK_OK(kiln_conv_winograd_backward_weight(&p, x, gy, gw, &ran));
    CHECK(!ran && gw[0] == 7);
    gy[3] = INFINITY;
    CHECK_OK(kiln_conv_winograd_backward_input(&p, gy, w, gx, &ran));
    CHECK(!ran && gx[0] == 7);
    gcase wide = {1, 4, 6, 6, 4, 3, 3, 3, 3};
    p = params_of(&wide);
    CHECK_OK(kiln_conv_winograd_backward_input(&p, gy, w, gx, &ran));
    CHECK(!ran);
    CHECK(kiln_conv_winograd_backward_input_reference(&p, gy, w, gx) == KILN_ERR_VALUE);
    kiln_clear_error();
}

int main(void) {
    test_against_direct();
    test_declines_and_refuses();
    if (check_failures) {
        fprintf(stderr, "%d check(s) failed\n", check_failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
